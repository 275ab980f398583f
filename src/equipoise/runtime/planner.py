"""Per-iteration plans: who trains on which slice of the global sample order.

Barrier protocols (BSP, LB-BSP) cut iteration t's global batch [tX, (t+1)X) into one
contiguous slice per worker, in worker order, with sizes from the batching policy. ASP
hands out the next μ positions of the stream to whichever worker asks.
"""

from __future__ import annotations

from typing import Mapping

from ..config import Config
from ..policy import batching
from ..policy.predict import make_predictor


class Planner:
    def __init__(self, cfg: Config, workers: list[int]):
        self.cfg = cfg
        self.workers = sorted(workers)
        self.predictors = {w: make_predictor(cfg.predictor) for w in self.workers}
        self.policy = None
        self._observed = False
        self._last_compute: dict[int, float] = {}
        if cfg.protocol == "lbbsp":
            caps = {w: cfg.max_batch for w in self.workers} if cfg.max_batch else None
            self.policy = batching.make_batch_policy(cfg.batch_policy, cfg.global_batch,
                                                     minimum=cfg.min_batch, caps=caps)

    def sizes(self) -> dict[int, int]:
        """Batch sizes for the next iteration, given everything observed so far."""
        cfg = self.cfg
        if cfg.batch_split:
            return dict(zip(self.workers, cfg.batch_split))
        if self.policy is None or not self._observed:
            return dict(zip(self.workers, batching.equal_split(cfg.global_batch, len(self.workers))))
        if cfg.batch_policy == "step":
            return self.policy.decide(self._last_compute)
        speeds = {w: self.predictors[w].predict() for w in self.workers}
        return self.policy.decide(speeds)

    def observe(self, reports: Mapping[int, dict]) -> None:
        """Feed one iteration's worker reports to the speed predictors."""
        self._observed = True
        self._last_compute = {w: max(r["compute_s"], 1e-9) for w, r in reports.items()}
        for w, r in reports.items():
            speed = r["samples"] / max(r["compute_s"], 1e-9)
            self.predictors[w].observe(speed, r.get("cpu", 0.0), r.get("mem", 0.0))

    def mape(self) -> dict[int, float]:
        return {w: p.mape for w, p in self.predictors.items()}

    @staticmethod
    def slices(sizes: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """(offset, size) of each worker's contiguous slice, in worker order."""
        out, offset = {}, 0
        for w in sorted(sizes):
            out[w] = (offset, sizes[w])
            offset += sizes[w]
        return out
