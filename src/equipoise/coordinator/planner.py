"""Per-iteration plans: who trains on which slice of the global sample order.

Barrier protocols (BSP, LB-BSP) cut iteration t's global batch [tX, (t+1)X) into one
contiguous slice per worker, in worker order, with sizes from the batching policy. ASP
hands out the next μ positions of the stream to whichever worker asks.

Every predictor (last value, EWMA, NARX) watches every worker's speed in the same run,
so their errors (MAPE) are compared on identical data; the configured one drives LB-BSP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..config_checks import PREDICTORS
from ..policy import batching
from ..policy.predict import Predictor, make_predictor, measured_speed
from ..protocol.fields import read_field


class CapError(ValueError):
    """The workers' caps cannot hold the global batch (one line: what to change)."""


@dataclass(frozen=True)
class PlanSettings:
    """The configuration the planner reads."""

    protocol: str
    global_batch: int
    batch_split: tuple[int, ...]
    batch_policy: str
    predictor: str
    shadow_predictors: bool
    min_batch: int
    max_batch: int
    hysteresis: float


REMEASURE_EVERY = 20  # plans in a row a worker may get no samples before one is given it to measure


class Planner:
    def __init__(self, cfg: PlanSettings, workers: list[int]):
        self.cfg = cfg
        self.workers: list[int] = []
        # Predictors only serve LB-BSP; other protocols should not pay for NARX training.
        names = () if cfg.protocol != "lbbsp" else PREDICTORS if cfg.shadow_predictors else (cfg.predictor,)
        self.predictors: dict[str, dict[int, Predictor]] = {name: {} for name in names}
        self.comm: dict[int, float] = {}
        self.policy = None
        self._last_compute: dict[int, float] = {}
        self._last_samples: dict[int, int] = {}
        self.fixed: dict[int, float] = {}  # each worker's step cost that does not grow with its batch
        self.memory_caps: dict[int, int] = {}  # the most samples each worker's memory holds (probe, or an OOM)
        self._idle: dict[int, int] = {}  # plans in a row that gave each worker no samples
        if cfg.protocol == "lbbsp":
            kw = {"minimum": cfg.min_batch}
            if cfg.batch_policy == "proportional":
                kw["hysteresis"] = cfg.hysteresis
            self.policy = batching.make_batch_policy(cfg.batch_policy, cfg.global_batch, **kw)
        self.set_workers(workers)

    def set_workers(self, workers: list[int]) -> None:
        """Membership changed: later plans split the global batch among `workers`."""
        self.workers = sorted(workers)
        for name, preds in self.predictors.items():
            for w in self.workers:
                preds.setdefault(w, make_predictor(name))
        self._set_caps()

    def cap(self, worker: int) -> int | None:
        """The most samples `worker` may get: `max_batch` and its memory cap."""
        caps = [c for c in (self.cfg.max_batch, self.memory_caps.get(worker)) if c]
        return min(caps) if caps else None

    def set_memory_cap(self, worker: int, cap: int) -> None:
        """`worker`'s memory holds at most `cap` samples (a probe measured it, or a step
        ran out of memory above it): no plan gives it more. A cap only ever falls (a
        worker that starts again after a rollback sends its probe's cap again)."""
        self.memory_caps[worker] = max(1, min(int(cap), self.memory_caps.get(worker, int(cap))))
        self._set_caps()

    def take_probes(self, worker: int, f: dict) -> tuple[float | None, int | None]:
        """What a worker's probes measured, sent with its first plan request: the batch
        its device memory holds (`memory_cap`), a step's fixed seconds (`fixed_s`).
        Returns the fixed seconds and the worker's cap now (None: not sent); FieldError
        (a ValueError) naming a malformed one, and nothing taken."""
        who = f"plan request of worker {worker}"
        cap, fixed = read_field(f, "memory_cap", int, who=who, least=1), read_field(f, "fixed_s", float, who=who, least=0)
        if fixed is not None:
            self.set_fixed_cost(worker, fixed)
        if cap is not None:
            self.set_memory_cap(worker, cap)
        return fixed, None if cap is None else self.memory_caps[worker]

    def set_fixed_cost(self, worker: int, seconds: float) -> None:
        """`worker`'s step takes `seconds` whatever its batch (its probe): its compute is
        modelled as F + n / v, not n / v."""
        self.fixed[worker] = max(0.0, float(seconds))

    def _set_caps(self) -> None:
        if self.policy is not None:
            self.policy.caps = {w: c for w in self.workers if (c := self.cap(w)) is not None}
            # a memory cap is hard: below min_batch, it lowers the policy's minimum
            self.policy.minimum = min([self.cfg.min_batch, *self.policy.caps.values()])

    def sizes(self) -> dict[int, int]:
        """Batch sizes for the next iteration, given everything observed so far; none
        above a worker's cap (`max_batch`, its memory). A worker planned no samples
        by LB-BSP (`min_batch` 0) for REMEASURE_EVERY plans in a row gets one sample,
        from the largest share, so that its speed is measured again (a slowdown that
        has passed)."""
        sizes = self._capped(self._sizes())
        if self.policy is None or self.cfg.batch_split:  # a split of the user's: as given
            return sizes
        for w, n in sizes.items():
            self._idle[w] = self._idle.get(w, 0) + 1 if n == 0 else 0
        for w in [w for w, k in self._idle.items() if k >= REMEASURE_EVERY and w in sizes]:
            donor = max(sizes, key=lambda d: (sizes[d], -d))
            if sizes[donor] > 1:
                sizes[donor], sizes[w], self._idle[w] = sizes[donor] - 1, 1, 0
        return sizes

    def _capped(self, sizes: dict[int, int]) -> dict[int, int]:
        caps = {w: self.cap(w) for w in sizes}
        if all(c is None or sizes[w] <= c for w, c in caps.items()):
            return sizes
        ws = sorted(sizes)
        if sum(caps[w] or self.cfg.global_batch for w in ws) < self.cfg.global_batch:
            raise CapError(f"the workers' caps {[caps[w] for w in ws]} (max_batch, device memory) hold fewer "
                           f"than the global batch of {self.cfg.global_batch} samples: lower global_batch or "
                           "add workers")
        # The same shares, within the caps (any split of the global batch is the same step).
        fixed = batching.allocate(self.cfg.global_batch, [max(sizes[w], 1e-9) for w in ws],
                                  minimum=0, caps=[caps[w] for w in ws])
        return dict(zip(ws, fixed))

    def _sizes(self) -> dict[int, int]:
        cfg, ws = self.cfg, self.workers
        if cfg.batch_split and len(ws) == len(cfg.batch_split):
            return dict(zip(ws, cfg.batch_split))
        if self.policy is None or not all(w in self._last_compute for w in ws):
            return dict(zip(ws, batching.equal_split(cfg.global_batch, len(ws))))
        if cfg.batch_policy == "step":
            return self.policy.decide({w: self._last_compute[w] for w in ws})
        if cfg.batch_policy == "model":  # the sizes the times were measured with
            return self.policy.decide({w: self._last_compute[w] for w in ws},
                                      {w: self._last_samples[w] for w in ws})
        chosen = self.predictors[cfg.predictor]
        speeds = {w: chosen[w].predict() for w in ws}
        return self.policy.decide(speeds, {w: self.comm.get(w, 0.0) + self.fixed.get(w, 0.0) for w in ws})

    def observe(self, reports: Mapping[int, dict]) -> None:
        """Feed one iteration's worker reports to every predictor."""
        for w, r in reports.items():
            if w not in self.workers:
                continue
            # The per-iteration constant cost of LB-BSP's c_i + x_i/v_i = T: communication (+ F, below).
            self.comm[w] = 0.7 * self.comm.get(w, float(r["comm_s"])) + 0.3 * float(r["comm_s"])
            if r["samples"] <= 0:  # planned none (min_batch = 0): no step to learn its speed from
                continue
            compute = max(float(r["compute_s"]), 1e-9)
            self._last_compute[w] = compute
            self._last_samples[w] = int(r["samples"])
            for preds in self.predictors.values():
                preds[w].observe(measured_speed(r["samples"], compute, self.fixed.get(w, 0.0)), r.get("cpu", 0.0), r.get("mem", 0.0))

    def predict(self, worker: int) -> float:
        """The configured predictor's speed (samples/s) of `worker` next iteration."""
        return self.predictors[self.cfg.predictor][worker].predict()

    def mape(self) -> dict[str, float | None]:
        """Each predictor's mean absolute percentage error, averaged over workers."""
        out: dict[str, float | None] = {}
        for name, preds in self.predictors.items():
            errors = [p.mape for p in preds.values() if not math.isnan(p.mape)]
            out[name] = sum(errors) / len(errors) if errors else None
        return out

    @staticmethod
    def slices(sizes: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """(offset, size) of each worker's contiguous slice, in worker order."""
        out, offset = {}, 0
        for w in sorted(sizes):
            out[w] = (offset, sizes[w])
            offset += sizes[w]
        return out


__all__ = ["CapError", "Planner"]
