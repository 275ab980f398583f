"""A worker's side of sparse tables: the modules that fetch rows instead of holding them.

`RemoteTables.install` replaces each sparse ``Embedding``/``EmbeddingBag`` of a worker's
model by a `RemoteTable`, which holds no weight. When its forward runs it takes the
batch's ids, deduplicated, asks the servers holding them for those rows (at the version
the worker's last pull read) and looks the batch up in that small local matrix with
torch's own ``embedding``/``embedding_bag``; backward gives the local matrix's gradient,
which is the table's gradient on those rows and nowhere else. `gradients` hands the
step's rows and their gradients to the push, per block (one entry per block of every
table, empty where the batch touched none of its rows: under a barrier every push holds
every block of its server).

``padding_idx`` keeps torch's meaning: the row is looked up as it is on the servers, and
its gradient is not pushed (torch's sparse gradient leaves it out too).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..policy.placement import Block
from .tables import Table, sparse_tables, stored_positions

__all__ = ["RemoteTable", "RemoteTables", "IdError", "with_rows"]

Fetch = Callable[[dict[int, torch.Tensor]], dict[int, torch.Tensor]]


class IdError(ValueError):
    """An id outside its table; the text names the table and the id."""


class RemoteTable(nn.Module):
    """A sparse table whose rows live on the servers (see the module docstring)."""

    def __init__(self, table: Table, blocks: list[Block], fetch: Fetch):
        super().__init__()
        self.table = table
        self.blocks = sorted(blocks, key=lambda b: b.start)
        self.step_rows = self.blocks[0].rows
        self.fetch = fetch
        self.taken: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, local matrix) of each forward
        self.ready: tuple[torch.Tensor, torch.Tensor] | None = None  # rows fetched ahead: (ids sorted, values)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        t = self.table
        uniq, inverse = torch.unique(self._checked(input), sorted=True, return_inverse=True)
        local = self._local(uniq).requires_grad_(True)
        self.taken.append((uniq, local))
        pad = None
        if t.padding_idx is not None:
            at = torch.searchsorted(uniq, torch.tensor([t.padding_idx]))
            if int(at) < len(uniq) and int(uniq[at]) == t.padding_idx:
                pad = int(at)
        index = inverse.view(input.shape)
        if not t.bag:
            return F.embedding(index, local, padding_idx=pad)
        return F.embedding_bag(index, local, offsets, mode=t.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=t.include_last_offset, padding_idx=pad)

    def _checked(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` flat as int64; IdError naming the table for a non-integer id or one outside it."""
        t = self.table
        ids = ids.reshape(-1)
        if ids.dtype not in (torch.int64, torch.int32):
            raise IdError(f"table {t.module}: ids of dtype {ids.dtype}, not an integer type")
        ids = ids.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= t.rows):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IdError(f"table {t.module}: id {bad} outside [0, {t.rows})")
        return ids

    def _where(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each id's block index (into `blocks`) and its row within the block."""
        pos = stored_positions(ids, self.table.rows)
        which = torch.div(pos, self.step_rows, rounding_mode="floor")
        return which, pos - which * self.step_rows

    def _local(self, uniq: torch.Tensor) -> torch.Tensor:
        """The rows of `uniq` (sorted ids): from those fetched ahead where they all are
        (`prefetch`), else from the servers now."""
        if self.ready is not None:
            ids, values = self.ready
            at = torch.searchsorted(ids, uniq).clamp(max=max(0, len(ids) - 1))
            if len(ids) and bool((ids[at] == uniq).all()):
                return values[at]
        return self._fetch(uniq)

    def wanted(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The distinct ids of `ids` (sorted, checked) and the rows of each block they are."""
        uniq = torch.unique(self._checked(ids), sorted=True)
        which, row = self._where(uniq)
        return uniq, self._by_block(which, row)

    @staticmethod
    def _groups(which: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
        """The order that sorts `which` (each id's block index) by block, stably, and the
        blocks in it with how many ids each has."""
        order = torch.argsort(which, stable=True)
        blocks, counts = torch.unique_consecutive(which[order], return_counts=True)
        return order, blocks.tolist(), counts.tolist()

    def _by_block(self, which: torch.Tensor, row: torch.Tensor) -> dict[int, torch.Tensor]:
        """`row` split by block (`which`), each block's rows in their order in `row`."""
        order, blocks, counts = self._groups(which)
        return {self.blocks[i].key: r for i, r in zip(blocks, torch.split(row[order], counts))}

    def _fetch(self, ids: torch.Tensor, got: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """The rows of `ids` (sorted, distinct): asked for now, or taken from `got` (a
        fetch of several tables at once)."""
        which, row = self._where(ids)
        if got is None:
            got = self.fetch(self._by_block(which, row))
        order, blocks, counts = self._groups(which)
        parts = []
        for i, n in zip(blocks, counts):
            key = self.blocks[i].key
            rows = got.get(key)
            if rows is None or tuple(rows.shape) != (n, self.table.dim):
                raise IdError(f"table {self.table.module}: block {key} came back with "
                              f"{None if rows is None else tuple(rows.shape)}, not {n} rows")
            parts.append(rows)
        out = torch.empty(len(ids), self.table.dim)
        if parts:
            out[order] = torch.cat(parts).to(out.dtype)
        return out

    def gradients(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """This step's gradient on the rows it touched, per block it touched: (values
        flat, rows within the block); a block it did not touch is left out (a server
        steps it as torch steps a table with no gradient for those rows). The step's
        lookups are then forgotten."""
        t = self.table
        taken, self.taken = self.taken, []
        ids = [u for u, w in taken if w.grad is not None]
        grads = [w.grad for u, w in taken if w.grad is not None]
        if len(ids) > 1:  # the module ran more than once this step: a row's gradients add up
            every = torch.cat(ids)
            uniq, inverse = torch.unique(every, sorted=True, return_inverse=True)
            total = torch.zeros(len(uniq), t.dim).index_add_(0, inverse, torch.cat(grads))
            ids, grads = [uniq], [total]
        uniq = ids[0] if ids else torch.zeros(0, dtype=torch.int64)
        grad = grads[0] if grads else torch.zeros(0, t.dim)
        if t.padding_idx is not None:
            keep = uniq != t.padding_idx
            uniq, grad = uniq[keep], grad[keep]
        which, row = self._where(uniq)
        order, blocks, counts = self._groups(which)  # by block, each block's rows in id order
        values, rows = {}, {}
        for i, r, g in zip(blocks, torch.split(row[order], counts), torch.split(grad[order], counts)):
            rows[self.blocks[i].key] = r
            values[self.blocks[i].key] = g.reshape(-1)
        return values, rows

    def clear(self) -> None:
        self.taken, self.ready = [], None

    def extra_repr(self) -> str:
        return f"{self.table.rows}, {self.table.dim}, rows on the servers"


class RemoteTables:
    """Every sparse table of a worker's model, replaced by a `RemoteTable`."""

    def __init__(self, modules: list[RemoteTable]):
        self.modules = modules
        self.version: int | None = None  # the version the rows must be of: the worker's last pull's (None: any)
        self.counts = [0, 0]  # rows fetched, rows whose gradient was pushed, since `take_counts`

    @classmethod
    def install(cls, model: nn.Module, blocks: list[Block], fetch: Callable[[int, dict], dict]) -> "RemoteTables | None":
        """Replace the model's sparse tables (their weights freed); None if it has none.
        `fetch(version, wanted)` asks the servers for rows of `version` (None: any)."""
        tables = sparse_tables(model)
        if not tables:
            return None
        out = cls([])
        for param, t in tables.items():
            mine = [b for b in blocks if b.kind == "rows" and b.name == param]
            module = RemoteTable(t, mine, out._fetcher(fetch))
            parent, _, leaf = t.module.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module)
            out.modules.append(module)
        return out

    def _fetcher(self, fetch: Callable[[int, dict], dict]) -> Fetch:
        def fetched(wanted: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
            self.counts[0] += sum(len(r) for r in wanted.values())
            return fetch(self.version, wanted)
        return fetched

    def gradients(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        values, rows = {}, {}
        for m in self.modules:
            v, r = m.gradients()
            values.update(v)
            rows.update(r)
        self.counts[1] += sum(len(r) for r in rows.values())
        return values, rows

    def prefetch(self, ids: dict[str, torch.Tensor], fetch: Callable[[int, dict], dict]) -> None:
        """The rows of a step's batch for every table `ids` names (by module; the user's
        `sparse_ids(batch)`), in one request per server for all tables; a table's forward
        then looks up these rows without asking (ids it did not foresee are fetched then)."""
        asked, wanted = self.wanted(ids)
        self.put_ready(asked, fetch(self.version, wanted) if wanted else {})

    def wanted(self, ids: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
        """For `ids` (by module), each table's distinct ids and the rows to ask for, by block."""
        by_module = {m.table.module: m for m in self.modules}
        unknown = sorted(set(ids) - set(by_module))
        if unknown:
            raise IdError(f"sparse_ids names {unknown[:3]}, not sparse tables of the model ({sorted(by_module)})")
        asked, wanted = {}, {}
        for name, t in ids.items():
            uniq, rows = by_module[name].wanted(t)
            asked[name] = uniq
            wanted.update(rows)  # two tables never share a block
        return asked, wanted

    def put_ready(self, asked: dict[str, torch.Tensor], got: dict[int, torch.Tensor]) -> None:
        """The rows `got` (by block) of the ids `asked` (by module), ready for the forward."""
        self.counts[0] += sum(len(r) for r in got.values())
        by_module = {m.table.module: m for m in self.modules}
        for name, uniq in asked.items():
            m = by_module[name]
            m.ready = (uniq, m._fetch(uniq, got))

    def take_counts(self) -> dict[str, list[int]]:
        """A report's `rows`: [fetched, pushed] since the last call."""
        got, self.counts = self.counts, [0, 0]
        return {"rows": got}

    def clear(self) -> None:
        for m in self.modules:
            m.clear()


def with_rows(tables: RemoteTables | None, pushes: dict[int, torch.Tensor]
              ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor] | None]:
    """A push's tensors with the tables' gradients of this step added, and the rows they
    are of (None without tables)."""
    if tables is None:
        return pushes, None
    values, rows = tables.gradients()
    return {**pushes, **values}, rows
