"""The live view's state, its drawing, `equipoise watch`, the plain lines off a terminal,
TensorBoard's scalars and report.html, on records made here (no job runs)."""

from __future__ import annotations

import io
import json
import re
import threading
import time

import pytest
from rich.console import Console

from equipoise import cli
from equipoise.report import ReportError, html_report
from equipoise.telemetry import progress
from equipoise.telemetry.live import ClusterState, WatchError, headline, plain_line, render, watch
from equipoise.telemetry.tensorboard import scalars


def _iteration(t, batch=(32, 32), compute=(0.01, 0.04), wait=(0.03, 0.0), stale=(0.0, 1.0)):
    n = len(batch)
    return {"type": "iteration", "iteration": t, "time": 1000.0 + t, "elapsed": 0.05 * (t + 1),
            "workers": list(range(n)), "batch": list(batch), "compute_s": list(compute), "wait_s": list(wait),
            "comm_s": [0.01] * n, "loss": 1.0, "samples_per_s": 1280.0, "staleness_mean": 0.5,
            "staleness_max": 1, "staleness": list(stale)}


SERVERS = {"type": "servers", "iteration": 10, "time": 1010.0, "elapsed": 0.5, "servers": [0, 1],
           "load_bytes": [2_000_000, 1_000_000], "blocks": [3, 2], "busy_s": [0.1, 0.2], "bytes": [1, 2],
           "throughput_mbps": [50.0, 25.0], "busy_share": [0.2, 0.4], "iteration_s": 0.05, "table_version": 0}


def _records(n=12):
    return ([{"type": "event", "event": "started", "iteration": 0, "time": 999.0, "resumed": False}]
            + [_iteration(t) for t in range(n)] + [SERVERS]
            + [{"type": "event", "event": "block_moved", "iteration": 11, "time": 1011.0, "blocks": [4],
                "from": [1], "to": 0, "bytes": 1_500_000, "pause_s": 0.02, "table_version": 1},
               {"type": "eval", "iteration": n, "time": 1012.0, "elapsed": 0.6, "test_loss": 0.5,
                "test_accuracy": 0.875}])


def _state(records):
    state = ClusterState(total=12)
    for r in records:
        state.feed(r)
    return state


def _text(renderable) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_a_worker_four_times_slower_is_slow_and_the_other_waits():
    rows = {r["rank"]: r for r in _state(_records()).worker_rows()}
    # worker 0: 32 samples per 0.01 s = 3200/s; worker 1: 800/s < 0.6 × median 2000/s
    assert rows[0]["speed"] == pytest.approx(3200) and rows[1]["speed"] == pytest.approx(800)
    assert rows[1]["state"] == "slow" and rows[0]["state"] == "waiting"  # 0.03 / 0.05 of its time waits
    assert rows[0]["wait"] == pytest.approx(0.6) and rows[1]["compute"] == pytest.approx(0.8)
    assert rows[1]["staleness"] == pytest.approx(1.0) and rows[0]["batch"] == 32


def test_equal_workers_are_running_and_lost_ones_failed_or_left():
    records = [_iteration(t, batch=(32, 32, 32), compute=(0.01, 0.011, 0.012), wait=(0.001,) * 3,
                          stale=(0, 0, 0)) for t in range(3)]
    records += [{"type": "event", "event": "failure", "iteration": 3, "time": 1.0, "role": "worker", "rank": 1,
                 "reason": "exited with code -9", "seen_s": 0.2, "action": "removed"},
                {"type": "event", "event": "worker_left", "iteration": 3, "time": 1.0, "worker": 2},
                {"type": "event", "event": "failure", "iteration": 3, "time": 1.0, "role": "server", "rank": 1,
                 "reason": "no heartbeat", "seen_s": 0.2, "action": "replaced"}]
    state = _state(records)
    assert [r["state"] for r in state.worker_rows()] == ["running", "failed", "left"]
    assert [(r["rank"], r["state"]) for r in state.server_rows()] == [(1, "lost")]
    assert "worker1 lost (exited with code -9): removed" in state.recent_events()[0]
    state.feed(SERVERS)  # server 1 measured again: its replacement runs
    assert [r["state"] for r in state.server_rows()] == ["running", "running"]


