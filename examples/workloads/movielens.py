"""Matrix factorization on MovieLens-100k with sparse embedding tables on the servers.

100,000 ratings (1-5) of 1,682 movies by 943 users (Harper and Konstan, "The MovieLens
Datasets: History and Context", ACM TiiS 2015). The model predicts a rating as
μ + b_u + b_i + ⟨p_u, q_i⟩ (Koren, Bell and Volinsky, "Matrix Factorization Techniques
for Recommender Systems", IEEE Computer 2009): four ``nn.Embedding(..., sparse=True)``
tables, whose rows stay on the servers (a worker pulls only the rows of its batch's
users and items), and one dense parameter μ. Loss: mean squared error plus a penalty on
the rows looked up; metric: the MSE on a held-out tenth of the ratings (a seeded random
split), whose root is the RMSE.

The data file is the one the ``recbole`` wheel (1.2.1) packages,
``recbole/dataset_example/ml-100k/ml-100k.inter``; install it with
``pip install --no-deps recbole==1.2.1`` (its own dependencies are not needed: the file is
read here, the package never imported). Nothing is downloaded.

    equipoise train examples/workloads/movielens.toml

`synthetic` is a small seeded rating set of the same shape, for tests.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

SPLIT_SEED = 0
EVAL_SHARE = 0.1


def _inter_file() -> Path:
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the MovieLens example reads ml-100k from the recbole wheel: "
                          "pip install --no-deps recbole==1.2.1")
    return Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / "ml-100k" / "ml-100k.inter"


def _split(users: torch.Tensor, items: torch.Tensor, ratings: torch.Tensor, n_users: int, n_items: int) -> dict:
    order = torch.randperm(len(ratings), generator=torch.Generator().manual_seed(SPLIT_SEED))
    cut = len(order) - int(len(order) * EVAL_SHARE)
    x = torch.stack([users, items], 1)[order]
    y = ratings[order]
    train, test = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])
    for d in (train, test):
        d.n_users, d.n_items, d.mean = n_users, n_items, float(y[:cut].mean())
    return {"train": train, "eval": test}


def movielens() -> dict:
    """ml-100k's ratings: user and item ids as 0-based indices, ratings as floats."""
    lines = _inter_file().read_text().splitlines()[1:]  # header: user_id item_id rating timestamp
    rows = [line.split("\t") for line in lines if line.strip()]
    users = torch.tensor([int(r[0]) - 1 for r in rows])
    items = torch.tensor([int(r[1]) - 1 for r in rows])
    ratings = torch.tensor([float(r[2]) for r in rows])
    return _split(users, items, ratings, int(users.max()) + 1, int(items.max()) + 1)


def synthetic(n: int = 4000, n_users: int = 300, n_items: int = 500) -> dict:
    """A seeded rating set of ml-100k's shape: Zipf-like item popularity, ratings from a
    low-rank truth plus noise, clipped to 1-5."""
    g = torch.Generator().manual_seed(1)
    users = torch.randint(0, n_users, (n,), generator=g)
    weights = 1.0 / torch.arange(1, n_items + 1, dtype=torch.float64) ** 1.1
    items = torch.multinomial(weights, n, replacement=True, generator=g)
    pu, qi = torch.randn(n_users, 4, generator=g), torch.randn(n_items, 4, generator=g)
    ratings = (3.5 + 0.5 * (pu[users] * qi[items]).sum(1) + 0.3 * torch.randn(n, generator=g)).clamp(1, 5)
    return _split(users, items, ratings, n_users, n_items)


class MF(nn.Module):
    """μ + b_u + b_i + ⟨p_u, q_i⟩, the four tables sparse (their rows live on the servers)."""

    def __init__(self, n_users: int, n_items: int, dim: int = 32, mean: float = 3.5):
        super().__init__()
        self.user, self.item = nn.Embedding(n_users, dim, sparse=True), nn.Embedding(n_items, dim, sparse=True)
        self.user_bias, self.item_bias = nn.Embedding(n_users, 1, sparse=True), nn.Embedding(n_items, 1, sparse=True)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=0.1)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        self.mu = nn.Parameter(torch.tensor([mean]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, i = x[:, 0], x[:, 1]
        p, q = self.user(u), self.item(i)
        bu, bi = self.user_bias(u).squeeze(1), self.item_bias(i).squeeze(1)
        # each sample's squared norm of the rows it looked up: `mse`'s regulariser, on the
        # touched rows only (a weight decay would decay every row, touched or not)
        self.penalty = ((p * p).sum(1) + (q * q).sum(1) + bu * bu + bi * bi).mean()
        return self.mu + bu + bi + (p * q).sum(1)


def mf(n_users: int = 943, n_items: int = 1682, dim: int = 32, mean: float = 3.5) -> nn.Module:
    """The model, by default for ml-100k's users and items (`model_args` for others)."""
    return MF(n_users, n_items, dim, mean)


def sparse_ids(batch) -> dict:
    """The ids each table looks up in `batch`: the servers are asked for all four tables'
    rows at once, before the forward (without this, each table asks when it runs)."""
    x, _ = batch
    return {"user": x[:, 0], "item": x[:, 1], "user_bias": x[:, 0], "item_bias": x[:, 1]}


def mse(model: nn.Module, batch, reg: float = 0.05) -> torch.Tensor:
    """Mean squared error plus `reg` times the mean squared norm of the rows looked up
    (the regularised loss of Koren et al.)."""
    x, y = batch
    return F.mse_loss(model(x), y) + reg * model.penalty


def metrics(model: nn.Module, batch) -> dict:
    """Squared error summed and counted: the evaluation's mean is the MSE, its root the RMSE."""
    x, y = batch
    return {"mse": (F.mse_loss(model(x).clamp(1, 5), y, reduction="sum"), len(y))}
