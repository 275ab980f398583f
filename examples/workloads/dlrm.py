"""A DLRM-style click-through-rate model on seeded synthetic clicks with Zipf-distributed
ids: the workload parameter servers exist for, with tables up to 10⁷ rows.

The model follows Naumov et al., "Deep Learning Recommendation Model for Personalization
and Recommendation Systems" (arXiv:1906.00091, 2019): a bottom MLP over the dense
features, one ``nn.EmbeddingBag(..., sparse=True)`` per categorical feature (its rows
stay on the servers: a worker pulls only those of its batch's ids), the pairwise dot
products of the bottom MLP's output and every bag's vector, and a top MLP over them and
the bottom output, giving a click logit (binary cross-entropy).

The data are generated per index, nothing stored or downloaded: sample ``i``'s dense
features, its id in each table and its click come from a counter-based hash of
(``seed``, ``i``), so a sample is the same in every process and every epoch, and any
index can be read alone. Ids follow a Zipf law of exponent ``ALPHA`` = 1.1 over each
table's rows (rank k drawn with probability ∝ (k + 1)^-α, by the inverse of the
continuous law's distribution function), then scattered by a fixed permutation-free
hash so that hot ids are not the low ones. A click is drawn with probability
sigmoid(w·dense + Σ_t e_t(id_t)), e_t a fixed per-id effect: what a model can learn is
in the hot ids' rows and in the dense part.

    equipoise train examples/workloads/dlrm.toml

``model_args = {rows = 1_000_000}`` sets every table's rows (tables, dim likewise), and
``data_args`` the ids' range to match.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ALPHA = 1.1  # the Zipf exponent of every table's ids
DENSE = 13  # dense features, as Criteo's
TABLES = 8  # categorical features (Criteo has 26)
ROWS = 100_000  # rows per table (model_args and data_args: rows)
TRAIN, EVAL = 200_000, 20_000
_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that scatters neighbouring inputs."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _uniform(seed: int, index: np.ndarray, stream: int) -> np.ndarray:
    """A uniform in (0, 1) per index, for one of the sample's streams (a feature)."""
    with np.errstate(over="ignore"):
        key = (index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
               + np.uint64((seed * 1_000_003 + stream) & 0xFFFFFFFF) * np.uint64(0xD1B54A32D192ED03))
    return ((_mix(key) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def zipf_ranks(u: np.ndarray, rows: int, alpha: float = ALPHA) -> np.ndarray:
    """Ranks in [0, rows) with P(k) ∝ (k + 1)^-alpha, from uniforms `u` (inverse CDF of
    the continuous law on [1, rows + 1), floored)."""
    a = 1.0 - alpha
    x = (1.0 + u * ((rows + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, rows - 1)


def _effect(table: int, ids: np.ndarray) -> np.ndarray:
    """The true per-id effect on the click logit, in [-1.5, 1.5]."""
    return 3.0 * (_uniform(7, ids, 100 + table) - 0.5)


class Clicks:
    """`n` synthetic samples from `first` on: (dense float32 [B, 13], ids int64 [B, 8],
    click float32 [B]) by ``get_batch(indices)``, one at a time by ``__getitem__``."""

    def __init__(self, n: int, first: int = 0, rows: int = ROWS, tables: int = TABLES, seed: int = 0):
        self.n, self.first, self.rows, self.tables, self.seed = n, first, rows, tables, seed
        g = np.random.default_rng(seed + 12345)
        self.w = g.normal(0.0, 0.5, DENSE)  # the true dense weights

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = np.asarray(torch.as_tensor(indices).reshape(-1), dtype=np.int64) + self.first
        dense = np.stack([_uniform(self.seed, idx, f) for f in range(DENSE)], 1) * 2.0 - 1.0
        ids = np.stack([(_mix(zipf_ranks(_uniform(self.seed, idx, 50 + t), self.rows).astype(np.uint64)
                              + np.uint64(t)) % np.uint64(self.rows)).astype(np.int64)
                        for t in range(self.tables)], 1)
        logit = dense @ self.w + sum(_effect(t, ids[:, t]) for t in range(self.tables)) - 0.5
        click = (_uniform(self.seed, idx, 99) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return (torch.from_numpy(dense.astype(np.float32)), torch.from_numpy(ids), torch.from_numpy(click))

    def __getitem__(self, i: int):
        dense, ids, click = self.get_batch(torch.tensor([int(i)]))
        return dense[0], ids[0], click[0]


def clicks(rows: int = ROWS, tables: int = TABLES, train: int = TRAIN, eval: int = EVAL, seed: int = 0) -> dict:
    """The training samples, and a disjoint evaluation set (later indices)."""
    return {"train": Clicks(train, 0, rows, tables, seed), "eval": Clicks(eval, train, rows, tables, seed)}


def _mlp(sizes: list[int], last_plain: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if not (last_plain and i == len(sizes) - 2):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP, one sparse EmbeddingBag per table, pairwise dot interactions, top MLP."""

    def __init__(self, rows: int = ROWS, tables: int = TABLES, dim: int = 16, sparse: bool = True):
        super().__init__()
        self.bottom = _mlp([DENSE, 64, dim], last_plain=False)
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse) for _ in range(tables))
        for t in self.tables:  # DLRM's initialisation: uniform in ±sqrt(1 / rows)
            nn.init.uniform_(t.weight, -(1.0 / rows) ** 0.5, (1.0 / rows) ** 0.5)
        n = tables + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = _mlp([dim + n * (n - 1) // 2, 64, 1], last_plain=True)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = [x] + [t(ids[:, i:i + 1]) for i, t in enumerate(self.tables)]  # one id per bag
        z = torch.stack(vectors, 1)  # [B, tables + 1, dim]
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


def dlrm(rows: int = ROWS, tables: int = TABLES, dim: int = 16, sparse: bool = True) -> nn.Module:
    """The model; ``sparse = False`` keeps the tables as dense parameters (pulled and
    pushed whole by every worker: the comparison the sparse path is measured against)."""
    return DLRM(rows, tables, dim, sparse)


def sparse_ids(batch) -> dict:
    """Each table's ids in `batch`: the servers are asked for every table's rows at once."""
    _, ids, _ = batch
    return {f"tables.{t}": ids[:, t] for t in range(ids.shape[1])}


def bce(model: nn.Module, batch) -> torch.Tensor:
    dense, ids, click = batch
    return F.binary_cross_entropy_with_logits(model(dense, ids), click)


def metrics(model: nn.Module, batch) -> dict:
    """Log loss and accuracy, each summed and counted (the evaluation's means)."""
    dense, ids, click = batch
    logit = model(dense, ids)
    loss = F.binary_cross_entropy_with_logits(logit, click, reduction="sum")
    right = ((logit > 0).float() == click).float().sum()
    return {"logloss": (loss, len(click)), "accuracy": (right, len(click))}
