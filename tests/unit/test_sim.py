"""The simulator against cases whose outcome can be worked out by hand, its calibration
against a run whose cost model is known, and its run directory against `equipoise report`."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from equipoise.config import Config, ConfigError
from equipoise.scenario import Scenario
from equipoise.sim import calibrate, simulate
from equipoise.sim.calibrate import _noise
from equipoise.sim.cost import SHAPES, CostModel, model_tensors_of
from equipoise.sim.engine import Simulation, WorkerFactors
from equipoise.telemetry.metrics import read_metrics

BASE = {"dataset": "digits", "model": "mlp", "eval_every": 0, "checkpoint_every": 0, "sim_noise": 0.0}


def run(tmp_path=None, **keys):
    """Simulate with BASE plus keys; (summary, iteration records, all records)."""
    records: list[dict] = []
    cfg = Config.from_dict({**BASE, **keys})
    sim = Simulation(cfg, model_tensors_of(cfg), cfg.iterations, emit=records.append)
    out = sim.run()
    iters = sorted((r for r in records if r["type"] == "iteration"), key=lambda r: r["iteration"])
    return out, iters, records


def test_bsp_two_workers_is_the_slower_compute_plus_four_messages():
    # Free links and servers: an iteration is the slower worker's (a + b·x) plus four
    # one-way latencies (push, ack, report, plan), exactly.
    lat = 0.001
    out, iters, _ = run(protocol="bsp", workers=2, servers=1, global_batch=30, batch_split=[10, 20],
                        sim_compute_s=[0.01, 0.02], sim_sample_s=[0.001, 0.0005], sim_latency_s=lat,
                        sim_link_mbps=0.0, sim_server_mbps=0.0, iterations=6)
    c0, c1 = 0.01 + 0.001 * 10, 0.02 + 0.0005 * 20
    elapsed = [r["elapsed"] for r in iters]
    assert np.allclose(np.diff(elapsed), max(c0, c1) + 4 * lat, rtol=0, atol=1e-12)
    assert elapsed[0] == pytest.approx(4 * lat + c1 + 3 * lat, abs=1e-12)  # first plan+pull, then 3 messages
    later = iters[1:]
    assert all(r["compute_s"] == pytest.approx([c0, c1], abs=1e-12) for r in iters)
    # the faster worker waited at the barrier for exactly the difference; both spent 4 latencies talking
    assert all(r["wait_s"] == pytest.approx([c1 - c0, 0.0], abs=1e-12) for r in later)
    assert all(r["comm_s"] == pytest.approx([4 * lat, 4 * lat], abs=1e-12) for r in later)
    assert out["histogram"] == {0: 2 * 6}


def test_bsp_server_queue_serves_pushes_then_pulls_one_after_another():
    # Two equal workers, one server taking s seconds per push and per pull, no latency.
    # Iteration 0: both pushes arrive at c, are served by c + s and c + 2s (the update),
    # the pulls are answered at c + 3s and c + 4s, so the workers start again s apart.
    # From then on worker A's push (arriving at T) is served by T + s, B's (at T + s) by
    # T + 2s, and the pulls at T + 3s (A restarts) and T + 4s: the barrier (last ack)
    # comes every c + 3s.
    cfg = Config.from_dict({**BASE, "workers": 2, "servers": 1, "sim_latency_s": 0.0, "sim_link_mbps": 0.0,
                            "sim_server_mbps": 100.0, "sim_compute_s": [0.01], "sim_sample_s": [0.0]})
    s = sum(n * size for _, n, _, size in model_tensors_of(cfg)) / 100e6
    _, iters, _ = run(protocol="bsp", workers=2, servers=1, sim_latency_s=0.0, sim_link_mbps=0.0,
                      sim_server_mbps=100.0, sim_compute_s=[0.01], sim_sample_s=[0.0], iterations=5)
    assert np.allclose(np.diff([r["elapsed"] for r in iters]), 0.01 + 3 * s, rtol=1e-12)


def test_asp_equal_workers_staleness_is_workers_minus_one():
    # λ equal workers start together and finish together (ties go to the lower rank): in
    # the first round worker k's gradient meets k newer versions; from then on each
    # worker reads right after its own push and pushes after the λ − 1 others: σ = λ − 1.
    lam, t, servers = 4, 10, 2
    out, iters, _ = run(protocol="asp", workers=lam, servers=servers, iterations=t, global_batch=32 * lam)
    expected = Counter({k: 1 for k in range(lam - 1)})
    expected[lam - 1] = lam * t - (lam - 1)
    assert out["histogram"] == {k: v * servers for k, v in expected.items()}
    assert sum(sum(r["batch"]) for r in iters) == t * 32 * lam


def test_ssp_never_exceeds_its_bound_and_fast_workers_wait():
    out, iters, _ = run(protocol="ssp", staleness_bound=2, workers=4, slowdown=[1, 1, 1, 4], iterations=30)
    assert max(out["histogram"]) <= 2
    waits = [w for r in iters for rank, w in zip(r["workers"], r["wait_s"]) if rank != 3]
    assert max(waits) > 0.0


def test_softsync_updates_every_c_gradients():
    # 2-softsync of 4 equal workers: groups of c = 2; no gradient is older than λ − 1.
    out, _, _ = run(protocol="softsync", softsync_n=2, workers=4, servers=1, iterations=20)
    assert sum(out["histogram"].values()) == 4 * 20
    assert max(out["histogram"]) <= 3


def test_worker_factors_follow_the_scenario(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("iteration,worker,factor\n0,1,2.0\n5,1,1.0\n5,2,3.0\n5,2,5.0\n9,0,1.5\n")
    scenario = Scenario.from_config({"slowdown": [1.0, 2.0, 1.0], "trace": str(trace)})
    factors = WorkerFactors(scenario, 3)
    for t in range(12):
        assert factors.at(0.0, t).tolist() == [scenario.worker_factor(w, elapsed=0.0, iteration=t)
                                               for w in range(3)]


def test_digits_shape_matches_the_dataset():
    from equipoise.data import load_dataset
    data = load_dataset("digits")
    assert (tuple(data.input_shape), data.num_classes, len(data)) == SHAPES["digits"]


def test_calibration_recovers_a_known_cost_model(tmp_path):
    # LB-BSP under changing slowdowns varies the batch sizes, so a and b are identifiable;
    # without noise the fit is exact, and the servers' cost per byte comes from the
    # "servers" records.
    a, b = [0.003, 0.004, 0.002, 0.005], [2e-4, 1e-4, 3e-4, 2.5e-4]
    trace = tmp_path / "trace.csv"
    trace.write_text("iteration,worker,factor\n10,0,3\n20,1,4\n20,0,1\n30,2,1\n30,3,2\n")
    simulate({**BASE, "protocol": "lbbsp", "workers": 4, "slowdown": [1, 2, 3, 1], "iterations": 40,
              "trace": str(trace),
              "sim_compute_s": a, "sim_sample_s": b, "sim_server_mbps": 250.0, "psld_interval": 5},
             out=tmp_path / "known")
    fitted = calibrate(tmp_path / "known")["keys"]
    assert fitted["sim_compute_s"] == pytest.approx(a, rel=1e-6)
    assert fitted["sim_sample_s"] == pytest.approx(b, rel=1e-6)
    assert fitted["sim_noise"] == pytest.approx(0.0, abs=1e-9)
    assert fitted["sim_server_mbps"] == pytest.approx(250.0, rel=1e-6)


def _as_if_run_here(run_dir):
    """Mark a simulated run's workers as having run on this machine (its summary's
    "nodes"), as a real emulation run's are: calibration then fits the host model."""
    import socket

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["nodes"] = {f"worker{w}": {"hostname": socket.gethostname()} for w in range(summary["workers"])}
    path.write_text(json.dumps(summary))


