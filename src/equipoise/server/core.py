"""The parameter server's main loop.

A server binds one listener and answers everyone on it: the coordinator (init, state,
stop) and the workers (pull, push). Every synchronisation decision — whether a push is
accepted, which pushes form an update, σ of each gradient, the version published, whether
a pull may be answered — is asked of a `ServerSync`; the server keeps the sockets, the
`ParameterStore`, the held replies and the emulated slowdown. Replies to pulls and state
requests that ask for a version the server does not hold yet are deferred until an update
produces it. A bad message is answered with an error and logged; it never stops the server.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable, Mapping

from ..clock import SYSTEM, Clock
from ..policy.placement import Block
from ..policy.sync import ServerSync, SyncFault, Update, make_sync_policy
from ..wire import Message, PeerTimeout, Transport
from ..wire.bandwidth import TokenBucket
from ..wire.names import grads_of, pack, states_of, unpack_parts, values_of
from ..wire.transport import QuietLog, kind_of
from .ahead import AheadUpdates, split
from .fragments import FragmentPart, Fragments, count_field
from .handover import Forwarding
from .ledger import PushLedger, drop_taken
from .replica import BackupPart, Replication
from .moves import BlockMoves
from .parts import Held, per_block, remember_read
from .rows import RowsPart
from .origin import refusal
from ..protocol.fields import FieldError, read_field
from ..protocol.steps import StepTotals
from .clipping import NormWait
from .store import OptimizerSpec, ParameterStore, Prepared, Push, PushError

log = logging.getLogger("equipoise.server")

# Bounds on deferred replies, so that no sender can make a server hold requests without
# end: a worker has at most overlap + 1 pulls in flight and the coordinator one state
# request, so 16 per peer is ample; a request for a version more than MAX_AHEAD updates
# away is refused outright (a protocol asks for at most a few versions ahead).
MAX_HELD, MAX_HELD_PER_PEER, MAX_AHEAD = 4096, 16, 1 << 20
READS_KEPT = 3  # delay compensation: the reads of each worker whose weights are kept

class Server:
    """One server's message handling; `serve` runs it until told to stop. The core
    (this class: what server/parts.py's `Core` names) and its parts: `moves` (blocks
    in and out, PSLD's measurements), `ahead` (eager_update) and `streamed`
    (backward_push's fragments)."""

    def __init__(self, rank: int, transport: Transport, coordinator: str, *, host: str = "127.0.0.1",
                 timeout: float = 120.0, clock: Clock = SYSTEM):
        self.rank, self.timeout, self.clock = rank, timeout, clock
        self.transport = transport
        self.listener = transport.listen(host)
        self.coordinator = coordinator
        self.store: ParameterStore | None = None
        self.sync: ServerSync | None = None
        self.pushes: dict[int, Push] = {}  # the tensors of the pushes `sync` holds, by token
        self.held: list[Held] = []
        self.reads: dict[int, dict[int, dict]] = {}  # delay compensation: worker -> read stamp -> weights
        self.steps = StepTotals()  # async_scaling: how the updates stepped
        self.compensated = 0  # delay compensation: gradients corrected with the weights they read
        self.block_grads: dict[int, int] = {}  # gradients applied to each block held, in all (they move with it)
        # When each block's value was last computed (clock.now(); eager_update: the update
        # computed ahead, when it was): a pull's replies say it as `applied_s`.
        self.applied_at: dict[int, float] = {}
        self.early_at: dict[int, float] = {}
        self.handover = Forwarding(rank, transport)  # no barrier: blocks handed over, late gradients sent on
        self.fragments = Fragments()  # backward_push: the parts of each worker's push in progress
        self.ledger = PushLedger()  # the push ids each block took: a gradient applied once
        self.replication: Replication | None = None  # replication = 1: backup duties both ways
        self.epoch = 0  # the coordinator's rollbacks: worker requests of earlier ones are stale
        self.done = False
        # Server stragglers (PSLD): extra time (factor − 1)·bytes / rate, a bandwidth cap,
        # and the busy time and bytes handled since the coordinator last asked, on `clock`.
        self.factor, self.rate = 1.0, 1000e6
        self.bucket: TokenBucket | None = None
        self.busy_s, self.bytes, self.block_bytes, self.rows_served, self.gather_s = 0.0, 0, {}, 0, 0.0
        self.refusals = QuietLog(log)  # the first refusal of each kind per peer, then counts
        self.eager = False  # eager_update, set by the coordinator's init
        self.moves = BlockMoves(self)
        self.ahead = AheadUpdates(self)
        self.streamed = FragmentPart(self, self.ahead)
        self.backup = BackupPart(self)
        self.tables = RowsPart(self)
        # Every message type a server handles, and its handler (tests/unit/server/test_hardening.py
        # checks it against the wire schema and SENDERS).
        self.handlers: dict[str, Callable[[bytes, Message], None]] = {
            "ping": self._on_ping, "init": self._on_init, "stop": self._on_stop, "straggle": self._on_straggle,
            "flush": self._on_flush, "members": self._on_members, "lose": self._on_lose, "expect": self._on_expect,
            "norm_req": self._on_norm_req, "clip": self._on_clip, "pull": self._on_pull,
            "state_req": self._on_state_req, "push": self._on_push, "fragment": self.streamed.on_fragment,
            "replicate": self.backup.on_replicate, "replica": self.backup.on_replica,
            "replica_ack": self.backup.on_replica_ack, "replica_req": self.backup.on_replica_req, "stats_req": self.moves.on_stats_req, "probe": self.moves.on_probe, "migrate": self.moves.on_migrate, "rows_req": self.tables.on_rows_req,
            "adopt": self.moves.on_adopt, "forward": self.moves.on_forward}
        self.norms: NormWait | None = None  # clip_grad_norm: an update waiting for the global norm

    def serve(self) -> None:
        """Register with the coordinator, then handle messages until `stop`. Raises
        TimeoutError if nobody talks to this server for `timeout` seconds."""
        log.info("server %d listening on %s", self.rank, self.listener.address)
        # Kept open while serving: closing at once (linger 0) could drop the hello unsent.
        conn = self.transport.connect(self.coordinator)
        conn.send(Message("hello", {"role": "server", "rank": self.rank,
                                    "address": self.listener.address, "pid": os.getpid()}))
        try:
            self._loop()
        finally:
            if self.replication is not None:
                self.replication.close()
            self.handover.close()
            conn.close()
            self.listener.close()

    def _loop(self) -> None:
        last = time.monotonic()
        while not self.done:
            got = self.listener.recv(timeout=0.5)
            if got is None:
                if time.monotonic() - last > self.timeout:
                    raise TimeoutError(f"server {self.rank}: no message from the coordinator or any "
                                       f"worker for {self.timeout:.0f} s")
                continue
            last = time.monotonic()
            self.handle(*got)

    # -- dispatch ---------------------------------------------------------------------
    def handle(self, peer: bytes, msg: Message) -> None:
        refused = refusal(msg, peer.hex()) if msg.origin is not None else None
        if refused is not None:  # its role may not send it, or it claims another worker's rank
            kind, reply, logged = refused
            # Bounded like every refusal: a peer that reconnects has a fresh identity each time.
            self.refusals(peer, kind, "%s (further refusals of this peer not logged one by one)", logged)
            self.listener.send(peer, Message("error", {"message": f"server {self.rank} {reply}"}))
            return
        handler = self.handlers.get(msg.type)
        if handler is None:
            return self._refuse(peer, f"server {self.rank} does not accept {msg.type!r} messages")
        if self.store is None and msg.type not in ("init", "stop", "ping"):
            return self._refuse(peer, f"server {self.rank} is not initialised yet")
        try:
            handler(peer, msg)
        except (ValueError, KeyError, TypeError, IndexError, ArithmeticError, AttributeError, RuntimeError,
                PeerTimeout) as exc:
            # A bad message never stops a server: the sender gets the reason, we go on. (torch
            # raises RuntimeError on tensors no check foresaw; a peer a handler waits on may time out.)
            log.debug("handling %s failed", msg.type, exc_info=True)
            if isinstance(exc, SyncFault):
                self._refuse(peer, f"server {self.rank}: {exc}")
            else:
                plain = isinstance(exc, (PushError, FieldError))
                self._refuse(peer, str(exc) if plain else f"{type(exc).__name__}: {exc}")

    def _refuse(self, peer: bytes, reason: str) -> None:
        self.refusals(peer, kind_of(reason), "refused a message from %s: %s", peer.hex(), reason)
        self.listener.send(peer, Message("error", {"message": reason}))

    def _on_ping(self, peer: bytes, msg: Message) -> None:
        fields = ({"version": self.store.version, "samples": self.store.samples, "held": len(self.held)}
                  if self.store else {})
        self.listener.send(peer, Message("pong", fields))

    def _on_init(self, peer: bytes, msg: Message) -> None:
        f = msg.fields
        blocks = [Block.from_list(row) for row in f["blocks"]]
        sent = values_of(msg.tensors)
        values = {b.key: sent[b.key] for b in blocks}
        workers = int(f["workers"])
        policy = make_sync_policy(f["protocol"], softsync_n=int(f.get("softsync_n") or workers),
                                  staleness_bound=int(f.get("staleness_bound", 0)),
                                  lr_modulation=str(f.get("lr_modulation", "none")),
                                  async_scaling=str(f.get("async_scaling", "none")),
                                  delay_compensation=str(f.get("delay_compensation", "none")),
                                  dc_lambda=float(f.get("dc_lambda", 0.0)))
        store = ParameterStore(blocks, values, OptimizerSpec.from_dict(f["optimizer"]), policy,
                               version=f["version"], samples=f["samples"], optim_state=states_of(msg.tensors),
                               adopt=True)  # a received tensor is the receiver's own (Listener.recv)
        counts = {int(k): int(n) for k, n in f.get("block_gradients", [])}  # a rollback restores them
        self._straggle(f.get("straggler", {}))  # before the store changes: a bad one changes nothing
        self.epoch = int(f.get("epoch", 0))
        ranks = f.get("ranks")
        if ranks is not None and not (isinstance(ranks, list) and all(isinstance(r, int) for r in ranks)):
            raise TypeError(f"ranks = {ranks!r} must be a list of worker ranks")
        self.store, self.sync = store, ServerSync(policy, workers, version=store.version, ranks=ranks)
        self.eager = f.get("eager_update") is True
        self.pushes, self.held, self.reads = {}, [], {}
        self.applied_at, self.early_at = {}, {}
        self.block_grads = {b.key: counts.get(b.key, 0) for b in blocks}
        self.handover.reset()
        self.ledger.clear()
        self.fragments.clear()
        self.norms = NormWait(lambda: self.store, self.sync, self.pushes, self.listener.send)
        if self.replication is not None:
            self.replication.reset(store.version)
        self.listener.send(peer, Message("ready", {"rank": self.rank}))

    def _on_stop(self, peer: bytes, msg: Message) -> None:
        self.done = True
        sync = self.sync
        self.listener.send(peer, Message("ack", {
            "version": sync.published() if sync else 0,
            "histogram": [[s, n] for s, n in sorted(sync.histogram.items())] if sync else [],
            "unapplied": sync.unapplied if sync else 0,
            "steps": self.steps.to_wire(), "compensated": self.compensated,
            "block_gradients": sorted(self.block_grads.items()), "forwarded": self.handover.sent,
            "duplicates": self.ledger.duplicates, "too_old": self.ledger.too_old}))

    def _straggle(self, f: dict) -> None:
        """Set the emulated slowdown; ValueError (and nothing set) unless the factor and
        rate are finite numbers > 0 and the bandwidth cap a finite number ≥ 0."""
        if not isinstance(f, dict):
            raise TypeError(f"straggler settings must be a map, not {type(f).__name__}")
        factor = _positive("factor", f.get("factor", self.factor))
        rate = _positive("rate_mbps", f.get("rate_mbps", self.rate / 1e6))
        bandwidth = _positive("bandwidth_mbps", f.get("bandwidth_mbps", 0.0), zero_ok=True)
        self.factor, self.rate = factor, rate * 1e6
        if "bandwidth_mbps" in f:
            self.bucket = TokenBucket(bandwidth * 1e6, clock=self.clock) if bandwidth > 0 else None

    def _on_straggle(self, peer: bytes, msg: Message) -> None:
        """The coordinator changes this server's emulated slowdown (a server trace)."""
        self._straggle(msg.fields)
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))

    def charge(self, nbytes: int | Mapping[int, int], since: float) -> None:
        """Emulate a slower server or link for `nbytes` handled (`emulated`), then book the busy time
        since `since` (a `clock.now()`); bytes given by block (`per_block`) are booked to each block too."""
        if not isinstance(nbytes, int):
            for k, b in nbytes.items():
                self.block_bytes[k] = self.block_bytes.get(k, 0) + b
            nbytes = sum(nbytes.values())
        self.clock.sleep(self.emulated(nbytes))
        self.busy_s += self.clock.now() - since
        self.bytes += nbytes

    def emulated(self, nbytes: int) -> float:
        """The seconds a slower server adds to `nbytes` handled, (factor − 1)·nbytes/rate, and
        its link's own time (with rate = bandwidth, factor f is f× slower)."""
        return (self.factor - 1.0) * nbytes / self.rate + (self.bucket.delay(nbytes) if self.bucket is not None else 0.0)

    def _on_flush(self, peer: bytes, msg: Message) -> None:
        """Apply a half-filled softsync group (the end of a run): no gradient is lost."""
        update = self.sync.flush()
        if update is not None:
            self.apply(update)
            self.release()
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))

    def _on_members(self, peer: bytes, msg: Message) -> None:
        """Membership changed: the new group size applies at once (a softsync group that
        the smaller size completes is applied now), and under SSP a worker that stopped
        (`retired`) no longer holds the clock back."""
        self.norms.release_group()
        self.sync.members(int(msg.fields["workers"]), [int(w) for w in msg.fields.get("retired", [])])
        self._apply_ready()
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))

    def _on_lose(self, peer: bytes, msg: Message) -> None:
        """A worker died (`worker`; `workers` remain). Its held pulls are forgotten, its
        pending pushes dropped if `drop` (they were not delivered to every server), and
        under a barrier the update in progress waits for an `expect`. The reply says
        how many of its gradients this server applied in all, and its version."""
        f = msg.fields
        worker = int(f["worker"])
        self.norms.release_group()
        for token in self.sync.lose(worker, int(f["workers"]), drop=bool(f.get("drop", True))):
            self.pushes.pop(token, None)
        self.held = [h for h in self.held if h.worker != worker]
        self.reads.pop(worker, None)
        self.fragments.drop(worker)
        self.store.early = {}  # computed ahead from a group that has changed: made again, or not at all
        self._apply_ready()
        self.listener.send(peer, Message("ack", {"version": self.sync.published(), "at": self.sync.version,
                                                 "applied": self.sync.applied[worker]}))

    def _on_expect(self, peer: bytes, msg: Message) -> None:
        """How many pushes the update from `version` waits for (null: one per worker)."""
        pushes = msg.fields.get("pushes")
        self.norms.release_group()
        self.sync.expect(int(msg.fields["version"]), None if pushes is None else int(pushes))
        self.store.early = {}  # the group changes: blocks computed ahead would not be taken
        self._apply_ready()
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))

    def _apply_ready(self, release: bool = True) -> None:
        """Apply every complete group; then (if `release`) answer what it made ready.
        With clip_grad_norm under a barrier a complete group is only combined: it waits
        for the global norm (server/clipping.py)."""
        while self.norms.waiting is None and (update := self.sync.next_update()) is not None:
            if self.norms.active():
                self.norms.hold(update)
                break
            self.apply(update)
        if release:
            self.release()

    def _on_norm_req(self, peer: bytes, msg: Message) -> None:
        """The coordinator asks for the gradient norms of this server's blocks in the
        update from `version` (answered once that update is complete)."""
        version = count_field(msg.fields, "version", None)
        if version is None or version < self.sync.published():
            raise PushError(f"server {self.rank}: norm request for version {version!r}, "
                            f"already at {self.sync.published()}")
        self.norms.ask(peer, version)

    def _on_clip(self, peer: bytes, msg: Message) -> None:
        """The global gradient norm of the update from `version`: clip, step, go on."""
        version = count_field(msg.fields, "version", None)
        norm = read_field(msg.fields, "norm", float, who=f"server {self.rank}: clip", least=0, required=True)
        if self.norms.waiting is not None:
            if version != self.sync.published():
                raise PushError(f"server {self.rank}: clip for version {version!r}, the update waiting is "
                                f"from {self.sync.published()}")
            w = self.norms.take()
            self.apply(w.update, w.group, w.prepared, norm)
            self._apply_ready(release=False)
        self.listener.send(peer, Message("ack", {"version": self.sync.published()}))
        self.release()

    def is_stale(self, msg: Message) -> bool:
        """A worker's request of an epoch before the last rollback: dropped unanswered
        (the worker has abandoned it, or will on hearing of the rollback)."""
        return int(msg.fields.get("epoch", 0)) < self.epoch

    def _on_pull(self, peer: bytes, msg: Message) -> None:
        if self.is_stale(msg):
            return
        part_kb = count_field(msg.fields, "part_kb", 0)
        early = {} if part_kb and msg.fields.get("early") is True else None  # it takes blocks computed ahead
        self.hold(Held(peer, "pull", int(msg.fields["min_version"]), self.clock.now(), int(msg.fields["worker"]),
                         part_kb * 1024, early))

    def _on_state_req(self, peer: bytes, msg: Message) -> None:
        self.hold(Held(peer, "state", int(msg.fields["version"]), self.clock.now()))

    def _on_push(self, peer: bytes, msg: Message) -> None:
        if self.is_stale(msg):
            return
        t0 = self.clock.now()
        f = msg.fields
        who = f"push from worker {f['worker']}"
        count = read_field(f, "count", float, who=who, least=0)
        read = read_field(f, "read", int, who=who, least=0)
        step = read_field(f, "step", int, who=who, least=0)
        version = int(f["version"])
        if f.get("borrowed") is True and not self.sync.policy.barrier():
            # The worker read these weights from other servers (a block handed over to us
            # since): their version and stamp are the nearest it has, up to our own.
            version = min(version, self.sync.published())
        own = {**grads_of(msg.tensors), **unpack_parts(msg.tensors, "G")}  # a table's blocks come packed
        earlier, checked = self.fragments.take(int(f["worker"]), count_field(f, "seq", None),
                                               count_field(f, "fragments", 0))
        again = sorted(set(earlier) & set(own))
        if again:
            raise PushError(f"push from worker {f['worker']} repeats blocks {again[:5]} of its fragments")
        push = Push(int(f["worker"]), version, int(f["samples"]), {**earlier, **own},
                    read_field(f, "start", int, who=who, least=-1, default=-1), count,
                    None if read is None else min(read, self.store.samples), rows=unpack_parts(msg.tensors, "I"))
        pid = None if step is None else (self.epoch, step, count_field(f, "part", 0))
        if drop_taken(self.ledger, push.worker, pid, push.tensors, "push"):  # all given already: acked
            self.listener.send(peer, Message("ack", {"version": self.sync.published(), "staleness": []}))
            return
        away = self.handover.split(push, self.store.blocks)
        if push.tensors or not away:  # an empty push is refused here, as a push of wrong blocks
            self.store.check(push, partial=bool(away) or not self.sync.policy.barrier(), checked=checked)
        if away:  # everything is checked before anything is applied or forwarded
            self.handover.check(push.worker, away, self.sync.lost, push.rows)
        if read is not None and self.sync.policy.delay_compensation != "none":
            push.then = self.reads.get(push.worker, {}).get(read)
        if push.tensors or not away:  # SyncFault refuses it whole (empty: a batch touching no shard here)
            token = self.sync.accept(push.worker, push.version, push.samples, int(f.get("part", 0)), step)
            self.pushes[token] = push
        self.ledger.record(push.worker, pid, push.tensors)
        if away:
            self.moves.forward(push, away, step, pid)
        self._apply_ready(release=False)  # after the ack
        self.charge(per_block(own, push.rows), t0)
        self.listener.send(peer, Message("ack", {"version": self.sync.published(),
                                                 "staleness": self.sync.take_staleness(push.worker)}))
        try:
            if self.eager and push.tensors:  # blocks this push completed (its version still in progress)
                self.ahead.speculate(own)
        finally:
            self.release()

    def apply(self, update: Update, group: list[Push] | None = None, prepared: Prepared | None = None,
               norm: float | None = None) -> None:
        """One update of the store, with σ of each gradient as `sync` measured it (the
        group combined already, and the global norm to clip it by, when clipping); with
        a backup, the new version is forwarded to it."""
        store = self.store
        before = store.compensated
        if prepared is None:
            group = [self.pushes.pop(t) for t in update.tokens]
            prepared = store.prepare(group, list(update.sigmas))
        store.finish(prepared, norm)
        now = self.clock.now()
        for k in {k for p in group for k in p.tensors if k in store.blocks}:
            self.applied_at[k] = self.early_at[k] if k in store.committed and k in self.early_at else now
        self.early_at = {}
        self.moves.count(group)
        self.compensated += store.compensated - before
        if store.last_step is not None:
            self.steps.add(store.last_step)
        self.sync.on_applied(update)
        if self.replication is not None and self.replication.backup is not None:
            self.backup.record()

    # -- deferred replies -------------------------------------------------------------
    def hold(self, held: Held) -> None:
        if self.store.blocks and not self.sync.pull_ready(held.min_version):  # to be held: bounded
            published = self.sync.published()
            if held.min_version - published > MAX_AHEAD:
                raise PushError(f"server {self.rank}: a {held.kind} request for version {held.min_version} "
                                f"is more than {MAX_AHEAD} versions ahead of {published}")
            mine = sum(h.peer == held.peer for h in self.held)
            if mine >= MAX_HELD_PER_PEER or len(self.held) >= MAX_HELD:
                raise PushError(f"server {self.rank}: too many requests held ({mine} from this peer, "
                                f"{len(self.held)} in all); {held.kind} for version {held.min_version} refused")
        self.held.append(held)
        self.release()

    def release(self) -> None:
        keep: list[Held] = []
        for h in self.held:
            # An empty server applies no updates, so its version stands still: it has
            # nothing to wait for.
            published = self.replication is None or self.replication.published(h.min_version)
            if not self.store.blocks or (self.sync.pull_ready(h.min_version) and published):
                self._reply(h)
            else:
                keep.append(h)
                if h.early is not None:
                    self.ahead.send_early(h)
        self.held = keep

    def _reply(self, h: Held) -> None:
        t0 = self.clock.now()
        store = self.store
        if h.kind == "rows":  # a sparse table's rows (server/rows.py)
            return self.tables.reply(h)
        # No copy: the transport may read the tensors after send() returns, so they are lent
        # to it, and the next update leaves them as they are until it is done (store.lend).
        values = dict(store.values)
        if h.kind == "pull":
            values = {k: v for k, v in values.items() if store.blocks[k].kind != "rows"}  # tables: by rows
            # `read` stamps the weights: the worker echoes it with the gradient computed on
            # them, and the server measures that gradient's delay in samples applied since.
            moved = {"moved": sorted(self.handover.moved)} if self.handover.moved else {}
            fields = {"version": self.sync.published(), "held_s": t0 - h.since, "read": store.samples, **moved}
            if self.sync.policy.delay_compensation != "none" and h.worker >= 0:
                remember_read(self.reads, h.worker, store.samples, values, store.blocks, READS_KEPT)
            if h.part_bytes:
                return self._reply_in_parts(h, fields, values, t0)
            msg = Message("params", {**fields, **self.applied_s(h, values)}, pack(values))
            self.charge(per_block(values), t0)
        else:
            msg = Message("state", {"version": store.version, "samples": store.samples,
                                    "blocks": len(store.blocks),
                                    "block_gradients": sorted(self.block_grads.items())},
                          pack(values, states=store.optim_state()))
        store.lend(list(values.values()), self.listener.send(h.peer, msg))

    def _reply_in_parts(self, h: Held, fields: dict, values: dict, t0: float) -> None:
        """A pull's weights as several `params` messages (`forward_pull`): the blocks in
        key order — the model's order, so the first layers' come first — in parts of at
        least `part_bytes`, each marked `last` or not, each through the emulated link on
        its own, so that the worker's forward can start on the first while the rest
        travel."""
        if h.early:  # eager_update: blocks sent ahead stand if the update took them, else all again
            fields["kept"] = self.ahead.kept(h)
            if fields["kept"]:
                values = {k: v for k, v in values.items() if k not in h.early}
        parts = split(values, h.part_bytes)
        for i, part in enumerate(parts):
            self.charge(per_block(part), t0)
            msg = Message("params", {**fields, "last": i == len(parts) - 1, **self.applied_s(h, part)}, pack(part))
            self.store.lend(list(part.values()), self.listener.send(h.peer, msg))
            t0 = self.clock.now()

    def applied_s(self, h: Held, keys, at: dict[int, float] | None = None) -> dict:
        """A reply's `applied_s`: when the last of the blocks `keys` it carries was
        computed here, in seconds after the pull `h` arrived (negative if before); {}
        if none of them has been updated here yet (a block adopted since: its first
        update here)."""
        at = self.applied_at if at is None else at
        times = [at[k] for k in keys if k in at]
        return {"applied_s": round(max(times) - h.since, 6)} if times else {}


def _positive(name: str, x, zero_ok: bool = False) -> float:
    if type(x) not in (int, float) or not math.isfinite(x) or x < 0 or (x == 0 and not zero_ok):
        raise ValueError(f"straggler {name} = {x!r} must be a finite number {'≥' if zero_ok else '>'} 0")
    return float(x)
