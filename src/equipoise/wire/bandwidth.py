"""A token bucket: the bandwidth cap of an emulated slow link (PSLD's bandwidth
contention, PAPERS.md §3)."""

from __future__ import annotations

import time
from typing import Callable


class TokenBucket:
    """`rate` bytes per second with a burst of `burst` bytes. `delay(n)` takes n bytes'
    tokens (going into debt if needed) and returns how long the caller must wait for
    the debt to be paid: a stream of messages through the bucket averages `rate`."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic):
        if not rate > 0:
            raise ValueError(f"rate = {rate!r} must be > 0 bytes/s")
        self.rate, self.clock = float(rate), clock
        self.burst = float(burst if burst is not None else rate * 0.005)
        self.tokens, self.t = self.burst, clock()

    def delay(self, nbytes: int) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= nbytes
        return max(0.0, -self.tokens / self.rate)


__all__ = ["TokenBucket"]
