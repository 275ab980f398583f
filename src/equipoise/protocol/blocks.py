"""Moving a model's tensors in and out of parameter blocks."""

from __future__ import annotations

import torch
from torch import nn

from ..policy.block_size import resolve_block_size
from ..policy.placement import Block, make_blocks


def model_tensors(model: nn.Module) -> list[tuple[str, int, str, int]]:
    """(name, numel, kind, itemsize) of the model's parameters (stepped by the
    optimizer), then of its persistent floating point buffers such as BatchNorm running
    statistics (averaged by sample count), in creation order. A non-persistent buffer
    (`register_buffer(..., persistent=False)`: a causal mask, a cache) is a constant of
    the model's code, the same in every process: it is never sent."""
    tensors = [(n, p.numel(), "param", p.element_size()) for n, p in model.named_parameters()]
    tensors += [(n, b.numel(), "buffer", b.element_size())
                for n, b in model.named_buffers() if b.is_floating_point() and _persistent(model, n)]
    return tensors


def _persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in module._non_persistent_buffers_set


def model_blocks(model: nn.Module, block_size: int, servers: int = 0) -> list[Block]:
    """The model's tensors cut into blocks of at most `block_size` elements (0: the
    size `auto_block_size` gives for `servers` servers, which must then be given)."""
    tensors = model_tensors(model)
    return make_blocks(tensors, resolve_block_size(block_size, tensors, servers))


def _flat(model: nn.Module) -> dict[str, torch.Tensor]:
    named = dict(model.named_parameters())
    named.update(model.named_buffers())
    return {n: t.detach().view(-1) for n, t in named.items()}


def read_values(model: nn.Module, blocks: list[Block]) -> dict[int, torch.Tensor]:
    """Views of the model's current values, one per block (no copy)."""
    flat = _flat(model)
    return {b.key: flat[b.name][b.start:b.stop] for b in blocks}


def write_values(model: nn.Module, blocks: list[Block], values: dict[int, torch.Tensor],
                 partial: bool = False) -> None:
    """Copy block values into the model in place; with `partial` a block without a value
    keeps its own (a worker's pull that reached a block's old owner after a hand-over),
    else it is a KeyError."""
    flat = _flat(model)
    with torch.no_grad():
        for b in blocks:
            if not partial or b.key in values:
                flat[b.name][b.start:b.stop].copy_(values[b.key])


def read_pushes(model: nn.Module, blocks: list[Block]) -> dict[int, torch.Tensor]:
    """What a worker pushes for each block: the gradient of a parameter block, the current
    value of a buffer block (views, no copy)."""
    params = dict(model.named_parameters())
    buffers = {n: b.detach().view(-1) for n, b in model.named_buffers()}
    out: dict[int, torch.Tensor] = {}
    for b in blocks:
        if b.kind == "param":
            grad = params[b.name].grad
            if grad is None:
                grad = torch.zeros_like(params[b.name])
            out[b.key] = grad.view(-1)[b.start:b.stop]
        else:
            out[b.key] = buffers[b.name][b.start:b.stop]
    return out