def test_calibration_recovers_a_known_emulation_host_model(tmp_path):
    # One host of 2 cores with 0.7 other runnable processes, ρ = 0.6, κ = 0.2, the validate
    # preset's calibration design (unequal batches, the last worker 3× slower beside one
    # of its batch): without noise the fit is exact. The line comes back in the units of
    # the fitted ρ (the unslowed steps' median core share), so its CPU seconds, a·ρ and
    # b·ρ, are what must match; κ to its rounding (4 places), the load to the bisection's
    # bracket and rounding (well under 1e-3).
    a, b, rho = 0.005, 0.001, 0.6
    simulate({**BASE, "protocol": "bsp", "workers": 4, "global_batch": 128, "batch_split": [56, 40, 16, 16],
              "slowdown": [1, 1, 1, 3], "iterations": 20, "sim_host_cores": 2, "sim_host_load": 0.7,
              "sim_cpu_share": rho, "sim_stretch_cpu": 0.2, "sim_compute_s": [a], "sim_sample_s": [b]},
             out=tmp_path / "known")
    _as_if_run_here(tmp_path / "known")
    fitted = calibrate(tmp_path / "known")
    keys = fitted["keys"]
    assert keys["sim_host_cores"] == 2
    assert keys["sim_stretch_cpu"] == pytest.approx(0.2, abs=1e-4)
    assert keys["sim_compute_s"][0] * keys["sim_cpu_share"] == pytest.approx(a * rho, rel=1e-3)
    assert keys["sim_sample_s"][0] * keys["sim_cpu_share"] == pytest.approx(b * rho, rel=1e-3)
    assert keys["sim_host_load"] == pytest.approx(0.7, abs=1e-3)
    assert "unslowed steps" in fitted["fit"]["host_load_from"]


