"""Smoke test of the benchmarks: they import, their core functions run on tiny inputs and
their reports (Markdown table, JSON) are written. No timing is asserted, only that the
numbers exist and are positive."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_ddp, bench_wire, common

pytestmark = pytest.mark.timeout(120)


def test_wire_core_runs_on_a_tiny_payload(tmp_path):
    results = bench_wire.measure_wire([16_384], reps=2, warmup=1)  # 64 KB
    (r,) = results
    assert r.nbytes == 65_536
    assert len(r.raw_ms) == len(r.equipoise_ms) == 2
    assert all(t > 0 for t in r.raw_ms + r.equipoise_ms + r.push_ms + r.pull_ms)
    assert r.ratio > 0
    table = bench_wire.results_table(results)
    assert table.startswith("| payload") and "0.065536 MB" in table
    path = common.write_results("bench_wire", {"results": [r.summary()]}, tmp_path / "w.json")
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "bench_wire"
    assert doc["results"][0]["raw_median_ms"] > 0 and doc["results"][0]["equipoise_median_ms"] > 0
    assert doc["machine"]["cpus"] >= 1


def test_wire_profile_times_every_server_step():
    profile = bench_wire.profile_server(4096, reps=1)
    assert profile["server: store.check (isfinite)"] > 0
    assert profile["server: handle(push) total"] > 0
    assert profile["server: handle(pull) total"] > 0


def test_ddp_comparison_runs_a_tiny_job(tmp_path):
    # The synthetic data set needs no files and no scikit-learn import: ~13 s in all.
    spec = bench_ddp.Spec(model="mlp", dataset="synthetic", workers=2, servers=1, global_batch=32,
                          iterations=6, warmup=2)
    result = bench_ddp.compare(spec, reps=1)
    eq, ddp = result["equipoise"], result["ddp"]
    assert eq["samples_per_s"] > 0 and ddp["samples_per_s"] > 0 and result["ratio"] > 0
    assert 0 <= eq["barrier_wait_fraction"] <= 1
    # Same job, same initial weights, same samples: both trained the same model.
    assert eq["final_train_loss"] == pytest.approx(ddp["final_train_loss"], rel=1e-3)
    assert "| samples/s (median)" in bench_ddp.results_table(result)
    doc = json.loads(common.write_results("bench_ddp", result, tmp_path / "d.json").read_text())
    assert doc["ddp"]["samples_per_s"] > 0 and len(doc["runs"]["equipoise"]) == 1


def test_ddp_steady_rate_and_spec_checks(tmp_path):
    spec = bench_ddp.Spec(iterations=4, warmup=1, global_batch=8, workers=2)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"type": "iteration", "iteration": t, "time": 100.0 + t}) + "\n"
                               for t in range(4)))
    assert bench_ddp._steady_rate(metrics, spec) == pytest.approx(3 * 8 / 3.0)
    with pytest.raises(ValueError):
        bench_ddp.Spec(workers=3, global_batch=128).check()


def test_common_helpers():
    assert common.median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(common.ratio(1.0, 0.0))
    calls: list[str] = []
    out = common.interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2},
                            reps=2, warmup=1)
    assert calls == ["a", "b", "a", "b", "a", "b"] and out == {"a": [1, 1], "b": [2, 2]}
    table = common.markdown_table(["x", "y"], [[1, 0.5], [None, float("nan")]])
    assert table.splitlines()[2] == "| 1 | 0.5 |"
