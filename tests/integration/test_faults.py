"""Peers that misbehave or die: the job fails fast naming them, or serves on unharmed."""

from __future__ import annotations

import re
import signal
import threading

import msgpack
import pytest
import torch
import zmq

import equipoise

from equipoise.wire.auth import secure_connection

from .helpers import all_gone, capture_job_keys, descendants, records, role_pid, set_args, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LONG = dict(dataset="digits", model="mlp", global_batch=64, workers=4, servers=2,
            iterations=100000, eval_every=0, checkpoint_every=0, progress=False, timeout=30.0)


def _send_raw(address: str, frames: list[bytes], keys) -> None:
    """Send `frames` as they are, over a connection authenticated with `keys` (JobKeys)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    secure_connection(sock, keys)
    sock.connect(address)
    sock.send_multipart(frames)
    sock.poll(300)  # give the server a moment; an error reply may or may not come
    sock.close()
    ctx.term()


def test_malformed_messages_are_logged_and_the_server_serves_on(tmp_path, monkeypatch):
    """From a peer the server authenticates (the job's worker keys), so they reach it."""
    keys = capture_job_keys(monkeypatch)
    run = tmp_path / "run"
    cfg = dict(LONG, iterations=300, eval_every=100)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(equipoise.train(cfg, out=run)))
    thread.start()
    log = run / "logs" / "server0.log"
    address = wait_for(lambda: log.exists() and re.search(r"listening on (\S+)", log.read_text()),
                       60, "server 0 to listen").group(1)
    header = lambda t, f, x=(): msgpack.packb({"v": 1, "t": t, "f": f, "x": list(x)})
    nan = torch.full((4,), float("nan")).numpy().tobytes()
    for frames in (
        [b"\xc1garbage"],                                                  # not msgpack
        [msgpack.packb({"v": 99, "t": "pull", "f": {}, "x": []})],          # wrong version
        [header("pull", {"worker": 0, "min_version": 0}, [["b0", "float32", [1000]]]), b"short"],  # truncated
        [header("nonsense", {})],                                           # unknown type
        [header("push", {"worker": 0, "version": 0, "samples": 4}, [["g0", "float32", [4]]]), nan],
    ):
        _send_raw(address, frames, keys["worker0"])
    thread.join(timeout=100)
    assert not thread.is_alive()
    assert result["status"] == "completed" and result["iterations"] == 300
    text = log.read_text()
    assert text.count("WARNING") >= 4, text
    assert "version" in text and "refused" in text


def test_a_dead_server_without_recovery_fails_the_job_fast_naming_it(tmp_path):
    run = tmp_path / "run"
    proc = start_cli("train", "--out", str(run), *set_args(dict(LONG, snapshot_every=0)))  # no rollback
    try:
        wait_for(lambda: len(records(run, "iteration")) >= 5, 60, "training to start")
        victim = role_pid(proc.pid, "server 1")
        others = [p.pid for p in descendants(proc.pid)]
        psutil_kill(victim)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "server1" in err and "-9" in err and "Traceback" not in err
    assert all_gone(others)


def test_ctrl_c_stops_every_process(tmp_path):
    run = tmp_path / "run"
    proc = start_cli("train", "--out", str(run), *set_args(LONG))
    try:
        wait_for(lambda: len(records(run, "iteration")) >= 5, 60, "training to start")
        kids = descendants(proc.pid)
        children = [p.pid for p in kids]  # the job's template (launch/warm.py) among them
        assert sum("equipoise.launch.proc" in " ".join(p.cmdline()) for p in kids) == 6
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert all_gone(children)


def psutil_kill(pid: int) -> None:
    import os
    os.kill(pid, signal.SIGKILL)
