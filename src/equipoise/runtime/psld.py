"""PSLD's decisions (PAPERS.md §3), separated from the sockets that carry them out.

Every `interval` iterations the coordinator measures each live server — bytes handled
and busy seconds, so its effective throughput rⱼ — and the mean iteration time. The
controller then either judges the trial it started last time (keep it if the measured
iteration time improved by more than `threshold` after charging the migration's pause,
else undo it), or starts a new trial:

* exploit: the descending-best-fit moves that cut the predicted maximum server time
  maxⱼ Lⱼ/rⱼ, if they cut it by more than `threshold`;
* explore (probability ε, or when exploiting finds nothing): a random move of one block
  off the slowest server, or adding a server while fewer than `max_servers` run.

Adding a server is not judged by itself: the new server holds nothing until a later
exploit moves blocks onto it (an idle server is assumed as fast as the best measured
one), and that move is the trial. A server PSLD added that is empty again after its
trial was undone is removed.

Actions are plain tuples: ("move", block, src, dst), ("add", "psld"), ("remove", rank).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..policy.placement import exploit_moves, predicted_time, server_loads

Action = tuple


@dataclass
class Trial:
    actions: list[Action]
    undo: list[Action]
    before_s: float
    pause_s: float = 0.0


@dataclass
class PsldController:
    sizes: list[int]
    epsilon: float = 0.1
    max_servers: int = 0
    threshold: float = 0.03
    horizon: int = 50  # iterations a migration's pause is amortised over
    tabu_decisions: int = 6  # an undone trial is not proposed again for this many decisions
    seed: int = 0
    trial: Trial | None = None
    log: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.undone: set[int] = set()  # servers whose moves were undone
        self.known: dict[int, float] = {}  # last measured bytes/s of each server
        self.tabu: dict[tuple, int] = {}  # undone trials -> decisions before they may be retried

    def decide(self, table: list[int], live: list[int], throughput: dict[int, float],
               iteration_s: float, added: set[int] = frozenset()) -> list[Action]:
        """The actions to carry out now. `live` are the server ranks running,
        `throughput` their measured bytes/s (missing for a server that handled nothing),
        `added` the servers PSLD started."""
        if self.trial is not None:
            trial, self.trial = self.trial, None
            gain = (trial.before_s - iteration_s - trial.pause_s / self.horizon) / trial.before_s
            keep = gain > self.threshold
            self.log.append({"judged": trial.actions, "before_s": trial.before_s, "after_s": iteration_s,
                             "kept": keep})
            if not keep:
                self.undone |= {a[3] for a in trial.actions if a[0] == "move"}
                self.tabu[tuple(trial.actions)] = self.tabu_decisions  # do not retry at once
                return trial.undo
            return []
        self.tabu = {k: n - 1 for k, n in self.tabu.items() if n > 1}
        empty = [r for r in live if r in added and r in self.undone and r not in table]
        if empty:
            self.undone -= set(empty)
            return [("remove", r) for r in empty]
        rates = self._rates(live, throughput)
        index = {r: i for i, r in enumerate(live)}
        owner = [index[s] for s in table]
        explore = self.rng.random() < self.epsilon
        if not explore:
            moves, new_owner = exploit_moves(self.sizes, owner, [rates[r] for r in live])
            now = predicted_time(server_loads(self.sizes, owner, len(live)), [rates[r] for r in live])
            then = predicted_time(server_loads(self.sizes, new_owner, len(live)), [rates[r] for r in live])
            actions = [("move", m.block, live[m.src], live[m.dst]) for m in moves]
            if moves and then < now * (1 - self.threshold) and tuple(actions) not in self.tabu:
                return self._start(actions, iteration_s)
            if moves and tuple(actions) in self.tabu:
                return []  # the best plan was just tried and undone: keep what we have
        return self._explore(table, live, rates, iteration_s)

    def _explore(self, table, live, rates, iteration_s) -> list[Action]:
        if self.max_servers and len(live) < self.max_servers and self.rng.random() < 0.5:
            return [("add", "psld")]
        loads = {r: 0 for r in live}
        for k, s in enumerate(table):
            loads[s] += self.sizes[k]
        slowest = max(live, key=lambda r: loads[r] / rates[r])
        blocks = [k for k, s in enumerate(table) if s == slowest]
        others = [r for r in live if r != slowest]
        if not blocks or not others:
            return []
        return self._start([("move", self.rng.choice(blocks), slowest, self.rng.choice(others))], iteration_s)

    def _start(self, actions: list[Action], iteration_s: float) -> list[Action]:
        undo = []
        for a in reversed(actions):
            if a[0] == "move":
                undo.append(("move", a[1], a[3], a[2]))
        self.trial = Trial(actions, undo, iteration_s)
        return actions

    def charge(self, pause_s: float) -> None:
        """The pause the current trial's migration cost (charged when it is judged)."""
        if self.trial is not None:
            self.trial.pause_s += pause_s

    def _rates(self, live: list[int], throughput: dict[int, float]) -> dict[int, float]:
        """Measured rates; a server idle this interval keeps its last measured rate, and
        one never measured (new) is assumed as fast as the best."""
        for r in live:
            if throughput.get(r, 0) > 0:
                self.known[r] = throughput[r]
        fallback = max((self.known[r] for r in live if r in self.known), default=1.0)
        return {r: self.known.get(r, fallback) for r in live}


__all__ = ["PsldController", "Trial"]
