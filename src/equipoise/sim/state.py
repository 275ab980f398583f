"""The simulated job's state that the two engines (engine.py) share: every worker's
scenario factor, the protocol state one ``ServerSync`` keeps for all servers, and the
servers' blocks, costs and measurements."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..config import Config
from ..policy.placement import placement_blocks
from ..policy.measure import PROBE_TRAIN, ProbeTrain, fixed_cost, probe_bytes, probed_rates, server_rates, server_reach, server_share
from ..policy.sync import ServerSync
from ..scenario import Scenario
from .cost import CostModel, state_copies


class WorkerFactors:
    """Every worker's scenario factor (static ``slowdown`` × ``trace``), kept current as
    time or iterations advance by applying the trace's rows in order: the values of
    ``Scenario.worker_factor`` for all workers at once, without a lookup per worker."""

    def __init__(self, scenario: Scenario, n: int):
        self.scenario, self.k = scenario, 0
        self.static = np.ones(0)
        self.trace = np.ones(0)
        self.grow(n)

    def grow(self, n: int) -> None:
        """Factors for ranks up to n − 1 (workers that joined); the trace is applied again
        from its first row at the next ``at``, so rows already passed reach them too."""
        old = len(self.static)
        if n > old:
            s = self.scenario.slowdown
            self.static = np.concatenate([self.static, [s.factor(w) if s else 1.0 for w in range(old, n)]])
            self.trace, self.k = np.ones(n), 0

    def advance(self, elapsed: float, iteration: int) -> None:
        """Apply the trace's rows due by ``elapsed`` seconds or ``iteration`` (its unit)."""
        trace = self.scenario.trace
        if trace is not None:
            at = elapsed if trace.unit == "time" else iteration
            rows, n = trace.rows, len(self.trace)
            while self.k < len(rows) and rows[self.k][0] <= at:
                _, w, f = rows[self.k]
                if w < n:
                    self.trace[w] = f
                self.k += 1

    def at(self, elapsed: float, iteration: int) -> np.ndarray:
        """Every worker's factor at that point (applied in order: points never go back)."""
        self.advance(elapsed, iteration)
        return self.static * self.trace


class _Sync(ServerSync):
    """``ServerSync`` with the SSP clock's minimum kept up to date, so that ``published``
    is O(1) instead of a min over every worker's clock (clocks only grow, one at a time)."""

    def __init__(self, policy, workers: int):
        super().__init__(policy, workers)
        self._at = Counter(self.clocks.values())
        self._min = 0

    def _advance(self) -> None:
        while self.clocks and self._at[self._min] == 0:
            self._min += 1

    def on_applied(self, update) -> None:
        if not self.policy.clocked:
            return super().on_applied(update)
        before = {p.worker: self.clocks[p.worker] for p in update.pushes if p.worker in self.clocks}
        super().on_applied(update)
        for w, c in before.items():
            self._at[c] -= 1
            self._at[self.clocks[w]] += 1
        self._advance()

    def members(self, workers: int, retired=()) -> None:
        gone = [self.clocks[w] for w in retired if w in self.clocks]
        super().members(workers, retired)
        for c in gone:
            self._at[c] -= 1
        self._advance()

    def published(self) -> int:
        if self.policy.clocked and self.clocks:
            return self._min
        return self.version


