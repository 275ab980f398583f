"""Smoke test of the benchmarks: they import, their core functions run on tiny inputs and
their reports (Markdown table, JSON) are written. No timing is asserted, only that the
numbers exist and are positive."""

from __future__ import annotations

import json
import math
import tempfile

import pytest

from benchmarks import bench_ddp, bench_wire, common, wire_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # runs the benchmarks' jobs


def test_wire_core_runs_on_a_tiny_payload(tmp_path):
    results = bench_wire.measure_wire([16_384], reps=2, warmup=1, parts=4)  # 64 KB; streamed in 4 blocks
    (r,) = results
    assert r.nbytes == 65_536 and r.parts == 4
    assert len(r.raw_ms) == len(r.equipoise_ms) == len(r.streamed_ms) == len(r.raw_streamed_ms) == 2
    assert all(t > 0 for t in r.raw_ms + r.equipoise_ms + r.push_ms + r.pull_ms)
    assert r.ratio > 0
    table = bench_wire.results_table(results)
    assert table.startswith("| payload") and "0.065536 MB" in table
    path = common.write_results("bench_wire", {"results": [r.summary()]}, tmp_path / "w.json")
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "bench_wire"
    assert doc["results"][0]["raw_median_ms"] > 0 and doc["results"][0]["equipoise_median_ms"] > 0
    assert doc["results"][0]["streamed"]["n"] == 2 and doc["results"][0]["streamed_ratio"] > 0
    assert doc["machine"]["cpus"] >= 1


def test_wire_auth_comparison_runs_on_a_tiny_payload():
    (r,) = bench_wire.measure_auth([16_384], reps=2, warmup=1)
    assert set(r["ms"]) == {"off", "curve", "plain"} and all(len(v) == 2 for v in r["ms"].values())
    assert all(r["min_ms"][m] <= r["median_ms"][m] <= r["max_ms"][m] for m in r["ms"])
    assert "curve ms median (min–max)" in bench_wire.auth_table([r])


def test_wire_profile_times_every_server_step():
    profile = wire_profile.profile_server(4096, reps=1)
    assert profile["server: store.check (finite check)"] > 0
    assert profile["server: handle(push) total"] > 0
    assert profile["server: handle(pull) total"] > 0
    # a real server process, the exchange streamed in 4 blocks: each fragment's steps timed
    streamed = wire_profile.profile_server_process(4096, reps=2, parts=4)
    assert {"server: _on_fragment total (check+keep+ahead+early)", "server: decode fragment",
            "server: a block updated ahead (speculate)"} <= streamed.keys()


def _single_process_loss(spec: bench_ddp.Spec) -> float:
    """The global-batch loss of the last iteration of plain single-process SGD."""
    import torch
    import torch.nn.functional as F

    from equipoise.data import SliceSampler, load_dataset
    from equipoise.models import build_model

    data = load_dataset(spec.dataset, seed=spec.seed)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, data.input_shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    sampler = SliceSampler(len(data), spec.global_batch, spec.seed)
    for t in range(spec.iterations):
        x, y = data.train_batch(sampler.batch(t))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return float(loss.detach())


def test_ddp_side_trains_the_same_sgd():
    # Only the DDP side (two spawned ranks, ~7 s): a whole comparison also runs an
    # equipoise job, 13-40 s on the shared machine; equipoise jobs are exercised by the
    # integration tests. The synthetic data set needs no files and no scikit-learn.
    spec = bench_ddp.Spec(model="mlp", dataset="synthetic", workers=2, servers=1, global_batch=32,
                          iterations=6, warmup=2)
    out = bench_ddp.run_ddp(spec)
    assert out["samples"] == 4 * 32 and out["samples_per_s"] > 0
    # Rank r trained on slice r of every global batch: together, SGD on the global batch.
    assert out["final_train_loss"] == pytest.approx(_single_process_loss(spec), rel=1e-4)


