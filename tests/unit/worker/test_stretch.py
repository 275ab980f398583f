"""The slower-machine emulation (worker/stretch.py) on virtual time: a fake CPU clock
advanced by the layers' fake compute and a virtual clock that sleeping advances, so the
stretch's arithmetic is checked exactly. Costs are powers of two, so sums are exact;
the shares of the stretch (fractions like 1/3) are compared with a relative 1e-12."""

import pytest
import torch
from torch import nn

from equipoise.clock import VirtualClock
from equipoise.worker.stretch import MIN_CHUNK_S, WARMUP, Stretch

FWD, BWD = 2.0 ** -7, 2.0 ** -8  # CPU seconds of each layer's forward and backward (>= MIN_CHUNK_S)
SAMPLES = 8


class Cost(torch.autograd.Function):
    """Identity that charges the fake CPU clock: `fwd` in the forward, `bwd` in the backward."""

    @staticmethod
    def forward(ctx, x, cpu, fwd, bwd):
        cpu.advance(fwd)
        ctx.cpu, ctx.bwd = cpu, bwd
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.cpu.advance(ctx.bwd)
        return grad, None, None, None


class Layer(nn.Module):
    def __init__(self, cpu, fwd, bwd):
        super().__init__()
        self.cpu, self.fwd, self.bwd = cpu, fwd, bwd
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return Cost.apply(x * self.w, self.cpu, self.fwd, self.bwd)


class Sleeps(VirtualClock):
    """A virtual clock that records every sleep and oversleeps each by `over` seconds."""

    def __init__(self, over=0.0):
        super().__init__()
        self.over, self.sleeps = over, []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        super().sleep(seconds + self.over)


def rig(layers=4, fwd=FWD, bwd=BWD, over=0.0, noise=0.0, seed=0):
    cpu, clock = VirtualClock(), Sleeps(over)
    net = nn.Sequential(*[Layer(cpu, fwd, bwd) for _ in range(layers)])
    stretch = Stretch(net, clock=clock, cpu=cpu.now, noise=noise, seed=seed)
    stretch.fake_cpu = cpu
    seen = []  # stretch.slept after each layer's forward (hooks run in registration order)
    for m in net:
        m.register_forward_hook(lambda *_: seen.append(stretch.slept))
    return net, stretch, clock, seen


def step(net, stretch, clock, seen, samples=SAMPLES):
    """One stretched step; returns (seconds slept, slept after each layer's forward)."""
    seen.clear()
    t0 = clock.now()
    stretch.start(samples)
    net(torch.ones(samples, requires_grad=True)).sum().backward()
    stretch.finish()
    assert clock.now() - t0 == pytest.approx(stretch.slept, rel=1e-12)
    return stretch.slept, list(seen)


def test_the_stretch_is_factor_minus_one_times_the_usual_compute_spread_through_the_step():
    net, stretch, clock, seen = rig()
    stretch.factor = 3.0
    compute = 4 * (FWD + BWD)
    for _ in range(WARMUP):  # no history yet: each step's own compute, slept at the end
        slept, in_forward = step(net, stretch, clock, seen)
        assert slept == 2 * compute and in_forward == [0.0] * 4
    clock.sleeps.clear()
    slept, in_forward = step(net, stretch, clock, seen)
    total = 2 * compute
    assert slept == pytest.approx(total, rel=1e-12)
    # after layer i's forward, the share of the stretch that i layers' compute earned
    assert in_forward == pytest.approx([total * i * FWD / compute for i in range(1, 5)], rel=1e-12)
    # one sleep after each forward and after each parameter's gradient; the last hook
    # completes the compute, so finish() has (up to rounding) nothing left to sleep
    assert sum(s > 1e-12 for s in clock.sleeps) == 8


def test_sleeps_wait_for_min_chunk_of_compute():
    tiny = 2.0 ** -10  # three of these are the first sum >= MIN_CHUNK_S
    assert 2 * tiny < MIN_CHUNK_S <= 3 * tiny
    net, stretch, clock, seen = rig(layers=6, fwd=tiny, bwd=tiny)
    stretch.factor = 2.0
    for _ in range(WARMUP):
        step(net, stretch, clock, seen)
    clock.sleeps.clear()
    slept, in_forward = step(net, stretch, clock, seen)
    assert slept == pytest.approx(12 * tiny, rel=1e-12)
    # forward: sleeps after layers 3 and 6; backward: after the gradients of 4 and 1
    assert [s > 1e-12 for s in in_forward] == [False, False, True, True, True, True]
    assert sum(s > 1e-12 for s in clock.sleeps) == 4


