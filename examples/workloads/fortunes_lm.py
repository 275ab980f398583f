"""A byte-level language model on real English text: a small GPT-style decoder trained on
the fortune-cookie files of Debian's `fortunes` package (`apt-get install fortunes`:
849 kB to download, 2.6 MB installed; about 2.58 MB of text in 15,000 fortunes: quotes,
literature, poems, jokes). Nothing is downloaded at run time.

Two workloads share the text and the model:

* ``blocks``: the text cut into windows of ``CONTEXT + 1`` bytes (next-byte prediction
  on every position; the loss is the mean over the batch's tokens);
* ``fortunes``: one fortune per sample, of varying length, padded by ``pad_collate``;
  ``token_loss`` returns ``(loss_sum, count)`` over the real (unpadded) tokens, so the
  servers weight each worker's gradient by its tokens, not its samples.

The first 90% of the text (by fortune) trains, the last 10% evaluates; ``metrics``
reports the validation loss in nats per byte and its perplexity.

    equipoise train examples/workloads/fortunes_lm.toml
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FORTUNES = Path("/usr/share/games/fortunes")
CONTEXT = 64  # bytes a model sees
VOCAB = 256  # byte-level
EVAL_SHARE = 0.1
PAD = -100  # target of a padded position: ignored by cross_entropy


def fortunes_text(directory: Path = FORTUNES) -> list[bytes]:
    """Every fortune of the package, in file order (files sorted by name)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: install Debian's fortunes package (apt-get install fortunes)")
    files = sorted(p for p in directory.iterdir()
                   if p.is_file() and not p.is_symlink() and p.suffix != ".dat")
    docs: list[bytes] = []
    for p in files:
        docs += [d.strip(b"\n") + b"\n" for d in p.read_bytes().split(b"\n%\n") if d.strip()]
    return docs


def split_docs(directory: Path = FORTUNES) -> tuple[list[bytes], list[bytes]]:
    docs = fortunes_text(directory)
    cut = int(len(docs) * (1 - EVAL_SHARE))
    return docs[:cut], docs[cut:]


def unigram_entropy(docs: list[bytes]) -> float:
    """The byte-unigram entropy of `docs` in nats: the loss of the best model that ignores
    context (it predicts every byte with the bytes' overall frequencies)."""
    counts = torch.bincount(torch.frombuffer(bytearray(b"".join(docs)), dtype=torch.uint8).long(),
                            minlength=VOCAB).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


class Blocks(torch.utils.data.Dataset):
    """Non-overlapping windows of CONTEXT + 1 bytes of the concatenated text."""

    def __init__(self, docs: list[bytes], context: int = CONTEXT):
        data = torch.frombuffer(bytearray(b"".join(docs)), dtype=torch.uint8).long()
        n = (len(data) - 1) // context
        self.windows = data[: n * context + 1].as_strided((n, context + 1), (context, 1))

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.windows[i].clone()

    def get_batch(self, idx: torch.Tensor) -> torch.Tensor:  # the batch at once (optional)
        return self.windows[idx]


class Fortunes(torch.utils.data.Dataset):
    """One fortune per item, its first CONTEXT + 1 bytes, as an int64 tensor."""

    def __init__(self, docs: list[bytes], context: int = CONTEXT):
        self.docs, self.context = docs, context

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(list(self.docs[i][: self.context + 1]), dtype=torch.int64)


def blocks(data_dir: str | None = None):
    train, test = split_docs(Path(data_dir) if data_dir else FORTUNES)
    return {"train": Blocks(train), "eval": Blocks(test)}


def fortunes(data_dir: str | None = None):
    train, test = split_docs(Path(data_dir) if data_dir else FORTUNES)
    return {"train": Fortunes(train), "eval": Fortunes(test)}


def pad_collate(items: list[torch.Tensor]) -> torch.Tensor:
    """Pad variable-length fortunes to the longest in the batch; padded positions are PAD."""
    longest = max(len(t) for t in items)
    out = torch.full((len(items), longest), PAD, dtype=torch.int64)
    for row, t in zip(out, items):
        row[: len(t)] = t
    return out


# -- the model -------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer over bytes: token and position embeddings, pre-norm
    blocks with causal self-attention, a tied output layer."""

    def __init__(self, d: int = 160, layers: int = 4, heads: int = 4, context: int = CONTEXT):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        nn.init.normal_(self.tok.weight, std=0.02)  # tied to the output layer: small logits at first
        self.pos = nn.Parameter(torch.zeros(context, d))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.tok(tokens.clamp_min(0)) + self.pos[:n]
        for b in self.blocks:
            x = b(x, self.mask[:n, :n])
        return self.ln(x) @ self.tok.weight.T  # logits (B, n, VOCAB)


def gpt() -> nn.Module:
    """About 1.3 M parameters (d = 160, 4 layers): the example's model."""
    return GPT()


def gpt_tiny() -> nn.Module:
    """About 40 k parameters (d = 32, 2 layers): for the tests."""
    return GPT(d=32, layers=2, heads=2)


# -- the steps -------------------------------------------------------------------------------
def next_byte_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of every next byte (windows of equal length: every sample
    has CONTEXT targets, so the mean over the batch is the mean over its tokens)."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def token_loss(model: nn.Module, batch: torch.Tensor):
    """(Σ cross-entropy over real tokens, their count): fortunes differ in length."""
    targets = batch[:, 1:]
    logits = model(batch[:, :-1])
    total = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=PAD,
                            reduction="sum")
    return total, int((targets != PAD).sum())


def metrics(model: nn.Module, batch: torch.Tensor) -> dict:
    """Validation loss (nats per byte) and bits per byte, each as (sum, count) over the
    real tokens; the perplexity is exp(test_loss)."""
    total, count = token_loss(model, batch)
    return {"loss": (total, count), "bits_per_byte": (total / math.log(2), count)}


def plain_pytorch(iterations: int = 300, batch: int = 32, lr: float = 3e-3, seed: int = 0) -> float:
    """The same model and data in one process, without equipoise: the comparison for
    the language-model benchmark. Returns the final validation loss."""
    torch.manual_seed(seed)
    data = blocks()
    model = gpt()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.randperm(len(data["train"]), generator=torch.Generator().manual_seed(seed))
    for t in range(iterations):
        idx = order[(t * batch) % len(order):][:batch]
        opt.zero_grad()
        next_byte_loss(model, data["train"].get_batch(idx)).backward()
        opt.step()
    return evaluate(model, data["eval"])


@torch.no_grad()
def evaluate(model: nn.Module, data: Blocks, batch: int = 256) -> float:
    model.eval()
    total = count = 0.0
    for s in range(0, len(data), batch):
        b = data.get_batch(torch.arange(s, min(len(data), s + batch)))
        t, c = token_loss(model, b)
        total, count = total + float(t), count + c
    return total / count


if __name__ == "__main__":
    import equipoise

    here = os.path.dirname(os.path.abspath(__file__))
    summary = equipoise.train(os.path.join(here, "fortunes_lm.toml"))
    print(f"validation loss {summary['final_test_loss']:.3f} nats/byte, "
          f"perplexity {math.exp(summary['final_test_loss']):.2f}, "
          f"unigram entropy {unigram_entropy(split_docs()[1]):.3f}")