def test_ddp_report_steady_rate_and_summary_keys(tmp_path):
    from equipoise.config import Config
    from equipoise.coordinator.stats import RunStats

    spec = bench_ddp.Spec(iterations=4, warmup=1, global_batch=8, workers=2)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"type": "iteration", "iteration": t, "time": 100.0 + t}) + "\n"
                               for t in range(4)))
    assert bench_ddp._steady_rate(metrics, spec) == pytest.approx(3 * 8 / 3.0)
    with pytest.raises(ValueError):
        bench_ddp.Spec(workers=3, global_batch=128).check()
    # run_equipoise reads these keys of a job's summary.
    summary = RunStats(8).summary(Config(), 1, {}, wall_s=1.0)
    assert {"samples_per_s", "barrier_wait_fraction", "train_s", "wall_s", "compute_s", "wait_s",
            "comm_s", "final_train_loss", "final_accuracy"} <= summary.keys()
    eq = {"samples_per_s": 90.0, "steady_samples_per_s": 95.0, "barrier_wait_fraction": 0.1,
          "compute_fraction": 0.6, "comm_fraction": 0.3, "final_train_loss": 1.0, "elapsed_s": 2.0}
    result = {"equipoise": eq, "ddp": {"samples_per_s": 100.0, "final_train_loss": 1.0, "elapsed_s": 1.0},
              "ratio": 0.9, "steady_ratio": 0.95, "pair_ratios": [0.9], "median_pair_ratio": 0.9}
    table = bench_ddp.results_table(result)
    assert "| samples/s (median)" in table and "| 0.9 " in table
    doc = json.loads(common.write_results("bench_ddp", result, tmp_path / "d.json").read_text())
    assert doc["ratio"] == 0.9 and doc["benchmark"] == "bench_ddp"


def test_common_helpers():
    assert common.median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(common.ratio(1.0, 0.0))
    calls: list[str] = []
    out = common.interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2},
                            reps=2, warmup=1)
    assert calls == ["a", "b", "a", "b", "a", "b"] and out == {"a": [1, 1], "b": [2, 2]}
    calls.clear()
    systems = {n: (lambda n=n: calls.append(n) or n) for n in ("a", "b", "c", "x", "y", "z")}
    out = common.interleave(systems, reps=3, rotate=3)  # each three start one later per round
    assert "".join(calls) == "abcxyz" + "bcayzx" + "cabzxy" and out["b"] == ["b"] * 3
    table = common.markdown_table(["x", "y"], [[1, 0.5], [None, float("nan")]])
    assert table.splitlines()[2] == "| 1 | 0.5 |"


def test_rudra_study_summarises_rounds_against_hardsync_and_plots(tmp_path):
    from benchmarks import bench_rudra

    def run(acc, sigma, speed, error=None):
        r = dict(final_accuracy=acc, staleness_mean=sigma, staleness_max=2 * sigma, samples_per_s=speed,
                 barrier_wait_fraction=0.0)
        return dict(r, error=error) if error else r

    runs = [{"seed": seed, "hardsync": run(0.86 + d, 0.0, 7000.0), "1-softsync none": run(0.84 + d, 1.0, 8000.0),
             "4-softsync none": run(0.30 + d, 4.0, 7000.0 * (1 + d)),
             "1-softsync per_gradient": run(0.85, 1.0, 8000.0),
             "4-softsync per_gradient": run(math.nan, math.nan, math.nan, "JobError: diverged") if seed == 2
             else run(0.85, 4.0, 8000.0)}
            for seed, d in ((0, 0.0), (1, 0.01), (2, 0.02))]
    systems = bench_rudra.summarise(runs, list(runs[0])[1:], "hardsync")
    assert systems["4-softsync none"]["delta_points"]["median"] == pytest.approx(-56.0)  # paired by round, in points
    assert systems["4-softsync none"]["speedup"]["max"] == pytest.approx(1.02)
    assert systems["4-softsync per_gradient"]["final_accuracy"]["n"] == 2
    text = bench_rudra.study_table(systems)
    assert "hardsync (bsp)" in text and "4-softsync" in text and "1 failed: JobError" in text
    assert "-56.0 (-56.0–-56.0)" in text
    path = bench_rudra.plot_study(systems, tmp_path / "acc.png")
    assert path.stat().st_size > 10_000


