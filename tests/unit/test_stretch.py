"""The slower-machine emulation (runtime/stretch.py): steps last f × their usual compute,
the stretch is spread through the step, and a one-off hiccup is not multiplied by f."""

import time

import torch
from torch import nn

from equipoise.runtime.stretch import WARMUP, Stretch


class Burn(nn.Module):
    """A layer whose forward costs `seconds` of CPU time (and its backward about none)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.seconds:
            pass
        return x * self.w


def model(layers=4, seconds=0.004):
    return nn.Sequential(*[Burn(seconds) for _ in range(layers)])


def step(net, stretch, samples=8):
    """One stretched step; returns (wall seconds, CPU seconds, slept before backward)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    stretch.start(samples)
    out = net(torch.ones(samples, requires_grad=True)).sum()
    slept_in_forward = stretch.slept
    out.backward()
    stretch.finish()
    return time.perf_counter() - t0, time.thread_time() - c0, slept_in_forward


def test_steps_last_factor_times_their_compute_and_the_sleep_is_spread():
    net = model()
    stretch = Stretch(net)
    stretch.factor = 3.0
    for _ in range(WARMUP + 2):
        step(net, stretch)
    walls, cpus, in_forward = zip(*[step(net, stretch) for _ in range(5)])
    ratio = sorted(w / c for w, c in zip(walls, cpus))[2]
    assert 2.6 < ratio < 3.6, ratio
    # 16 ms of forward compute: most of its 32 ms of stretch is slept during the forward.
    assert min(in_forward) > 0.02, in_forward


def test_a_one_off_hiccup_is_not_multiplied_by_the_factor():
    net = model(layers=2, seconds=0.005)
    stretch = Stretch(net)
    stretch.factor = 4.0
    for _ in range(WARMUP + 3):
        step(net, stretch)
    net[0].seconds = 0.035  # one step costs 4x its usual 10 ms of compute
    wall, cpu, _ = step(net, stretch)
    # Usual stretch 3 x 10 ms on top of 40 ms of compute ~ 70 ms; stretching the
    # hiccup itself would make it 4 x 40 = 160 ms.
    assert wall < 0.11, (wall, cpu)
    net[0].seconds = 0.005


def test_factor_one_never_sleeps_and_a_raised_factor_applies_at_once():
    net = model(layers=2, seconds=0.002)
    stretch = Stretch(net)
    for _ in range(3):
        step(net, stretch)
        assert stretch.slept == 0.0
    stretch.factor = 2.0  # a trace raises the factor: the next step is stretched at once
    wall, cpu, _ = step(net, stretch)
    assert wall > 1.6 * cpu
