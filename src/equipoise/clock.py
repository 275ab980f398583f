"""Clocks that timing code takes as an argument, so its tests run on virtual time."""

from __future__ import annotations

import time


class SystemClock:
    """The real clock: monotonic seconds and a real sleep."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """A clock that moves only when told: sleeping advances it, nothing waits."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds


SYSTEM = SystemClock()