def test_psld_settling_is_counted_from_the_switch():
    from benchmarks import psld_job

    spec = psld_job.Spec(scenario="dynamic", iterations=60, switch=20, interval=5, settled=20)
    times = {5: 0.05, 10: 0.05, 15: 0.05, 20: 0.05, 25: 0.2, 30: 0.12, 35: 0.052, 40: 0.05, 45: 0.05,
             50: 0.05, 55: 0.05, 60: 0.05}
    records = [{"iteration": i, "iteration_s": t} for i, t in times.items()]
    assert psld_job.settle_after(records, spec) == 15  # the interval ending at 35 is back within 1.1×
    slow = [{"iteration": i, "iteration_s": 0.2 if 20 < i < 45 else 0.05} for i in times]
    assert psld_job.settle_after(slow, spec) == 25


def test_results_name_the_command_relative_to_the_checkout(monkeypatch):
    import sys
    from pathlib import Path

    root = Path(common.__file__).resolve().parent.parent
    monkeypatch.setattr(sys, "argv", [str(root / "benchmarks" / "bench_x.py"), "--keep", "/tmp/x"])
    assert common.relative_argv() == ["benchmarks/bench_x.py", "--keep", "/tmp/x"]


def test_live_view_cost_preset_interleaves_and_draws_the_view(tmp_path, monkeypatch):
    """The harness (the jobs, live view on, are test_live's): the variants interleaved,
    each under its own settings, the view drawn as on a terminal."""
    from benchmarks import bench_costs
    from equipoise.telemetry.progress import ProgressDisplay

    with bench_costs.terminal():  # what the "live view" variant runs under
        display = ProgressDisplay(10, enabled=True)
        drawn = display._progress is not None  # the bar and the view, not plain lines
        display.close()
    assert drawn
    calls = []

    def fake(spec, extra):
        calls.append(dict(extra))
        return 80.0 if extra.get("progress") else 100.0

    monkeypatch.setattr(bench_costs, "_run_variant", fake)
    result = bench_costs.run("live-ci", results_path=str(tmp_path / "live.json"), reps=2)
    assert calls == [{}, {"progress": True}] * 2
    rows = result["results"]
    assert list(rows) == ["default", "live view"]
    assert all(r["runs"] == [r["median"]] * 2 for r in rows.values())
    assert rows["default"]["ratio_to_default"] == 1.0 and rows["live view"]["ratio_to_default"] == 0.8
    assert json.loads((tmp_path / "live.json").read_text())["preset"] == "live-ci"


def test_testbed_wire_times_take_the_floor_from_the_last_worker_to_send(tmp_path):
    """bench_testbed's per-iteration split: iterations from record to record, the plan's
    round trip of the last worker to report (the shortest), and the floor: the latest
    first fragment plus the gradient's link time."""
    from benchmarks import bench_testbed

    def record(t, first):  # two workers; worker 1 sends its first fragment `first` s into its step
        return {"type": "iteration", "iteration": t, "elapsed": 0.25 * t, "batch": [8, 8], "compute_s": [0.05, 0.07],
                "gap_s": [0.1, 0.1],
                "timeline": [[["plan", -1, -0.03, -0.001, []], ["fragment", 0, 0.02, None, [1]],
                              ["early", 0, 0.01, 0.2, [1]], ["push", 0, 0.06, 0.21, [0]]],
                             [["plan", -1, -0.004, -0.001, []], ["fragment", 1, first, None, [1]],
                              ["push", 1, 0.08, 0.22, [0]]]]}

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(record(t, 0.04 + 0.01 * t)) + "\n" for t in range(5)))
    w = bench_testbed.wire_times(metrics, warmup=1, link_s=0.135)
    assert w["iteration_s"] == pytest.approx(0.25) and w["plan_last_s"] == pytest.approx(0.003)
    assert w["bound_s"] == pytest.approx(0.135 + 0.04 + 0.01 * 2.5)  # median of iterations 1-4
    assert w["first_fragment_s"] == pytest.approx((0.02 + 0.05) / 2)  # over (iteration, worker): 4 × 0.02, 0.05-0.08
    assert w["last_early_s"] == pytest.approx(0.2) and w["last_ack_s"] == pytest.approx(0.215)
    assert "bound_s" not in bench_testbed.wire_times(metrics, warmup=1)  # no link rate: no floor


