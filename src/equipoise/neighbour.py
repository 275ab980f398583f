"""A real noisy neighbour: a process that burns CPU beside a target process.

Runtime helper behind ``scenario.NoisyNeighbour`` (not a policy).  The burner is a
child ``python -c`` process (no equipoise import, so it starts in tens of ms) pinned to
the CPUs the target may run on, so the kernel has to share those CPUs between the two.
It busy-loops ``share`` of every 10 ms period and sleeps the rest, and exits on its own
when the process that started it dies (it polls ``os.getppid()``).  One burner is one
single-threaded competitor: on a target pinned to one CPU it takes about half of it
(fair scheduling); for a target spread over k CPUs start k burners for the same effect.
"""
from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["Burner", "start_burner"]

PERIOD_S = 0.010          # duty-cycle period: short enough to look like steady load

# Runs in the child.  argv: parent pid, share, comma-separated CPU ids.
_BURNER_CODE = r"""
import os, sys, time
parent, share, cpus = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
period, next_check = %r, 0.0
while True:
    start = time.monotonic()
    if start >= next_check:             # orphaned? our parent died: stop burning
        if os.getppid() != parent:
            sys.exit(0)
        next_check = start + 0.1
    while time.monotonic() - start < share * period:
        pass
    if share < 1.0:
        time.sleep(max(0.0, period - (time.monotonic() - start)))
""" % PERIOD_S


class Burner:
    """Handle on a running burner process; ``stop()`` ends and reaps it."""

    def __init__(self, proc: subprocess.Popen, target_pid: int, cpus: frozenset[int],
                 share: float):
        self._proc = proc
        self.target_pid, self.cpus, self.share = target_pid, cpus, share

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self, timeout: float = 2.0) -> None:
        """Terminate, wait up to ``timeout`` s, then kill; always reaps the child."""
        if self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "Burner":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_burner(target_pid: int, share: float = 1.0) -> Burner:
    """Start a process burning CPU on the CPUs ``target_pid`` is allowed to run on.

    ``share`` in (0, 1] is the busy fraction of each 10 ms period.  Raises ValueError
    for a bad share and ProcessLookupError if the target does not exist.
    """
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    cpus = frozenset(os.sched_getaffinity(target_pid))
    cmd = [sys.executable, "-c", _BURNER_CODE, str(os.getpid()), repr(float(share)),
           ",".join(str(c) for c in sorted(cpus))]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            close_fds=True)
    try:  # pin from here too, so the affinity holds from the start, not after its import
        os.sched_setaffinity(proc.pid, cpus)
    except OSError:
        pass  # it pins itself as well
    return Burner(proc, target_pid, cpus, float(share))
