"""Children forked warm from the job's template (launch/warm.py): the launcher's own
children (exit status, kill), their command line as a cold child's, the subreaper only
while a template runs, and the cold fallback."""

import ctypes
import os
import shutil
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


def test_a_template_started_early_is_adopted_by_the_job_it_was_started_for_or_stopped():
    """`prestart` starts the template and the job's folder before the checks; the job of
    the same thread count adopts both; one of another thread count does not (the early
    one is stopped), and `discard_early` stops one no job took, folder and all."""
    from equipoise.launch import warm

    warm.prestart(1, 60)
    early = warm.adopt(1)
    assert early is not None
    env, tmp, template = early
    try:
        assert env["TMPDIR"] == tmp and os.path.isdir(tmp) and env["OMP_NUM_THREADS"] == "1"
        assert template.proc.poll() is None and warm.adopt(1) is None  # adopted once
    finally:
        template.close()
        shutil.rmtree(tmp, ignore_errors=True)
    warm.prestart(1, 60)
    [(_, _, other_tmp, other)] = warm._early
    assert warm.adopt(2) is None and other.proc is None and not os.path.exists(other_tmp)
    warm.prestart(1, 60)
    [(_, _, left_tmp, left)] = warm._early
    warm.discard_early()
    assert left.proc is None and not os.path.exists(left_tmp) and warm._early == []
    assert not [p for p in psutil.Process().children() if "equipoise.launch.warm" in " ".join(p.cmdline())]


def test_an_early_template_is_adopted_where_the_user_sets_tmpdir(monkeypatch):
    """The job's folder replaces the user's TMPDIR in the children's environment: a
    TMPDIR of the user's own does not make the early template look like another job's."""
    from equipoise.launch import warm

    monkeypatch.setenv("TMPDIR", "/tmp")
    warm.prestart(1, 60)
    early = warm.adopt(1)
    try:
        assert early is not None and early[0]["TMPDIR"] == early[1] != "/tmp"
    finally:
        if early is not None:
            early[2].close()
            shutil.rmtree(early[1], ignore_errors=True)
        warm.discard_early()


def test_prestart_imports_no_torch():
    """The command line calls `prestart` before it imports torch, so that the template's
    imports run beside its own: `prestart` itself must not import torch (its ipc path
    check once imported the wire package, and the template started 1.3 s late). In a
    fresh interpreter, as the command line runs it."""
    import subprocess
    import sys

    code = ("import sys; from equipoise.launch import warm; warm.prestart(1, 60); "
            "print('torch' in sys.modules); warm.discard_early()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", done.stdout


def test_threads_beyond_one_sleep_when_idle_unless_the_user_says_otherwise(monkeypatch):
    """A job's processes share the cores: with more than one thread OpenMP's idle threads
    sleep (OMP_WAIT_POLICY=PASSIVE) rather than spin through the exchange; one thread has
    no idle threads to set; a policy the user set is kept."""
    from equipoise.launch.warm import job_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert job_env(2)["OMP_WAIT_POLICY"] == "PASSIVE" and job_env(2)["OMP_NUM_THREADS"] == "2"
    assert "OMP_WAIT_POLICY" not in job_env(1)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert job_env(2)["OMP_WAIT_POLICY"] == "ACTIVE"
