"""Names of the tensors a message carries: one codec for every role.

A message's tensors are named by what they are and which block they belong to:

* ``b<key>`` — the value of block ``key`` (init, params, state, adopt, checkpoints);
* ``g<key>`` — a worker's gradient (or buffer value) for block ``key`` (push);
* ``s<key>.<slot>`` — optimizer state ``slot`` (e.g. ``momentum_buffer``, ``exp_avg``)
  of block ``key``;
* ``i<key>`` — rows of a sparse table's block ``key`` (int64, within the block): the
  rows a push's ``g<key>`` holds the gradient of, or the rows a ``rows_req`` asks for;
* ``r<key>`` — those rows' values (rows × width), a ``rows`` reply.

Optimizer state travels inside the runtime as a flat mapping ``"<key>.<slot>" → tensor``
(what ``ParameterStore.optim_state`` returns); `state_block` reads the key back.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

__all__ = ["value_name", "grad_name", "row_name", "state_name", "state_block", "pack", "values_of", "grads_of",
           "rows_of", "row_values_of", "states_of", "states_for"]


def value_name(key: int) -> str:
    return f"b{key}"


def grad_name(key: int) -> str:
    return f"g{key}"


def row_name(key: int) -> str:
    return f"i{key}"


def row_values_of(tensors: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """A rows reply's values by block key (``r<key>`` tensors)."""
    return _keyed(tensors, "r")


def rows_of(tensors: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Rows of sparse tables' blocks by key (``i<key>`` tensors)."""
    return _keyed(tensors, "i")


def state_name(flat: str) -> str:
    """The tensor name of optimizer state ``"<key>.<slot>"``."""
    return f"s{flat}"


def state_block(flat: str) -> int:
    """The block key of optimizer state ``"<key>.<slot>"``; ValueError if malformed."""
    key, sep, slot = flat.partition(".")
    if not sep or not slot or not key.isdigit():
        raise ValueError(f"optimizer state name {flat!r} is not '<block>.<slot>'")
    return int(key)


def pack(values: Mapping[int, torch.Tensor] | None = None, grads: Mapping[int, torch.Tensor] | None = None,
         states: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a message: block values, gradients and optimizer state, named."""
    out: dict[str, torch.Tensor] = {}
    for k, t in (values or {}).items():
        out[value_name(k)] = t
    for k, t in (grads or {}).items():
        out[grad_name(k)] = t
    for n, t in (states or {}).items():
        out[state_name(n)] = t
    return out


def _keyed(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[int, torch.Tensor]:
    return {int(n[1:]): t for n, t in tensors.items() if n[:1] == prefix and n[1:].isdigit()}


def values_of(tensors: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Block values by key (``b<key>`` tensors); other names are ignored."""
    return _keyed(tensors, "b")


def grads_of(tensors: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Gradients by block key (``g<key>`` tensors); other names are ignored."""
    return _keyed(tensors, "g")


def states_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Optimizer state as ``"<key>.<slot>" → tensor``; ValueError on a malformed name."""
    out = {}
    for n, t in tensors.items():
        if n[:1] == "s":
            state_block(n[1:])
            out[n[1:]] = t
    return out


def states_for(states: Mapping[str, torch.Tensor], keys: Iterable[int]) -> dict[str, torch.Tensor]:
    """The optimizer state of blocks `keys` only."""
    wanted = set(keys)
    return {n: t for n, t in states.items() if state_block(n) in wanted}
