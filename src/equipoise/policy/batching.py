"""Per-worker batch sizing for load-balanced BSP (LB-BSP, Chen et al. SoCC 2018/2020).

Pure policy code: plain numbers in, plain numbers out; no clocks, sockets or threads,
so the runtime and the discrete-event simulator share it.  Workers are identified by
int ids.  Every policy keeps Σ batch sizes == the global batch X exactly, because the
aggregation g = Σ (x_i/X)·g_i is only equivalent to SGD with batch X under that sum.

* ``allocate``: x_i ∝ predicted speed (CPU clusters [paper]); per-iteration constant
  costs, largest-remainder rounding, minimum and memory caps are [ours].
* ``ProportionalPolicy``: ``allocate`` plus hysteresis and changing membership [ours].
* ``StepTuner``: move samples from the slowest to the fastest worker, halving the step
  and growing the window when moves oscillate (GPU clusters [paper]; sizes [ours]).
  With ``model=True`` (``batch_policy = "model"``) each worker's step time is a
  ``PiecewiseLinear`` function of its batch (GPU clusters [paper]: flat while the device
  is under-used, then linear), learnt from the sizes it ran, and a move is sized to
  equalise the pair's predicted times (at most 4 steps) [ours].
"""
from __future__ import annotations

import bisect
import math
from numbers import Integral, Real
from typing import Mapping, Sequence

__all__ = ["equal_split", "allocate", "ideal_allocation", "iteration_time",
           "EqualPolicy", "ProportionalPolicy", "StepTuner", "PiecewiseLinear", "make_batch_policy"]


