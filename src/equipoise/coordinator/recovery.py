"""Recovery: what the coordinator does when a process is lost, as a part of its own.

`Recovery` owns what recovery keeps — the losses recorded (summary.json's `recovered`),
the worker replacements still allowed and owed, the in-memory snapshot a rollback
restores, the lost servers being replaced, and the rollback *epoch* — and acts through
the server manager's methods (`lose_worker`, `expect`, `restore`, `promote`, …) and
the coordinator's `Plan`: the few things about the plan it must ask or change (who is
active, where the plan stands, how the iteration in flight is finished without a
lost worker). A lost worker is removed (its pending pushes dropped by every server); a
lost server is failed over to its backup (`replication = 1`) or replaced, and then every
server restarts from the newest state every block still has and every worker from its
iteration (a new epoch). How the iteration in flight ends without the lost worker is
the pacing's (`Plan.after_loss`: under a barrier its slices are cut among the survivors,
coordinator/assignments.py; without one it is simply not computed).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from ..config import Config
from ..wire import Message
from .rpc import Failure, JobError, PeerLost, Peers
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


class SnapshotPace:
    """When the next in-memory snapshot is due. At every `every`-th iteration, and no
    sooner than its cost allows: the workers wait while every server's state is
    fetched, so a snapshot that held them c seconds, after training at τ seconds an
    iteration since the one before, is followed by the next after at least
    c ÷ (`budget` · τ) iterations, rounded up to a multiple of `every`. That bounds the
    snapshots' share of the training at about `budget` (0: no bound); what it costs is
    the iterations a rollback replays (at most the spacing). The DLRM-style example's
    100 MB of tables and Adagrad state took about 0.1 s to fetch from one server, against
    iterations of 20-35 ms: every 10 iterations, that held the workers a fifth to a third
    of the time (docs/sparse.md)."""

    def __init__(self, every: int, budget: float, clock: Callable[[], float] = time.monotonic):
        self.every, self.budget, self.clock = every, budget, clock
        self.spacing = every  # iterations from one snapshot to the next
        self.last: tuple[int, float] | None = None  # the last one's iteration, and the clock when it was in
        self.cost_s, self.iteration_s = math.nan, math.nan  # the last one's fetch, and the iterations before it
        self.next = 0

    def due(self, t: int, fetching: bool = False) -> bool:
        """A snapshot at iteration t: at a multiple of `every`, once the spacing has
        passed or where the state is `fetching` anyway (then it costs nothing more)."""
        return bool(self.every) and t % self.every == 0 and (fetching or t >= self.next)

    def taken(self, t: int, started: float) -> bool:
        """The snapshot of iteration t was fetched from `started` until now; True if the
        spacing changed. The cost weighed is the lesser of this fetch's and the one
        before (one slow fetch, a collection or a busy host, does not push the next
        rollback point far out on its own)."""
        now, before, previous = self.clock(), self.spacing, self.cost_s
        self.cost_s, self.iteration_s = now - started, math.nan
        if self.budget > 0 and self.last is not None and t > self.last[0]:
            self.iteration_s = (started - self.last[1]) / (t - self.last[0])
            cost = min(self.cost_s, previous) if math.isfinite(previous) else self.cost_s
            need = cost / (self.budget * self.iteration_s) if self.iteration_s > 0 else math.nan
            if math.isfinite(need):
                self.spacing = self.every * max(1, math.ceil(need / self.every))
        self.last, self.next = (t, now), t + self.spacing
        return self.spacing != before

    def rolled_back(self) -> None:
        """A rollback to the last snapshot: the time since it (the lost run, the
        recovery) is no iteration's; the next snapshot weighs none."""
        self.last = None


