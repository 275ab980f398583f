"""A job's processes by role (the coordinator, each worker and server): their peak
resident set and their CPU seconds, sampled while the job runs in this process
(bench_sparse's DLRM-style jobs)."""

from __future__ import annotations

import json
import time
from pathlib import Path


class PeakRss:
    """The largest resident set of each child process of this one (the job's workers,
    servers) and of this process (the coordinator), sampled every `every` seconds, and
    their CPU seconds so far at each sample (`cpu_between`)."""

    def __init__(self, every: float = 0.2):
        import threading

        self.every, self.peak, self._stop = every, {}, threading.Event()
        self.cpu: list[tuple[float, dict[str, float]]] = []  # (time.time(), CPU seconds by role)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            now, cpu = time.time(), {}
            for proc in [me] + me.children(recursive=True):
                try:
                    cmd = proc.cmdline()
                    role = ("coordinator" if proc.pid == me.pid else
                            f"{cmd[-3]} {cmd[-2]}" if "equipoise.launch.proc" in cmd else None)
                    if role:
                        self.peak[role] = max(self.peak.get(role, 0), proc.memory_info().rss)
                        times = proc.cpu_times()
                        cpu[role] = times.user + times.system
                except (psutil.Error, IndexError):
                    pass
            self.cpu.append((now, cpu))
            self._stop.wait(self.every)

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each role used between times `t0` and `t1` (time.time()): its CPU
        seconds so far at each, interpolated between the samples around it that hold the
        role (a role not sampled on both sides of both is left out)."""
        def at(role: str, t: float) -> float | None:
            seen = [(s, c[role]) for s, c in self.cpu if role in c]
            for (sa, ca), (sb, cb) in zip(seen, seen[1:]):
                if sa <= t <= sb:
                    return ca + (cb - ca) * (t - sa) / (sb - sa) if sb > sa else ca
            return None

        roles = {role for _, c in self.cpu for role in c}
        out = {}
        for role in roles:
            a, b = at(role, t0), at(role, t1)
            if a is not None and b is not None:
                out[role] = b - a
        return out

    def of(self, role: str) -> list[float]:
        """Peak RSS in MB of every process whose role starts with `role`, by rank."""
        return [v / 1e6 for k, v in sorted(self.peak.items()) if k.startswith(role)]


def steady_cpu(rss: PeakRss, metrics: Path, warmup: int) -> dict[str, float]:
    """CPU milliseconds per iteration of the job's workers, servers and coordinator (all
    of each kind together; the coordinator's process also runs this harness's sampling)
    over the iterations after `warmup` but the last 5 (the processes must still run at
    the window's end), and `cores`: their sum over the window's seconds per iteration (2
    where both cores of this machine were busy)."""
    recs = sorted((r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("type") == "iteration"),
                  key=lambda r: r["iteration"])
    t0, t1 = recs[warmup - 1]["time"], recs[-6]["time"]
    used = rss.cpu_between(t0, t1)
    n = len(recs) - 5 - warmup
    out = {kind: 1e3 * sum(v for role, v in used.items() if role.startswith(kind)) / n
           for kind in ("worker", "server", "coordinator")}
    out["cores"] = sum(out.values()) / 1e3 * n / (t1 - t0)
    return out


__all__ = ["PeakRss", "steady_cpu"]
