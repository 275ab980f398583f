"""Evaluations on the coordinator's thread (coordinator/snapshots.py): one that falls
behind training is superseded by the newer one instead of queued, one still running when
the final one is due stops at its next batch; the final one always runs; summary.json's
evaluations and the job's time split."""

import threading
import time

import pytest
from torch import nn

from equipoise.api import timing_split
from equipoise.coordinator.snapshots import Snapshots, SnapshotSettings, State
from equipoise.workload import EvalAborted


class _Metrics:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


class _Data:
    """An evaluation set whose evaluation waits for `go` (a slow evaluation), asking
    `abort` between its batches of 10 ms, as Workload.evaluate does."""
    num_eval = 10

    def __init__(self):
        self.go, self.started, self.evaluated = threading.Event(), threading.Event(), []

    def evaluate(self, model, batch_size, limit, device, abort=None):
        self.started.set()
        deadline = time.monotonic() + 30
        while not self.go.wait(0.01):
            if abort is not None and abort():
                raise EvalAborted("aborted")
            assert time.monotonic() < deadline, "the test never released the evaluation"
        self.evaluated.append(limit)
        return {"accuracy": 0.5, "loss": 1.0}


def _snapshots(tmp_path, data, metrics):
    settings = SnapshotSettings(eval_every=1, eval_samples=5, checkpoint_every=0, timeout=30.0, target={})
    return Snapshots(settings, tmp_path, data, metrics, lambda: nn.Linear(1, 1), total=10)


def _take(s: Snapshots, t: int) -> None:
    s.take(t, State({}, {}, t, t), cursor=0, blocks=[], table=[], elapsed=float(t), want_eval=True,
           want_ckpt=False)


def test_an_evaluation_behind_training_is_superseded_and_the_final_one_runs(tmp_path):
    data, metrics = _Data(), _Metrics()
    s = _snapshots(tmp_path, data, metrics)
    try:
        _take(s, 2)  # begins, and waits for `go`
        assert data.started.wait(30)
        _take(s, 4)  # queued behind it
        _take(s, 6)  # supersedes 4
        _take(s, 8)  # supersedes 6; 2, still running, goes on: training is not waiting for it
        assert not s._pending[0][1].done()
        _take(s, 10)  # the final one supersedes 8, and 2 stops at its next batch
        assert s._pending[0][1].result(timeout=30) is None  # stopped without `go`
        data.go.set()
        done = s.results()
    finally:
        s.close()
    assert [r["iteration"] for r in done] == [10] and s.superseded == [4, 6, 8, 2]
    assert data.evaluated == [0]  # the final evaluation is of the whole set (limit 0)
    events = [(r["iteration"], r["by"], r.get("begun", False)) for r in metrics.records
              if r.get("event") == "eval_superseded"]
    assert events == [(4, 6, False), (6, 8, False), (8, 10, False), (2, 10, True)]


def test_an_evaluation_that_kept_up_is_not_superseded(tmp_path):
    data, metrics = _Data(), _Metrics()
    data.go.set()
    s = _snapshots(tmp_path, data, metrics)
    try:
        for t in (2, 4, 6, 10):
            _take(s, t)
            s._pending[-1][1].result(timeout=30)  # done before the next is due
        assert [r["iteration"] for r in s.results()] == [2, 4, 6, 10] and s.superseded == []
    finally:
        s.close()


def test_the_jobs_time_split_adds_up_to_its_wall_time():
    marks = {"first_iteration": 102.0, "trained": 130.0, "evaluated": 133.5}
    split = timing_split(100.0, 134.0, marks)
    assert split == {"startup_s": 2.0, "eval_s": 3.5, "shutdown_s": 0.5, "total_s": 34.0}
    # train_s (28 s here) is the coordinator's; the four parts make the whole
    assert split["startup_s"] + 28.0 + split["eval_s"] + split["shutdown_s"] == pytest.approx(split["total_s"])
    assert timing_split(100.0, 101.0, None) == {"total_s": 1.0}  # a job without marks
