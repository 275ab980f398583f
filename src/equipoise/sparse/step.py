"""A sparse table's gradients on a server: rows checked, and summed into one sparse
gradient for torch's sparse optimizers (pure functions)."""

from __future__ import annotations

import torch

__all__ = ["check_rows", "sparse_sum"]

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


def sparse_sum(rows: list[torch.Tensor], grads: list[torch.Tensor], weights: list[float], shape: tuple[int, int]
               ) -> torch.Tensor:
    """Σ wᵢ·gᵢ of sparse gradients (`rows[i]` of a block, `grads[i]` their values flat),
    as one sparse COO tensor of `shape` (rows, width), not coalesced (the optimizers do)."""
    width = shape[1]
    values = [g.view(-1, width) * w if w != 1.0 else g.view(-1, width) for g, w in zip(grads, weights)]
    return torch.sparse_coo_tensor(torch.cat(rows).unsqueeze(0), torch.cat(values), shape, check_invariants=False)