def test_calibration_of_a_host_run_without_unslowed_steps_leaves_the_load_alone(tmp_path):
    # every worker slowed: no step shows the host's share at factor 1, so no load is fitted
    simulate({**BASE, "protocol": "bsp", "workers": 2, "slowdown": [2, 2], "iterations": 10, "sim_host_cores": 2,
              "sim_host_load": 0.5}, out=tmp_path / "slowed")
    _as_if_run_here(tmp_path / "slowed")
    fitted = calibrate(tmp_path / "slowed")
    assert fitted["keys"]["sim_host_load"] == 0.0
    assert fitted["fit"]["host_load_from"] == "not fitted: no unslowed step reported its cpu"


def test_run_directory_is_marked_simulated_and_reported(tmp_path):
    from equipoise.report import report

    summary = simulate({**BASE, "protocol": "lbbsp", "workers": 3, "slowdown": [1, 1, 3], "iterations": 25},
                       out=tmp_path / "run")
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "summary.json").read_text())["simulated"] is True
    assert Config.load(run_dir / "config.toml").protocol == "lbbsp"
    assert summary["samples"] == 25 * 128
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert recs[0]["event"] == "started" and recs[0]["simulated"] is True
    last = [r for r in recs if r["type"] == "iteration"][-1]
    assert last["batch"][2] < last["batch"][0]  # the slow worker got less
    names = {p.name for p in report(run_dir)}
    assert {"batch_sizes.png", "time_split.png", "timeline.png", "accuracy.png"} <= names


def test_psld_moves_blocks_off_a_slow_server_and_beats_mxnet():
    keys = dict(protocol="bsp", workers=4, servers=4, model="cnn", block_size=32768, iterations=120,
                server_slowdown=[4, 1, 1, 1], server_rate=200.0, server_bandwidth=[200.0] * 4,
                psld_interval=5, psld_epsilon=0.0)
    psld, _, records = run(placement="psld", **keys)
    mxnet, _, _ = run(placement="mxnet", **keys)
    assert any(r.get("event") == "block_moved" for r in records)
    servers = [r for r in records if r["type"] == "servers"]
    assert servers[-1]["load_bytes"][0] < servers[0]["load_bytes"][0]
    assert psld["train_s"] < mxnet["train_s"]


def test_membership_and_server_events_are_simulated():
    _, iters, records = run(protocol="bsp", workers=3, servers=2, iterations=12,
                            membership=[{"iteration": 4, "leave": 1}, {"iteration": 8, "join": 1}],
                            server_events=[{"iteration": 3, "add": 1}, {"iteration": 6, "remove": 0}])
    assert iters[5]["workers"] == [0, 2] and iters[9]["workers"] == [0, 2, 3]
    assert all(sum(r["batch"]) == 128 for r in iters)
    events = [r["event"] for r in records if r["type"] == "event"]
    assert {"worker_left", "worker_joined", "server_added", "server_removed"} <= set(events)


def test_sim_keys_are_validated():
    with pytest.raises(ConfigError, match="sim_compute_s"):
        Config.from_dict({"workers": 4, "sim_compute_s": [0.1, 0.2]})
    with pytest.raises(ConfigError, match="sim_latency_s"):
        Config.from_dict({"sim_latency_s": -1.0})
    with pytest.raises(ConfigError, match="neighbours"):
        simulate({**BASE, "neighbours": [{"worker": 0}]}, write=False)
    with pytest.raises(ConfigError, match="simulated at barriers only"):
        simulate({**BASE, "protocol": "ssp", "placement": "psld"}, write=False)


