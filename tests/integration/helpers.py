"""Shared pieces of the integration tests: running the CLI and watching a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equipoise.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "equipoise.cli", *args],
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


def records(run_dir: Path, kind: str | None = None) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or r.get("type") == kind:
            out.append(r)
    return out


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def role_pid(pid: int, role: str) -> int:
    """The pid of the child process running `role` (e.g. 'worker 1') under `pid`."""
    kind, rank = role.split()
    for p in descendants(pid):
        cmd = p.cmdline()
        if "equipoise.runtime.proc" in cmd and cmd[cmd.index("equipoise.runtime.proc") + 1:][:2] == [kind, rank]:
            return p.pid
    raise AssertionError(f"no {role} process under {pid}")


def all_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


__all__ = ["cli", "start_cli", "set_args", "wait_for", "records", "descendants", "role_pid",
           "all_gone", "os"]
