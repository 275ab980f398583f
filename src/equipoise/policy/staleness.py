"""What a server does with a gradient that is not of the current weights: pure arithmetic.

Two rules, each a plain function of plain numbers (the server applies them, policy/sync.py
names them):

* `bsp_step` — BSP's settings carried over to the protocols without a barrier (asp,
  softsync, ssp). A user tunes `lr` and `momentum` for updates of `global_batch` samples
  on current weights. An asynchronous update is smaller (one worker's gradient, or ⌊λ/n⌋
  of them) and computed on weights that other updates have moved since. The rule scales
  the update's learning rate by its share of the global batch and lowers the explicit
  momentum by the momentum that the staleness itself implies:

  - **The step per sample.** An update of b samples takes the rate α·b/B, B the global
    batch: the linear scaling rule (Krizhevsky, "One weird trick for parallelizing
    convolutional neural networks", 2014; Goyal et al., "Accurate, Large Minibatch SGD",
    2017), read backwards. B/b such updates take BSP's one step, per sample the same rate
    and the same gradient noise (α/B). This is what Rudra's α0/σ does when σ = n and b =
    B/n (Zhang et al., IJCAI 2016), with the update's real size in place of n: measured σ
    runs below n (the pusher's own push is never in its window), so α0/σ steps further
    than BSP does, by n/σ.
  - **The momentum.** Mitliagkas, Zhang, Hadjis and Ré ("Asynchrony begets Momentum,
    with an Application to Deep Learning", Allerton 2016) show that asynchronous SGD
    behaves in expectation like momentum SGD with an implicit momentum 1 − 1/M, where a
    gradient is on average M − 1 updates old, and that the explicit momentum must come
    down as asynchrony grows. With τ̄ the measured mean delay in updates, the implicit
    momentum is μᵢ = τ̄/(1 + τ̄); the explicit one is chosen so that the total — momentum
    filters compose as 1 − μ = (1 − μₑ)(1 − μᵢ) — is the user's μ:
    μₑ = max(0, 1 − (1 − μ)(1 + τ̄)). With no delay (one worker) μₑ = μ and b = B: the
    update is BSP's.

  A gradient's delay is measured, not assumed: the server stamps every reply to a pull with
  the samples it had applied (`read`), the worker echoes the stamp with the gradient
  computed on those weights, and delay = samples applied since, in updates of this size.
  The mean over an update's gradients is τ̄.

* `dc_compensate` — delay compensation (Zheng et al., "Asynchronous Stochastic Gradient
  Descent with Delay Compensation", ICML 2017, DC-ASGD): a gradient g computed on w_then
  is corrected by the first-order Taylor term of its change to w_now, the Hessian
  approximated by λ·g⊙g: g + λ·g⊙g⊙(w_now − w_then). The adaptive variant scales λ by
  1/√(mean square of g), the mean square an exponential average (m = 0.95) per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

ASYNC_SCALINGS = ("bsp", "none")
DELAY_COMPENSATIONS = ("none", "dc", "dc_adaptive")
DC_MEAN_SQUARE_DECAY = 0.95  # Zheng et al.'s m for the adaptive λ
DC_EPSILON = 1e-7  # keeps 1/√(mean square) finite where a gradient has been 0 so far


@dataclass(frozen=True)
class Step:
    """How an update steps: its learning rate is the schedule's times `lr_factor`, its
    momentum `momentum`; `delay` is the mean delay τ̄ (in updates of this size) it was
    computed from."""
    lr_factor: float
    momentum: float
    delay: float


def mean_delay(samples: int, delays: Sequence[float]) -> float:
    """τ̄ of an update of `samples` samples whose gradients were computed on weights that
    `delays` samples of updates ago were current (one per gradient)."""
    if not delays or samples <= 0:
        return 0.0
    return sum(max(0.0, float(d)) for d in delays) / len(delays) / samples


def bsp_step(samples: int, global_batch: int, momentum: float, delay: float) -> Step:
    """The step of an asynchronous update of `samples` samples with mean delay `delay`
    (τ̄, in updates) under BSP's `momentum` μ and global batch B: rate ×b/B, explicit
    momentum max(0, 1 − (1 − μ)(1 + τ̄)) (see the module's docstring)."""
    if samples <= 0 or global_batch <= 0:
        raise ValueError(f"samples = {samples} and global_batch = {global_batch} must be > 0")
    delay = max(0.0, float(delay))
    explicit = max(0.0, 1.0 - (1.0 - float(momentum)) * (1.0 + delay)) if momentum > 0 else 0.0
    return Step(samples / global_batch, explicit, delay)


def dc_compensate(grad: torch.Tensor, now: torch.Tensor, then: torch.Tensor, lam: float,
                  mean_square: torch.Tensor | None = None) -> torch.Tensor:
    """g + λ·g⊙g⊙(w_now − w_then), a new tensor; with `mean_square` (the adaptive variant,
    updated in place with this g first) λ is divided by √(mean square) per element."""
    if mean_square is not None:
        mean_square.mul_(DC_MEAN_SQUARE_DECAY).addcmul_(grad, grad, value=1.0 - DC_MEAN_SQUARE_DECAY)
        scale = lam / (mean_square.sqrt() + DC_EPSILON)
        return grad + scale * grad * grad * (now - then)
    return grad + lam * grad * grad * (now - then)
