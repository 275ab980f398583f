"""A token bucket: the bandwidth cap of an emulated slow link (the link contention PSLD
reacts to: Chen et al., "Elastic parameter server load distribution in deep learning
clusters", ACM SoCC 2020)."""

from __future__ import annotations

from ..clock import SYSTEM, SystemClock, VirtualClock


class TokenBucket:
    """`rate` bytes per second with a burst of `burst` bytes (default: 5 ms at `rate`).
    `delay(n)` takes n bytes' tokens (going into debt if needed) and returns how long
    the caller must wait for the debt to be paid: a stream of messages through the
    bucket averages `rate`. Time is read from `clock.now()` (see equipoise.clock)."""

    def __init__(self, rate: float, burst: float | None = None,
                 clock: SystemClock | VirtualClock = SYSTEM):
        if not rate > 0:
            raise ValueError(f"rate = {rate!r} must be > 0 bytes/s")
        self.rate, self.clock = float(rate), clock
        self.burst = float(burst if burst is not None else rate * 0.005)
        self.tokens, self.t = self.burst, clock.now()

    def delay(self, nbytes: int) -> float:
        now = self.clock.now()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= nbytes
        return max(0.0, -self.tokens / self.rate)


__all__ = ["TokenBucket"]
