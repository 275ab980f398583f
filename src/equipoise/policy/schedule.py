"""Learning-rate schedules as pure functions of training progress.

Progress is measured in global-batch iterations: samples applied so far divided by the
global batch X. A server computes the rate from its own sample count before each step, so
every server, every protocol and the single-process reference agree on it.

The schedules are torch.optim.lr_scheduler's, in closed form (tests/unit/policy/test_schedule.py
steps torch's classes beside them): ``step`` is StepLR, ``cosine`` CosineAnnealingLR over
the iterations after the warm-up (``floor``: its eta_min), a user schedule LambdaLR (a
function of the iteration returning the factor of the base rate). A warm-up of W
iterations (LinearLR from 1/(W + 1) to 1 over W iterations, then the schedule, as
SequentialLR with the milestone W) multiplies the rate by (t + 1)/(W + 1) at iteration
t < W, as nanoGPT's recipe does.
"""

from __future__ import annotations

import math
from typing import Callable


def learning_rate(base: float, schedule: str, progress: float, *, total: float,
                  step_size: int = 100, gamma: float = 0.1, warmup: int = 0, floor: float = 0.0,
                  user: Callable[[int], float] | None = None) -> float:
    """The rate for the update that starts at `progress` (≥ 0) of `total` iterations;
    `user`: the function a schedule spec names (``schedule`` is then that spec)."""
    if progress < warmup:
        return base * (math.floor(progress) + 1) / (warmup + 1)
    k = progress - warmup  # the schedule's own iterations, counted from the warm-up's end
    if schedule == "constant":
        return base
    if schedule == "step":
        return base * gamma ** math.floor(k / max(1, step_size))
    if schedule == "cosine":
        frac = min(max(k / max(total - warmup, 1e-12), 0.0), 1.0)
        return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))
    if user is not None:
        return base * user_factor(user, schedule, math.floor(k))
    raise ValueError(f"lr_schedule = {schedule!r} is not one of constant, step, cosine, or a spec")


def user_factor(user: Callable[[int], float], spec: str, iteration: int) -> float:
    """`user(iteration)`, which must be a finite number ≥ 0 (ValueError naming the spec)."""
    try:
        factor = user(iteration)
    except Exception as exc:  # the user's code, failing in any way
        raise ValueError(f"lr_schedule {spec!r}({iteration}) raised {type(exc).__name__}: {exc}") from None
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"lr_schedule {spec!r}({iteration}) = {factor!r}: must be a finite number ≥ 0")
    return float(factor)
