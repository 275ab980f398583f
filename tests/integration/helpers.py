"""Shared pieces of the integration tests: running the CLI and watching a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

from equipoise.config import Config
from equipoise.reference import oracle_diff, run_splits, train_reference


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equipoise.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(*args: str) -> subprocess.Popen:
    """The CLI in a process of its own, with Ctrl-C's default action whatever this
    process's is: a suite started in the background of a shell inherits SIGINT
    ignored, which a child would keep (Python leaves an ignored SIGINT ignored), so the
    tests that send it SIGINT would see it ignored."""
    return subprocess.Popen([sys.executable, "-m", "equipoise.cli", *args], preexec_fn=_default_sigint,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def set_args(cfg: dict) -> list[str]:
    out = []
    for k, v in cfg.items():
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, str):
            v = f'"{v}"'
        out += ["--set", f"{k}={v}"]
    return out


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# metrics.jsonl is append-only: what was parsed of each file is kept, and a call reads only
# what was appended since. Tests poll it every 10 ms while the job's coordinator runs in
# the same process; parsing the whole file each time took the coordinator's GIL from it.
_PARSED: dict[Path, tuple[int, int, list[dict]]] = {}  # path -> (inode, bytes parsed, records)


def records(run_dir: Path, kind: str | None = None) -> list[dict]:
    """The run's metrics records so far (of type `kind`); a line still being written is
    left for the next call."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        inode = path.stat().st_ino
        with path.open("rb") as fh:
            seen_inode, offset, parsed = _PARSED.get(path, (inode, 0, []))
            if seen_inode != inode or fh.seek(0, 2) < offset:  # another file there now: from the start
                offset, parsed = 0, []
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:
        return []
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    _PARSED[path] = (inode, offset + end, parsed)
    return [r for r in parsed if kind is None or r.get("type") == kind]


def assert_equals_reference(cfg: dict, run_dir: Path) -> None:
    """The run's final weights equal `train_reference` on the run's own batch splits, and
    training moved them much further than the tolerance (the comparison is not vacuous).

    The tolerance. The reference performs the job's floating point operations in the job's
    order (see equipoise.reference): each slice's forward and backward with the same
    shapes, thread count and seed, so the same kernels, on this machine; the servers'
    weighted sum, weight by weight; the same torch.optim step on the same block tensors,
    whose arithmetic is elementwise. Weights and gradients travel as raw bytes, and the
    learning rate is the same function of the same integer sample count. So each
    iteration starts from bit-identical weights and the two runs are equal bit for bit:
    nothing is left to differ, and any difference is a fault. A tolerance would not
    help either: where a gradient element is rounding noise, one differing bit may flip
    its sign and Adam's step there by ±lr, and after that the two runs are on different
    trajectories — a bound that admitted that would admit real faults too.
    """
    splits = run_splits(run_dir)
    conf = Config.from_dict(cfg)
    ref = train_reference(conf, splits=splits).state_dict()
    got = torch.load(Path(run_dir) / "model.pt", weights_only=True)
    assert ref.keys() == got.keys()
    for name in ref:
        diff = (got[name] - ref[name]).abs().max().item()
        assert torch.equal(got[name], ref[name]), f"{name}: max |difference| {diff:.3g}"
    start = train_reference(conf, iterations=0).state_dict()
    moved = max((got[n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-3, f"training moved no weight by more than {moved:.3g}"


def assert_near_reference(cfg: dict, run_dir: Path, tol: float = 1e-5) -> float:
    """The run's final weights are within `tol` of `train_reference` on the run's own
    splits (a run that lost processes; test_recovery's docstring argues the 1e-5), and
    training moved them by more than 100·tol. Returns the max |difference|."""
    diff, moved = oracle_diff(Config.from_dict(cfg), run_dir)
    assert diff <= tol, f"final weights differ from the oracle by {diff:.3g}"
    assert moved > 100 * tol, f"training moved no weight by more than {moved:.3g}"
    return diff


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def role_pid(pid: int, role: str) -> int:
    """The pid of the child process running `role` (e.g. 'worker 1') under `pid`."""
    kind, rank = role.split()
    for p in descendants(pid):
        try:
            cmd = p.cmdline()
        except psutil.Error:  # exited since (a zombie until reaped): not the one
            continue
        if "equipoise.launch.proc" in cmd and cmd[cmd.index("equipoise.launch.proc") + 1:][:2] == [kind, rank]:
            return p.pid
    raise AssertionError(f"no {role} process under {pid}")


def all_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


__all__ = ["cli", "start_cli", "set_args", "wait_for", "records", "assert_equals_reference",
           "assert_near_reference", "descendants", "role_pid", "all_gone", "os"]


def capture_job_keys(monkeypatch) -> dict:
    """A test hook: the dict fills with identity ("worker0") -> JobKeys when a job run by this process
    (equipoise.train, local launcher) generates its keys."""
    from equipoise.launch import local

    keys: dict = {}
    real = local.generate_keys
    monkeypatch.setattr(local, "generate_keys", lambda mode, **counts: keys.update(real(mode, **counts)) or keys)
    return keys
