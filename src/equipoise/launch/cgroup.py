"""Real CPU limits for worker processes with cgroup v1 `cpu.cfs_quota_us` (needs root).

A worker limited to c CPUs gets c × period of CPU time per period, however idle the
machine is — a slower machine, for real. A noisy neighbour of that worker joins the same
cgroup and so competes for the same quota, as a co-located job would.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpu")
MIN_QUOTA_US = 1_000  # the kernel's minimum


class CgroupError(RuntimeError):
    """cgroup v1 cpu controller missing or not writable; names the path."""


class CpuLimit:
    def __init__(self, name: str, cpus: float):
        if not (ROOT / "cpu.cfs_quota_us").exists():
            raise CgroupError(f"cpu_limit needs the cgroup v1 cpu controller at {ROOT}, which is missing")
        self.path = ROOT / name
        try:
            self.path.mkdir(exist_ok=True)
            # The shortest period the kernel allows for this share: a throttled step is
            # late by up to one period, so short periods keep step times steady.
            period = int(min(1_000_000, max(MIN_QUOTA_US, MIN_QUOTA_US / cpus)))
            (self.path / "cpu.cfs_quota_us").write_text("-1")  # lift first: period and quota
            (self.path / "cpu.cfs_period_us").write_text(str(period))  # must stay consistent
            (self.path / "cpu.cfs_quota_us").write_text(str(max(MIN_QUOTA_US, int(cpus * period))))
        except OSError as exc:
            raise CgroupError(f"cannot set up {self.path} for cpu_limit (run as root?): {exc}") from None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Move any process left back to the root group, then delete the group."""
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (ROOT / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            os.rmdir(self.path)
        except OSError:
            pass
