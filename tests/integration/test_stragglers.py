"""Real stragglers: cgroup CPU quotas and a CPU-burning noisy neighbour in a worker's
cgroup slow that worker for real, the readings show it, and nothing is left behind."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import psutil
import pytest

import equipoise

from .helpers import records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists(),
                                 reason="needs root and the cgroup v1 cpu controller")]


def test_noisy_neighbour_in_a_cpu_limited_worker(small, tmp_path):
    # 28×28 inputs, so a step takes long enough (≈ 20 ms at 0.5 CPU) for the burner,
    # which needs a moment to start, to be there for most of the run.
    cfg = dict(small, model="cnn", dataset="synthetic", iterations=50, eval_every=0,
               checkpoint_every=0, cpu_limit=[0.5, 0.5], workers=2, servers=1, transport="ipc",
               neighbours=[{"worker": 0, "start": 0.0}])
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["iterations"] == 50
    its = records(tmp_path / "run", "iteration")[20:]
    slow = statistics.median(r["compute_s"][0] for r in its)
    fast = statistics.median(r["compute_s"][1] for r in its)
    assert slow > 1.3 * fast, (slow, fast)  # the burner takes about half of worker 0's quota
    print(f"neighboured worker {slow * 1e3:.1f} ms per step, other {fast * 1e3:.1f} ms")
    assert statistics.median(r["cpu"][0] for r in its) < statistics.median(r["cpu"][1] for r in its)
    # no burner process and no cgroup left behind
    burners = [p for p in psutil.process_iter(["cmdline"])
               if "sched_setaffinity" in " ".join(p.info["cmdline"] or [])]
    assert not burners
    assert not list(Path("/sys/fs/cgroup/cpu").glob(f"equipoise-{os.getpid()}-*"))


def test_a_straggler_trace_changes_who_is_slow(small, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("iteration,worker,factor\n0,0,5\n15,0,1\n15,1,5\n")
    cfg = dict(small, model="cnn", iterations=30, eval_every=0, checkpoint_every=0, workers=2,
               trace=str(trace))
    equipoise.train(cfg, out=tmp_path / "run")
    its = {r["iteration"]: r for r in records(tmp_path / "run", "iteration")}
    early = statistics.median(its[t]["compute_s"][0] / its[t]["compute_s"][1] for t in range(3, 14))
    late = statistics.median(its[t]["compute_s"][1] / its[t]["compute_s"][0] for t in range(18, 29))
    assert early > 2.5 and late > 2.5, (early, late)
