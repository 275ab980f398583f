"""Whole jobs on the in-memory transport (threads): the protocols' end-to-end semantics,
fast and without sockets."""

import json

import pytest
import torch

from equipoise.config import Config
from equipoise.data import load_dataset
from equipoise.reference import train_reference
from equipoise.launch.threads import run_threads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real jobs, in threads


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def job(**kw):
    base = dict(dataset="digits", model="mlp", global_batch=48, workers=3, servers=2, iterations=12,
                eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=2000)
    base.update(kw)
    return Config.from_dict(base)


def final_values(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def test_bsp_threads_equals_reference(tmp_path, digits):
    cfg = job(batch_split=[5, 30, 13])
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["staleness_max"] == 0
    ref = train_reference(cfg, data=digits).state_dict()
    got = final_values(tmp_path)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)


def test_asp_applies_every_gradient_and_records_staleness(tmp_path, digits):
    cfg = job(protocol="asp", iterations=10)
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["samples"] == 10 * 48
    # one gradient per μ = 16 samples, applied once on each server
    assert sum(summary["staleness_histogram"].values()) == 10 * 3 * cfg.servers


def test_replayed_predictor_errors_equal_the_ones_measured_in_the_run(tmp_path, digits):
    from equipoise.report.replay import replay_mape

    cfg = job(protocol="lbbsp", iterations=30, shadow_predictors=True, slowdown=[1.0, 2.0, 3.0])
    summary = run_threads(cfg, tmp_path, digits)
    replayed = replay_mape(tmp_path)
    assert set(replayed) == set(summary["predictor_mape"]) == {"last", "ewma", "narx"}
    for name, value in summary["predictor_mape"].items():
        assert replayed[name] == pytest.approx(value, rel=1e-9), name


def test_one_asp_worker_at_bsp_settings_is_the_reference(tmp_path, digits):
    """async_scaling = "bsp" with one worker: every update is the global batch, read after
    the last one was applied (delay 0), so the rule keeps lr and momentum as they are and
    the job is the single-process reference."""
    cfg = job(protocol="asp", workers=1, momentum=0.9, lr=0.05)
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["async_steps"]["delay_mean"] == 0.0
    assert summary["async_steps"]["momentum_mean"] == pytest.approx(0.9)
    ref = train_reference(cfg, data=digits, splits=[[48]] * 12).state_dict()
    got = final_values(tmp_path)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)


def test_dc_asgd_corrects_every_gradient_with_the_weights_it_read(tmp_path, digits):
    """Every push echoes the stamp of the weights it was computed on, also with overlap
    (the read before last), and the servers still hold those weights: each gradient
    applied is compensated, on each server."""
    cfg = job(protocol="asp", overlap=True, delay_compensation="dc", dc_lambda=0.04)
    summary = run_threads(cfg, tmp_path, digits)
    applied = sum(summary["staleness_histogram"].values())
    assert applied == 12 * 3 * cfg.servers
    assert summary["dc_compensated"] == applied
    assert summary["async_steps"]["delay_mean"] > 0  # three workers, overlap: gradients are late


@pytest.mark.parametrize("protocol,extra", [("asp", {"overlap": True}), ("softsync", {}),
                                            ("ssp", {"staleness_bound": 1})])
def test_blocks_move_and_servers_come_and_go_while_workers_run(tmp_path, digits, protocol, extra):
    """No barrier: blocks moved, a server added and one drained and stopped mid-run;
    every block has every gradient applied exactly once (counted on the servers, where
    a gradient that reached an old owner is counted where it was forwarded to)."""
    events = [{"iteration": 3, "move": 0, "to": 1}, {"iteration": 4, "move": 1, "to": 0},
              {"iteration": 5, "add": 1}, {"iteration": 7, "move": 2, "to": 2}, {"iteration": 9, "remove": 0}]
    cfg = job(protocol=protocol, iterations=14, server_events=events, **extra)
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["status"] == "completed"
    assert summary["gradients"] == {"owed": 14 * 3, "applied_min": 14 * 3, "applied_max": 14 * 3}
    assert summary["lost_updates"] == 0
    if protocol == "ssp":
        assert summary["staleness_max"] <= 1
    events = [e["event"] for e in records(tmp_path, "event")]
    assert events.count("block_moved") >= 3 and "server_added" in events
    assert "server_removed" in events and "server_retired" in events


def records(run_dir, kind):
    with open(run_dir / "metrics.jsonl") as fh:
        return [r for r in map(json.loads, fh) if r.get("type") == kind]


def test_the_model_tuner_gives_a_slowed_worker_less(tmp_path, digits):
    from equipoise.reference import run_splits

    cfg = job(protocol="lbbsp", batch_policy="model", iterations=30, slowdown=[1.0, 1.0, 4.0])
    run_threads(cfg, tmp_path, digits)
    last = records(tmp_path, "iteration")[-1]
    assert last["batch"][last["workers"].index(2)] < 16 and sum(last["batch"]) == 48
    ref = train_reference(cfg, data=digits, splits=run_splits(tmp_path)).state_dict()
    got = final_values(tmp_path)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)


def test_bsp_clipped_while_blocks_move_equals_the_reference(tmp_path, digits):
    """clip_grad_norm under a barrier holds each update for the global norm on the
    server's store: after a block moves (a new store), the next update must be combined
    on the new one, and the run still equals clip_grad_norm_ on one process."""
    cfg = job(clip_grad_norm=0.5, momentum=0.9, lr=0.2, iterations=12,
              server_events=[{"iteration": 3, "move": 0, "to": 1}, {"iteration": 5, "add": 1},
                             {"iteration": 7, "move": 1, "to": 2}])
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert sum(r.get("event") == "block_moved" for r in records) == 2
    ref = train_reference(cfg, data=digits).state_dict()
    got = final_values(tmp_path)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_an_iterations_record_is_timed_by_its_last_report_not_by_when_it_is_written(tmp_path, digits, protocol):
    """Under a barrier the coordinator writes iteration t's record after the snapshot of
    t + 1 (at the end: the final checkpoint and model), but the record is timed by the
    last report of t to arrive: the last iteration's record is of a time before the
    final checkpoint began (its event is written once it is saved), and the records'
    times rise with the iterations."""
    cfg = job(protocol=protocol, checkpoint_every=4)
    run_threads(cfg, tmp_path, digits)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    its = sorted((r for r in records if r.get("type") == "iteration"), key=lambda r: r["iteration"])
    final = [r for r in records if r.get("event") == "checkpoint" and r["iteration"] == cfg.iterations]
    assert len(its) == cfg.iterations and len(final) == 1
    assert its[-1]["time"] < final[0]["time"]
    if protocol == "bsp":  # without a barrier an iteration's last report may come before an earlier one's
        assert all(a["elapsed"] <= b["elapsed"] for a, b in zip(its, its[1:]))
