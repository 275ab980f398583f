"""The two pacings of the coordinator's loop (coordinator/base.py has what they share).

`BarrierCoordinator` (BSP, LB-BSP) answers the plan requests of iteration t once every
worker has asked for them; `StreamCoordinator` (ASP, softsync, SSP) gives each request
the next positions of the global sample stream at once. `make_coordinator` picks one
for a job's protocol.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from ..config import Config
from ..policy.sync import make_sync_policy
from ..scenario import WorkerJoin, WorkerLeave
from ..wire import Listener, Message, Transport
from ..protocol.checkpoint import Checkpoint
from .base import Coordinator
from .recovery import Memory, plan_message
from .planner import CapError
from .assignments import Slice
from .rpc import JobError, Peers

log = logging.getLogger("equipoise.coordinator")


def make_coordinator(cfg: Config, run_dir: Path, transport: Transport, listener: Listener, data, *,
                     peers: Peers, resume: Checkpoint | None = None,
                     on_tick: Callable[[float], None] | None = None) -> "Coordinator":
    """The coordinator of `cfg.protocol`: barrier pacing or stream pacing."""
    make_sync_policy(cfg.protocol, softsync_n=cfg.softsync_n or cfg.workers,  # a bad protocol fails here
                     staleness_bound=cfg.staleness_bound, lr_modulation=cfg.lr_modulation)
    kind = BarrierCoordinator if cfg.has_barrier else StreamCoordinator
    return kind(cfg, run_dir, transport, listener, data, peers=peers, resume=resume, on_tick=on_tick)


class BarrierCoordinator(Coordinator):
    """BSP and LB-BSP: iteration t's plans go out once every worker asked for them."""

    recovers_servers = True
    barrier_paced = True

    def _advance(self, worker: int) -> None:
        if self.assign.queue.get(worker):
            return self._send_share(worker)
        if len(self.waiting) == len(self.workers) - len(self.stopped) and not self.assign.owed():
            self._advance_barrier()

    def _advance_barrier(self) -> None:
        """Every worker waits for iteration t: snapshot if due, then hand out slices.
        The reports of t−1 are digested after the replies, so predictor training overlaps
        the workers' pulls; LB-BSP sizes thus react to speeds up to t−2."""
        t = self.iteration
        if self.clip_due == t - 1:  # clip_grad_norm: update t−1 waits on the servers for its norm
            self.clip_due = None
            self.grad_norms[t - 1] = self.servers.clip(t - 1)
        self.servers.reached(t)
        self._snapshot(t, version=t, cursor=t * self.cfg.global_batch)
        if t >= self.total:
            self._end_iteration(t - 1)
            return self._stop_all()
        if self._membership(t):
            return  # a joining worker's first plan request completes the barrier
        actions = self.servers.at_barrier(t)
        try:
            sizes = self.planner.sizes()
        except CapError as exc:  # the job's, not the plan request's that completed the barrier
            raise JobError(f"iteration {t}: {exc}") from None
        slices = {w: (t * self.cfg.global_batch + offset, size)
                  for w, (offset, size) in self.planner.slices(sizes).items()}
        self.assign.begin(t, slices)
        for w, (start, size) in slices.items():
            self._reply_plan(w, t, start, size, version=t, await_table=bool(actions))
        if self.cfg.clip_grad_norm:
            self.clip_due = t
        self.iteration += 1
        if actions:  # workers compute meanwhile; they ask for the table before pushing
            self.servers.carry_out(t, actions)
            if self.cfg.replication:  # the ring over the servers there are now
                self.servers.replicate()
        self._end_iteration(t - 1)

    def _out_of_memory(self, worker: int, report: dict) -> None:
        """A slice of iteration t ran out of memory on `worker`, before its push: its cap
        becomes ¾ of that batch, and the slice is cut again among the active workers
        (by their planned sizes, each piece within its worker's cap, the worker itself
        included), as shares the servers' update t waits for — the step is the same SGD
        step as before, whoever computes which samples."""
        t, size, start = self.assign.iteration, int(report["samples"]), int(report["start"])
        if t is None or int(report["iteration"]) != t:
            raise JobError(f"worker {worker}: out of memory in iteration {report['iteration']}, "
                           f"but iteration {t} is in flight")
        if size <= 1:
            raise JobError(f"{report.get('message', f'worker {worker}: out of memory')}: not even one sample "
                           f"fits its device")
        cap = max(1, (3 * size) // 4)
        self.planner.set_memory_cap(worker, min(cap, self.planner.cap(worker) or cap))
        active = sorted(set(self.workers) - self.stopped)
        planned = {s.worker: s.size for s in self.assign.slices if s.part == 0}
        caps = {w: c for w in active if (c := self.planner.cap(w)) is not None}
        shares = {w: 0.0 if planned.get(w) == 0 else float(min(planned.get(w, size), caps.get(w, size))) or 1.0
                  for w in active}  # a worker planned no samples takes no share (the worker itself was planned some)
        holding = tuple(r for r in self.servers.live() if r in self.servers.table)
        new = self.assign.resplit(worker, start, shares, caps, holding)
        self.servers.expect(holding, t, self.assign.expected)
        self._event("out_of_memory", t, worker=worker, batch=size, cap=self.planner.cap(worker),
                    shares=[[s.worker, s.size] for s in new])
        log.warning("%s; its cap is now %d samples, the slice is cut into %d shares",
                    report.get("message", f"worker {worker} ran out of memory"), self.planner.cap(worker), len(new))
        for w in sorted(self.waiting):
            if w != worker and self.assign.queue.get(w):
                self._send_share(w)

    def _send_share(self, worker: int) -> None:
        """Hand `worker` its next share of a lost worker's slices (iteration in flight)."""
        share, t = self.assign.next_share(worker), self.assign.iteration
        peer, since = self.waiting.pop(worker)
        self.listener.send(peer, plan_message(t, share.start, share.size, t, stop=False, epoch=self.epoch,
                                              recover=True, part=share.part, servers=list(share.servers),
                                              held_s=time.monotonic() - since, elapsed=self.stats.elapsed()))

    def after_loss(self, worker: int, delivered: bool, active: list[int], replies: dict[int, Message]) -> str:
        """Iteration t in flight: unless the lost worker had delivered its pushes, its
        slices are cut among the survivors for the servers still at version t; then
        every server is told how many pushes its update t waits for."""
        t = self.assign.iteration
        if t is None or t != self.iteration - 1:  # e.g. lost just after a restart, before its plan
            self.servers.expect(replies, self.iteration, lambda rank: None)
            self._advance_if_all_wait(active)  # the survivors may all be waiting for it
            return "removed; it held no slice of the iteration in flight"
        action = f"its pushes for iteration {t} had all arrived; removed"
        if not delivered:
            planned = {s.worker: s.size for s in self.assign.slices if s.part == 0}  # LB-BSP: by speed
            behind = sorted(r for r, m in replies.items() if int(m.fields["at"]) == t)
            mine = [s for s in self.assign.slices if s.worker == worker]
            caps = {w: c for w in active if (c := self.planner.cap(w)) is not None}
            shares = {w: planned.get(w, 1) for w in active}  # one planned no samples takes none, unless all were
            new = self.assign.lose(worker, shares if any(shares.values()) else dict.fromkeys(shares, 1), behind, caps)
            self._unreported(t, [s for s in mine if not any(s.reaches(r) for r in behind)])
            action = (f"iteration {t}: its slices re-planned as {len(new)} shares for workers "
                      f"{sorted({s.worker for s in new})} (servers {behind} had not applied it)"
                      if new else f"iteration {t} had been applied everywhere; removed")
        self.servers.expect(replies, t, self.assign.expected)
        for w in sorted(self.waiting):
            if self.assign.queue.get(w):
                self._send_share(w)
        self._advance_if_all_wait(active)
        return action

    def _unreported(self, t: int, slices: list[Slice]) -> None:
        """`slices` of iteration t were applied by every server they were owed to, but
        some reports never came (their worker was lost, or a restart past t cut them
        off): iteration t's record lists those slices itself (`lost`), so that its
        `batch` is the split that was applied."""
        reported = {(r["worker"], r.get("start")) for r in self.reports.get(t, [])}
        for s in slices:
            if (s.worker, s.start) not in reported:
                self._collect(s.worker, {"iteration": t, "start": s.start, "samples": s.size, "loss": 0.0,
                                         "count": 0.0, "compute_s": 0.0, "wait_s": 0.0, "comm_s": 0.0,
                                         "staleness": [], "recovery": True, "lost": True})

    def _rewind(self, mem: Memory) -> None:
        """A fail-over that restarts from the end of the iteration in flight (every block
        of version t + 1 survived) does not replay t: the reports the restart cut off
        (a worker waiting on the lost server for its pull had not sent its own) are
        recorded from the slices."""
        t = self.assign.iteration
        if t is not None and mem.iteration == t + 1 == self.iteration:
            self._unreported(t, self.assign.slices)
        super()._rewind(mem)

    def _advance_if_all_wait(self, active: list[int]) -> None:
        """After a loss: if every worker left waits and no share is owed, the barrier is
        passed (the lost worker was the one it waited for)."""
        if self.waiting and len(self.waiting) == len(active) and not self.assign.owed():
            self._advance_barrier()

    def _membership(self, t: int) -> bool:
        """Apply the scenario's membership events due at iteration t (a quiet moment: no
        update in flight). Returns True if workers joined and their first plan request
        is awaited."""
        joined = False
        for _ in range(self.recovery.joins_owed):
            joined |= self._join(t)
        self.recovery.joins_owed = 0
        for i, ev in enumerate(self.scenario.membership):
            if i in self.events_done or ev.iteration > t:
                continue
            self.events_done.add(i)
            if isinstance(ev, WorkerLeave) and ev.worker in self.workers and ev.worker not in self.stopped:
                self._stop(ev.worker)
                self._event("worker_left", t, worker=ev.worker)
            elif isinstance(ev, WorkerJoin):
                for _ in range(ev.count):
                    joined |= self._join(t)
        active = sorted(set(self.workers) - self.stopped)
        if not active:
            raise JobError(f"no worker left at iteration {t}")
        if active != self.planner.workers:
            self.planner.set_workers(active)
            self.servers.members(len(active))
        return joined

    def _join(self, t: int) -> bool:
        """Start a worker of a new rank and take it in; False if it was lost before it
        registered."""
        rank = max([*self.workers, *self.recovery.never_joined]) + 1
        self.peers.spawn("worker", rank)

        def gone() -> bool:
            """Whether the joining worker was lost before it registered (other losses
            are kept for the main loop)."""
            for failure in self.peers.lost():
                if failure.role == "worker" and failure.rank == rank:
                    self.recovery.never_joined.add(rank)
                    self.recovery.record(failure, "a replacement lost before it registered; not replaced again")
                    return True
                self.recovery.unhandled.append(failure)
            return False

        peer = self.await_hello(f"joining worker {rank} to register",
                                 lambda m: m.fields.get("role") == "worker" and m.fields.get("rank") == rank,
                                 gone=gone)
        if peer is None:
            return False
        self.workers[rank] = peer
        self.listener.send(peer, self._welcome(rank))
        self._event("worker_joined", t, worker=rank)
        return True


class StreamCoordinator(Coordinator):
    """ASP, softsync, SSP: each request gets the next μ positions of the global stream;
    an iteration ends once its X samples are reported; the final snapshot is taken once
    every worker stopped.

    A lost server is replaced and every server rolled back to the last in-memory snapshot
    (`snapshot_every`), as under a barrier; the stream goes back to the position the
    snapshot was taken at. Without a barrier that snapshot is not quiet: gradients handed
    out before it and not yet applied on some server are applied there never (each
    server's state is its own moment). Every server counts the gradients it applied, and
    the coordinator the plans it handed out (each one gradient owed to every server), both
    rolled back with the snapshot: `lost_updates` is, at the end, the most any block was
    owed and never applied (each plan is one gradient owed to every block)."""

    recovers_servers = True

    def _advance(self, worker: int) -> None:
        self._routed(worker)
        end = self.total * self.cfg.global_batch
        if self.cursor >= end:
            return self._stop(worker)
        size = min(self.planner.sizes()[worker], end - self.cursor)
        before = self.cursor // self.cfg.global_batch
        table = self.known_table.get(worker, 0)
        self._reply_plan(worker, before, self.cursor, size, version=0)
        if self.known_table[worker] != table:  # it routes by the new table from this plan on
            self.switched[worker] = (self.known_table[worker], self.asked.get(worker, 0))
        self.cursor += size
        self.plans += 1
        self.iteration = self.cursor // self.cfg.global_batch
        if self.iteration > before and self.iteration < self.total:
            self.servers.reached(self.iteration)
            self._snapshot(self.iteration, version=0, cursor=self.cursor)
            self._server_work(self.iteration)

    def _server_work(self, t: int) -> None:
        """As the stream passes iteration t: measure the servers, and move blocks, add
        and remove servers as PSLD, the scenario and control.jsonl ask, while the
        workers run (the servers fence and forward: coordinator/pool.py). Workers get the
        new table with their next plan."""
        actions = self.servers.at_barrier(t)
        if actions:
            self.servers.carry_out(t, actions)

    def _routed(self, worker: int) -> None:
        """A plan request of `worker`: once it has sent overlap + 2 of them since the one
        answered with a table (with overlap, the last exchange by the old table is
        collected only after the request two after the switch), none of its exchanges in
        flight routes by an older one; servers emptied for removal that no worker
        reaches any more are stopped."""
        self.asked[worker] = self.asked.get(worker, 0) + 1
        version, at = self.switched.get(worker, (None, 0))
        if version is not None and self.asked[worker] - at > int(self.cfg.overlap) + 1:
            self.routing[worker] = version
            del self.switched[worker]
        if self.servers.pool.leaving:
            # A stopped worker still collects its exchanges in flight, which may reach a
            # server by its last table: it counts until the end (then every server stops).
            self.servers.retire(self.iteration, min([self.routing.get(w, 0) for w in self.workers],
                                                    default=self.servers.version))

    def after_loss(self, worker: int, delivered: bool, active: list[int], replies: dict[int, Message]) -> str:
        """The servers dropped its pushes still waiting in a group; a gradient it had
        delivered to some servers and not others is counted as lost."""
        applied = [int(m.fields["applied"]) for m in replies.values()]
        partial = max(applied) - min(applied) if applied else 0  # summary.json counts it (gradients owed)
        if active:
            self.planner.set_workers(active)
        return (f"removed; {len(active)} workers go on"
                + ("; its last gradient reached only some servers (counted in lost_updates)" if partial else ""))

    def _rewind(self, mem: Memory) -> None:
        """Back to the stream position of `mem`; what was in flight then is lost (counted)."""
        self.cursor = mem.iteration * self.cfg.global_batch if mem.cursor is None else mem.cursor
        self.iteration = self.cursor // self.cfg.global_batch
        self.reports = {t: [r for r in held if r.get("start", 0) < self.cursor] for t, held in self.reports.items()}
        self.reports = {t: held for t, held in self.reports.items() if held}
        short = max([mem.plans - g for g in mem.state.gradients.values()] + [0])  # per block
        self.plans = mem.plans
        # Every worker starts again on new connections and the restored table.
        self.routing, self.switched = {w: self.servers.version for w in self.workers}, {}
        if short:
            log.warning("rollback: a server had applied %d fewer gradients than were handed out before the "
                        "snapshot (in flight then, or lost before); they are not applied there (lost_updates)", short)

    def _reported(self, t: int) -> None:
        if sum(r["samples"] for r in self.reports[t]) >= self.cfg.global_batch:
            self._end_iteration(t)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: dict[int, int] = {}  # plan requests received, per worker
        self.switched: dict[int, tuple[int, int]] = {}  # a table sent: worker -> (its version, requests then)
        self.routing: dict[int, int] = {}  # the oldest table each worker's exchanges may route by

    def _wind_down(self) -> None:
        for t in sorted(self.reports):  # partial last iterations
            self._end_iteration(t)
        self.servers.broadcast(Message("flush", {}), "ack")  # apply half-filled softsync groups
        self._snapshot(self.total, version=0, cursor=self.cursor, force=True)


__all__ = ["BarrierCoordinator", "StreamCoordinator", "make_coordinator"]
