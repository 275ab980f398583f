"""Names of the tensors a message carries: one codec for every role.

A message's tensors are named by what they are and which block they belong to:

* ``b<key>`` — the value of block ``key`` (init, params, state, adopt, checkpoints);
* ``g<key>`` — a worker's gradient (or buffer value) for block ``key`` (push);
* ``s<key>.<slot>`` — optimizer state ``slot`` (e.g. ``momentum_buffer``, ``exp_avg``)
  of block ``key``;
* ``I<j>``, ``G<j>``, ``R<j>`` with ``I<j>#`` ... — sparse tables' blocks, many in one
  tensor (``pack_parts``): the rows within each block (int64) a ``rows_req`` asks for or
  a push's gradient is of, that gradient (flat), a ``rows`` reply's values (flat). A
  batch touches rows of hundreds of a large table's blocks: one tensor each cost about
  7 µs apiece to encode and as much to decode, 5 ms a message for 300 blocks.

Optimizer state travels inside the runtime as a flat mapping ``"<key>.<slot>" → tensor``
(what ``ParameterStore.optim_state`` returns); `state_block` reads the key back.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

__all__ = ["value_name", "grad_name", "state_name", "state_block", "pack", "values_of", "grads_of",
           "pack_parts", "unpack_parts", "blocks_named", "states_of", "states_for"]


def value_name(key: int) -> str:
    return f"b{key}"


def grad_name(key: int) -> str:
    return f"g{key}"


def pack_parts(name: str, parts: Mapping[int, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of many blocks as a few: for each dtype among them (in order of first
    appearance, numbered j), ``<name><j>`` their flattened concatenation and
    ``<name><j>#`` an int64 [n, 2] of (block key, element count). Empty: nothing."""
    groups: dict[torch.dtype, list[tuple[int, torch.Tensor]]] = {}
    for k, t in parts.items():
        groups.setdefault(t.dtype, []).append((int(k), t.reshape(-1)))
    out: dict[str, torch.Tensor] = {}
    for j, items in enumerate(groups.values()):
        out[f"{name}{j}"] = torch.cat([t for _, t in items]) if len(items) > 1 else items[0][1]
        out[f"{name}{j}#"] = torch.tensor([[k, t.numel()] for k, t in items], dtype=torch.int64)
    return out


def blocks_named(tensors: Mapping[str, torch.Tensor]) -> list[int]:
    """The block keys a message's tensors carry: ``<letter><key>`` names, and the blocks
    ``pack_parts``'s indexes list (sorted, once each)."""
    keys: set[int] = set()
    for n, t in tensors.items():
        if n[:1].isupper():
            if n.endswith("#") and t.dim() == 2 and t.shape[1:] == (2,):
                keys.update(t[:, 0].tolist())
        elif n[1:].isdigit():
            keys.add(int(n[1:]))
    return sorted(keys)


def unpack_parts(tensors: Mapping[str, torch.Tensor], name: str) -> dict[int, torch.Tensor]:
    """``pack_parts``'s blocks back, by key (1-D views, no copy); ValueError, naming the
    tensor, if its index does not describe it (a malformed message)."""
    out: dict[int, torch.Tensor] = {}
    j = 0
    while f"{name}{j}" in tensors or f"{name}{j}#" in tensors:
        values, index = tensors.get(f"{name}{j}"), tensors.get(f"{name}{j}#")
        what = f"tensor {name}{j}"
        if values is None or index is None:
            raise ValueError(f"{what} comes without its index {name}{j}# (or the index without it)")
        if index.dtype != torch.int64 or index.dim() != 2 or index.shape[1] != 2 or values.dim() != 1:
            raise ValueError(f"{what}: {tuple(values.shape)} with an index of {tuple(index.shape)} {index.dtype}, "
                             "not 1-D values and an int64 [n, 2] of (block, count)")
        keys, counts = index[:, 0].tolist(), index[:, 1].tolist()
        if min(keys, default=0) < 0 or min(counts, default=0) < 0 or sum(counts) != values.numel():
            raise ValueError(f"{what}: its index names negative blocks or counts, or counts {sum(counts)} "
                             f"elements of {values.numel()}")
        for k, v in zip(keys, torch.split(values, counts)):
            if k in out:
                raise ValueError(f"{what}: block {k} twice")
            out[k] = v
        j += 1
    return out


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