def test_results_folder_refuses_a_dirty_checkout(tmp_path, monkeypatch):
    """benchmarks/results/ only takes results of committed code: with uncommitted
    changes the write is refused (exit status 2) and nothing lands in the folder."""
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the refused results are kept aside
    monkeypatch.setattr(common, "git_state", lambda: {"commit": "0" * 40, "dirty": True,
                                                      "src_changes": ["M src/x.py"]})
    with pytest.raises(common.DirtyCheckout) as err:
        common.write_results("bench_x", {"a": 1})
    assert err.value.code != 0 and "uncommitted" in str(err.value) and not (tmp_path / "bench_x.json").exists()
    assert (tmp_path / "bench_x.dirty.json").exists()
    monkeypatch.setattr(common, "git_state", lambda: {"commit": "0" * 40, "dirty": False, "src_changes": []})
    doc = json.loads(common.write_results("bench_x", {"a": 1}).read_text())
    assert doc["machine"]["git"]["commit"] == "0" * 40 and doc["a"] == 1


def test_summary_is_median_min_max_of_the_finite_values():
    s = common.summary([3.0, 1.0, math.nan, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)


def test_psld_slow_servers_come_from_the_placement_rules():
    from benchmarks import psld_job

    # cnn on 28×28: MXNet keeps the 401,408-element layer whole on server (index·9973) mod 4 = 0,
    # BytePS's djb2 hash of its name picks server 1; greedy's first (largest) block goes to server 0
    spec = psld_job.Spec(cases=("greedy", "mxnet", "byteps", 2))
    assert psld_job.slow_servers(spec) == {0: ["greedy's largest block", "mxnet's most bytes"],
                                             1: ["byteps's most bytes"], 2: ["server 2"]}


def test_psld_ratios_are_taken_within_each_round():
    from benchmarks import bench_psld

    def rounds(*pairs):
        return [{"iteration_s": a, "settled_iteration_s": b} for a, b in pairs]

    runs = {"psld": rounds((1.0, 1.0), (2.0, 1.0)), "mxnet": rounds((4.0, 4.0), (4.0, 2.0)),
            "oracle": rounds((0.5, 0.5), (1.0, 1.0))}
    r = bench_psld.round_ratios(runs)
    assert r["psld speed-up × mxnet"]["values"] == [4.0, 2.0]
    assert r["psld speed-up × mxnet settled"]["values"] == [4.0, 2.0]
    assert r["psld settled × oracle"]["values"] == [2.0, 1.0] and r["psld settled × oracle"]["median"] == 1.5


def test_async_benchmark_pairs_rounds_against_hardsync():
    from benchmarks import bench_async

    def run(acc, speed, ttt, error=None):
        r = dict(final_accuracy=acc, samples_per_s=speed, staleness_mean=2.0, time_to_target=ttt, delay_mean=2.0,
                 momentum_mean=0.66, train_s=10.0)
        return dict(r, error=error) if error else r

    runs = [{"seed": s, "hardsync": run(0.84 + d, 100.0, 4.0), "4-softsync": run(0.85 + d, 150.0, 2.0),
             "asp": run(math.nan, math.nan, math.nan, "JobError: diverged") if s == 2 else run(0.80, 120.0, 8.0)}
            for s, d in ((0, 0.0), (1, 0.01), (2, 0.02))]
    systems = bench_async.summarise(runs, "hardsync")
    assert systems["4-softsync"]["delta_points"]["median"] == pytest.approx(1.0)  # in points, paired by round
    assert systems["4-softsync"]["time_to_target_ratio"]["median"] == pytest.approx(2.0)  # hardsync's time ÷ this
    assert systems["asp"]["final_accuracy"]["n"] == 2 and systems["asp"]["errors"] == ["JobError: diverged"]
    text = bench_async.accuracy_table(systems, speed=True)
    assert "1 failed: JobError" in text and "1.50" in text
    assert "2.00" in bench_async.target_table(systems)


def test_overlap_benchmark_interleaves_the_sides_and_summarises_each_round(tmp_path, monkeypatch):
    """The harness (bench_overlap's jobs are the ones test_backward_push runs): the four
    sides interleaved per model, medians and each side's ratio to `off` per round."""
    from benchmarks import bench_overlap

    calls = []

    def fake(model, iterations, warmup, side):
        calls.append((model, side))
        rate = {"off": 100.0 + len(calls), "push": 150.0, "pipelined": 200.0, "eager": 250.0}[side]
        return {"samples_per_s": rate, "gap_s": 0.01, "compute_s": 0.05, "iterations": iterations - warmup}

    monkeypatch.setattr(bench_overlap, "run_job", fake)
    result = bench_overlap.run("ci", results=str(tmp_path / "o.json"), reps=2)
    assert calls == [("mlp", "off"), ("mlp", "push"), ("mlp", "pipelined"), ("mlp", "eager")] * 2
    r = result["models"]["mlp"]
    assert r["pipelined_ratio"]["min"] == 200 / 105 and r["pipelined_ratio"]["max"] == 200 / 101
    assert r["push_samples_per_s"]["median"] == 150 and "| mlp " in bench_overlap.results_table(result)
    assert json.loads((tmp_path / "o.json").read_text())["benchmark"] == "bench_overlap"


def test_the_unseen_sweep_draws_every_kind_of_case_nobody_tuned_on():
    """bench_psld's `unseen` preset: its seeded cases are the same on every run and span
    what the sweep promises (every block-size shape, the slow server at every position,
    2-8 servers, links of 50-1,000 MB/s, slowdowns of 2-6x, static and moving, BSP and
    SSP); each case's slow server and switch target are ranks of its own servers."""
    from benchmarks import psld_job, psld_sweep

    base = psld_job.PRESETS["unseen"]
    cases = psld_sweep.random_cases(base.seed, 20)
    assert cases == psld_sweep.random_cases(base.seed, 20)
    assert {c["shape"] for c in cases} == {s for _, _, s in psld_sweep.SHAPES}
    assert {c["where"] for c in cases} == set(psld_sweep.WHERE)
    assert {c["scenario"] for c in cases} == {"static", "dynamic"} and {c["protocol"] for c in cases} == {"bsp", "ssp"}
    assert all(2 <= c["servers"] <= 8 and 50 <= c["bandwidth"] <= 1000 and 2 <= c["factor"] <= 6 for c in cases)
    for case in cases:
        spec, slow = psld_sweep.case_spec(base, case)
        assert 0 <= slow < spec.servers and 0 <= spec.switch_to < spec.servers and spec.switch_to != slow


def test_the_plain_loop_is_the_jobs_training(tmp_path):
    """bench_startup compares equipoise with benchmarks/plain_loop.py: the loop must train
    what a one-worker job trains. Its weights equal the single-process oracle's
    (reference.train_reference: the same seed, samples and SGD with the default job's
    momentum), bit for bit on one thread: the same operations on the same tensors; and it
    evaluates at the job's points (every `eval_every` iterations before the last, and
    once after it)."""
    import torch

    from benchmarks import plain_loop
    from equipoise.config import DEFAULT_JOB, Config
    from equipoise.reference import train_reference

    keys = dict(dataset="digits", model="mlp", lr=0.1)
    r = plain_loop.run(batch=32, threads=1, iterations=12, eval_every=5, warmup=2, seed=3, **keys)
    assert r["evaluations"] == 3 and 0.0 <= r["final_metrics"]["accuracy"] <= 1.0 and r["steady_samples_per_s"] > 0
    assert DEFAULT_JOB["momentum"] > 0  # the loop's momentum is the default job's: 0 would not tell
    oracle = train_reference(Config.from_dict({**DEFAULT_JOB, **keys, "global_batch": 32, "seed": 3, "workers": 1,
                                               "servers": 1, "iterations": 12}))
    for (name, a), (_, b) in zip(r["model"].state_dict().items(), oracle.state_dict().items()):
        assert torch.equal(a, b), name