def test_host_rate_is_the_processor_sharing_fixed_point():
    # 4 unslowed workers on 2 cores, nothing else running: each runnable all the time,
    # so each gets 2/4 of a core. With factors [1, 1, 2, 4] the stretched workers sleep
    # part of their steps, and r solves r = 2 / (2 + 1/(1 + r) + 1/(1 + 3r)).
    cost = CostModel(Config(workers=4, sim_host_cores=2, sim_cpu_share=0.5))
    assert cost.host_rate(np.ones(4)) == pytest.approx(0.5, abs=1e-9)
    r = cost.host_rate(np.array([1.0, 1.0, 2.0, 4.0]))
    assert r == pytest.approx(2 / (2 + 1 / (1 + r) + 1 / (1 + 3 * r)), abs=1e-8) and 0.5 < r < 1
    assert cost.host_rate(np.ones(1)) == 1.0  # one worker on two cores: a core of its own


def test_host_compute_shares_the_cores_between_steps_as_they_start_and_finish():
    # One core, ρ = 1: worker 0 starts at 0 with 1 s of CPU work, worker 1 at 0.5 s with
    # 1 s. Alone until 0.5 (0.5 s done), then half a core each: worker 0 ends at 1.5;
    # worker 1 has done 0.5 s by then and finishes alone at 2.0.
    cost = CostModel(Config(workers=2, sim_host_cores=1, sim_cpu_share=1.0))
    took = cost.host_compute(np.array([0.0, 0.5]), np.array([1.0, 1.0]), np.ones(2))
    assert took == pytest.approx([1.5, 1.5], abs=1e-9)
    # a worker at f = 3 sleeps 2 s per CPU second: alone on a core its 1 s step takes 3 s
    assert cost.host_compute(np.zeros(1), np.ones(1), np.array([3.0])) == pytest.approx([3.0], abs=1e-9)


def test_a_stretched_step_does_more_cpu_work_by_the_fitted_overhead():
    # ρ = 0.5, κ = 0.2: at f = 3 a step's CPU work is × m = 1 + 0.2·(1 − 1/3); the step is
    # its other part (1 − ρ) plus the inflated CPU part × f; at f = 1 nothing changes.
    cost = CostModel(Config(sim_cpu_share=0.5, sim_stretch_cpu=0.2))
    m = 1 + 0.2 * 2 / 3
    assert cost.inflate(3.0) == pytest.approx(m, abs=1e-12) and cost.inflate(1.0) == 1.0
    assert cost.stretch(3.0) == pytest.approx(0.5 + 0.5 * m * 3, abs=1e-12)
    assert cost.cpu(3.0) == pytest.approx(0.5 * m / (0.5 + 1.5 * m), abs=1e-12)
    # an emulation host, alone on its core at f = 3: CPU work m, then the stretch's 2m of sleep
    host = CostModel(Config(workers=1, sim_host_cores=1, sim_cpu_share=1.0, sim_stretch_cpu=0.2))
    assert host.host_compute(np.zeros(1), np.ones(1), np.array([3.0])) == pytest.approx([3 * m], abs=1e-12)


def test_stretch_overhead_is_fitted_against_unstretched_steps_of_several_batches():
    # CPU seconds of a step = (a + b·x)·(1 + κ·(1 − 1/f)) exactly, on batches 48, 32, 16
    # unstretched and 32 at f = 3 (the validate preset's calibration run): the line
    # through the unstretched steps is a + b·x, the stretched step's excess over it is
    # κ·2/3, and every point divided back lies on (a + b·x) / ρ. The wall times and core
    # shares vary: only their product, CPU seconds, may matter.
    from equipoise.sim.calibrate import _cpu_points

    a, b, kappa, rho = 0.007, 0.0009, 0.2, 0.6
    steps = []
    for k in range(10):
        for w, (x, f) in enumerate([(48, 1.0), (32, 1.0), (16, 1.0), (32, 3.0)]):
            cpu_s = (a + b * x) * (1 + kappa * (1 - 1 / f))
            wall = cpu_s * (2 + 0.1 * k + w)
            steps.append((k, w, float(x), wall, cpu_s / wall, f))
    points, fitted, source = _cpu_points(steps, rho)
    assert fitted == pytest.approx(kappa, rel=1e-9) and "10 stretched steps" in source
    assert all(y == pytest.approx((a + b * x) / rho, rel=1e-9) for _, _, x, y in points)
    _, none, why = _cpu_points([s for s in steps if s[5] == 1.0], rho)
    assert none == 0.0 and "no stretched step" in why


