"""A server's side of a block hand-over without a barrier (asp, softsync, ssp): the
blocks it handed to other servers, and the forwarding of the gradients of those blocks
that still reach it from workers routing by an older table (docs/psld.md, "Without a
barrier"). The server fences a block and hands it over (`BlockMoves.on_migrate`); from then
on `Forwarding` takes such gradients out of a push (`split`), checks them (`check`) and
sends them on to the block's new owner (`send`), which applies them on their own
(`BlockMoves.on_forward`).
"""

from __future__ import annotations

import logging
import math

import torch

from ..policy.placement import Block
from ..policy.sync import SyncFault
from ..sparse.step import check_rows
from ..wire import Message, Transport
from ..wire.names import grad_name, pack_parts
from .store import Push, PushError

log = logging.getLogger("equipoise.server")


class Forwarding:
    """The blocks server `rank` handed over: key → the new owner's address, and the
    size and dtype each left with."""

    def __init__(self, rank: int, transport: Transport):
        self.rank, self.transport = rank, transport
        self.moved: dict[int, str] = {}
        self.shape: dict[int, tuple[int, str]] = {}
        self.tables: dict[int, Block] = {}  # the blocks of tables among them (gradients of rows)
        self.sent = 0  # forward messages sent (one per new owner and hop)
        self._conns: dict[str, object] = {}

    def handed(self, key: int, to: str, value: torch.Tensor, table: Block | None = None) -> None:
        """Block `key` (its value as it left; `table`: the block, if a table's) now lives
        at `to`."""
        self.moved[key] = to
        self.shape[key] = (int(value.numel()), str(value.dtype))
        if table is not None:
            self.tables[key] = table
        else:
            self.tables.pop(key, None)

    def adopted(self, key: int) -> None:
        """Block `key` is ours again: nothing of it is forwarded any more."""
        self.moved.pop(key, None)
        self.shape.pop(key, None)
        self.tables.pop(key, None)

    def split(self, push: Push, held) -> dict[int, torch.Tensor]:
        """Take out of `push` the gradients of blocks handed over and not `held` again;
        a block neither held nor handed over stays in, for the store's check to refuse."""
        away = {k: push.tensors[k] for k in push.tensors if k in self.moved and k not in held}
        for k in away:
            del push.tensors[k]
        return away

    def check(self, worker: int, away: dict, lost, rows: dict | None = None) -> None:
        """What a gradient to forward must be, checked before anything of its push is
        applied, so that a refusal reaches its sender: a worker not declared lost (in
        `lost`), each block's size and dtype as it left (a table's block: its `rows`,
        checked as the store checks them, a row's width each), finite."""
        if worker in lost:
            raise SyncFault(f"push from worker {worker}, which was declared lost")
        for key, t in away.items():
            numel, dtype = self.shape[key]
            if key in self.tables:
                r = (rows or {}).get(key)
                if r is None:
                    raise PushError(f"push from worker {worker}: block {key} of a table comes without its rows")
                try:
                    check_rows(self.tables[key], r, f"push from worker {worker}")
                except ValueError as exc:
                    raise PushError(str(exc)) from None
                numel = r.numel() * self.tables[key].width
            if t.dim() != 1 or t.numel() != numel or str(t.dtype) != dtype:
                raise PushError(f"push from worker {worker}: block {key} has shape {tuple(t.shape)} {t.dtype}, "
                                f"expected ({numel},) {dtype}")
            if not math.isfinite(float(t.sum())):
                raise PushError(f"push from worker {worker}: block {key} holds a non-finite gradient (NaN or inf)")

    def send(self, push: Push, away: dict, step: int | None, delay: int | None, epoch: int,
             part: int = 0) -> None:
        """Send checked gradients to their blocks' new owners, with what their step needs
        there: the worker, its samples and units, its step (SSP's clock), the step's
        `part` (with the epoch and step, the push's id) and its delay in samples. A
        send that times out is logged: that gradient is lost (lost_updates)."""
        by_owner: dict[str, dict] = {}
        for key, t in away.items():
            by_owner.setdefault(self.moved[key], {})[key] = t
        for address, grads in by_owner.items():
            conn = self._conns.get(address)
            if conn is None:
                conn = self._conns[address] = self.transport.connect(address)
            self._drain(conn)
            try:
                conn.send(Message("forward", {"worker": push.worker, "samples": push.samples, "step": step,
                                              "epoch": epoch, "delay": delay, "part": part,
                                              **({} if push.count is None else {"count": push.count})},
                                  {**{grad_name(k): v for k, v in grads.items() if k not in push.rows},
                                   **pack_parts("G", {k: v for k, v in grads.items() if k in push.rows}),
                                   **pack_parts("I", {k: push.rows[k] for k in grads if k in push.rows})}))
                self.sent += 1
            except TimeoutError:
                log.warning("server %d: could not forward worker %d's gradient of blocks %s to %s in time: "
                            "lost", self.rank, push.worker, sorted(grads), address)

    def _drain(self, conn) -> None:
        """A new owner answers a forward only to refuse it: log what it said."""
        while True:
            try:
                reply = conn.recv(timeout=0)
            except TimeoutError:
                return
            log.warning("server %d: %s refused a forwarded gradient: %s", self.rank, conn.address,
                        reply.fields.get("message", reply.type))

    def reset(self) -> None:
        """A new init (a rollback): nothing handed over; connections closed."""
        self.moved, self.shape, self.tables = {}, {}, {}
        self.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns = {}


__all__ = ["Forwarding"]