@dataclass(frozen=True)
class Plan:
    """What recovery asks of the coordinator's plan and does to it, handed over one
    function each (recovery never holds the coordinator itself)."""

    iteration: Callable[[], int]
    """The iteration in flight."""
    drop_worker: Callable[[int, str], tuple[bool, list[int]] | None]
    """`worker` is lost: it no longer counts. (whether its pushes of the iteration in
    flight had all been acknowledged, the active workers), or None if it had been told
    to stop already; JobError if no worker is left to finish the job."""
    active: Callable[[], list[int]]
    """The ranks of the workers not stopped."""
    after_loss: Callable[[int, bool, list[int], dict[int, Message]], str]
    """The servers forgot `worker` (`replies`: what each had applied): finish the
    iteration in flight without it; returns what was done."""
    restart_from: Callable[[Memory, int], None]
    """Every server restarted from `memory`: the plan goes back there and every worker
    is told to start again from it, in `epoch`."""
    await_hello: Callable[[str, Callable[[Message], bool]], bytes | None]
    """Wait up to `timeout` for the hello `wanted` accepts; its sender."""


class Recovery:
    """Lost workers and servers, under both pacings."""

    def __init__(self, cfg: Config, servers, peers: Peers, plan: Plan, *, recovers_servers: bool,
                 event: Callable[..., None], elapsed: Callable[[], float], note: Callable[[str], None]):
        """`event(name, iteration, **fields)` writes an event record, `elapsed()` is the
        training time so far, `note(line)` tells the progress display."""
        self.cfg, self.servers, self.peers, self.plan = cfg, servers, peers, plan
        self.recovers_servers = recovers_servers
        self._event, self._elapsed, self._note = event, elapsed, note
        self.recovered: list[dict] = []  # every process lost, and what was done
        self.restarts = cfg.worker_restarts  # replacements still allowed
        self.joins_owed = 0  # replacements to start at the next barrier
        self.never_joined: set[int] = set()  # ranks of replacements lost before they registered
        self.unhandled: list[Failure] = []  # losses seen while waiting for a joiner
        self.epoch = 0  # rollbacks so far; a plan request of an earlier epoch is stale
        self.memory: Memory | None = None  # the snapshot a rollback restores
        self.pace = SnapshotPace(cfg.snapshot_every, cfg.snapshot_budget)  # when the next is due
        self.replacing: dict[int, str] = {}  # lost servers being replaced: rank -> address ("" until hello)

    def memory_due(self, t: int, total: int, fetching: bool = False) -> bool:
        """An in-memory snapshot is wanted at iteration t of `total`: a rollback would
        restore it (a server can be replaced; no backup replicas), and `pace` says so or,
        at a multiple of `snapshot_every`, the state is `fetching` anyway (an evaluation's,
        a checkpoint's: then it costs nothing more)."""
        return bool(self.recovers_servers and not self.cfg.replication and t < total and self.memory
                    and t > self.memory.iteration and self.pace.due(t, fetching))

    def remember(self, memory: Memory, started: float) -> None:
        """Keep `memory`, a snapshot fetched from `started` (the clock of `pace`) until now."""
        self.memory = memory
        if self.pace.taken(memory.iteration, started):
            self._event("snapshot_spacing", memory.iteration, iterations=self.pace.spacing, budget=self.pace.budget,
                        cost_s=round(self.pace.cost_s, 4), iteration_s=round(self.pace.iteration_s, 5))

    def handle(self, lost: list[Failure]) -> None:
        """Every loss seen (servers first, so that a worker lost with its server is
        removed in the rollback's epoch), then the rollback if a server is replaced."""
        lost, self.unhandled = self.unhandled + lost, []
        for failure in sorted(lost, key=lambda f: f.role != "server"):
            self.lose(failure)
        if self.replacing:
            self.roll_back()

    def lose(self, failure: Failure) -> None:
        """A process was lost (killed, or frozen and then killed)."""
        if failure.role == "server":
            return self.lose_server(failure)
        w = failure.rank
        dropped = self.plan.drop_worker(w, failure.reason)
        if dropped is None:
            return  # it had been told to stop: nothing was in flight
        delivered, active = dropped
        try:
            if self.replacing:  # a rollback is under way: it starts every server afresh
                self.servers.active(active)
                raise PeerLost(failure)
            replies = self.servers.lose_worker(w, active, drop=not delivered)
            action = self.plan.after_loss(w, delivered, active, replies)
        except PeerLost:  # handled next; the rollback replays without this worker
            action = "removed; a server was lost meanwhile and the rollback replays without it"
        if self.restarts > 0:
            self.restarts -= 1
            self.joins_owed += 1
            action += "; a replacement joins at the next barrier"
        self.record(failure, action)

    def lose_server(self, failure: Failure) -> None:
        """replication = 1: fail over to the backup. Else start a replacement; the
        rollback follows once it has registered."""
        if not self.recovers_servers or self.memory is None:
            raise JobError(f"server{failure.rank} {failure.reason}")
        if failure.rank not in self.servers.live():  # started, never joined
            raise JobError(f"server{failure.rank} {failure.reason} before it joined the job")
        if self.cfg.replication:
            return self.fail_over(failure)
        self.replacing[failure.rank] = ""
        self.peers.spawn("server", failure.rank)
        first, now = self.memory.iteration, self.plan.iteration()
        self.record(failure, f"replaced; every server rolled back to the snapshot of iteration {first}, "
                             f"iterations {first}–{now - 1} replayed", replayed=[first, now])

    def record(self, failure: Failure, action: str, iteration: int | None = None, **extra) -> None:
        """In summary.json's `recovered`, a `failure` event, the log and the progress line."""
        t = self.plan.iteration() if iteration is None else iteration
        entry = {"role": failure.role, "rank": failure.rank, "reason": failure.reason, "iteration": t,
                 "seen_s": round(self._elapsed(), 3), "action": action, **extra}
        self.recovered.append(entry)
        self._event("failure", t, **{k: v for k, v in entry.items() if k != "iteration"})
        log.warning("%s%d %s: %s", failure.role, failure.rank, failure.reason, action)
        self._note(f"{failure.role}{failure.rank} lost ({failure.reason}): {action}")

    def note_replacement(self, msg: Message) -> bool:
        """Whether `msg` is the hello of a replacement server (its address is kept)."""
        if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self.replacing:
            self.replacing[int(msg.fields["rank"])] = str(msg.fields["address"])
            return True
        return False

    def fail_over(self, failure: Failure) -> None:
        """replication = 1: the lost server's backup takes its blocks; every server
        starts again from the newest version every block still has (the start of the
        iteration in flight, or its end if it was complete and replicated everywhere),
        and the workers replay from there. New backups are named among the survivors."""
        lost, now = failure.rank, self.plan.iteration()
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
        self.restart()
        self.servers.replicate()
        replay = (f"iterations {version}–{now - 1} replayed" if version < now
                  else f"nothing replayed (iteration {now - 1} had been applied everywhere)")
        self.record(failure, f"its backup, server {backup}, took its blocks; every server restarted from "
                             f"version {version}, {replay}", replayed=[version, now], iteration=now)

    def roll_back(self) -> None:
        """Every server starts again from the last in-memory snapshot, the replacements
        too."""
        if not all(self.replacing.values()):
            self.plan.await_hello("replacement servers to register",
                                  lambda m: self.note_replacement(m) and all(self.replacing.values()))
        self.restart(dict(self.replacing))
        self.replacing = {}

    def restart(self, replacements: dict[int, str] | None = None) -> None:
        """Every server (and the `replacements`, rank → address) starts from `memory` in
        a new epoch; then the plan goes back there."""
        mem = self.memory
        self.epoch += 1
        self.servers.restore(replacements or {}, mem.table, mem.state.values, mem.state.optim,
                             mem.state.version, mem.state.samples, mem.state.gradients,
                             active=self.plan.active())  # whose clocks SSP keeps from the restart on
        self.plan.restart_from(mem, self.epoch)
        self.pace.rolled_back()


def plan_message(iteration: int, start: int, size: int, version: int, *, stop: bool, **extra) -> Message:
    """A plan reply; `step` is the worker's own counter and is not echoed back."""
    return Message("plan", {"step": 0, "iteration": iteration, "start": start, "size": size,
                            "stop": stop, "version": version, **extra})


__all__ = ["Memory", "Plan", "Recovery", "plan_message"]