def test_render_and_plain_line_show_workers_servers_and_events():
    state = _state(_records())
    text = _text(render(state, header=True))
    assert "iteration 12/12" in text and "acc 87.5%" in text
    assert re.search(r"w1\s+32\s+800\s+80%\s+0%\s+0%\s+20%\s+–\s+1\.0\s+slow", text), text  # data 0%, no copy: none recorded
    assert re.search(r"s1\s+2\s+1\.00\s+40%\s+25\s+running", text), text
    assert "blocks [4] [1] → 0, 1.5 MB in 20 ms" in text and "started" not in text
    line = plain_line(state)
    assert "\n" not in line and "w1 b32 800/s wait 0% slow" in line and "s0 busy 20% running" in line
    assert "no iteration recorded yet" in _text(render(ClusterState()))


def test_data_waits_and_the_users_metrics_are_shown():
    rec = {**_iteration(0, batch=(32,), compute=(0.03,), wait=(0.0,), stale=(0,)), "data_s": [0.01],
           "comm_s": [0.0]}
    state = _state([rec, {"type": "eval", "iteration": 1, "time": 1.0, "test_loss": 1.25, "test_mse": 0.5,
                          "test_samples": 10}])
    assert state.worker_rows()[0]["data"] == pytest.approx(0.25)  # 0.01 of 0.04 s
    line = headline(state)
    assert "test mse 0.5" in line and "acc" not in line


def test_records_with_nulls_and_old_fields_are_drawn():
    rec = _iteration(0)
    del rec["staleness"]
    rec["compute_s"] = [None, 0.02]
    servers = {k: v for k, v in SERVERS.items() if k != "busy_share"}  # a run from before busy_share
    state = _state([rec, servers])
    assert state.worker_rows()[0]["speed"] is None and state.worker_rows()[1]["staleness"] is None
    assert "–" in _text(render(state))


def _run_dir(tmp_path, records, summary=None):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records) + '{"type": "iter')
    (d / "config.toml").write_text("iterations = 12\nslowdown = [1.0, 4.0]\n")
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_watch_a_finished_run_prints_its_last_state(tmp_path):
    d = _run_dir(tmp_path, _records(), {"status": "completed", "protocol": "bsp"})
    console = Console(file=io.StringIO(), width=120, color_system=None)
    assert watch(d, console=console) == 0
    text = console.file.getvalue()
    assert "iteration 12/12" in text and "completed" in text and re.search(r"w1 .* slow", text)


