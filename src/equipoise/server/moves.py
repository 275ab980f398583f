"""The server's handlers for blocks that move between servers (PSLD, elastic servers):
the measurements PSLD reads, the hand-over of blocks with their optimizer state (at a
barrier, or fenced without one), their adoption by another server, and the forwarding of
gradients that still reach a block's old owner. A part of the server, built around its
core (server/parts.py names what it uses)."""

from __future__ import annotations

from ..policy.placement import Block
from ..policy.sync import SyncFault
from ..protocol.fields import read_field
from ..wire import Message
from ..wire.names import grads_of, pack, states_for, states_of, unpack_parts, value_name, values_of
from .fragments import count_field
from .ledger import PushLedger, drop_taken
from .parts import Core, nbytes as _nbytes
from .store import ParameterStore, Push, PushError


class BlockMoves:
    """Moves of blocks in and out of one server, and the measurements that decide them."""

    def __init__(self, core: Core):
        self.core = core

    def on_stats_req(self, peer: bytes, msg: Message) -> None:
        """Busy seconds and bytes handled since the last request (PSLD's measurements)."""
        nbytes = sum(b.nbytes for b in self.core.store.blocks.values())
        self.core.listener.send(peer, Message("stats", {
            "busy_s": self.core.busy_s, "bytes": self.core.bytes, "load_bytes": nbytes,
            "blocks": len(self.core.store.blocks), "block_bytes": sorted(self.core.block_bytes.items()),
            "rows": self.core.rows_served, "gather_s": self.core.gather_s}))
        self.core.busy_s, self.core.bytes, self.core.block_bytes = 0.0, 0, {}
        self.core.rows_served, self.core.gather_s = 0, 0.0

    def on_probe(self, peer: bytes, msg: Message) -> None:
        """A probe of this server's rate (PSLD's ``probe_targets``): its tensors' bytes take
        the emulated slowdown and link a push's would, booked nowhere (the next stats hold
        only the job's exchanges); the reply carries nothing."""
        nbytes = sum(t.numel() * t.element_size() for t in msg.tensors.values())
        self.core.clock.sleep(self.core.emulated(nbytes))
        self.core.listener.send(peer, Message("pong", {}))

    def on_migrate(self, peer: bytes, msg: Message) -> None:
        """Hand blocks, with their optimizer state, to the server at `to`. Only at a
        barrier (nothing pending), so no update is lost or applied twice. The bytes pass
        this server's emulated link, then the receiver's (store and forward: a move
        takes the sum of the two link times)."""
        keys = [int(k) for k in msg.fields["keys"]]
        store = self.core.store
        missing = [k for k in keys if k not in store.blocks]
        if missing:
            raise KeyError(f"server {self.core.rank} does not hold blocks {missing}")
        if self.core.sync.policy.barrier() and (not self.core.sync.can_migrate() or self.core.held):
            raise PushError(f"server {self.core.rank}: cannot migrate with {self.core.sync.unapplied} pushes pending "
                            f"and {len(self.core.held)} pulls held (not at a barrier)")
        if not self.core.sync.policy.barrier():
            # The fence: what this server holds for the blocks is applied now (a softsync
            # group half-filled is applied as it stands, as at the end of a run); pushes
            # arriving after this message are forwarded (`_on_push`).
            update = self.core.sync.flush()
            if update is not None:
                self.core.apply(update)
            store = self.core.store
        t0 = self.core.clock.now()
        moved = set(keys)
        tensors = pack(values={k: store.values[k] for k in keys}, states=states_for(store.optim_state(), moved))
        nbytes = _nbytes(tensors.values())
        self.core.charge(nbytes, t0)  # out through this server's emulated link, as a pull's reply is
        conn = self.core.transport.connect(str(msg.fields["to"]))
        try:
            conn.send(Message("adopt", {"blocks": [store.blocks[k].to_list() for k in keys],
                                        "version": store.version, "samples": store.samples,
                                        "block_gradients": [[k, self.core.block_grads.get(k, 0)] for k in keys],
                                        "ledger": self.core.ledger.rows(keys),
                                        "clocks": self.core.sync.clock_state()}, tensors))
            reply = conn.recv(timeout=self.core.timeout)
        except TimeoutError:
            raise PushError(f"server {self.core.rank}: {msg.fields['to']} did not take the blocks within "
                            f"{self.core.timeout:.0f} s") from None
        finally:
            conn.close()
        if reply.type != "ack":
            raise PushError(f"server {self.core.rank}: {msg.fields['to']} refused the blocks: "
                            f"{reply.fields.get('message', reply.type)}")
        self.rebuild([b for k, b in store.blocks.items() if k not in moved], {}, {})
        self.core.ledger.drop(keys)
        for k in keys:
            self.core.block_grads.pop(k, None)
            self.core.applied_at.pop(k, None)  # its next owner knows when it next updates it
            if not self.core.sync.policy.barrier():
                b = store.blocks[k]
                self.core.handover.handed(k, str(msg.fields["to"]), tensors[value_name(k)],
                                          b if b.kind == "rows" else None)
        self.core.release()  # pulls held here no longer wait for the blocks that left
        self.core.listener.send(peer, Message("ack", {"version": self.core.sync.published(), "bytes": nbytes,
                                                 "seconds": self.core.clock.now() - t0}))

    def on_adopt(self, peer: bytes, msg: Message) -> None:
        """Take over blocks from another server, values and optimizer state; the bytes
        come in through this server's emulated link, as a push does."""
        t0 = self.core.clock.now()
        f = msg.fields
        store = self.core.store
        barrier = self.core.sync.policy.barrier()
        # Everything parsed and checked before anything changes: a bad adopt changes nothing.
        blocks = [Block.from_list(r) for r in f["blocks"]]
        clash = [b.key for b in blocks if b.key in store.blocks]
        if clash:
            raise KeyError(f"server {self.core.rank} already holds blocks {clash}")
        sent = values_of(msg.tensors)
        values = {b.key: sent[b.key] for b in blocks}
        counts = {int(k): int(n) for k, n in f.get("block_gradients", [])}
        version, samples = int(f["version"]), int(f["samples"])
        taken = PushLedger.parse(f.get("ledger", []), [b.key for b in blocks])  # checked before anything changes
        if not store.blocks:  # an empty server saw no updates: it joins the sender's version (and clocks)
            self.core.sync.join(version, None if barrier else f.get("clocks"))
            store.version, store.samples = version, samples
        if barrier and (version != store.version or samples != store.samples):
            raise PushError(f"server {self.core.rank} at version {store.version} cannot adopt blocks of "
                            f"version {f['version']}")
        # Without a barrier each server is at its own moment: the blocks join this one's stream.
        self.rebuild(list(store.blocks.values()) + blocks, values, states_of(msg.tensors))
        self.core.ledger.take(taken)
        for b in blocks:
            self.core.block_grads[b.key] = counts.get(b.key, 0)
            self.core.handover.adopted(b.key)
        self.core.charge(_nbytes(msg.tensors.values()), t0)
        self.core.listener.send(peer, Message("ack", {"version": self.core.sync.published()}))

    def rebuild(self, blocks: list[Block], extra_values: dict, extra_state: dict) -> None:
        """A new store over `blocks`: kept blocks carry their values and optimizer state,
        adopted ones come in `extra_*`. Elementwise optimizers step a block the same on
        any server, so the numbers do not change."""
        old = self.core.store
        values = {**old.values, **extra_values}
        state = states_for({**old.optim_state(), **extra_state}, [b.key for b in blocks])
        self.core.store = ParameterStore(sorted(blocks, key=lambda b: b.key), {b.key: values[b.key] for b in blocks},
                                    old.spec, old.policy, version=old.version, samples=old.samples,
                                    optim_state=state)


    # -- hand-over without a barrier ---------------------------------------------------
    def count(self, group: list[Push]) -> None:
        """Each block's gradients applied, counted (every gradient once: the test of a
        hand-over). A table's block counts the pushes whose batch touched its rows."""
        grads = self.core.block_grads
        for p in group:
            for k in p.tensors:
                if k in grads:
                    grads[k] += 1

    def forward(self, push: Push, away: dict, step: int | None, pid: tuple | None = None) -> None:
        """Send handed-over blocks' gradients on, with their delay in samples: this
        server's count against the stamp the worker read, and the push's id."""
        delay = None if push.read is None else max(0, self.core.store.samples - push.read)
        self.core.handover.send(push, away, step, delay, self.core.epoch, 0 if pid is None else pid[2])

    def on_forward(self, peer: bytes, msg: Message) -> None:
        """A block's gradient that reached its old owner after the hand-over: applied
        here on its own (its share of the step: its samples against the global batch
        under async_scaling = "bsp"), or sent on if the block moved again. Under SSP the
        worker's step is counted on the clock unless its own push for this server's
        other blocks already was."""
        if self.core.is_stale(msg):
            return
        f = msg.fields
        who = f"forward of worker {f['worker']}"
        count = read_field(f, "count", float, who=who, least=0)
        delay, step = read_field(f, "delay", int, who=who, least=0), read_field(f, "step", int, who=who, least=0)
        if not msg.tensors:
            raise PushError(f"forward of worker {f['worker']} carries no gradient")
        if int(f["worker"]) in self.core.sync.lost:
            raise SyncFault(f"forward of worker {f['worker']}, which was declared lost")
        store = self.core.store
        push = Push(int(f["worker"]), store.version, int(f["samples"]),
                    {**grads_of(msg.tensors), **unpack_parts(msg.tensors, "G")}, -1, count,
                    None if delay is None else max(0, store.samples - delay), rows=unpack_parts(msg.tensors, "I"))
        pid = None if step is None else (self.core.epoch, step, count_field(f, "part", 0))
        if drop_taken(self.core.ledger, push.worker, pid, push.tensors, "forward"):
            return  # every block of it taken already
        away = self.core.handover.split(push, store.blocks)
        if push.tensors or not away:
            store.check(push, partial=True)
        if away:
            self.core.handover.check(push.worker, away, self.core.sync.lost, push.rows)
        if push.tensors:
            store.apply([push], [0], forwarded=True)
            self.core.ledger.record(push.worker, pid, push.tensors)
            self.count([push])
            self.core.applied_at.update(dict.fromkeys(push.tensors, self.core.clock.now()))
        if away:
            self.forward(push, away, step, pid)
        self.core.sync.forwarded(push.worker, step)
        self.core.release()


__all__ = ["BlockMoves"]
