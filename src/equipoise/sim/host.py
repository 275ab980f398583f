"""Processor sharing of an emulation host's cores for the stream engine (asp, softsync,
ssp), where steps start and finish at any time.

The barrier engine shares the cores over one iteration's steps at once
(``CostModel.host_compute``); here the steps of different iterations overlap, so the
share of a core each computing worker gets (``CostModel.host_rate``) is recomputed at
every start and finish, from the workers computing then and the workers in an exchange
(each keeps ``sim_host_exchange`` processes runnable: on one machine a message is CPU
work), and every computing worker's predicted finish moves with it, so only the earliest
one is queued. A prediction made before the last change is stale: ``stamp`` tells the
event loop which to skip.
"""

from __future__ import annotations

import numpy as np

from .cost import CostModel


class HostCores:
    """The host's state: which workers compute (their CPU work still to do and their
    speed, CPU seconds per second) and how many are in an exchange."""

    def __init__(self, cost: CostModel, n: int):
        self.cost = cost
        self.left, self.cpu, self.speed = np.zeros(n), np.zeros(n), np.zeros(n)
        self.factor, self.began = np.ones(n), np.zeros(n)
        self.computing: list[int] = []
        self.exchanging = n  # every worker starts in its first exchange
        self.since = 0.0
        self.stamp = 0

    def _advance(self, now: float) -> None:
        if self.computing:
            idx = np.array(self.computing)
            self.left[idx] -= self.speed[idx] * (now - self.since)
        self.since = now

    def start(self, w: int, now: float, work: float, factor: float) -> None:
        """Worker w begins a step of ``work`` seconds of a + b·x at scenario factor
        ``factor`` at ``now`` (it was in an exchange)."""
        self._advance(now)
        self.cpu[w] = self.left[w] = self.cost.cpu_work(work, factor)
        self.factor[w], self.began[w] = factor, now
        self.computing.append(w)
        self.exchanging -= 1

    def finish(self, w: int, now: float) -> tuple[float, float]:
        """Worker w's step ends at ``now`` and its exchange begins: (its wall seconds, its
        ``cpu``: CPU seconds over wall seconds, 0 for a step of no work)."""
        self._advance(now)
        self.computing.remove(w)
        self.exchanging += 1
        took = now - self.began[w]
        return took, float(self.cpu[w] / took) if took > 0 else 0.0

    def block(self) -> None:
        """A worker leaves its exchange without computing: held back by the protocol
        until its pull is ready, or done (not runnable)."""
        self.exchanging -= 1
        assert self.exchanging >= 0, "more workers left an exchange than were in one"

    def release(self) -> None:
        """A worker held back by the protocol goes on with its exchange."""
        self.exchanging += 1

    def schedule(self, now: float) -> tuple[float, int] | None:
        """The next finish from ``now`` at the current shares: (time, worker), None if no
        worker computes. Every start and finish shares the cores out anew, so only the
        earliest prediction can come true; the ones made before are stale from here
        (``stamp`` moves on)."""
        self._advance(now)
        self.stamp += 1
        if not self.computing:
            return None
        idx = np.array(self.computing)
        self.left[idx] = np.maximum(self.left[idx], 0.0)  # rounding at equal times
        self.speed[idx] = self.cost.host_speed(self.factor[idx], self.cost.exchange * self.exchanging)
        k = int(np.argmin(self.left[idx] / self.speed[idx]))
        return now + float(self.left[idx[k]] / self.speed[idx[k]]), int(idx[k])


__all__ = ["HostCores"]