def test_a_one_off_hiccup_is_not_multiplied_by_the_factor():
    net, stretch, clock, seen = rig(layers=2)
    stretch.factor = 4.0
    usual = 2 * (FWD + BWD)
    for _ in range(WARMUP + 3):
        step(net, stretch, clock, seen)
    net[0].fwd = FWD + 3 * usual  # this step's compute is 4x the usual
    slept, _ = step(net, stretch, clock, seen)
    assert slept == pytest.approx(3 * usual, rel=1e-12)  # not 3 x 4 x usual
    net[0].fwd = FWD
    slept, _ = step(net, stretch, clock, seen)  # the median of the history ignores the hiccup
    assert slept == pytest.approx(3 * usual, rel=1e-12)


def test_the_stretch_follows_the_median_per_sample_compute_times_this_steps_samples():
    net, stretch, clock, seen = rig(layers=2)
    stretch.factor = 2.0
    for _ in range(WARMUP):
        step(net, stretch, clock, seen, samples=4)  # 2 (FWD + BWD) per 4 samples
    slept, _ = step(net, stretch, clock, seen, samples=12)  # same compute: 12 samples are cheaper here
    assert slept == pytest.approx(3 * 2 * (FWD + BWD), rel=1e-12)


def test_oversleep_is_a_debt_paid_by_a_later_final_sleep():
    over = 2.0 ** -12  # every sleep overshoots by this much
    net, stretch, clock, seen = rig(over=over)
    stretch.factor = 2.0
    compute = 4 * (FWD + BWD)
    assert step(net, stretch, clock, seen)[0] == compute + over  # no history: one sleep, at the end
    for _ in range(WARMUP - 1):  # each final sleep pays the last one's overshoot and overshoots anew
        assert step(net, stretch, clock, seen)[0] == compute
    for _ in range(3):
        # spread: within a step the next target absorbs an overshoot, but the last hook
        # finishes the step's share, so finish() has nothing to pay it with: carried
        assert step(net, stretch, clock, seen)[0] == pytest.approx(compute + over, rel=1e-12)
    for layer in net:  # a step at half the usual compute ends with a long final sleep, which
        layer.fwd, layer.bwd = FWD / 2, BWD / 2  # pays the 4 carried overshoots and overshoots once
    assert step(net, stretch, clock, seen)[0] == pytest.approx(compute - 3 * over, rel=1e-12)


def test_factor_one_never_sleeps_and_a_raised_factor_applies_at_once():
    net, stretch, clock, seen = rig(layers=2)
    for _ in range(WARMUP):
        assert step(net, stretch, clock, seen) == (0.0, [0.0, 0.0])
    assert clock.sleeps == [] and clock.now() == 0.0
    stretch.factor = 2.0  # a trace raises the factor: this step is stretched and spread at once
    slept, in_forward = step(net, stretch, clock, seen)
    assert slept == pytest.approx(2 * (FWD + BWD), rel=1e-12)
    assert in_forward[0] > 0


def test_local_work_is_stretched_like_the_step():
    """Unpacking, packing and the report run inside local(): (f − 1) × their CPU time is
    slept after them; at f = 1 nothing is."""
    net, stretch, clock, seen = rig()
    for factor, want in ((1.0, 0.0), (3.0, 2 * FWD)):
        stretch.factor = factor
        t0 = clock.now()
        with stretch.local():
            stretch.fake_cpu.advance(FWD)
        assert clock.now() - t0 == want


def test_noise_multiplies_every_sleep_of_a_step_and_grows_with_the_factor():
    """With noise c each step's stretch is (f − 1) × compute × m, m = max(0, 1 + c·z) drawn
    once per step from the seeded generator: the same seed gives the same steps, the
    sleeps of one step share m, and the spread of a step's length is ∝ (f − 1)."""
    import random

    compute = 4 * (FWD + BWD)
    for factor in (2.0, 5.0):
        net, stretch, clock, seen = rig(noise=0.3, seed=7)
        stretch.factor = factor
        draws = random.Random(7)
        slept = []
        for _ in range(WARMUP + 20):
            m = max(0.0, 1.0 + 0.3 * draws.gauss(0.0, 1.0))
            s, _ = step(net, stretch, clock, seen)
            assert stretch.multiplier == m
            assert s == pytest.approx((factor - 1) * compute * m, rel=1e-12, abs=1e-15)
            t0 = clock.now()
            with stretch.local():  # local work of the step: the same multiplier
                stretch.fake_cpu.advance(FWD)
            assert clock.now() - t0 == pytest.approx((factor - 1) * FWD * m, rel=1e-12, abs=1e-15)
            slept.append(s)
        assert len(set(slept)) > 1  # it does vary
    net, stretch, clock, seen = rig(noise=0.3, seed=7)
    stretch.factor = 1.0
    assert step(net, stretch, clock, seen)[0] == 0.0  # f = 1: no stretch, so no noise
