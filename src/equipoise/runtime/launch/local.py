"""The local launcher: the coordinator runs in this process, servers and workers as child
processes on this machine, all talking ZeroMQ over loopback.

Whatever happens — success, a dead child, a timeout, Ctrl-C — every child is stopped
before `run_local` returns or raises, so no process is orphaned and every port is freed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ...config import Config
from ...wire import make_transport
from ..checkpoint import Checkpoint
from ..coordinator import Coordinator, JobError


class Children:
    """The job's child processes, with their logs under run_dir/logs/."""

    def __init__(self, cfg: Config, run_dir: Path, coordinator: str):
        self.procs: dict[str, subprocess.Popen] = {}
        logs = run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads))
        cfg_json = json.dumps(cfg.to_dict())
        roles = [("server", r) for r in range(cfg.servers)] + [("worker", r) for r in range(cfg.workers)]
        for role, rank in roles:
            name = f"{role}{rank}"
            log = (logs / f"{name}.log").open("w")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "equipoise.runtime.proc", role, str(rank), coordinator, cfg_json],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            log.close()
        self.logs = logs
        self.finished_ok: set[str] = set()

    def check(self) -> None:
        """Raise JobError naming the first child that exited unexpectedly."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and not (code == 0 and name in self.finished_ok):
                if code == 0 and name.startswith("worker"):
                    continue  # a worker that was told to stop
                raise JobError(f"{name} (pid {proc.pid}) exited with code {code}: {self.last_error(name)}")

    def last_error(self, name: str) -> str:
        lines = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("error:")]
        return (errors or lines or ["(no output)"])[-1][:300]

    def stop(self, grace: float = 10.0) -> None:
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)


def run_local(cfg: Config, run_dir: Path, data, resume: Checkpoint | None = None) -> dict:
    """Run one job on this machine and return its summary."""
    transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20)
    listener = transport.listen(cfg.host)
    children = Children(cfg, run_dir, listener.address)
    clean = False
    try:
        coord = Coordinator(cfg, run_dir, transport, listener, data, check_peers=children.check,
                            resume=resume)
        summary = coord.run()
        clean = True
        return summary
    finally:
        children.stop(grace=10.0 if clean else 0.0)
        listener.close()
        transport.close()
