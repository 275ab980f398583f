"""What a worker's user code is doing now, for its heartbeat to say.

A worker calls the user's code — the dataset's ``__getitem__`` or ``get_batch``, the
collate function, the loss — on its main thread and on its loader threads. Each such call
is entered here (``USER_CODE.call``), and the heartbeat thread reports the one running
longest (``longest``): what it is, the iteration, the sample index and for how long. The
launcher's heartbeat listener keeps the report, and a worker in one call for longer than
``stuck_s`` fails the job, named: "worker 2 is stuck in the dataset's __getitem__ (sample
3081, iteration 14) for 61 s". Without it a worker stuck in user code still beats (the
heartbeat is a thread of its own), so under a barrier the job waits out its timeout, and
without one it ends on a server's idle timeout naming a server; re-planning the worker's
slice onto the others would only send them to the same sample.

Entering and leaving a call costs a lock and a dict operation (about a microsecond).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["UserCode", "Busy", "USER_CODE"]


@dataclass(frozen=True)
class Busy:
    """A call into user code under way: `what` ("the dataset's __getitem__", …), the
    worker's `iteration`, the `sample` index it reads (-1: none) and `for_s` seconds so far."""
    what: str
    iteration: int
    sample: int
    for_s: float

    def to_list(self) -> list:
        return [self.what, self.iteration, self.sample, round(self.for_s, 3)]

    def describe(self) -> str:
        where = [f"sample {self.sample}"] if self.sample >= 0 else []
        where += [f"iteration {self.iteration}"] if self.iteration >= 0 else []
        return f"{self.what}" + (f" ({', '.join(where)})" if where else "")


class UserCode:
    """The calls into user code under way, one per thread."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[str, int, int, float]] = {}
        self.iteration = -1  # the worker loop's current iteration

    @contextmanager
    def call(self, what: str, sample: int = -1) -> Iterator[None]:
        key = threading.get_ident()
        with self._lock:
            outer = self._calls.get(key)
            if outer is None:  # a nested call (collate inside get_batch) keeps the outer one
                self._calls[key] = (what, self.iteration, int(sample), self._clock())
        try:
            yield
        finally:
            if outer is None:
                with self._lock:
                    self._calls.pop(key, None)

    def longest(self) -> Busy | None:
        """The call under way for longest, or None."""
        with self._lock:
            calls = list(self._calls.values())
        if not calls:
            return None
        what, iteration, sample, since = min(calls, key=lambda c: c[3])
        return Busy(what, iteration, sample, max(0.0, self._clock() - since))


USER_CODE = UserCode()
