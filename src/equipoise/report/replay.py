"""Replay a run's recorded worker speeds through every speed predictor.

The predictors are pure (policy/predict.py), and metrics.jsonl holds what the coordinator
fed them — each worker's batch, compute seconds, CPU and memory per iteration — so their
one-step-ahead errors can be compared after the fact on exactly the same data, without
paying for NARX training during the run (about 9% of LB-BSP throughput here).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..policy.predict import make_predictor, measured_speed
from ..telemetry.metrics import read_metrics

NAMES = ("last", "ewma", "narx")


def replay_mape(run_dir: str | Path, names: tuple[str, ...] = NAMES) -> dict[str, float | None]:
    """Each predictor's MAPE over the run, averaged over workers (None if no data)."""
    everything = read_metrics(Path(run_dir) / "metrics.jsonl")
    records = [r for r in everything if r.get("type") == "iteration"]
    # each worker's fixed step cost, as its probe measured it (LB-BSP: a `fixed_cost` event)
    fixed = {r["worker"]: r["seconds"] for r in everything if r.get("event") == "fixed_cost"}
    by_iteration = {r["iteration"]: r for r in records}  # a resumed run: the later record wins
    predictors: dict[str, dict[int, object]] = {n: {} for n in names}
    for t in sorted(by_iteration):
        r = by_iteration[t]
        for i, w in enumerate(r["workers"]):
            x, c = r["batch"][i], r["compute_s"][i]
            if not x or not c or c <= 0:
                continue
            cpu, mem = (r.get("cpu") or [0.0] * len(r["workers"]))[i], (r.get("mem") or [0.0] * len(r["workers"]))[i]
            for n in names:
                predictors[n].setdefault(w, make_predictor(n)).observe(measured_speed(x, c, fixed.get(w, 0.0)),
                                                                       cpu or 0.0, mem or 0.0)
    out: dict[str, float | None] = {}
    for n, preds in predictors.items():
        errors = [p.mape for p in preds.values() if not math.isnan(p.mape)]
        out[n] = sum(errors) / len(errors) if errors else None
    return out