class PiecewiseLinear:
    """A worker's step time as a function of its batch: the mean time measured at each
    batch size it ran (an EWMA per size, at most ``knots`` sizes, the oldest dropped),
    joined by straight lines, non-decreasing; beyond the last size the last segment's
    slope (or, with one size, time ∝ batch)."""

    def __init__(self, alpha: float = 0.5, knots: int = 16):
        self.alpha, self.knots = alpha, knots
        self._t: dict[int, float] = {}
        self._order: list[int] = []

    def observe(self, batch: int, seconds: float) -> None:
        if batch < 1 or not (math.isfinite(seconds) and seconds >= 0):
            return
        old = self._t.get(batch)
        self._t[batch] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        if batch in self._order:
            self._order.remove(batch)
        self._order.append(batch)
        while len(self._order) > self.knots:
            del self._t[self._order.pop(0)]

    def __len__(self) -> int:
        return len(self._t)

    def predict(self, batch: float) -> float:
        xs = sorted(self._t)
        if not xs:
            raise ValueError("no step time observed yet")
        ts, peak = [], 0.0
        for x in xs:  # non-decreasing: a larger batch never takes less time
            peak = max(peak, self._t[x])
            ts.append(peak)
        if len(xs) == 1:
            return ts[0] * batch / xs[0]
        if batch <= xs[0]:
            slope = (ts[1] - ts[0]) / (xs[1] - xs[0])
            return max(0.0, ts[0] - slope * (xs[0] - batch))
        i = bisect.bisect_left(xs, batch)
        if i == len(xs):
            i -= 1
        x0, x1, t0, t1 = xs[i - 1], xs[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (batch - x0) / (x1 - x0)


def equal_split(total: int, workers: int) -> list[int]:
    """Split ``total`` into ``workers`` near-equal ints; the remainder goes to the first."""
    _check_int("total", total, 0)
    _check_int("workers", workers, 1)
    q, r = divmod(total, workers)
    return [q + 1 if i < r else q for i in range(workers)]


def ideal_allocation(total: int, speeds: Sequence[float], *, minimum: int = 1,
                     caps: Sequence[int | None] | None = None,
                     const_costs: Sequence[float] | None = None) -> tuple[list[float], float]:
    """Continuous solution of c_i + x_i/v_i = T, Σ x_i = total, minimum <= x_i <= cap_i.

    Returns (x, T).  Workers strictly between their bounds finish exactly at T; a worker
    at its minimum finishes no later than T, one at its cap no earlier.  Raises
    ValueError for bad speeds/costs/caps or an infeasible total.
    """
    lo, hi, costs = _validate(total, speeds, minimum, caps, const_costs)

    def f(t: float) -> float:
        return sum(_clip(v * (t - c), lo, h) for v, c, h in zip(speeds, costs, hi))

    # f(T) is piecewise linear and non-decreasing with kinks where a worker leaves its
    # minimum or reaches its cap: bisect the kinks, then interpolate inside one piece.
    kinks = sorted({c + lo / v for v, c in zip(speeds, costs)}
                   | {c + h / v for v, c, h in zip(speeds, costs, hi) if h != math.inf})
    k = bisect.bisect_left(kinks, total, key=f)
    if k == 0:                      # total == n * minimum: everyone at the minimum
        t = kinks[0]
    elif k == len(kinks):           # past every kink only uncapped workers still grow
        slope = sum(v for v, h in zip(speeds, hi) if h == math.inf)
        # slope == 0: all capped and total == Σcaps; f fell short only by rounding.
        t = kinks[-1] + ((total - f(kinks[-1])) / slope if slope else 0.0)
    else:
        left, right = kinks[k - 1], kinks[k]
        f_left = f(left)
        t = left + (total - f_left) * (right - left) / (f(right) - f_left)
    return [_clip(v * (t - c), lo, h) for v, c, h in zip(speeds, costs, hi)], t


def allocate(total: int, speeds: Sequence[float], *, minimum: int = 1,
             caps: Sequence[int | None] | None = None,
             const_costs: Sequence[float] | None = None) -> list[int]:
    """Integer batch sizes so all workers finish together (see ``ideal_allocation``).

    Guarantees: Σ x_i == total; minimum <= x_i <= caps[i]; |x_i - ideal_i| < 1.
    Rounding is largest remainder, ties to the lower index (deterministic).
    speeds are samples/s (finite > 0), const_costs seconds per iteration (finite >= 0).
    """
    ideal, _ = ideal_allocation(total, speeds, minimum=minimum, caps=caps,
                                const_costs=const_costs)
    hi = [math.inf if c is None else c for c in (caps or [None] * len(speeds))]
    sizes = [int(math.floor(x)) for x in ideal]
    spare = total - sum(sizes)
    # A worker at its cap has no fractional part, so it never receives a remainder.
    order = sorted((i for i in range(len(sizes)) if sizes[i] < hi[i]),
                   key=lambda i: (-(ideal[i] - sizes[i]), i))
    if spare < 0 or spare > len(order):
        raise AssertionError(f"rounding failed: {spare} samples for {len(order)} workers")
    for i in order[:spare]:
        sizes[i] += 1
    return sizes


def iteration_time(sizes: Sequence[int], speeds: Sequence[float],
                   const_costs: Sequence[float] | None = None) -> float:
    """Predicted BSP iteration time max_i c_i + x_i/v_i (the barrier waits for the last)
    over the workers given samples: one given none (``minimum`` 0) takes no step, and its
    exchange is the one every worker makes (0 if none is given any)."""
    costs = const_costs or [0.0] * len(sizes)
    return max((c + x / v for x, v, c in zip(sizes, speeds, costs) if x > 0), default=0.0)


class _BatchPolicy:
    """Shared config of the batch policies: X, the minimum and per-worker-id caps."""

    def __init__(self, global_batch: int, *, minimum: int = 1,
                 caps: Mapping[int, int] | None = None):
        _check_int("global_batch", global_batch, 1)
        _check_int("minimum", minimum, 0)
        self.global_batch, self.minimum, self.caps = global_batch, minimum, dict(caps or {})
        for w, c in self.caps.items():
            _check_int(f"caps[{w}]", c, minimum)

    def _split(self, ids: list[int], weights: list[float],
               costs: list[float] | None = None) -> dict[int, int]:
        sizes = allocate(self.global_batch, weights, minimum=self.minimum,
                         caps=[self.caps.get(w) for w in ids], const_costs=costs)
        return dict(zip(ids, sizes))

    def state_dict(self) -> dict:
        return {"global_batch": self.global_batch}

    def load_state_dict(self, d: dict) -> None:
        if d["global_batch"] != self.global_batch:
            raise ValueError(f"state_dict global_batch is {d['global_batch']!r} but this"
                             f" policy has {self.global_batch!r}")


class EqualPolicy(_BatchPolicy):
    """Baseline BSP: the same batch for every present worker (within caps)."""

    def decide(self, measurements: Mapping[int, float],
               const_costs: Mapping[int, float] | None = None) -> dict[int, int]:
        """Equal split over the ids in ``measurements`` (values and costs are ignored)."""
        ids = _ids(measurements)
        return self._split(ids, [1.0] * len(ids))


class ProportionalPolicy(_BatchPolicy):
    """LB-BSP CPU policy: x_i ∝ predicted speed, with hysteresis against noise.

    ``decide`` keeps the previous allocation (same worker set) unless the new one's
    predicted iteration time is lower than the old one's by more than ``hysteresis``
    (a fraction).  When the worker set changes, X is redistributed among those present.
    """

    def __init__(self, global_batch: int, *, minimum: int = 1,
                 caps: Mapping[int, int] | None = None, hysteresis: float = 0.05):
        super().__init__(global_batch, minimum=minimum, caps=caps)
        if not (_is_real(hysteresis) and 0.0 <= hysteresis < 1.0):
            raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis!r}")
        self.hysteresis = float(hysteresis)
        self._last: dict[int, int] | None = None

    def decide(self, speeds: Mapping[int, float],
               const_costs: Mapping[int, float] | None = None) -> dict[int, int]:
        """Batch size per worker id for the next iteration; Σ == global_batch."""
        ids = _ids(speeds)
        for w in ids:                # name the worker id, not its position in the list
            _check_real(f"speeds[{w}]", speeds[w], positive=True)
        v, c = [float(speeds[w]) for w in ids], _costs_for(ids, const_costs)
        new = self._split(ids, v, c)
        if self._last is not None and set(self._last) == set(ids):
            # Only switch for a real gain: re-sizing on noise costs cache/pipeline churn.
            old_t = iteration_time([self._last[w] for w in ids], v, c)
            if iteration_time([new[w] for w in ids], v, c) >= old_t * (1 - self.hysteresis):
                new = self._last
        self._last = dict(new)
        return dict(new)

    def state_dict(self) -> dict:
        last = None if self._last is None else [[w, x] for w, x in sorted(self._last.items())]
        return {**super().state_dict(), "last": last}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self._last = None if d["last"] is None else {int(w): int(x) for w, x in d["last"]}


