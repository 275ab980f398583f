"""The coordinator's handling of lost processes, mixed into its pacings.

`Losses` is what both pacings share: a lost worker is removed (its pending pushes
dropped by every server), a lost server is failed over to its backup (`replication = 1`)
or replaced, and then every server restarts from the newest state every block still has
and every worker from its iteration (a new *epoch*). `BarrierLosses` adds what a barrier
allows: the slices of the iteration in flight that a lost worker had not delivered are
cut among the survivors (runtime/recovery.py), so the iteration ends as if nobody had
been lost. The methods use the coordinator's state (`servers`, `workers`, `waiting`,
`assign`, ...); they live here so that the main loop reads on its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..wire import Message
from .recovery import Assignments
from .rpc import Failure, JobError, PeerLost
from .snapshots import State

log = logging.getLogger("equipoise.coordinator")


@dataclass(frozen=True)
class Memory:
    """An in-memory snapshot at a barrier: what a rollback restores."""

    iteration: int
    state: State
    table: list[int]
    cursor: int | None = None  # the stream position it was taken at (None: iteration × global batch)
    plans: int = 0  # no barrier: plans handed out before it (each one gradient for every server)


class Losses:
    """Lost workers and servers, both pacings."""

    def _lose(self, failure: Failure) -> None:
        """A process was lost (killed, or frozen and then killed)."""
        if failure.role == "server":
            return self._lose_server(failure)
        w = failure.rank
        if w not in self.workers or w in self.done:
            return  # it had been told to stop: nothing was in flight
        # It asked for its next plan: every push of its was acked (with overlap a request
        # goes ahead of the acks, so nothing can be said to be delivered).
        delivered = w in self.waiting and not self.cfg.overlap
        self.waiting.pop(w, None)
        self.stopped.add(w)
        self.done.add(w)
        active = sorted(set(self.workers) - self.stopped)
        # Without a barrier the others may have stopped because the stream is handed out:
        # the lost worker's slice is simply not computed, as for any lost worker there.
        if not active and (self.barrier_paced or self.cursor < self.total * self.cfg.global_batch):
            raise JobError(f"worker{w} {failure.reason}, and no worker is left")
        self.servers.workers, self.servers.ranks = len(active), active
        try:
            if self.replacing:  # a rollback is under way: it starts every server afresh
                raise PeerLost(failure)
            replies = self.servers.broadcast(Message("lose", {"worker": w, "workers": len(active),
                                                              "drop": not delivered}), "ack")
            action = self._after_loss(w, delivered, active, replies)
        except PeerLost:  # handled next; the rollback replays without this worker
            action = "removed; a server was lost meanwhile and the rollback replays without it"
        if self.restarts > 0:
            self.restarts -= 1
            self.joins_owed += 1
            action += "; a replacement joins at the next barrier"
        self._record_loss(failure, action)

    def _after_loss(self, worker: int, delivered: bool, active: list[int], replies: dict[int, Message]) -> str:
        """Pacing-specific recovery once the servers forgot `worker`; what was done."""
        raise NotImplementedError

    def _lose_server(self, failure: Failure) -> None:
        """replication = 1: fail over to the backup. Else start a replacement; the
        rollback follows once it has registered."""
        if not self.recovers_servers or self.memory is None:
            raise JobError(f"server{failure.rank} {failure.reason}")
        if failure.rank not in self.servers.pool.live():  # started, never joined
            raise JobError(f"server{failure.rank} {failure.reason} before it joined the job")
        if self.cfg.replication:
            return self._fail_over(failure)
        self.replacing[failure.rank] = ""
        self.peers.spawn("server", failure.rank)
        first = self.memory.iteration
        self._record_loss(failure, f"replaced; every server rolled back to the snapshot of iteration {first}, "
                                   f"iterations {first}–{self.iteration - 1} replayed", replayed=[first, self.iteration])

    def _record_loss(self, failure: Failure, action: str, iteration: int | None = None, **extra) -> None:
        """In summary.json's `recovered`, a `failure` event, the log and the progress line."""
        t = self.iteration if iteration is None else iteration
        entry = {"role": failure.role, "rank": failure.rank, "reason": failure.reason, "iteration": t,
                 "seen_s": round(self.stats.elapsed(), 3), "action": action, **extra}
        self.recovered.append(entry)
        self._event("failure", t, **{k: v for k, v in entry.items() if k != "iteration"})
        log.warning("%s%d %s: %s", failure.role, failure.rank, failure.reason, action)
        self.display.note(f"{failure.role}{failure.rank} lost ({failure.reason}): {action}")

    def _note_replacement(self, msg: Message) -> bool:
        if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self.replacing:
            self.replacing[int(msg.fields["rank"])] = str(msg.fields["address"])
            return True
        return False

    def _fail_over(self, failure: Failure) -> None:
        """replication = 1: the lost server's backup takes its blocks; every server
        starts again from the newest version every block still has (the start of the
        iteration in flight, or its end if it was complete and replicated everywhere),
        and the workers replay from there. New backups are named among the survivors."""
        lost, now = failure.rank, self.iteration
        if lost not in self.servers.backup_of:
            raise JobError(f"server{lost} {failure.reason}, and it had no backup")
        for version in (now, now - 1):
            state = self.servers.read_back(lost, version) if version >= 0 else None
            if state is not None:
                break
        else:
            raise JobError(f"server{lost} {failure.reason}; no version of its blocks survives")
        backup = self.servers.backup_of[lost]
        self.memory = Memory(version, state, self.servers.promote(lost))
        self._restart()
        self.servers.replicate()
        self._record_loss(failure, f"its backup, server {backup}, took its blocks; every server restarted from "
                                   f"version {version}, iterations {version}–{now - 1} replayed",
                          replayed=[version, now], iteration=now)

    def _roll_back(self) -> None:
        """Every server starts again from the last in-memory snapshot, the replacements
        too."""
        if not all(self.replacing.values()):
            self._await_hello("replacement servers to register",
                              lambda m: self._note_replacement(m) and all(self.replacing.values()))
        self._restart(dict(self.replacing))
        self.replacing = {}

    def _restart(self, replacements: dict[int, str] | None = None) -> None:
        """Every server (and the `replacements`, rank → address) starts from `memory`;
        every worker is told to start again from its iteration (a new epoch)."""
        mem = self.memory
        self.epoch += 1
        self.servers.epoch = self.epoch
        active = sorted(set(self.workers) - self.stopped)  # whose clocks SSP keeps from the restart on
        self.servers.workers, self.servers.ranks = len(active), active
        self.servers.restore(replacements or {}, mem.table, mem.state.values, mem.state.optim,
                             mem.state.version, mem.state.samples, mem.state.gradients)
        self._rewind(mem)
        self.waiting, self.assign = {}, Assignments()
        self.snapshots.replay_from(mem.iteration)
        # Every worker not yet done, also one stopped with a request still owed an answer
        # (overlap): after the reset it asks again, and is stopped again.
        for w in sorted(set(self.workers) - self.done):
            self.known_table[w] = self.servers.version
            self.listener.send(self.workers[w], plan_message(mem.iteration, 0, 0, mem.iteration, stop=False, reset=True,
                                                      epoch=self.epoch, table=self.servers.table,
                                                      servers=self.servers.addresses))


    def _rewind(self, mem: Memory) -> None:
        """The plan goes back to `mem`: at a barrier every slice before it was applied on
        every server, and every report after it is replayed."""
        self.iteration, self.cursor = mem.iteration, mem.iteration * self.cfg.global_batch
        self.reports = {t: r for t, r in self.reports.items() if t < mem.iteration}
        self.ended = {t for t in self.ended if t < mem.iteration}  # replayed: recorded again


