"""Learning-rate schedules (policy/schedule.py) against torch.optim.lr_scheduler's own
classes, stepped beside them. torch computes StepLR, LinearLR and CosineAnnealingLR
recursively (each rate from the last), ours in closed form: the two agree to rounding,
about one ulp a step, so 1e-9 relative over 100 steps is far above what rounding makes
and far below what a wrong formula does (≥ 1e-3 of the rate at some step)."""

from __future__ import annotations

import math

import pytest
import torch

from equipoise.config import Config, ConfigError
from equipoise.policy.schedule import learning_rate

TOTAL, BASE = 100, 0.5


def _torch_rates(make, steps=TOTAL):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=BASE)
    sched = make(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def _ours(schedule, **kw):
    return [learning_rate(BASE, schedule, t, total=TOTAL, **kw) for t in range(TOTAL)]


def _close(ours, theirs):
    assert len(ours) == len(theirs)
    for t, (a, b) in enumerate(zip(ours, theirs)):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15), f"iteration {t}: {a} against torch's {b}"


def test_step_is_steplr():
    _close(_ours("step", step_size=7, gamma=0.5), _torch_rates(lambda o: torch.optim.lr_scheduler.StepLR(o, 7, 0.5)))


@pytest.mark.parametrize("floor", [0.0, 0.01])
def test_cosine_is_cosineannealinglr_with_its_floor(floor):
    _close(_ours("cosine", floor=floor),
           _torch_rates(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, TOTAL, eta_min=floor)))


@pytest.mark.parametrize("warmup", [1, 10])
def test_warm_up_then_cosine_is_linearlr_then_cosineannealinglr(warmup):
    """nanoGPT's recipe: lr × (t + 1)/(W + 1) for t < W, then cosine to the floor over
    the rest, as SequentialLR chains torch's two classes."""
    def make(o):
        s = torch.optim.lr_scheduler
        return s.SequentialLR(o, [s.LinearLR(o, 1 / (warmup + 1), 1.0, total_iters=warmup),
                                  s.CosineAnnealingLR(o, TOTAL - warmup, eta_min=0.05)], milestones=[warmup])
    ours = _ours("cosine", warmup=warmup, floor=0.05)
    _close(ours, _torch_rates(make))
    assert ours[0] == BASE / (warmup + 1) and ours[warmup] == BASE  # ramps, then starts the cosine at the top


def _halving(t):
    return 0.5 ** (t // 10)


def test_a_user_schedule_is_lambdalr():
    _close(_ours("tests:halving", user=_halving), _torch_rates(lambda o: torch.optim.lr_scheduler.LambdaLR(o, _halving)))


@pytest.mark.parametrize("factor, match", [(-1.0, "finite number ≥ 0"), (math.nan, "finite number ≥ 0"),
                                           ("x", "finite number ≥ 0"), (None, "finite number ≥ 0")])
def test_a_user_schedule_returning_no_factor_is_named(factor, match):
    with pytest.raises(ValueError, match=rf"lr_schedule 'mod:f'\(3\) = .*{match}"):
        learning_rate(BASE, "mod:f", 3, total=TOTAL, user=lambda t: factor)


def test_a_user_schedule_that_raises_is_named():
    with pytest.raises(ValueError, match=r"lr_schedule 'mod:f'\(0\) raised ZeroDivisionError"):
        learning_rate(BASE, "mod:f", 0, total=TOTAL, user=lambda t: 1 / 0)


@pytest.mark.parametrize("keys, match", [
    (dict(lr_schedule="linear"), "lr_schedule = 'linear' is not one of"),
    (dict(lr_schedule="m.py:f", warmup_iterations=5), "a user schedule gives the whole factor"),
    (dict(warmup_iterations=-1), "warmup_iterations = -1 must be ≥ 0"),
    (dict(lr_min=-0.1), "lr_min = -0.1 must be ≥ 0"),
    (dict(lr=0.1, lr_min=0.2), "lr_min = 0.2 is above lr = 0.1"),
    (dict(optimizer="lamb"), "optimizer = 'lamb' is not one of sgd, adam, adamw"),
])
def test_bad_schedule_settings_are_refused_by_name(keys, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(keys)
