"""Children forked warm from the job's template (launch/warm.py): the launcher's own
children (exit status, kill), their command line as a cold child's, the subreaper only
while a template runs, and the cold fallback."""

import ctypes
import os
import signal
import time

import psutil
import pytest

from equipoise.launch.warm import Template

pytestmark = pytest.mark.timeout(120)
PR_GET_CHILD_SUBREAPER = 37


def _subreaper() -> int:
    value = ctypes.c_int(0)
    ctypes.CDLL("libc.so.6").prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0)
    return value.value


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux only")
def test_a_warm_child_is_the_launchers_and_reads_as_a_cold_one(tmp_path):
    before = _subreaper()
    template = Template(dict(os.environ), 60)
    try:
        assert _subreaper() == 1
        # A worker whose coordinator never answers: it fails, naming itself, exit 1.
        job = {"config": {"timeout": 3.0, "heartbeat_s": 0}, "keys": None, "beats": ""}
        failing = template.spawn("worker", 3, "tcp://127.0.0.1:9", tmp_path / "w3.log", job)
        child = psutil.Process(failing.pid)
        assert child.ppid() == os.getpid()  # reparented: waited for here
        assert child.cmdline()[-5:] == ["-m", "equipoise.launch.proc", "worker", "3", "tcp://127.0.0.1:9"]
        assert failing.wait(60) == 1
        assert "error: worker 3: WorkerError" in (tmp_path / "w3.log").read_text()
        # Killed by a signal: as Popen says it.
        killed = template.spawn("worker", 4, "tcp://127.0.0.1:9", tmp_path / "w4.log", dict(job, config={"timeout": 60.0}))
        assert killed.poll() is None
        killed.kill()
        assert killed.wait(30) == -signal.SIGKILL
    finally:
        template.close()
    assert _subreaper() == before  # no longer a subreaper once no template runs


def test_children_start_cold_when_asked_or_when_the_template_is_gone(tmp_path):
    off = Template(dict(os.environ, EQUIPOISE_WARM="0"), 60)
    assert off.proc is None and off.spawn("worker", 0, "tcp://127.0.0.1:9", tmp_path / "a.log", {}) is None
    template = Template(dict(os.environ), 60)
    try:
        template.proc.kill()
        template.proc.wait(10)
        assert template.spawn("worker", 0, "tcp://127.0.0.1:9", tmp_path / "b.log", {}) is None
        assert template.proc is None  # stopped: later spawns start cold at once
    finally:
        template.close()


def test_a_job_runs_with_warm_children_and_leaves_none(tmp_path):
    import equipoise

    summary = equipoise.train(dict(dataset="digits", model="mlp", workers=2, servers=2, iterations=6, eval_every=0,
                                   checkpoint_every=0, progress=False), out=tmp_path / "run")
    assert summary["status"] == "completed"
    pids = [n["pid"] for n in summary["nodes"].values()]
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in pids)  # reaped: no zombie left either
    assert not [p for p in psutil.Process().children() if "equipoise.launch.warm" in " ".join(p.cmdline())]
