"""LB-BSP with real processes: batch sizes change every iteration, workers leave and
join, and the parameters still equal single-process SGD with the global batch X."""

from __future__ import annotations

import pytest
import torch

import equipoise
from equipoise.config import Config
from equipoise.reference import train_reference

from .helpers import records

pytestmark = pytest.mark.timeout(180)


def _assert_reference(cfg: dict, run_dir) -> None:
    ref = train_reference(Config.from_dict(cfg)).state_dict()
    got = torch.load(run_dir / "model.pt", weights_only=True)
    for name in ref:
        assert torch.allclose(got[name], ref[name], atol=1e-5, rtol=0), name


def test_sizes_change_every_iteration_and_training_equals_sgd(small, tmp_path):
    trace = tmp_path / "trace.csv"
    rows = ["iteration,worker,factor"]
    for t in range(0, 30):  # the slow worker moves every iteration
        rows += [f"{t},{w},{6.0 if w == t % 4 else 1.0}" for w in range(4)]
    trace.write_text("\n".join(rows) + "\n")
    cfg = dict(small, protocol="lbbsp", predictor="last", hysteresis=0.0, iterations=24, model="cnn",
               trace=str(trace), seed=5, momentum=0.9, weight_decay=1e-4)
    summary = equipoise.train(cfg, out=tmp_path / "run")
    batches = [r["batch"] for r in records(tmp_path / "run", "iteration")]
    assert all(sum(b) == 64 for b in batches)
    changes = sum(a != b for a, b in zip(batches, batches[1:]))
    assert changes >= 0.8 * (len(batches) - 1), batches
    assert summary["barrier_wait_fraction"] < 1
    _assert_reference(cfg, tmp_path / "run")


def test_workers_leave_and_join_and_training_equals_sgd(small, tmp_path):
    cfg = dict(small, protocol="bsp", iterations=24, seed=2,
               membership=[{"iteration": 8, "leave": 1}, {"iteration": 14, "join": 2}])
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["samples"] == 24 * 64
    events = [(r["event"], r["iteration"], r.get("worker")) for r in records(tmp_path / "run", "event")]
    assert ("worker_left", 8, 1) in events
    assert ("worker_joined", 14, 4) in events and ("worker_joined", 14, 5) in events
    its = {r["iteration"]: r for r in records(tmp_path / "run", "iteration")}
    assert its[7]["workers"] == [0, 1, 2, 3]
    assert its[8]["workers"] == [0, 2, 3] and sum(its[8]["batch"]) == 64
    assert its[14]["workers"] == [0, 2, 3, 4, 5] and sum(its[14]["batch"]) == 64
    _assert_reference(cfg, tmp_path / "run")
