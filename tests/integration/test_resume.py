"""--resume continues a BSP run so that it ends bit-for-bit where an uninterrupted run ends,
after an interrupt and after the coordinator itself was killed."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import equipoise
from equipoise.config import Config
from equipoise.protocol.checkpoint import load_checkpoint

from .helpers import all_gone, descendants, records, set_args, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOB = dict(dataset="digits", model="mlp", global_batch=64, workers=3, servers=2, iterations=200,
           eval_every=0, checkpoint_every=20, lr=0.05, momentum=0.9, weight_decay=1e-4,
           optimizer="sgd", lr_schedule="step", lr_step_size=75, lr_gamma=0.5, seed=7,
           progress=False, slowdown=[1.0, 1.0, 3.0])


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run's final weights."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert equipoise.train(JOB, out=out)["iterations"] == JOB["iterations"]
    return torch.load(out / "model.pt", weights_only=True)


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resume_after_interrupt_ends_bit_for_bit(tmp_path, whole):

    run = tmp_path / "interrupted"
    proc = start_cli("train", "--out", str(run), *set_args(JOB))
    try:
        wait_for(lambda: any(r.get("event") == "checkpoint" and r["iteration"] >= 40
                             for r in records(run, "event")), 120, "a checkpoint at iteration ≥ 40")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    done = max(r["iteration"] for r in records(run, "iteration"))
    assert done < JOB["iterations"] - 1, "the interrupt came too late to test anything"

    resumed = equipoise.train(resume=run)
    assert resumed["resumed_from"] >= 40 and resumed["iterations"] == JOB["iterations"]
    _assert_equal(whole, torch.load(run / "model.pt", weights_only=True))


def test_a_killed_coordinator_takes_its_processes_along_and_the_run_resumes(tmp_path, whole):
    """kill -9 of the CLI: its servers and workers die with it (PR_SET_PDEATHSIG, and
    the heartbeat's own timeout), the checkpoint on disk loads, and resuming from it
    ends where the uninterrupted run ends."""
    run = tmp_path / "killed"
    proc = start_cli("train", "--out", str(run), *set_args(JOB))
    try:
        wait_for(lambda: any(r.get("event") == "checkpoint" and r["iteration"] >= 40
                             for r in records(run, "event")), 120, "a checkpoint at iteration ≥ 40")
        kids = descendants(proc.pid)
        children = [p.pid for p in kids]
        # the children's temporary folder: a launcher killed by a signal cannot remove it
        folders = {p.environ().get("TMPDIR") for p in kids if "equipoise.launch.proc" in " ".join(p.cmdline())}
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert len(children) >= JOB["workers"] + JOB["servers"]
    assert all_gone(children, timeout=Config.from_dict(JOB).timeout), "children outlived the coordinator"
    [folder] = folders  # one job: one folder, which this test removes
    assert folder and Path(folder).name.startswith("equipoise-job-")
    shutil.rmtree(folder)
    done = max(r["iteration"] for r in records(run, "iteration"))
    assert done < JOB["iterations"] - 1, "the kill came too late to test anything"

    ckpt = load_checkpoint(run)
    assert ckpt.iteration >= 40 and ckpt.iteration % JOB["checkpoint_every"] == 0
    resumed = equipoise.train(resume=run)
    assert resumed["resumed_from"] == ckpt.iteration and resumed["iterations"] == JOB["iterations"]
    _assert_equal(whole, torch.load(run / "model.pt", weights_only=True))


# The CLI with one kill point: SIGKILL of the coordinator's own process at the n-th time it
# reaches the point, so the crash lands exactly there. "state.pt": half of a checkpoint's
# state written; "renames": between a checkpoint's two renames (the old one moved aside,
# the new one not yet in place); any other name: a run file written by write_atomic,
# complete in its temp file, not yet renamed over the old one.
KILLER = """
import os, signal, sys
from pathlib import Path

point, n, count = sys.argv[1], int(sys.argv[2]), [0]

def hit():
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)

if point == "state.pt":
    write_bytes = Path.write_bytes
    def torn(self, data):
        if self.name == "state.pt" and count[0] + 1 == n:
            with open(self, "wb") as fh:
                fh.write(data[: len(data) // 2])
                fh.flush()
        if self.name == "state.pt":
            hit()
        return write_bytes(self, data)
    Path.write_bytes = torn
elif point == "renames":
    rename = Path.rename
    def moved(self, target):
        out = rename(self, target)
        if self.name == "checkpoint" and Path(target).name == "checkpoint.old":
            hit()
        return out
    Path.rename = moved
else:
    replace = os.replace
    def replaced(src, dst, *args, **kwargs):
        if Path(dst).name == point:
            hit()
        return replace(src, dst, *args, **kwargs)
    os.replace = replaced

from equipoise.cli import main
sys.exit(main(sys.argv[3:]))
"""


# The third checkpoint (iteration 60) is the third state.pt written, but the second rename
# of a checkpoint aside (the first save has none to move).
@pytest.mark.parametrize("point,n", [("state.pt", 3), ("renames", 2), ("model.pt", 1)])
def test_a_crash_while_a_run_file_is_written_resumes_as_if_uninterrupted(tmp_path, whole, point, n):
    """The coordinator is killed (SIGKILL) while it writes a file of the run directory:
    half-way through the third checkpoint's state, between that checkpoint's renames,
    or with the final weights complete but not yet in place. Every file it had written
    before is whole (written beside, then renamed), so --resume starts from the last
    complete checkpoint and ends bit for bit where the uninterrupted run ends."""
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    run = tmp_path / "run"
    before = set(Path(tempfile.gettempdir()).glob("equipoise-job-*"))
    proc = subprocess.Popen([sys.executable, str(killer), point, str(n), "train", "--out", str(run),
                             *set_args(JOB)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point} (exit {proc.returncode}): {err[-500:]}"
    # the children die with it; their temporary folder, which a killed launcher cannot remove
    for folder in set(Path(tempfile.gettempdir()).glob("equipoise-job-*")) - before:
        shutil.rmtree(folder, ignore_errors=True)
    if point == "model.pt":
        assert not (run / "model.pt").exists() and (run / ".model.pt.tmp").exists()
    ckpt = load_checkpoint(run)  # the last complete one: the third's was killed, the final one is whole
    assert ckpt.iteration == (JOB["iterations"] if point == "model.pt" else 2 * JOB["checkpoint_every"])
    resumed = equipoise.train(resume=run)
    assert resumed["resumed_from"] == ckpt.iteration and resumed["iterations"] == JOB["iterations"]
    _assert_equal(whole, torch.load(run / "model.pt", weights_only=True))


def test_resume_from_a_run_without_checkpoint_is_a_clear_error(tmp_path):
    from equipoise.protocol.checkpoint import CheckpointError
    (tmp_path / "config.toml").write_text('dataset = "digits"\n')
    with pytest.raises(CheckpointError, match="checkpoint"):
        equipoise.train(resume=tmp_path)
