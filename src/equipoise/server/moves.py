"""The server's handlers for blocks that move between servers (PSLD, elastic servers):
the measurements PSLD reads, the hand-over of blocks with their optimizer state (at a
barrier, or fenced without one), their adoption by another server, and the forwarding of
gradients that still reach a block's old owner. A mixin of `Server` (server/core.py):
the same state, one responsibility per file."""

from __future__ import annotations

from ..policy.placement import Block
from ..policy.sync import SyncFault
from ..wire import Message
from ..wire.names import grads_of, pack, states_for, states_of, value_name, values_of
from .store import ParameterStore, Push, PushError


class BlockMoves:
    def _on_stats_req(self, peer: bytes, msg: Message) -> None:
        """Busy seconds and bytes handled since the last request (PSLD's measurements)."""
        nbytes = sum(b.nbytes for b in self.store.blocks.values())
        self.listener.send(peer, Message("stats", {"busy_s": self.busy_s, "bytes": self.bytes,
                                                   "load_bytes": nbytes, "blocks": len(self.store.blocks)}))
        self.busy_s, self.bytes = 0.0, 0

    def _on_migrate(self, peer: bytes, msg: Message) -> None:
        """Hand blocks, with their optimizer state, to the server at `to`. Only at a
        barrier (nothing pending), so no update is lost or applied twice. The bytes pass
        this server's emulated link, then the receiver's (store and forward: a move
        takes the sum of the two link times)."""
        keys = [int(k) for k in msg.fields["keys"]]
        store = self.store
        missing = [k for k in keys if k not in store.blocks]
        if missing:
            raise KeyError(f"server {self.rank} does not hold blocks {missing}")
        if self.sync.policy.barrier() and (not self.sync.can_migrate() or self.held):
            raise PushError(f"server {self.rank}: cannot migrate with {self.sync.unapplied} pushes pending "
                            f"and {len(self.held)} pulls held (not at a barrier)")
        if not self.sync.policy.barrier():
            # The fence: what this server holds for the blocks is applied now (a softsync
            # group half-filled is applied as it stands, as at the end of a run); pushes
            # arriving after this message are forwarded (`_on_push`).
            update = self.sync.flush()
            if update is not None:
                self._apply(update)
            store = self.store
        t0 = self.clock.now()
        moved = set(keys)
        tensors = pack(values={k: store.values[k] for k in keys}, states=states_for(store.optim_state(), moved))
        nbytes = _nbytes(tensors.values())
        self._charge(nbytes, t0)  # out through this server's emulated link, as a pull's reply is
        conn = self.transport.connect(str(msg.fields["to"]))
        try:
            conn.send(Message("adopt", {"blocks": [store.blocks[k].to_list() for k in keys],
                                        "version": store.version, "samples": store.samples,
                                        "block_gradients": [[k, self.block_grads.get(k, 0)] for k in keys],
                                        "clocks": self.sync.clock_state()}, tensors))
            reply = conn.recv(timeout=self.timeout)
        except TimeoutError:
            raise PushError(f"server {self.rank}: {msg.fields['to']} did not take the blocks within "
                            f"{self.timeout:.0f} s") from None
        finally:
            conn.close()
        if reply.type != "ack":
            raise PushError(f"server {self.rank}: {msg.fields['to']} refused the blocks: "
                            f"{reply.fields.get('message', reply.type)}")
        self._rebuild([b for k, b in store.blocks.items() if k not in moved], {}, {})
        for k in keys:
            self.block_grads.pop(k, None)
            self.applied_at.pop(k, None)  # its next owner knows when it next updates it
            if not self.sync.policy.barrier():
                self.handover.handed(k, str(msg.fields["to"]), tensors[value_name(k)])
        self._release()  # pulls held here no longer wait for the blocks that left
        self.listener.send(peer, Message("ack", {"version": self.sync.published(), "bytes": nbytes,
                                                 "seconds": self.clock.now() - t0}))

    def _on_adopt(self, peer: bytes, msg: Message) -> None:
        """Take over blocks from another server, values and optimizer state; the bytes
        come in through this server's emulated link, as a push does."""
        t0 = self.clock.now()
        f = msg.fields
        store = self.store
        barrier = self.sync.policy.barrier()
        # Everything parsed and checked before anything changes: a bad adopt changes nothing.
        blocks = [Block.from_list(r) for r in f["blocks"]]
        clash = [b.key for b in blocks if b.key in store.blocks]
        if clash:
            raise KeyError(f"server {self.rank} already holds blocks {clash}")
        sent = values_of(msg.tensors)
        values = {b.key: sent[b.key] for b in blocks}
        counts = {int(k): int(n) for k, n in f.get("block_gradients", [])}
        version, samples = int(f["version"]), int(f["samples"])
        if not store.blocks:  # an empty server saw no updates: it joins the sender's version (and clocks)
            self.sync.join(version, None if barrier else f.get("clocks"))
            store.version, store.samples = version, samples
        if barrier and (version != store.version or samples != store.samples):
            raise PushError(f"server {self.rank} at version {store.version} cannot adopt blocks of "
                            f"version {f['version']}")
        # Without a barrier each server is at its own moment: the blocks join this one's stream.
        self._rebuild(list(store.blocks.values()) + blocks, values, states_of(msg.tensors))
        for b in blocks:
            self.block_grads[b.key] = counts.get(b.key, 0)
            self.handover.adopted(b.key)
        self._charge(_nbytes(msg.tensors.values()), t0)
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))

    def _rebuild(self, blocks: list[Block], extra_values: dict, extra_state: dict) -> None:
        """A new store over `blocks`: kept blocks carry their values and optimizer state,
        adopted ones come in `extra_*`. Elementwise optimizers step a block the same on
        any server, so the numbers do not change."""
        old = self.store
        values = {**old.values, **extra_values}
        state = states_for({**old.optim_state(), **extra_state}, [b.key for b in blocks])
        self.store = ParameterStore(sorted(blocks, key=lambda b: b.key), {b.key: values[b.key] for b in blocks},
                                    old.spec, old.policy, version=old.version, samples=old.samples,
                                    optim_state=state)


    # -- hand-over without a barrier ---------------------------------------------------
    def _count(self, group: list[Push]) -> None:
        """Each block's gradients applied, counted (every gradient once: the test of a hand-over)."""
        grads = self.block_grads
        for p in group:
            for k in p.tensors:
                if k in grads:
                    grads[k] += 1

    def _forward(self, push: Push, away: dict, step: int | None) -> None:
        """Send handed-over blocks' gradients on, with their delay in samples: this
        server's count against the stamp the worker read."""
        delay = None if push.read is None else max(0, self.store.samples - push.read)
        self.handover.send(push, away, step, delay, self.epoch)

    def _on_forward(self, peer: bytes, msg: Message) -> None:
        """A block's gradient that reached its old owner after the hand-over: applied
        here on its own (its share of the step: its samples against the global batch
        under async_scaling = "bsp"), or sent on if the block moved again. Under SSP the
        worker's step is counted on the clock unless its own push for this server's
        other blocks already was."""
        if self._stale(msg):
            return
        f = msg.fields
        count, delay, step = f.get("count"), f.get("delay"), f.get("step")
        for name, x in (("delay", delay), ("step", step)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 0):
                raise PushError(f"forward of worker {f['worker']}: {name} = {x!r} is not a count ≥ 0")
        if count is not None and (isinstance(count, bool) or not isinstance(count, (int, float))):
            raise PushError(f"forward of worker {f['worker']}: count = {count!r} is not a number")
        if not msg.tensors:
            raise PushError(f"forward of worker {f['worker']} carries no gradient")
        if int(f["worker"]) in self.sync.lost:
            raise SyncFault(f"forward of worker {f['worker']}, which was declared lost")
        store = self.store
        push = Push(int(f["worker"]), store.version, int(f["samples"]), grads_of(msg.tensors),
                    -1, None if count is None else float(count),
                    None if delay is None else max(0, store.samples - delay))
        away = self.handover.split(push, store.blocks)
        if push.tensors or not away:
            store.check(push, partial=True)
        if away:
            self.handover.check(push.worker, away, self.sync.lost)
        if push.tensors:
            store.apply([push], [0], forwarded=True)
            self._count([push])
            self.applied_at.update(dict.fromkeys(push.tensors, self.clock.now()))
        if away:
            self._forward(push, away, step)
        self.sync.forwarded(push.worker, step)
        self._release()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


__all__ = ["BlockMoves"]