def test_watch_follows_a_running_job_until_its_summary(tmp_path):
    records = _records()
    d = _run_dir(tmp_path, records[:4])  # ends with a torn line, completed below

    def finish():
        time.sleep(0.2)
        with (d / "metrics.jsonl").open("a") as fh:
            fh.write('ation"}\n' + "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records[4:]))
        (d / "summary.json").write_text(json.dumps({"status": "completed"}))

    writer = threading.Thread(target=finish)
    writer.start()
    console = Console(file=io.StringIO(), width=120, color_system=None)
    try:
        assert watch(d, interval=0.02, idle=60.0, console=console) == 0
    finally:
        writer.join(timeout=10)
    assert "iteration 12/12" in console.file.getvalue()


def test_watch_gives_up_on_a_job_gone_without_summary(tmp_path):
    d = _run_dir(tmp_path, _records())
    console = Console(file=io.StringIO(), width=120, color_system=None)
    assert watch(d, idle=0.0, interval=0.01, console=console) == 1
    assert "has stopped without finishing" in console.file.getvalue()


def test_watch_refuses_a_folder_without_metrics(tmp_path, capsys):
    with pytest.raises(WatchError, match="not a run directory"):
        watch(tmp_path)
    assert cli.main(["watch", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("equipoise: error:") and str(tmp_path) in err[0]


def test_the_display_off_a_terminal_prints_plain_lines(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    display = progress.ProgressDisplay(12, enabled=True)
    assert display._progress is None  # pytest's stderr is no terminal
    for r in _records(3):
        display.record(r)
    display.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 + 1  # one per iteration record (at most one per PLAIN_EVERY_S), one at the end
    assert lines[0].startswith("iteration 1/12  1280 samples/s") and "w1 b32 800/s" in lines[0]
    assert lines[-1].startswith("iteration 3/12") and "acc 87.5%" in lines[-1] and "s1 busy 40%" in lines[-1]
    quiet = progress.ProgressDisplay(12, enabled=False)
    for r in _records(3):
        quiet.record(r)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_tensorboard_scalars_of_each_record():
    tags = dict(scalars(_iteration(4)))
    assert tags["train/loss"] == 1.0 and tags["worker1/batch"] == 32.0 and tags["worker0/wait_s"] == 0.03
    assert tags["worker1/staleness"] == 1.0 and tags["train/staleness_mean"] == 0.5
    assert dict(scalars(SERVERS)) == {"server0/busy_share": 0.2, "server1/busy_share": 0.4, "server0/load_mb": 2.0,
                                      "server1/load_mb": 1.0, "server0/link_mbps": 50.0, "server1/link_mbps": 25.0}
    assert dict(scalars({"type": "eval", "iteration": 3, "test_accuracy": 0.5, "test_loss": None})) == {
        "test/accuracy": 0.5}
    assert scalars({"type": "event", "event": "started"}) == []


def test_tensorboard_log_is_read_back_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from equipoise.telemetry.tensorboard import TensorBoardLog

    log = TensorBoardLog(tmp_path / "tb")
    for r in _records(5):
        log.record(r)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("worker1/compute_s")] == [0, 1, 2, 3, 4]
    assert [(e.step, e.value) for e in acc.Scalars("test/accuracy")] == [(5, 0.875)]


def test_tensorboard_key_without_the_package_is_a_config_error(monkeypatch):
    import importlib.util

    from equipoise.config import Config, ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"tensorboard = true needs the tensorboard package"):
        Config.from_dict({"tensorboard": True})
    assert Config.from_dict({}).tensorboard is False


def test_html_report_of_two_runs_embeds_every_plot(tmp_path):
    a = _run_dir(tmp_path, _records(), {"status": "completed", "protocol": "bsp", "samples_per_s": 1280.0,
                                        "final_accuracy": 0.875})
    b = tmp_path / "other" / "run"
    b.mkdir(parents=True)
    (b / "metrics.jsonl").write_text((a / "metrics.jsonl").read_text())  # running: no summary.json
    paths = html_report([a, b])
    page = paths[-1]
    assert page == tmp_path / "report" / "report.html"
    text = page.read_text()
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {p.name for p in pngs} >= {"accuracy.png", "throughput.png", "batch_sizes.png", "servers.png"}
    assert text.count('src="data:image/png;base64,') == len(pngs) == 2 + 2 * 5
    assert "<script" not in text and "http" not in re.sub(r'src="data:[^"]*"', "", text)
    assert "time to 87.5% (s)" in text and "running (no summary.json)" in text and "1: run (bsp)" in text
    assert (tmp_path / "report" / "2-run" / "timeline.png").is_file()


def test_html_report_of_one_run_goes_beside_its_plots(tmp_path, capsys):
    d = _run_dir(tmp_path, _records(), {"status": "completed"})
    assert cli.main(["report", str(d)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[-1] == str(d / "report" / "report.html") and str(d / "report" / "timeline.png") in printed
    with pytest.raises(ReportError):
        html_report([])