class BarrierLosses(Losses):
    """A lost worker's slices of the iteration in flight go to the survivors."""

    def _send_share(self, worker: int) -> None:
        """Hand `worker` its next share of a lost worker's slices (iteration in flight)."""
        share, t = self.assign.next_share(worker), self.assign.iteration
        peer, since = self.waiting.pop(worker)
        self.listener.send(peer, plan_message(t, share.start, share.size, t, stop=False, epoch=self.epoch,
                                              recover=True, part=share.part,
                                       servers=list(share.servers), held_s=time.monotonic() - since,
                                       elapsed=self.stats.elapsed()))

    def _after_loss(self, worker: int, delivered: bool, active: list[int], replies: dict[int, Message]) -> str:
        """Iteration t in flight: unless the lost worker had delivered its pushes, its
        slices are cut among the survivors for the servers still at version t; then
        every server is told how many pushes its update t waits for."""
        t = self.assign.iteration
        if t is None or t != self.iteration - 1:
            for rank in replies:
                self.servers.pool.request(rank, Message("expect", {"version": self.iteration, "pushes": None}), "ack")
            return "removed; it held no slice of the iteration in flight"
        action = f"its pushes for iteration {t} had all arrived; removed"
        if not delivered:
            planned = {s.worker: s.size for s in self.assign.slices if s.part == 0}  # LB-BSP: by speed
            behind = sorted(r for r, m in replies.items() if int(m.fields["at"]) == t)
            mine = [s for s in self.assign.slices if s.worker == worker]
            caps = {w: c for w in active if (c := self.planner.cap(w)) is not None}
            new = self.assign.lose(worker, {w: planned.get(w, 1) for w in active}, behind, caps)
            reported = {r.get("start") for r in self.reports.get(t, []) if r["worker"] == worker}
            for s in mine:  # applied by every server it was owed to, but its report never came
                if not any(s.reaches(r) for r in behind) and s.start not in reported:
                    self._collect(worker, {"iteration": t, "start": s.start, "samples": s.size, "loss": 0.0,
                                           "count": 0.0, "compute_s": 0.0, "wait_s": 0.0, "comm_s": 0.0,
                                           "staleness": [], "recovery": True, "lost": True})
            action = (f"iteration {t}: its slices re-planned as {len(new)} shares for workers "
                      f"{sorted({s.worker for s in new})} (servers {behind} had not applied it)"
                      if new else f"iteration {t} had been applied everywhere; removed")
        for rank in replies:
            self.servers.pool.request(rank, Message("expect", {"version": t, "pushes": self.assign.expected(rank)}),
                                      "ack")
        for w in sorted(self.waiting):
            if self.assign.queue.get(w):
                self._send_share(w)
        if self.waiting and len(self.waiting) == len(active) and not self.assign.owed():
            self._advance_barrier()
        return action


def plan_message(iteration: int, start: int, size: int, version: int, *, stop: bool, **extra) -> Message:
    """A plan reply; `step` is the worker's own counter and is not echoed back."""
    return Message("plan", {"step": 0, "iteration": iteration, "start": start, "size": size,
                            "stop": stop, "version": version, **extra})


__all__ = ["BarrierLosses", "Losses", "Memory", "plan_message"]
