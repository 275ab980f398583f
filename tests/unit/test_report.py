import json
import subprocess
import sys

import pytest

from equipoise.report import ReportError, load_run, plot_accuracy, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _iteration(t, workers, batch, elapsed, **extra):
    n = len(workers)
    return {"type": "iteration", "iteration": t, "time": 1000.0 + elapsed, "elapsed": elapsed,
            "workers": workers, "batch": batch, "compute_s": [0.01 * (w + 1) for w in workers],
            "wait_s": [0.03 - 0.01 * (w + 1) for w in workers], "comm_s": [0.002] * n,
            "cpu": [0.9] * n, "mem": [0.01] * n, "loss": 2.0 - 0.1 * t, "samples_per_s": 1000.0,
            "staleness_mean": 0.0, "staleness_max": 0, "predictor_mape": {"ewma": None, "last": 0.2},
            "predicted_speed": [1.0] * n, **extra}


def _write_run(run_dir, records, summary=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture
def run_dir(tmp_path):
    """3 workers, worker 2 leaves at iteration 3; two evals; a torn last line."""
    records = [{"type": "event", "event": "started", "iteration": 0, "time": 1000.0, "resumed": False}]
    records += [_iteration(t, [0, 1, 2], [40 + t, 44, 44 - t], 0.1 * (t + 1)) for t in range(3)]
    records.append({"type": "eval", "iteration": 2, "elapsed": 0.3, "test_loss": 1.0, "test_accuracy": 0.5})
    records.append({"type": "event", "event": "worker_left", "iteration": 3, "time": 1000.3, "worker": 2})
    records += [_iteration(t, [0, 1], [64, 64], 0.1 * (t + 1)) for t in range(3, 6)]
    records[-1]["wait_s"][1] = None  # values may be null
    records.append({"type": "event", "event": "checkpoint", "iteration": 6, "time": 1000.6, "path": "x"})
    records.append({"type": "eval", "iteration": 6, "elapsed": 0.6, "test_loss": 0.5, "test_accuracy": 0.8})
    d = _write_run(tmp_path / "run", records, {"status": "completed", "protocol": "lbbsp"})
    with (d / "metrics.jsonl").open("a") as fh:
        fh.write('{"type": "iteration", "iter')  # a torn line, as a killed run leaves
    return d


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 10_000, (path, len(data))


def test_report_writes_four_pngs(run_dir):
    paths = report(run_dir)
    assert [p.name for p in paths] == ["batch_sizes.png", "time_split.png", "timeline.png", "accuracy.png"]
    for p in paths:
        assert p.parent == run_dir / "report"
        _assert_png(p)


def test_report_into_another_folder(run_dir, tmp_path):
    out = tmp_path / "plots" / "here"
    paths = report(run_dir, out)
    assert {p.parent for p in paths} == {out}
    for p in paths:
        _assert_png(p)


def test_load_run(run_dir):
    run = load_run(run_dir)
    assert [r["iteration"] for r in run.iterations] == list(range(6))
    assert [e["iteration"] for e in run.evals] == [2, 6]
    assert run.workers == [0, 1, 2]
    assert run.summary["protocol"] == "lbbsp" and run.config == {}
    assert [m["text"] for m in run.markers()] == ["w2 left"]
    assert run.markers()[0]["elapsed"] == pytest.approx(0.3)  # end of iteration 2
    assert [len(v) for v in run.per_worker("wait_s").values()] == [6, 5, 3]  # the null left out


def test_resumed_run_later_record_wins_and_elapsed_continues(tmp_path):
    records = [{"type": "event", "event": "started", "iteration": 0, "resumed": False}]
    records += [_iteration(t, [0, 1], [64, 64], 1.0 * (t + 1)) for t in range(5)]  # killed after 4
    records.append({"type": "event", "event": "worker_left", "iteration": 4, "worker": 1})
    records.append({"type": "event", "event": "started", "iteration": 3, "resumed": True})  # ckpt at 3
    records += [_iteration(t, [0], [128], 1.0 * (t - 2)) for t in range(3, 6)]  # clock restarts at 0
    run = load_run(_write_run(tmp_path / "r", records))
    assert [r["iteration"] for r in run.iterations] == list(range(6))
    assert [r["batch"] for r in run.iterations[2:4]] == [[64, 64], [128]]
    assert [r["elapsed"] for r in run.iterations] == pytest.approx([1, 2, 3, 4, 5, 6])
    assert [m["kind"] for m in run.markers()] == ["resumed"]  # the lost session's event is gone


def test_membership_replayed_on_resume_is_dropped(tmp_path):
    records = [{"type": "event", "event": "started", "iteration": 0, "resumed": False},
               {"type": "event", "event": "worker_left", "iteration": 1, "worker": 2},
               {"type": "event", "event": "started", "iteration": 3, "resumed": True},
               {"type": "event", "event": "worker_left", "iteration": 3, "worker": 2}]
    run = load_run(_write_run(tmp_path / "r", records))
    assert [(m["kind"], m["iteration"]) for m in run.markers()] == [("worker_left", 1), ("resumed", 3)]


def test_accuracy_of_several_runs(run_dir, tmp_path):
    empty = _write_run(tmp_path / "empty", [])
    path = plot_accuracy({"a": load_run(run_dir), "b": run_dir, "no evals": empty},
                         tmp_path / "acc.png", x="iteration")
    _assert_png(path)
    with pytest.raises(ReportError, match="x = 'time'"):
        plot_accuracy({"a": load_run(run_dir)}, tmp_path / "acc2.png", x="time")


def test_report_on_a_run_without_records(tmp_path):
    for p in report(_write_run(tmp_path / "empty", [])):
        assert p.read_bytes()[:8] == PNG_MAGIC


def test_missing_run_dir_or_metrics(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ReportError, match="nope") as exc:
        report(missing)
    assert isinstance(exc.value, ValueError) and "\n" not in str(exc.value)
    (tmp_path / "bare").mkdir()
    with pytest.raises(ReportError, match="bare.*metrics.jsonl"):
        load_run(tmp_path / "bare")


def test_importing_report_does_not_import_matplotlib():
    code = "import sys, equipoise, equipoise.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_report_draws_a_steady_steps_traffic_per_block(tmp_path):
    """Records with wire events (`timeline`) add wire.png: by default the middle record of
    those that have them (away from the cold start), or the iteration asked for; an
    iteration without them draws a figure that says so."""
    from equipoise.report import plot_wire
    from equipoise.report.wire import wire_record

    def events(t):  # one worker's step: report→plan, fragments, the update, weights early and last
        return [["plan", -1, -0.004, -0.001, []], ["pull", 0, -0.003, 0.002, [0, 1, 2]],
                ["fragment", 0, 0.02, None, [2]], ["applied", 0, 0.025, None, [2]],
                ["early", 0, 0.01, 0.03, [2]], ["push", 0, 0.04, 0.05, [0, 1]],
                ["applied", 0, 0.045 + t / 1000, None, [0, 1]]]

    records = [_iteration(0, [0, 1], [32, 32], 0.1)]  # no timeline: the first record
    records += [_iteration(t, [0, 1], [32, 32], 0.1 * (t + 1), timeline=[events(t), events(t)]) for t in (1, 2, 3)]
    d = _write_run(tmp_path / "run", records, {"status": "completed", "protocol": "bsp"})
    run = load_run(d)
    assert wire_record(run)["iteration"] == 2 and wire_record(run, 3)["iteration"] == 3
    assert wire_record(run, 0) is None
    paths = report(d)
    assert paths[-1].name == "wire.png"
    _assert_png(paths[-1])
    _assert_png(plot_wire(run, tmp_path / "none.png", iteration=0))
