"""Learning-rate schedules as pure functions of training progress.

Progress is measured in global-batch iterations: samples applied so far divided by the
global batch X. A server computes the rate from its own sample count before each step, so
every server, every protocol and the single-process reference agree on it.
"""

from __future__ import annotations

import math


def learning_rate(base: float, schedule: str, progress: float, *, total: float,
                  step_size: int = 100, gamma: float = 0.1) -> float:
    """The rate for the update that starts at `progress` (≥ 0) of `total` iterations."""
    if schedule == "constant":
        return base
    if schedule == "step":
        return base * gamma ** math.floor(progress / max(1, step_size))
    if schedule == "cosine":
        frac = min(max(progress / max(total, 1e-12), 0.0), 1.0)
        return base * 0.5 * (1.0 + math.cos(math.pi * frac))
    raise ValueError(f"lr_schedule = {schedule!r} is not one of constant, step, cosine")