class Servers:
    """Blocks, the server of each, the live servers, their costs and what they did since
    the last measurement."""

    def __init__(self, cfg: Config, tensors, cost: CostModel, scenario: Scenario):
        self.cfg, self.cost, self.scenario = cfg, cost, scenario
        self.live = list(range(cfg.servers))
        self.per_byte = {r: self._per_byte(r, 0.0, 0) for r in self.live}
        rates = [1.0 / max(self.per_byte[r], 1e-300) for r in self.live]
        blocks, owner = placement_blocks(cfg.placement, tensors, cfg.servers, cfg.block_size, rates)
        self.sizes = np.array([b.nbytes for b in blocks], dtype=float)
        self.owner = np.array(owner, dtype=int)
        self.total = float(self.sizes.sum())
        self.busy: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()
        self.exchanges: Counter[int] = Counter()  # one worker's pushes and pulls with each server
        self.share = self.reach = 1.0  # the part of the last interval's wall time its slowest server took (its bytes)
        self.upper: dict[int, float] = {}  # rates with the whole fixed cost off (policy.psld)
        self.version = 0  # the block table's
        self.update(0.0, 0)

    def _per_byte(self, r: int, elapsed: float, t: int, load: float = 0.0) -> float:
        """Server r's seconds per byte; ``load`` its bytes held, of which each worker pushes
        and pulls a copy an iteration (the share of those its cap's burst lets through)."""
        caps = self.scenario.server_bandwidth
        cap = caps[r] if r < len(caps) else 0.0
        per_iteration = 2 * self.cfg.workers * load
        burst = min(1.0, self.cost.burst_bytes(cap) / per_iteration) if per_iteration > 0 else 0.0
        return self.cost.server_per_byte(self.scenario.server_factor(r, elapsed, t), cap, burst)

    def update(self, elapsed: float, t: int) -> None:
        self.at = (elapsed, t)
        loads = np.bincount(self.owner, weights=self.sizes, minlength=max(self.live) + 1)
        self.per_byte = {r: self._per_byte(r, elapsed, t, loads[r]) for r in self.live}

    def used(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks, bytes held, seconds per byte) of the live servers holding blocks."""
        loads = np.bincount(self.owner, weights=self.sizes, minlength=max(self.live) + 1)
        ranks = np.array([r for r in self.live if loads[r] > 0])
        return ranks, loads[ranks], np.array([self.per_byte[r] for r in ranks])

    def charge(self, ranks: np.ndarray, busy: np.ndarray, nbytes: np.ndarray, exchanges: int = 2) -> None:
        for r, s, b in zip(ranks.tolist(), busy.tolist(), nbytes.tolist()):
            self.busy[r] += s
            self.bytes[r] += b
            self.exchanges[r] += exchanges

    def move(self, block: int, dst: int, round_trip: bool = True) -> tuple[int, float]:
        """Move one block; (bytes moved with its optimizer state, seconds it took). Without
        ``round_trip`` it goes in a migration already paid for (the runtime's moves from
        one server to another in a plan: one message, one reply)."""
        src = int(self.owner[block])
        nbytes = int(self.sizes[block]) * state_copies(self.cfg)
        self.owner[block] = dst
        return nbytes, nbytes * (self.per_byte[src] + self.per_byte[dst]) + 2 * self.cost.latency * round_trip

    def probe(self, ranks: list[int], measured: dict[int, float]) -> tuple[dict[int, float], float]:
        """PSLD's probe of servers `ranks` (the runtime's ``ServerPool.probe``): a train of PROBE_TRAIN[0]
        probes of the first's largest block's bytes (``probe_bytes``), sent as ``ProbeTrain``
        says; the spacing of the last replies is each server's sustained time per probe
        (no load: no burst). The rates, and the seconds the train took (the train's probes
        and a round trip)."""
        size = probe_bytes(max((int(b) for b, o in zip(self.sizes, self.owner) if o == ranks[0]), default=0),
                           measured.get(ranks[0], 0.0))
        each = {r: size * self._per_byte(r, *self.at) for r in ranks}
        plan, free = ProbeTrain(ranks, PROBE_TRAIN[0], PROBE_TRAIN[2]), dict.fromkeys(ranks, 0.0)

        def handle(r: int, sent: float) -> float:  # a server handles its probes one at a time
            free[r] = max(free[r], sent) + each[r]
            return free[r]

        end = plan.run(handle)
        return (probed_rates(plan.seconds(0.0, PROBE_TRAIN[1]), size, 0.0, measured, ranks[0]),
                end + 2 * self.cost.latency)

    def measure(self, t: int, elapsed: float, iteration_s: float | None) -> tuple[dict, dict[int, float]]:
        """A "servers" record (as coordinator/server_manager.py writes it) and PSLD's throughputs."""
        ranks = sorted(self.live)
        loads = np.bincount(self.owner, weights=self.sizes, minlength=max(ranks) + 1)
        blocks = np.bincount(self.owner, minlength=max(ranks) + 1)
        # A server's time as the runtime measures it: its busy time plus each exchange's
        # round trip, a cost no byte causes (policy.psld.server_rates)
        seconds = {r: self.busy[r] + self.exchanges[r] * 2 * self.cost.latency for r in ranks}
        nbytes = {r: self.bytes[r] for r in ranks}
        fixed_s = fixed_cost(nbytes, seconds, max(self.exchanges.values(), default=0), self.cfg.workers,
                             2 * self.cost.latency)
        thr = server_rates(nbytes, seconds, fixed_s)
        self.share = server_share(seconds, self.cfg.psld_interval, iteration_s)
        self.reach = server_reach(seconds, fixed_s, self.cfg.psld_interval, iteration_s)
        self.upper = server_rates(nbytes, seconds, fixed_s, most=0.9)
        rec = {"type": "servers", "iteration": t, "elapsed": elapsed, "servers": ranks,
               "load_bytes": [int(loads[r]) for r in ranks], "blocks": [int(blocks[r]) for r in ranks],
               "busy_s": [self.busy[r] for r in ranks], "bytes": [int(self.bytes[r]) for r in ranks],
               "throughput_mbps": [thr.get(r, 0.0) / 1e6 for r in ranks], "fixed_s": fixed_s,
               "iteration_s": iteration_s,
               "table_version": self.version}
        self.busy.clear()
        self.bytes.clear()
        self.exchanges.clear()
        return rec, thr


__all__ = ["Servers", "WorkerFactors"]  # and _Sync, for engine.py