class StepTuner(_BatchPolicy):
    """LB-BSP GPU-style policy: shift ``step`` samples slowest -> fastest every window.

    Fed each worker's measured compute time of the iteration that ran with the sizes
    this tuner last returned.  Every ``window`` iterations it moves ``step`` samples
    from the worker with the highest mean time to the one with the lowest mean time that
    is below its cap.  Oscillation [ours: a move takes from the previous move's
    recipient or gives to its donor, which includes the pair reversing] halves the step
    (>= 1) and doubles the window (<= max_window, default 8 x window).  Three moves in a
    row between the same pair grow them back towards the initial values [ours], so the
    tuner can follow a new straggler after having settled.  On a change of the worker
    set the sizes are rescaled and tuning restarts; times from that call are dropped.
    """

    def __init__(self, global_batch: int, *, step_fraction: float = 0.05, window: int = 5,
                 minimum: int = 1, caps: Mapping[int, int] | None = None,
                 max_window: int | None = None, model: bool = False):
        super().__init__(global_batch, minimum=minimum, caps=caps)
        self.models: dict[int, PiecewiseLinear] | None = {} if model else None
        if not (_is_real(step_fraction) and 0.0 < step_fraction <= 1.0):
            raise ValueError(f"step_fraction must be in (0, 1], got {step_fraction!r}")
        _check_int("window", window, 1)
        self.step_fraction, self.base_window = float(step_fraction), window
        self.max_window = 8 * window if max_window is None else max_window
        _check_int("max_window", self.max_window, window)
        self._alloc: dict[int, int] = {}
        self.step, self.window = 1, window
        self._reset_window()
        self._last_move: tuple[int, int] | None = None
        self._run = 0                      # consecutive moves between the same pair
        self._initial_step = 1             # set per worker set: fraction x mean batch

    @property
    def allocation(self) -> dict[int, int]:
        """The sizes last returned by ``decide`` (empty before the first call)."""
        return dict(self._alloc)

    def decide(self, iteration_times: Mapping[int, float],
               sizes: Mapping[int, int] | None = None) -> dict[int, int]:
        """Record one iteration's compute times (seconds), measured with `sizes` (default:
        the sizes last returned); return the next sizes."""
        ids = _ids(iteration_times)
        for w in ids:
            _check_real(f"iteration_times[{w}]", iteration_times[w], positive=False)
        if self.models is not None:
            for w in ids:
                ran = (sizes or self._alloc).get(w)
                if ran:
                    self.models.setdefault(w, PiecewiseLinear()).observe(int(ran), float(iteration_times[w]))
        if set(ids) != set(self._alloc):
            self._restart(ids)
            return dict(self._alloc)
        for w in ids:
            self._sums[w] = self._sums.get(w, 0.0) + float(iteration_times[w])
        self._count += 1
        if self._count >= self.window:
            self._move({w: s / self._count for w, s in self._sums.items()})
            self._reset_window()
        return dict(self._alloc)

    def _restart(self, ids: list[int]) -> None:
        # Keep the learned relative sizes of the survivors; newcomers get their mean.
        known = [self._alloc[w] for w in ids if w in self._alloc]
        fill = sum(known) / len(known) if known else 1.0
        weights = [float(max(self._alloc.get(w, fill), 1e-9)) for w in ids]
        self._alloc = self._split(ids, weights)
        self._initial_step = max(1, round(self.step_fraction * self.global_batch / len(ids)))
        self.step, self.window = self._initial_step, self.base_window
        self._last_move, self._run = None, 0
        self._reset_window()

    def _reset_window(self) -> None:
        self._sums: dict[int, float] = {}
        self._count = 0

    def _move(self, means: dict[int, float]) -> None:
        donor = max(means, key=lambda w: (means[w], -w))
        open_ = [w for w in means if w != donor and self._alloc[w] < self.caps.get(w, math.inf)]
        if not open_:
            return
        recipient = min(open_, key=lambda w: (means[w], w))
        room = min(self._alloc[donor] - self.minimum,
                   self.caps.get(recipient, math.inf) - self._alloc[recipient])
        if means[recipient] >= means[donor] or room <= 0:
            return                                  # balanced, or nothing can move
        self._adapt(donor, recipient)
        amount = min(self.step, room)
        models = self.models or {}
        if donor in models and recipient in models:
            amount = min(room, 4 * self.step, self._balance(models[donor], models[recipient], donor, recipient, room))
        self._alloc[donor] -= amount
        self._alloc[recipient] += amount

    def _balance(self, d: PiecewiseLinear, r: PiecewiseLinear, donor: int, recipient: int, room: int) -> int:
        """The move (≥ 1) after which the donor's predicted time is no longer above the
        recipient's: the smallest such, by bisection (one falls, the other rises)."""
        xd, xr = self._alloc[donor], self._alloc[recipient]
        lo, hi = 1, room
        while lo < hi:
            mid = (lo + hi) // 2
            if d.predict(xd - mid) <= r.predict(xr + mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _adapt(self, donor: int, recipient: int) -> None:
        last = self._last_move
        if last is not None and (donor == last[1] or recipient == last[0]):
            self.step = max(1, self.step // 2)      # overshot: finer moves, more evidence
            self.window = min(self.max_window, self.window * 2)
            self._run = 0
        elif last == (donor, recipient):
            self._run += 1
            if self._run >= 2:                      # third same move: load has shifted
                self.step = min(self._initial_step, self.step * 2)
                self.window = max(self.base_window, self.window // 2)
                self._run = 0
        else:
            self._run = 0
        self._last_move = (donor, recipient)

    _INT_STATE = ("step", "window", "_initial_step", "_count", "_run")

    def state_dict(self) -> dict:
        ints = {k.lstrip("_"): getattr(self, k) for k in self._INT_STATE}
        return {**super().state_dict(), **ints,
                "alloc": [[w, x] for w, x in sorted(self._alloc.items())],
                "sums": [[w, s] for w, s in sorted(self._sums.items())],
                "last_move": None if self._last_move is None else list(self._last_move)}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        for k in self._INT_STATE:
            setattr(self, k, int(d[k.lstrip("_")]))
        self._alloc = {int(w): int(x) for w, x in d["alloc"]}
        self._sums = {int(w): float(s) for w, s in d["sums"]}
        self._last_move = None if d["last_move"] is None else tuple(d["last_move"])


def make_batch_policy(name: str, global_batch: int, **kw):
    """Build a batch policy by name: "equal", "proportional" or "step"."""
    if name == "model":  # the step tuner with piecewise-linear step-time models
        return StepTuner(global_batch, model=True, **kw)
    classes = {"equal": EqualPolicy, "proportional": ProportionalPolicy, "step": StepTuner}
    if name not in classes:
        raise ValueError(f"batch policy name must be one of {sorted(classes)}, got {name!r}")
    return classes[name](global_batch, **kw)


# ---------------------------------------------------------------- validation helpers

def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_real(name: str, value, *, positive: bool) -> None:
    if not (_is_real(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ValueError(f"{name} must be finite {'> 0' if positive else '>= 0'}, got {value!r}")


def _check_int(name: str, value, lowest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lowest:
        raise ValueError(f"{name} must be an int >= {lowest}, got {value!r}")


def _ids(mapping: Mapping[int, float]) -> list[int]:
    if not mapping:
        raise ValueError("no workers: the mapping of worker id -> value is empty")
    return sorted(mapping)


def _costs_for(ids: list[int], const_costs: Mapping[int, float] | None) -> list[float]:
    if const_costs is None:
        return [0.0] * len(ids)
    for w in ids:
        if w not in const_costs:
            raise ValueError(f"const_costs has no entry for worker {w}")
        _check_real(f"const_costs[{w}]", const_costs[w], positive=False)
    return [float(const_costs[w]) for w in ids]


def _validate(total, speeds, minimum, caps, const_costs):
    """Check allocate's inputs; return (minimum, caps with None -> inf, costs)."""
    _check_int("total", total, 0)
    _check_int("minimum", minimum, 0)
    n = len(speeds)
    if n == 0:
        raise ValueError("speeds is empty: need at least one worker")
    costs = [0.0] * n if const_costs is None else list(const_costs)
    hi = [None] * n if caps is None else list(caps)
    for name, seq in (("const_costs", costs), ("caps", hi)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but speeds has {n}")
    for i in range(n):
        _check_real(f"speeds[{i}]", speeds[i], positive=True)
        _check_real(f"const_costs[{i}]", costs[i], positive=False)
        if hi[i] is not None:
            _check_int(f"caps[{i}]", hi[i], minimum)
    hi = [math.inf if h is None else h for h in hi]
    if total < minimum * n or total > sum(hi):
        raise ValueError(f"total={total} infeasible for {n} workers with minimum={minimum}"
                         f" (needs >= {minimum * n}) and caps summing to {sum(hi)}")
    return minimum, hi, costs
