"""Emulating a slower machine inside a worker: each step is stretched to f times its
compute, with the stretch spread through the forward and backward passes.

A machine f times slower takes f times as long for each piece of work, and uses its CPU
as densely as ours does — it does not compute at full speed and then pause. So the
stretch is spread through the step: after each leaf module's forward, and whenever a
gradient reaches a module's output or a parameter in the backward pass, the worker sleeps
its share of the step's stretch so far. A worker at f = 4 keeps a core busy a quarter of
the time at any moment, the way a quarter-CPU machine would, and several emulated
machines share this box's cores without queueing behind each other's bursts (one long
sleep after each step would make every worker compute at once right after each barrier).

How long the stretch is: (f − 1) × the step's *usual* compute — the median compute
seconds per sample of this worker's recent steps × this step's samples — not × this
step's own compute. This box is shared: a hiccup of the host that doubles one step's
time would otherwise be multiplied by f, while on a real slow machine a hiccup costs what
it lasts. So the box's momentary noise passes through once and the emulated machine is
steady. Compute is measured as this thread's CPU time, not wall time: the emulated
machines are separate machines, so time a worker spends waiting for a core that another
emulated machine (or a server) holds is an artifact of sharing this box and must not be
multiplied by f. (A real noisy neighbour therefore slows an emulated machine's compute,
not its stretch; see docs/lbbsp.md.) Sleeps come after at least `MIN_CHUNK_S` of compute,
so waking up (idle exit, cold caches) happens a few times per step. Until a few steps
are known, a step's own compute is used.

A slow machine is slow at everything, not only at the forward and backward passes: the
worker's other local work of a step — writing the pulled weights into the model, reading
the gradients out for the push, building its report — runs inside `local()`, which
sleeps (f − 1) × that work's CPU time after it.

A real slow machine is also noisier. With `noise` = c > 0 each step draws a multiplier
m = max(0, 1 + c·z), z standard normal (from its own seeded generator: reproducible, and
the training's random streams are untouched), and every sleep of that step is m times as
long: the step lasts (1 + (f − 1)·m) × its compute, so the noise grows with the factor
(standard deviation c·(f − 1) compute-times) and a worker at f = 1 is not stretched.

Sleeping is deterministic and costs no CPU. Oversleeping is paid back: the difference is
carried as a debt to the next sleep. Works under DistributedDataParallel too (hooks are on
the wrapped module's leaves and on activation and parameter gradients).
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

from ..clock import SYSTEM

MIN_CHUNK_S = 0.002  # compute between two sleeps, at least (fewer wake-ups)
HISTORY = 15  # steps whose CPU time per sample make "usual"
WARMUP = 3  # steps before the history is trusted


def noise_seed(seed: int, rank: int) -> int:
    """The seed of worker `rank`'s noise generator in a job seeded `seed` (equipoise's
    workers and the DDP baseline's ranks draw the same noise)."""
    return seed * 7919 + rank


class Stretch:
    """Hooks that make `model`'s steps last about `factor` × their usual compute time.

    Set `factor` before a step, call `start(samples)` before the forward pass and
    `finish()` after `backward()` returns; run the step's other local work inside
    `local()`. With `factor <= 1` the hooks only return. `noise` ≥ 0 is the coefficient c
    of the per-step multiplier (module docstring), drawn from `random.Random(seed)`.
    Compute is read from `cpu` (this thread's CPU seconds by default); sleeping and its
    measurement go through `clock` (`now()`, `sleep(seconds)`), so tests can run on
    virtual time."""

    def __init__(self, model: nn.Module, clock=SYSTEM, cpu: Callable[[], float] = time.thread_time,
                 noise: float = 0.0, seed: int = 0):
        self.clock, self.cpu = clock, cpu
        self.factor = 1.0
        self.noise, self._rng = float(noise), random.Random(seed)
        self.multiplier = 1.0  # this step's noise multiplier m
        self.slept = 0.0  # seconds slept in the current (or last) step
        self._history: deque[float] = deque(maxlen=HISTORY)
        self._samples = 0
        self._t0 = self._last = self._since = self._expected = self._total = 0.0  # CPU seconds
        self._carry = 0.0  # seconds the last step overslept (<= 0), taken off the next
        for m in model.modules():
            if not any(True for _ in m.children()):
                m.register_forward_hook(self._after_forward)
        for p in model.parameters():
            if p.requires_grad:
                p.register_hook(self._at_backward)

    def start(self, samples: int) -> None:
        """A step on `samples` samples begins."""
        self._samples, self.slept = max(1, int(samples)), 0.0
        if self.noise > 0:
            self.multiplier = max(0.0, 1.0 + self.noise * self._rng.gauss(0.0, 1.0))
        self._t0 = self._last = self.cpu()
        self._since = 0.0  # compute since the last sleep
        known = len(self._history) >= WARMUP
        self._expected = statistics.median(self._history) * self._samples if known else 0.0
        self._total = self._stretch(self._expected)  # 0 until known: charged at the end

    def _stretch(self, compute: float) -> float:
        """Seconds to sleep for `compute` CPU seconds of this step's work."""
        return (self.factor - 1.0) * compute * self.multiplier

    @contextmanager
    def local(self) -> Iterator[None]:
        """Local work of the step outside the forward and backward passes (unpacking
        pulled weights, packing pushes, the report): afterwards, sleep (f − 1)·m × its
        CPU time, m the multiplier of the last step started (unpacking a pull comes before
        the next `start`). These short sleeps are not counted in `slept` and an oversleep
        of theirs is not carried."""
        t0 = self.cpu()
        yield
        if self.factor > 1.0:
            want = self._stretch(self.cpu() - t0)
            if want > 0:
                self.clock.sleep(want)

    def compute_s(self) -> float:
        """This step's compute up to the last hook: CPU seconds of this thread."""
        return self._last - self._t0

    def finish(self) -> None:
        """The step's backward is done: sleep whatever of its stretch is left. The
        step's compute is taken at its last hook (a parameter's gradient), so time spent
        after it — DDP waiting for the all-reduce — is not counted as compute."""
        compute = self.compute_s() if self.factor > 1.0 else self.cpu() - self._t0
        if self.factor > 1.0:
            if not self._expected:  # no history yet: stretch this step's own compute
                self._total = self._stretch(compute)
            self._sleep(self._total - self.slept, final=True)
        self._history.append(compute / self._samples)

    def _after_forward(self, module: nn.Module, inputs, output) -> None:
        if self.factor <= 1.0:
            return
        self._progress()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self._at_backward)

    def _at_backward(self, grad: torch.Tensor) -> None:
        if self.factor > 1.0:
            self._progress()

    def _progress(self) -> None:
        """After each chunk of compute, sleep the share of the stretch it has earned."""
        now = self.cpu()
        self._since += now - self._last
        self._last = now
        if not self._expected or self._since < MIN_CHUNK_S:
            return
        done = min(1.0, self.compute_s() / self._expected)
        self._sleep(self._total * done - self.slept, final=False)
        self._since = 0.0

    def _sleep(self, seconds: float, final: bool) -> None:
        """Sleep `seconds` (at the end of a step, plus the carry: what the last step
        overslept). Within a step an overshoot is absorbed by the next target."""
        want = seconds + (self._carry if final else 0.0)
        if want > 0:
            t0 = self.clock.now()
            self.clock.sleep(want)
            took = self.clock.now() - t0
            self.slept += took
            want -= took
        if final:
            self._carry = min(0.0, want)


__all__ = ["Stretch", "noise_seed"]
