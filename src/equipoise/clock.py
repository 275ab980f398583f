"""Clocks: the system's, and a virtual one for tests and discrete-event simulation.

A clock has `now()` (monotonic seconds) and `sleep(s)`. Code that emulates or measures
time takes a clock, so the same code runs on real or on virtual time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, s: float) -> None: ...


class SystemClock:
    """Real time: `time.perf_counter` and `time.sleep` (a wait of s ≤ 0 returns at once)."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, s: float) -> None:
        if s > 0:
            time.sleep(s)


class VirtualClock:
    """Time that moves only when told: `sleep(s)` and `advance(s)` add s to `now()`."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        if s > 0:
            self.t += s

    def advance(self, s: float) -> None:
        if s < 0:
            raise ValueError(f"cannot advance a clock by {s} s")
        self.t += s


SYSTEM = SystemClock()

__all__ = ["Clock", "SystemClock", "VirtualClock", "SYSTEM"]
