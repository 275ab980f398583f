"""Sparse embedding tables: which of a model's tensors are tables, how their rows are
laid out in blocks, and where the blocks go.

A table is the weight of a ``torch.nn.Embedding`` or ``torch.nn.EmbeddingBag`` built
with ``sparse=True`` (PyTorch's own mark of a sparse gradient). Its rows are held by the
servers and never whole by a worker: a worker pulls only the rows its batch touches and
pushes only their gradients (sparse/remote.py).

Layout. Row ``r`` of a table of ``R`` rows sits at position ``p(r) = (a·r + c) mod R``
of the table's *stored order* (``a`` coprime with ``R``: a bijection), and the stored
order is cut into blocks of whole rows (``table_blocks``), the table's shards. The
multiplicative hash spreads neighbouring ids — under a Zipf-like law the hot ones are the
low ids — over every shard, while each shard stays one dense range of rows: a shard is a
block like any other, placed, moved, checkpointed and replicated by the machinery of
blocks, and each server's measured load is that of the rows it serves.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from ..policy.placement import Block, _lpt, placement_blocks

__all__ = ["Table", "sparse_tables", "untouched_tables", "row_order", "stored_positions", "table_blocks", "place_with_tables",
           "TableError", "gather_rows", "scatter_rows", "tables_summary"]

_GOLDEN = 0.6180339887498949


class TableError(ValueError):
    """A sparse table the servers cannot hold as written; the text names the module."""


@dataclass(frozen=True)
class Table:
    """One sparse table: the module's path, its weight's parameter name, rows × dim."""
    module: str
    param: str
    rows: int
    dim: int
    padding_idx: int | None
    bag: bool = False
    mode: str = "sum"  # EmbeddingBag's reduction
    include_last_offset: bool = False  # EmbeddingBag's


def sparse_tables(model: nn.Module) -> dict[str, Table]:
    """The model's sparse tables by weight name, in module order; TableError for one
    the servers cannot honour (``max_norm``: torch renormalises the looked-up rows in
    place, on the worker's copy)."""
    out: dict[str, Table] = {}
    paths: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(name)
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    for name, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse:
            if not name:
                raise TableError("the model itself is a sparse table: wrap it in a module of its own")
            if len(paths[id(m)]) > 1 or len(owners[id(m.weight)]) > 1:
                shared = sorted(set(paths[id(m)][1:] + owners[id(m.weight)][1:]))
                raise TableError(f"{name or 'model'}: a sparse table shared with {shared[0]} (a tied weight); "
                                 f"a table on the servers cannot be shared yet")
            if m.max_norm is not None:
                raise TableError(f"{name or 'model'}: {type(m).__name__}(max_norm={m.max_norm}) renormalises "
                                 f"rows in place; sparse tables on the servers cannot (drop max_norm)")
            if m.scale_grad_by_freq:
                raise TableError(f"{name or 'model'}: scale_grad_by_freq is not supported for sparse tables")
            param = f"{name}.weight" if name else "weight"
            out[param] = Table(name, param, int(m.weight.shape[0]), int(m.weight.shape[1]), m.padding_idx,
                               isinstance(m, nn.EmbeddingBag), getattr(m, "mode", "sum"),
                               bool(getattr(m, "include_last_offset", False)))
    return out


_untouched = threading.local()  # this thread builds a worker's model: its sparse tables on "meta"
_patch_lock = threading.Lock()
_patched: dict[type, tuple] = {}  # class -> (its own __init__, threads inside)


@contextlib.contextmanager
def untouched_tables():
    """Within it, on this thread, a ``sparse=True`` Embedding or EmbeddingBag puts its
    weight on the "meta" device: no memory, and an initialisation of it (the module's or
    the user's own ``nn.init`` call) does nothing, so a 10⁷-row table costs a worker
    neither 1.3 GB nor the seconds of writing it. For a worker's model only, whose
    tables RemoteTables.install replaces (sparse/remote.py) before it is moved to its
    device or run; its dense tensors are built as written (the servers' values replace
    them at the first pull). Other threads build models as usual meanwhile (the threads
    launcher runs workers beside the coordinator)."""
    with _patch_lock:
        for cls in (nn.Embedding, nn.EmbeddingBag):
            if cls not in _patched:
                _patched[cls] = (cls.__dict__["__init__"], 0)
                cls.__init__ = _on_meta(cls.__dict__["__init__"])
            own, inside = _patched[cls]
            _patched[cls] = (own, inside + 1)
    before = getattr(_untouched, "on", False)
    _untouched.on = True
    try:
        yield
    finally:
        _untouched.on = before
        with _patch_lock:
            for cls in (nn.Embedding, nn.EmbeddingBag):
                own, inside = _patched[cls]
                if inside > 1:
                    _patched[cls] = (own, inside - 1)
                else:
                    cls.__init__ = own
                    del _patched[cls]


def _on_meta(own):
    signature = inspect.signature(own)

    @functools.wraps(own)
    def __init__(self, *args, **kwargs):
        if getattr(_untouched, "on", False):
            bound = signature.bind(self, *args, **kwargs)
            if bound.arguments.get("sparse") and bound.arguments.get("_weight") is None:
                bound.arguments["device"] = "meta"
                return own(*bound.args, **bound.kwargs)
        return own(self, *args, **kwargs)
    return __init__


def row_order(rows: int) -> tuple[int, int]:
    """(a, c) of the table's stored order p(r) = (a·r + c) mod rows: a the first integer
    from the golden ratio of ``rows`` up that is coprime with it."""
    if rows <= 1:
        return 1, 0
    a = max(1, int(rows * _GOLDEN))
    while math.gcd(a, rows) != 1:
        a += 1
    return a, rows // 3


def stored_positions(ids: torch.Tensor, rows: int) -> torch.Tensor:
    """Where ids (int64, in [0, rows)) sit in the table's stored order."""
    a, c = row_order(rows)
    return (ids * a + c) % rows  # a·id < 2^63 for any table under 2^31 rows


@functools.lru_cache(maxsize=8)
def _inverse(rows: int) -> torch.Tensor:
    """The id at each stored position (kept for the last few tables asked)."""
    ids = torch.arange(rows, dtype=torch.int64)
    inv = torch.empty_like(ids)
    inv[stored_positions(ids, rows)] = ids
    return inv


def gather_rows(weight: torch.Tensor, block: Block) -> torch.Tensor:
    """Block ``block`` of a table's stored order, from the model's ``weight`` (rows ×
    dim, ids in natural order), flat: a copy."""
    lo, hi = block.start // block.width, block.stop // block.width
    ids = _inverse(weight.shape[0])[lo:hi]
    return weight.detach()[ids].reshape(-1)


def scatter_rows(weight: torch.Tensor, block: Block, value: torch.Tensor) -> None:
    """Write block ``block`` (flat, stored order) back into the model's ``weight``."""
    lo, hi = block.start // block.width, block.stop // block.width
    ids = _inverse(weight.shape[0])[lo:hi]
    with torch.no_grad():
        weight[ids] = value.view(-1, block.width).to(weight.dtype)


SHARDS_PER_SERVER = 2  # a table is cut into at least this many shards per server (fewer rows: one each)


def table_blocks(tensors: Sequence[tuple[str, int, str, int]], widths: Mapping[str, int], block_size: int,
                 first: int = 0, servers: int = 1) -> list[Block]:
    """Tables (kind "rows") cut into blocks of whole rows — at most ``block_size``
    elements where a row fits, and at least SHARDS_PER_SERVER × ``servers`` blocks where
    the table has the rows: shards fine enough to balance and to move —; keys from
    ``first``."""
    blocks: list[Block] = []
    for name, numel, kind, itemsize in tensors:
        width = int(widths[name])
        rows = numel // width
        per = min(max(1, block_size // width), max(1, -(-rows // (SHARDS_PER_SERVER * max(1, servers)))))
        step = per * width
        for start in range(0, max(numel, 1), step):
            blocks.append(Block(first + len(blocks), name, start, min(numel, start + step), kind, itemsize, width))
    return blocks


def place_with_tables(policy: str, tensors: Sequence[tuple[str, int, str, int]], servers: int, block_size: int,
                      rates: Sequence[float] | None = None, widths: Mapping[str, int] | None = None,
                      ) -> tuple[list[Block], list[int]]:
    """``placement_blocks`` for the dense tensors, then each table's blocks after them:
    under ``round_robin`` shard i on server i mod ``servers`` (rows hashed to servers,
    as PERSIA and Monolith place them); otherwise each onto the server that finishes
    first by bytes given what it holds, over ``rates`` for the oracle (which knows the
    servers' speeds) and equal rates for every other policy. A shard is placed by size:
    nothing is measured yet; PSLD moves it by its measured load later."""
    from ..policy.block_size import resolve_block_size

    dense = [t for t in tensors if t[2] != "rows"]
    tables = [t for t in tensors if t[2] == "rows"]
    size = resolve_block_size(block_size, tensors, servers)  # sized over every tensor, as model_blocks does
    blocks, owner = placement_blocks(policy, dense, servers, size, rates)
    if not tables:
        return blocks, owner
    shards = table_blocks(tables, widths or {}, size, len(blocks), servers)
    loads = [0] * servers
    for b, j in zip(blocks, owner):
        loads[j] += b.nbytes
    out = list(owner) + [i % servers for i in range(len(shards))]
    if policy != "round_robin":
        for i, j in _lpt([b.nbytes for b in shards], range(len(shards)), loads,
                         list(rates) if rates is not None and policy == "oracle" else [1.0] * servers):
            out[len(blocks) + i] = j
    return blocks + shards, out


def tables_summary(blocks: Sequence[Block]) -> dict[str, dict]:
    """summary.json's `sparse_tables`: per table, its rows, dim, shards (blocks) and bytes."""
    out: dict[str, dict] = {}
    for b in blocks:
        if b.kind == "rows":
            t = out.setdefault(b.name, {"rows": 0, "dim": b.width, "shards": 0, "bytes": 0})
            t["rows"] += b.rows
            t["shards"] += 1
            t["bytes"] += b.nbytes
    return out
