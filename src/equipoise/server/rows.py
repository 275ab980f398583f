"""A server's part in sparse tables: the rows a worker asks for, and the sparse step.

A table's blocks ("rows" blocks, sparse/tables.py) are held like any other block; what
differs is the traffic. A worker asks for the rows its batch touches (``rows_req``,
tensors ``i<key>``: rows within block ``key``), held like a pull until the server is at
the version asked, and answered with just those rows (``rows``, tensors ``r<key>``). A
pull's reply leaves the tables' blocks out. A push carries, for a table's block, the
gradient of the rows it names (``g<key>`` flat, ``i<key>``); the update sums the pushes'
rows weighted as dense gradients are (sparse/step.py ``sparse_sum``) into a sparse gradient, which
torch's own optimizers step (server/optimizers.py `make_rows_optimizer`): only the rows touched move (SGD,
Adagrad; Adam as ``torch.optim.SparseAdam``).
"""

from __future__ import annotations

import torch

from ..wire import Message
from ..wire.names import rows_of
from ..sparse.step import check_rows
from .parts import Core, Held, per_block

__all__ = ["RowsPart"]


class RowsPart:
    """The handlers of a server's tables (a part built around its core)."""

    def __init__(self, core: Core):
        self.core = core

    def on_rows_req(self, peer: bytes, msg: Message) -> None:
        """Rows of table blocks held here, once the server is at `min_version`."""
        core = self.core
        if core.is_stale(msg):
            return
        wanted = rows_of(msg.tensors)
        who = f"server {core.rank}: rows for worker {msg.fields['worker']}"
        for key, rows in wanted.items():
            block = core.store.blocks.get(key)
            if block is None or block.kind != "rows":
                raise ValueError(f"{who}: block {key} is not a table's block held here")
            check_rows(block, rows, who)
            if rows.numel() > block.rows:  # a worker asks for distinct rows: a reply is at most the block
                raise ValueError(f"{who}: {rows.numel()} rows of block {key}, which has {block.rows}")
        core.hold(Held(peer, "rows", int(msg.fields["min_version"]), core.clock.now(), int(msg.fields["worker"]),
                       wanted=wanted))

    def reply(self, h: Held) -> None:
        core = self.core
        t0, store = core.clock.now(), core.store
        out = {}
        for key, rows in (h.wanted or {}).items():
            block = store.blocks.get(key)
            if block is None:
                core.listener.send(h.peer, Message("error", {"message": f"server {core.rank}: block {key} left"}))
                return
            out[key] = store.values[key].view(-1, block.width).index_select(0, rows)
        # the memory-gather bound: the rows served against the time their gather alone took
        core.rows_served += sum(t.shape[0] for t in out.values())
        core.gather_s += core.clock.now() - t0
        core.charge(per_block(out), t0)
        core.listener.send(h.peer, Message("rows", {"version": core.sync.published()},
                                           {f"r{key}": t for key, t in out.items()}))
