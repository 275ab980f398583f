"""A sparse table's gradients on a server: rows checked, and summed into one sparse
gradient for torch's sparse optimizers (pure functions)."""

from __future__ import annotations

import math

import torch

__all__ = ["check_rows", "rows_within", "table_push_ok", "sparse_sum"]

# torch's default, said explicitly (its sparse optimizers warn where it is left implicit):
# rows are checked here (`check_rows`) before a sparse tensor is made of them.
torch.sparse.check_sparse_tensor_invariants.disable()


def check_rows(block, rows: torch.Tensor, who: str) -> None:
    """ValueError unless `rows` are int64 row numbers within `block`."""
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise ValueError(f"{who}: rows of block {block.key} must be a 1-d int64 tensor, not "
                         f"{tuple(rows.shape)} {rows.dtype}")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= block.rows):
        raise ValueError(f"{who}: block {block.key} has rows [0, {block.rows}); asked for "
                         f"{int(rows.min()) if int(rows.min()) < 0 else int(rows.max())}")


def rows_within(blocks: list, rows: list[torch.Tensor]) -> bool:
    """True if every `rows[i]` is a 1-d int64 tensor of row numbers within `blocks[i]`,
    all checked at once (a few operations, where `check_rows` takes four per block);
    False if any is not, for `check_rows` to find and name it."""
    if any(r.dtype != torch.int64 or r.dim() != 1 for r in rows):
        return False
    flat = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    if not flat.numel():
        return True
    limit = torch.repeat_interleave(torch.tensor([b.rows for b in blocks]), torch.tensor([len(r) for r in rows]))
    return not bool(((flat < 0) | (flat >= limit)).any())


def table_push_ok(blocks: list, rows: list, grads: list[torch.Tensor], dtypes: list) -> bool:
    """True if a push's gradients of table blocks are all well formed: rows given and
    within their block (`rows_within`), `grads[i]` flat, that many rows of the block's
    width, of `dtypes[i]`, and all finite (one sum: NaN and inf propagate). False if any
    is not, or their sum overflows: the caller then checks block by block and names the
    one at fault (or none, for an overflow of the sum alone)."""
    if any(r is None or g.dim() != 1 or g.dtype != d or g.numel() != r.numel() * b.width
           for b, r, g, d in zip(blocks, rows, grads, dtypes)):
        return False
    return rows_within(blocks, rows) and (not grads or math.isfinite(float(torch.cat(grads).sum())))


def sparse_sum(rows: list[torch.Tensor], grads: list[torch.Tensor], weights: list[float], shape: tuple[int, int]
               ) -> torch.Tensor:
    """Σ wᵢ·gᵢ of sparse gradients (`rows[i]` of a block, `grads[i]` their values flat),
    as one sparse COO tensor of `shape` (rows, width), not coalesced (the optimizers do)."""
    width = shape[1]
    values = [g.view(-1, width) * w if w != 1.0 else g.view(-1, width) for g, w in zip(grads, weights)]
    return torch.sparse_coo_tensor(torch.cat(rows).unsqueeze(0), torch.cat(values), shape, check_invariants=False)
