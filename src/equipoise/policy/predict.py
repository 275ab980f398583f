"""One-step-ahead worker speed predictors for LB-BSP (Chen et al., SoCC 2018/2020).

Pure policy code: observations (speed, cpu, mem) in, a predicted speed out; no clocks,
so the simulator can replay traces through the same classes.  The paper [paper] uses a
NARX net fed past speeds and the worker's CPU/memory usage; its sizes and training are
not published, ours are documented on ``NARX``.  ``LastValue`` and ``EWMA`` are the
baselines the paper's predictor must beat.

Contract shared by all predictors:
* ``observe(speed, cpu, mem)``: speed (samples/s, finite > 0) of the iteration that just
  finished and that worker's CPU and memory utilisation (fractions; clipped to [0, 1]).
* ``predict()``: speed expected for the next iteration; ``nan`` before any observation.
* ``mape``: mean |prediction - actual| / actual over every ``observe`` that had a
  prediction available before it (i.e. all but the first); ``nan`` if none yet.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from contextlib import contextmanager
from numbers import Integral, Real

import torch

__all__ = ["measured_speed", "Predictor", "LastValue", "EWMA", "NARX", "make_predictor"]


class Predictor(ABC):
    """Base class: validates inputs, scores one-step-ahead predictions, caches them."""

    def __init__(self) -> None:
        self._next = math.nan          # prediction for the next, not yet seen, iteration
        self._err_sum = 0.0
        self._err_count = 0

    def observe(self, speed: float, cpu: float = 0.0, mem: float = 0.0) -> None:
        """Record the iteration just finished, then refresh the next prediction."""
        if not (_is_real(speed) and math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be finite > 0, got {speed!r}")
        cpu, mem = _fraction("cpu", cpu), _fraction("mem", mem)
        if not math.isnan(self._next):  # score the prediction made before seeing this
            self._err_sum += abs(self._next - speed) / speed
            self._err_count += 1
        self._update(float(speed), cpu, mem)
        self._next = float(self._forecast())

    def predict(self) -> float:
        """Predicted speed of the next iteration (samples/s); nan before any observe."""
        return self._next

    @property
    def mape(self) -> float:
        """Mean absolute percentage error (a fraction, 0.05 = 5%) so far; nan if none."""
        return self._err_sum / self._err_count if self._err_count else math.nan

    @abstractmethod
    def _update(self, speed: float, cpu: float, mem: float) -> None:
        """Absorb one validated observation."""

    @abstractmethod
    def _forecast(self) -> float:
        """Prediction for the next iteration given everything absorbed so far."""

    def state_dict(self) -> dict:
        return {"next": self._next, "err_sum": self._err_sum, "err_count": self._err_count}

    def load_state_dict(self, d: dict) -> None:
        self._next = float(d["next"])
        self._err_sum, self._err_count = float(d["err_sum"]), int(d["err_count"])


class LastValue(Predictor):
    """Predicts that the next iteration runs at the speed of the last one."""

    def __init__(self) -> None:
        super().__init__()
        self._last = math.nan

    def _update(self, speed: float, cpu: float, mem: float) -> None:
        self._last = speed

    def _forecast(self) -> float:
        return self._last

    def state_dict(self) -> dict:
        return {**super().state_dict(), "last": self._last}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self._last = float(d["last"])


class EWMA(Predictor):
    """Exponentially weighted moving average: s <- alpha*speed + (1-alpha)*s; s0 = speed."""

    def __init__(self, alpha: float = 0.3) -> None:
        super().__init__()
        if not (_is_real(alpha) and 0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._avg = math.nan

    def _update(self, speed: float, cpu: float, mem: float) -> None:
        if math.isnan(self._avg):
            self._avg = speed
        else:
            self._avg += self.alpha * (speed - self._avg)

    def _forecast(self) -> float:
        return self._avg

    def state_dict(self) -> dict:
        return {**super().state_dict(), "avg": self._avg}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self._avg = float(d["avg"])


class NARX(Predictor):
    """Small NARX net trained online [paper idea; every size and rule below is ours].

    Input: the last ``delays`` speeds divided by the window's mean speed, and the last
    ``delays`` cpu and mem readings (the current ones included).  One hidden layer of
    ``hidden`` tanh units plus a linear skip term on (newest speed / mean − 1), whose
    weight is not decayed, so following the last value under drift costs the net no
    more than learning a regime from the CPU readings; output = 1 + net(x) is the next
    speed over that mean, so an untrained net predicts the window mean.  After every observation it takes
    ``epochs_per_update`` full-batch Adam steps on a Huber loss (quadratic within
    ``huber_delta`` of the target, in units of the mean speed; + ``weight_decay`` x L2
    of the weights) over the last ``window`` (input, next speed) pairs.  Until
    ``min_history`` observations it returns EWMA(0.3)'s prediction.  Predictions are
    clamped to [0.1 x min, 10 x max] of the window's speeds so a bad net never yields a
    negative or absurd speed.  Randomness comes only from a local ``torch.Generator``
    seeded with ``seed``: same seed and observations give identical predictions.
    """

    def __init__(self, delays: int = 4, hidden: int = 10, window: int = 64,
                 min_history: int = 16, epochs_per_update: int = 20, lr: float = 0.01,
                 seed: int = 0, weight_decay: float = 1e-3, huber_delta: float = 0.1) -> None:
        super().__init__()
        for name, value, lowest in (("delays", delays, 1), ("hidden", hidden, 1),
                                    ("window", window, 1), ("seed", seed, 0),
                                    ("epochs_per_update", epochs_per_update, 0),
                                    ("min_history", min_history, delays + 1)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < lowest:
                raise ValueError(f"{name} must be an int >= {lowest}, got {value!r}")
        for name, value, least in (("lr", lr, 1e-12), ("weight_decay", weight_decay, 0.0),
                                   ("huber_delta", huber_delta, 1e-12)):
            if not (_is_real(value) and math.isfinite(value) and value >= least):
                raise ValueError(f"{name} must be finite >= {least:g}, got {value!r}")
        self.delays, self.hidden, self.window = delays, hidden, window
        self.min_history, self.epochs = min_history, epochs_per_update
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.huber_delta = float(huber_delta)
        self._fallback = EWMA(0.3)
        # Enough history for `window` training pairs plus the newest input.
        self._hist: deque[tuple[float, float, float]] = deque(maxlen=window + delays)
        self._seen = 0
        self._init_params(seed)

    def _init_params(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        n_in, h = 3 * self.delays, self.hidden
        f64 = torch.float64
        bound1 = math.sqrt(6 / (n_in + h))                       # Glorot uniform
        w1 = (torch.rand(h, n_in, generator=gen, dtype=f64) * 2 - 1) * bound1
        # Small output weights: start close to "predict the window mean".
        w2 = (torch.rand(h, generator=gen, dtype=f64) * 2 - 1) * 0.1 * math.sqrt(6 / (h + 1))
        # One flat parameter vector keeps Adam to a handful of tensor ops per step.
        zeros = torch.zeros(h + 2, dtype=f64)
        # [w1, b1, w2, skip, b2]: `skip` weighs (newest speed / mean − 1), a linear path
        # to the last value that weight decay does not pull to zero.
        self._theta = torch.cat([w1.flatten(), zeros[:h], w2, zeros[h:]])
        self._weight_mask = torch.zeros_like(self._theta, dtype=torch.bool)
        self._weight_mask[: h * n_in] = True
        self._weight_mask[h * n_in + h: h * n_in + 2 * h] = True
        self._m = torch.zeros_like(self._theta)
        self._v = torch.zeros_like(self._theta)
        self._steps = 0

    def _unpack(self, theta: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views (w1, b1, w2, skip, b2) into the flat parameter vector."""
        n_in, h = 3 * self.delays, self.hidden
        return (theta[: h * n_in].view(h, n_in), theta[h * n_in: h * n_in + h],
                theta[h * n_in + h: h * n_in + 2 * h], theta[-2], theta[-1])

    def _skip_input(self, x: torch.Tensor) -> torch.Tensor:
        """Newest speed over the mean, minus 1 (the speeds come first, oldest first)."""
        return x[..., self.delays - 1] - 1.0

    def _net(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, skip, b2 = self._unpack(theta)
        return 1.0 + torch.tanh(x @ w1.T + b1) @ w2 + skip * self._skip_input(x) + b2

    def _grad(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gradient of mean(huber(net(x) - y)) w.r.t. theta, by hand.

        huber(r) = r^2 for |r| <= delta, else 2*delta*|r| - delta^2.  Huber, not MSE
        [ours]: iterations that straddle a regime switch (a neighbour arriving mid-
        iteration) are outliers, and squared loss lets them bias the regime means;
        measured on the test trace, MAPE 0.080 -> 0.073.  Backprop written out is ~3x
        cheaper than autograd on a net this small; a unit test checks it.
        """
        w1, b1, w2, skip, b2 = self._unpack(self._theta)
        hid = torch.tanh(torch.addmm(b1, x, w1.T))                      # (n, h)
        z = self._skip_input(x)
        resid = (1.0 + b2 + hid @ w2 + skip * z - y).clamp_(-self.huber_delta, self.huber_delta)
        d_out = resid * (2.0 / len(y))                                  # (n,)
        d_pre = torch.outer(d_out, w2).mul_(1.0 - hid * hid)            # (n, h)
        return torch.cat([(d_pre.T @ x).flatten(), d_pre.sum(0), hid.T @ d_out,
                          (z @ d_out).view(1), d_out.sum().view(1)])

    def _update(self, speed: float, cpu: float, mem: float) -> None:
        self._fallback.observe(speed, cpu, mem)
        self._hist.append((speed, cpu, mem))
        self._seen += 1
        if self._seen >= self.min_history:
            x, y, _, _ = self._dataset()
            with _one_thread():
                self._fit(x, y)

    def _dataset(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """(inputs of every training pair, their targets, the newest input, scale)."""
        hist = torch.tensor(list(self._hist), dtype=torch.float64)
        scale = float(hist[:, 0].mean())
        feats = torch.cat([hist[:, :1] / scale, hist[:, 1:]], dim=1)   # (n, 3)
        # Row j of `lagged` holds observations j .. j+delays-1, grouped by feature.
        lagged = feats.unfold(0, self.delays, 1).reshape(-1, 3 * self.delays)
        return lagged[:-1], feats[self.delays:, 0], lagged[-1], scale

    def _fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        for _ in range(self.epochs):
            grad = self._grad(x, y)
            # L2 on the weights (not biases): ~64 noisy pairs against ~140 parameters
            # overfit, and an overfitted net chases the last value's noise.
            grad += self.weight_decay * self._theta * self._weight_mask
            self._adam_step(grad)

    def _adam_step(self, grad: torch.Tensor) -> None:
        b1, b2 = 0.9, 0.999
        self._steps += 1
        self._m.mul_(b1).add_(grad, alpha=1 - b1)
        self._v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (self._v / (1 - b2 ** self._steps)).sqrt_().add_(1e-8)
        self._theta.addcdiv_(self._m, denom, value=-self.lr / (1 - b1 ** self._steps))

    def _forecast(self) -> float:
        if self._seen < self.min_history:
            return self._fallback.predict()
        _, _, newest, scale = self._dataset()
        with torch.no_grad(), _one_thread():
            guess = float(self._net(self._theta, newest)) * scale
        speeds = [s for s, _, _ in self._hist]
        return min(max(guess, 0.1 * min(speeds)), 10.0 * max(speeds))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "fallback": self._fallback.state_dict(),
                "hist": [list(r) for r in self._hist], "seen": self._seen,
                "theta": self._theta.clone(), "m": self._m.clone(),
                "v": self._v.clone(), "steps": self._steps}

    def load_state_dict(self, d: dict) -> None:
        theta = torch.as_tensor(d["theta"], dtype=torch.float64)
        if theta.shape != self._theta.shape:
            raise ValueError(f"state_dict theta has shape {tuple(theta.shape)}, this NARX"
                             f" needs {tuple(self._theta.shape)} (delays/hidden differ)")
        super().load_state_dict(d)
        self._fallback.load_state_dict(d["fallback"])
        self._hist.clear()
        self._hist.extend(tuple(float(x) for x in r) for r in d["hist"])
        self._seen, self._steps = int(d["seen"]), int(d["steps"])
        self._theta = theta.clone()
        self._m = torch.as_tensor(d["m"], dtype=torch.float64).clone()
        self._v = torch.as_tensor(d["v"], dtype=torch.float64).clone()


def measured_speed(samples: float, compute_s: float, fixed_s: float = 0.0) -> float:
    """A worker's speed (samples/s) from one step: samples over the part of its compute
    that grows with them, compute − F, F the step's fixed cost (LB-BSP's affine model).
    A step measured faster than F (noise) still counts a tenth of its time as
    per-sample work, so a speed stays finite."""
    compute = max(float(compute_s), 1e-9)
    return samples / max(compute - fixed_s, 0.1 * compute)


def make_predictor(name: str, **kw) -> Predictor:
    """Build a predictor by name: "last", "ewma" or "narx" (kw go to the constructor)."""
    classes = {"last": LastValue, "ewma": EWMA, "narx": NARX}
    if name not in classes:
        raise ValueError(f"predictor name must be one of {sorted(classes)}, got {name!r}")
    return classes[name](**kw)


@contextmanager
def _one_thread():
    """Run torch single-threaded, then restore the caller's setting.

    On these tiny tensors a parallel region buys nothing, and on a loaded box (other
    processes on every core) each OpenMP barrier can cost milliseconds: measured 2.5 ms
    vs 70-550 ms per observe on a busy 2-core VM.  Torch's thread count is process-wide,
    so another thread running torch ops during these few ms also runs on one thread.
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _fraction(name: str, value: float) -> float:
    # Per-process CPU readings can exceed 1 on multi-core boxes; the net wants [0, 1].
    if not (_is_real(value) and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return min(max(float(value), 0.0), 1.0)


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)
