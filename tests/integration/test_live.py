"""The live view, `equipoise watch`, report.html and TensorBoard on real jobs.

Two jobs of 2 workers on the digits data set, worker 1 emulating a machine 32× slower
(`slowdown = [1, 32]`): a BSP job run by the CLI in a pseudo-terminal (so the progress
bar and the live view are drawn as a user sees them), and an LB-BSP job with
`tensorboard = true`.

Why worker 1 is marked slow and worker 0 is not, on a loaded machine too: the view marks
a worker whose compute speed (samples per compute second over its last 10 iterations)
is below 0.6 × the median of the workers' speeds, with two workers their mean: worker 1
is marked iff v₁ < 0.3 (v₀ + v₁), i.e. v₁ / v₀ < 3/7. Under BSP both compute 64 samples
an iteration on the same CPU work c; a step's compute time is its wall time k·c (k ≥ 1:
how much host contention stretches it) plus, for worker 1, the emulation's sleep of
(32 − 1)·c (sized on its usual CPU time, docs/configuration.md). So
v₁ / v₀ = k₀ / (k₁ + 31) ≤ k₀ / 32, below 3/7 while k₀ < 13.7: worker 0's CPU work
would have to be stretched 13.7× by other load for the mark to fail (the 2-core machine
this was written on, at load average 8, stretched it about 5×). Worker 0 is marked iff
v₀ < 0.3 (v₀ + v₁), impossible while v₀ ≥ v₁. A 4× slowdown would not do: it fails
from k₀ ≈ 1.7.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import struct
import subprocess
import sys
import time

import pytest

from .helpers import cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = ["--set", "dataset=digits", "--set", "workers=2", "--set", "iterations=20", "--set", "eval_every=10",
       "--set", "slowdown=[1,32]", "--set", "timeout=60"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_pty(args: list[str], timeout: float = 180.0) -> tuple[int, str]:
    """Run `python -m equipoise.cli *args` with a pseudo-terminal as its stdin, stdout
    and stderr (120 × 40); return its exit status and everything it wrote."""
    import fcntl
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    proc = subprocess.Popen([sys.executable, "-m", "equipoise.cli", *args], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    return status, ANSI.sub("", out.decode("utf-8", errors="replace"))


def worker_rows(text: str) -> dict[str, str]:
    """The last row of each worker in the view's tables: 'w0' -> the row."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\s*(w\d+)\s+\d+\s", line)
        if m:
            rows[m.group(1)] = line
    return rows


@pytest.fixture(scope="module")
def bsp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("live") / "bsp"
    status, text = run_in_pty(["train", *JOB, "--out", str(out)])
    assert status == 0, text[-3000:]
    return out, text


@pytest.fixture(scope="module")
def lbbsp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("live") / "lbbsp"
    proc = cli("train", *JOB, "--set", "protocol=lbbsp", "--set", "tensorboard=true", "--quiet", "--out", str(out),
               timeout=180)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_live_view_marks_the_slowed_worker(bsp_run):
    _, text = bsp_run
    assert "workers (last 10 iterations)" in text and "samples/s" in text
    rows = worker_rows(text)
    assert set(rows) == {"w0", "w1"}, text[-3000:]
    assert rows["w1"].rstrip().endswith("slow"), rows
    assert "slow" not in rows["w0"], rows
    assert re.search(r"^\s*s0\s+\d+", text, re.M) and re.search(r"^\s*s1\s+\d+", text, re.M)  # the servers


def test_watch_shows_the_same_on_the_finished_run(bsp_run):
    out, _ = bsp_run
    proc = cli("watch", str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "iteration 20/20" in proc.stdout and "completed" in proc.stdout
    rows = worker_rows(proc.stdout)
    assert rows["w1"].rstrip().endswith("slow") and "slow" not in rows["w0"], proc.stdout


def test_tensorboard_has_one_value_per_iteration(lbbsp_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(lbbsp_run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    per_iteration = {"train/loss", "train/samples_per_s", "worker0/batch", "worker1/batch", "worker0/wait_s",
                     "worker1/wait_s", "worker0/compute_s", "worker1/compute_s"}
    assert per_iteration | {"test/accuracy", "server0/busy_share", "server1/busy_share"} <= tags, tags
    for tag in per_iteration:
        assert [e.step for e in acc.Scalars(tag)] == list(range(20)), tag
    assert [e.step for e in acc.Scalars("test/accuracy")] == [10, 20]
    # LB-BSP's global batch stays 128: the two workers' logged batches sum to it every iteration
    b0, b1 = acc.Scalars("worker0/batch"), acc.Scalars("worker1/batch")
    assert all(x.value + y.value == 128 for x, y in zip(b0, b1))
    assert b1[-1].value < b0[-1].value  # the slowed worker was given the smaller share


@pytest.mark.skipif(shutil.which("chromium") is None and not os.environ.get("CI"),
                    reason="Debian's chromium is not installed (the README's test command installs it)")
def test_report_html_opens_in_headless_chromium(bsp_run, lbbsp_run, tmp_path):
    from equipoise.report import html_report

    paths = html_report([bsp_run[0], lbbsp_run], tmp_path / "report")
    page, pngs = paths[-1], paths[:-1]
    text = page.read_text()
    assert "<script" not in text and "http" not in re.sub(r'src="data:[^"]*"', "", text)  # nothing fetched
    assert text.count('src="data:image/png;base64,') == len(pngs) >= 12
    # A copy of the page with a probe that writes, once loaded, how many images it has
    # and how many did not decode into the body's attributes, which --dump-dom prints.
    probe = ("<script>window.addEventListener('load',()=>{const im=[...document.images];"
             "document.body.dataset.images=im.length;"
             "document.body.dataset.broken=im.filter(i=>!i.complete||i.naturalWidth===0).length});</script>")
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", probe + "</body>"))
    proc = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()],
                          capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stderr[-2000:]
    assert f'data-images="{len(pngs)}"' in body.group(0) and 'data-broken="0"' in body.group(0), body.group(0)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
