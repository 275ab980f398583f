"""A server's part in sparse tables: the rows a worker asks for, and the sparse step.

A table's blocks ("rows" blocks, sparse/tables.py) are held like any other block; what
differs is the traffic. A worker asks for the rows its batch touches (``rows_req``,
rows within each block, ``I0``/``I0#``: wire/names.py ``pack_parts``), held like a pull
until the server is at the version asked, and answered with just those rows (``rows``,
``R0``). A pull's reply leaves the tables' blocks out. A push carries, for a table's
block, the gradient of the rows it names (``G0`` flat, ``I0``); the update sums the pushes'
rows weighted as dense gradients are (sparse/step.py ``sparse_sum``) into a sparse gradient,
stepped as torch's own sparse optimizers do (server/optimizers.py `make_rows_optimizer`): only the rows touched
move (SGD; Adagrad and Adam as ``torch.optim.Adagrad`` and ``torch.optim.SparseAdam``).
"""

from __future__ import annotations

from ..wire import Message
from ..wire.names import pack_parts, unpack_parts
from ..sparse.step import check_rows, rows_within
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
        wanted = unpack_parts(msg.tensors, "I")
        who = f"server {core.rank}: rows for worker {msg.fields['worker']}"
        # asked ahead (worker/rows.py RowsAhead): a block moved at a barrier since is missing, not an error
        moved, held, missing = {}, [], [] if msg.fields.get("ahead") is True else None
        for key, rows in list(wanted.items()):
            block = core.store.blocks.get(key)
            if block is None and key in core.handover.moved:  # handed over without a barrier:
                moved[key] = core.handover.moved[key]  # the worker asks its new owner
                del wanted[key]
                continue
            if block is None and missing is not None:
                missing.append(key)
                del wanted[key]
                continue
            if block is None or block.kind != "rows":
                raise ValueError(f"{who}: block {key} is not a table's block held here")
            if rows.numel() > block.rows:  # a worker asks for distinct rows: a reply is at most the block
                raise ValueError(f"{who}: {rows.numel()} rows of block {key}, which has {block.rows}")
            held.append(block)
        if not rows_within(held, [wanted[b.key] for b in held]):  # all at once; one is wrong: named
            for block in held:
                check_rows(block, wanted[block.key], who)
        core.hold(Held(peer, "rows", int(msg.fields["min_version"]), core.clock.now(), int(msg.fields["worker"]),
                       wanted=wanted, moved=moved, missing=missing))

    def reply(self, h: Held) -> None:
        core = self.core
        t0, store = core.clock.now(), core.store
        out, moved, missing = {}, dict(h.moved or {}), None if h.missing is None else list(h.missing)
        for key, rows in (h.wanted or {}).items():
            block = store.blocks.get(key)
            if block is None and key in core.handover.moved:  # left while the request was held
                moved[key] = core.handover.moved[key]
                continue
            if block is None and missing is not None:
                missing.append(key)
                continue
            if block is None:
                core.listener.send(h.peer, Message("error", {"message": f"server {core.rank}: block {key} left"}))
                return
            out[key] = store.values[key].view(-1, block.width).index_select(0, rows).view(-1)
        # the memory-gather bound: the rows served against the time their gather alone took
        core.rows_served += sum(h.wanted[k].numel() for k in out)
        core.gather_s += core.clock.now() - t0
        core.charge(per_block(out), t0)
        core.listener.send(h.peer, Message("rows", {"version": core.sync.published(),
                                                    **({"moved": sorted(moved.items())} if moved else {}),
                                                    **({"missing": sorted(missing)} if missing else {})},
                                           pack_parts("R", out)))