def test_stream_steps_share_the_host_cores_as_they_overlap():
    # ASP, two equal workers on one core, ρ = 1, messages free (no latency, links or
    # server cost): both compute all the time, so each gets half the core and a step of
    # 0.01 CPU seconds takes 0.02 s, cpu 0.5. (Sharing fixed at a step's start would give
    # the first worker to start a core of its own for its whole step.)
    _, iters, _ = run(protocol="asp", workers=2, servers=1, global_batch=64, iterations=10, sim_host_cores=1,
                      sim_cpu_share=1.0, sim_latency_s=0.0, sim_link_mbps=0.0, sim_server_mbps=0.0,
                      sim_compute_s=[0.01], sim_sample_s=[0.0])
    steps = [(c, u) for r in iters for c, u in zip(r["compute_s"], r["cpu"])]
    assert len(steps) == 20
    assert all(c == pytest.approx(0.02, abs=1e-12) and u == pytest.approx(0.5, abs=1e-9) for c, u in steps)


def test_a_worker_in_an_exchange_holds_a_share_of_the_host():
    # ASP, two workers on one core, worker 1 slowed 3× (sim_cpu_share 1): when
    # worker 0 computes while worker 1's exchange runs, sim_host_exchange = 1 counts
    # that exchange as a runnable process, so worker 0 gets less of the core than with 0.
    keys = dict(protocol="asp", workers=2, servers=1, global_batch=64, iterations=20, sim_host_cores=1,
                sim_cpu_share=1.0, sim_latency_s=0.002, sim_link_mbps=0.0, sim_server_mbps=0.0,
                sim_compute_s=[0.01], sim_sample_s=[0.0], slowdown=[1.0, 3.0])
    shares = {}
    for lam in (0.0, 1.0):
        _, iters, _ = run(sim_host_exchange=lam, **keys)
        shares[lam] = np.mean([c for r in iters for w, c in zip(r["workers"], r["cpu"]) if w == 0])
    assert shares[1.0] < shares[0.0]


def test_noise_splits_into_a_shared_and_an_own_part():
    # residuals ±0.2 per iteration shared by its 4 steps, and ±0.1 of each step's own
    # (two +, two −: the iteration's mean is the shared part exactly; the estimator still
    # takes off the own/4 variance a mean of 4 independent steps would carry)
    res = [(k, (0.2 if k % 2 else -0.2) + d) for k in range(100) for d in (0.1, -0.1, 0.1, -0.1)]
    shared, own, corr = _noise(res)
    own_var = 4 * 0.01 / 3  # sample variance of (0.1, -0.1, 0.1, -0.1)
    assert own == pytest.approx(own_var ** 0.5, rel=1e-9)
    assert shared == pytest.approx((0.04 - own_var / 4) ** 0.5, rel=1e-9)
    assert corr == 0.0  # the shared part alternates sign: correlation −1, clipped to 0


def test_a_run_of_moves_to_one_server_is_one_block_moved_event_as_in_a_real_job():
    """The coordinator carries out a run of moves as one migration per destination, with
    one block_moved event listing its blocks (coordinator/server_manager.py `_grouped`);
    the simulator's events are the same: a block named again starts a new run."""
    keys = dict(protocol="bsp", workers=2, servers=3, iterations=8, block_size=2000)
    cfg = Config.from_dict({**BASE, **keys})
    owner = Simulation(cfg, model_tensors_of(cfg), cfg.iterations, emit=lambda r: None).servers.owner.tolist()
    a, b = [k for k, s in enumerate(owner) if s != 2][:2]
    _, _, records = run(**keys, server_events=[{"iteration": 4, "move": a, "to": 2}, {"iteration": 4, "move": b, "to": 2},
                                               {"iteration": 4, "move": a, "to": owner[a]}])
    moved = [(r["blocks"], r["from"], r["to"]) for r in records if r.get("event") == "block_moved"]
    assert moved == [(sorted([a, b]), sorted({owner[a], owner[b]}), 2), ([a], [2], owner[a])]
