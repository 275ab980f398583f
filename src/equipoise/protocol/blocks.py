"""Moving a model's tensors in and out of parameter blocks."""

from __future__ import annotations

import torch
from torch import nn

from ..policy.block_size import resolve_block_size
from ..policy.placement import Block, make_blocks
from ..sparse.tables import gather_rows, scatter_rows, sparse_tables, table_blocks


def model_tensors(model: nn.Module) -> list[tuple[str, int, str, int]]:
    """(name, numel, kind, itemsize) of the model's parameters (stepped by the
    optimizer; kind "rows" for a sparse table's weight, sparse/tables.py), then of its persistent floating point buffers such as BatchNorm running
    statistics (averaged by sample count), in creation order. A non-persistent buffer
    (`register_buffer(..., persistent=False)`: a causal mask, a cache) is a constant of
    the model's code, the same in every process: it is never sent."""
    tables = sparse_tables(model)
    tensors = [(n, p.numel(), "rows" if n in tables else "param", p.element_size())
               for n, p in model.named_parameters()]
    tensors += [(n, b.numel(), "buffer", b.element_size())
                for n, b in model.named_buffers() if b.is_floating_point() and _persistent(model, n)]
    return tensors


def _persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in module._non_persistent_buffers_set


def table_widths(model: nn.Module) -> dict[str, int]:
    """Each sparse table's elements per row, by weight name."""
    return {n: t.dim for n, t in sparse_tables(model).items()}


def model_blocks(model: nn.Module, block_size: int, servers: int = 0) -> list[Block]:
    """The model's tensors cut into blocks of at most `block_size` elements (0: the
    size `auto_block_size` gives for `servers` servers, which must then be given);
    sparse tables' in blocks of whole rows after the others."""
    tensors = model_tensors(model)
    size = resolve_block_size(block_size, tensors, servers)
    dense = make_blocks([t for t in tensors if t[2] != "rows"], size)
    return dense + table_blocks([t for t in tensors if t[2] == "rows"], table_widths(model), size, len(dense),
                                max(1, servers))


def _flat(model: nn.Module) -> dict[str, torch.Tensor]:
    named = dict(model.named_parameters())
    named.update(model.named_buffers())
    return {n: t.detach().view(-1) for n, t in named.items()}


def read_values(model: nn.Module, blocks: list[Block]) -> dict[int, torch.Tensor]:
    """Views of the model's current values, one per block (no copy; a sparse table's
    rows in their stored order: a copy)."""
    flat = _flat(model)
    named = dict(model.named_parameters())
    return {b.key: gather_rows(named[b.name], b) if b.kind == "rows" else flat[b.name][b.start:b.stop]
            for b in blocks}


def write_values(model: nn.Module, blocks: list[Block], values: dict[int, torch.Tensor],
                 partial: bool = False) -> None:
    """Copy block values into the model in place; with `partial` a block without a value
    keeps its own (a worker's pull that reached a block's old owner after a hand-over),
    else it is a KeyError."""
    flat = _flat(model)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for b in blocks:
            if not partial or b.key in values:
                if b.kind == "rows":
                    scatter_rows(named[b.name], b, values[b.key])
                else:
                    flat[b.name][b.start:b.stop].copy_(values[b.key])


def read_pushes(model: nn.Module, blocks: list[Block]) -> dict[int, torch.Tensor]:
    """What a worker pushes for each block: the gradient of a parameter block, the current
    value of a buffer block (views, no copy)."""
    params = dict(model.named_parameters())
    buffers = {n: b.detach().view(-1) for n, b in model.named_buffers()}
    out: dict[int, torch.Tensor] = {}
    for b in blocks:
        if b.kind == "rows":  # a sparse table's gradient is the worker's table client's (sparse/remote.py)
            continue
        if b.kind == "param":
            grad = params[b.name].grad
            if grad is None:
                grad = torch.zeros_like(params[b.name])
            out[b.key] = grad.view(-1)[b.start:b.stop]
        else:
            out[b.key] = buffers[b.name][b.start:b.stop]
    return out
