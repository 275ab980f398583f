"""Tests for equipoise.policy.batching (LB-BSP batch sizing)."""
import math

import pytest
from hypothesis import assume, given, settings, strategies as st

from equipoise.policy.batching import (EqualPolicy, ProportionalPolicy, StepTuner, allocate,
                                       equal_split, ideal_allocation, iteration_time,
                                       make_batch_policy)

speeds_st = st.lists(st.floats(0.01, 1e4, allow_nan=False), min_size=1, max_size=12)


@st.composite
def problems(draw, with_caps=True, with_costs=True):
    """A feasible allocate() problem: (total, speeds, minimum, caps, costs)."""
    speeds = draw(speeds_st)
    n = len(speeds)
    minimum = draw(st.integers(0, 5))
    caps = None
    if with_caps and draw(st.booleans()):
        caps = draw(st.lists(st.one_of(st.none(), st.integers(minimum, minimum + 200)),
                             min_size=n, max_size=n))
    costs = None
    if with_costs and draw(st.booleans()):
        costs = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
    top = sum(c if c is not None else 10_000 for c in (caps or [None] * n))
    total = draw(st.integers(minimum * n, max(minimum * n, min(top, 10_000))))
    return total, speeds, minimum, caps, costs


def test_equal_split_gives_remainder_to_first_workers():
    assert equal_split(10, 3) == [4, 3, 3]
    assert equal_split(2, 4) == [1, 1, 0, 0]
    assert equal_split(0, 2) == [0, 0]
    with pytest.raises(ValueError, match="workers"):
        equal_split(10, 0)


def test_allocate_simple_cases():
    assert allocate(100, [1, 2, 3, 4]) == [10, 20, 30, 40]
    assert allocate(100, [1, 2, 3, 4], caps=[None, None, None, 20]) == [13, 27, 40, 20]
    assert allocate(100, [1, 2], const_costs=[0, 10]) == [40, 60]
    assert allocate(3, [1, 100, 1]) == [1, 1, 1]


@settings(max_examples=300, deadline=None)
@given(problems())
def test_allocate_sums_exactly_and_respects_bounds(p):
    total, speeds, minimum, caps, costs = p
    x = allocate(total, speeds, minimum=minimum, caps=caps, const_costs=costs)
    assert sum(x) == total
    assert all(isinstance(xi, int) and xi >= minimum for xi in x)
    for xi, cap in zip(x, caps or [None] * len(x)):
        assert cap is None or xi <= cap


@settings(max_examples=300, deadline=None)
@given(problems())
def test_allocate_within_one_sample_of_the_continuous_solution(p):
    total, speeds, minimum, caps, costs = p
    x = allocate(total, speeds, minimum=minimum, caps=caps, const_costs=costs)
    ideal, t = ideal_allocation(total, speeds, minimum=minimum, caps=caps, const_costs=costs)
    assert math.isclose(sum(ideal), total, rel_tol=1e-9, abs_tol=1e-6)
    assert all(abs(xi - yi) < 1 + 1e-9 for xi, yi in zip(x, ideal))


@settings(max_examples=300, deadline=None)
@given(problems(with_caps=False))
def test_allocate_is_proportional_without_costs_or_caps(p):
    total, speeds, _, _, _ = p
    assume(total >= len(speeds))
    x = allocate(total, speeds, minimum=0)
    share = [total * v / sum(speeds) for v in speeds]
    assert all(abs(xi - si) < 1 + 1e-9 for xi, si in zip(x, share))


@settings(max_examples=300, deadline=None)
@given(problems())
def test_no_single_sample_move_would_finish_earlier(p):
    """Finish times c_i + x_i/v_i are equalised to within one sample's time: moving a
    sample off any worker above its minimum onto any worker below its cap cannot
    make the receiver finish before the giver did."""
    total, speeds, minimum, caps, costs = p
    x = allocate(total, speeds, minimum=minimum, caps=caps, const_costs=costs)
    c = costs or [0.0] * len(x)
    hi = [math.inf if h is None else h for h in (caps or [None] * len(x))]
    for i in range(len(x)):
        for j in range(len(x)):
            if i != j and x[i] > minimum and x[j] < hi[j]:
                giver_after = c[i] + (x[i] - 1) / speeds[i]
                taker_after = c[j] + (x[j] + 1) / speeds[j]
                assert giver_after <= taker_after * (1 + 1e-9) + 1e-9


@settings(max_examples=200, deadline=None)
@given(speeds_st, st.integers(0, 5), st.data())
def test_allocate_infeasible_raises(speeds, minimum, data):
    n = len(speeds)
    if minimum > 0:
        with pytest.raises(ValueError, match=f"total={minimum * n - 1}"):
            allocate(minimum * n - 1, speeds, minimum=minimum)
    caps = data.draw(st.lists(st.integers(minimum, minimum + 50), min_size=n, max_size=n))
    with pytest.raises(ValueError, match="caps summing to"):
        allocate(sum(caps) + 1, speeds, minimum=minimum, caps=caps)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_allocate_rejects_bad_speed_naming_the_worker(bad):
    with pytest.raises(ValueError, match=r"speeds\[1\]"):
        allocate(10, [1.0, bad, 2.0])


def test_allocate_rejects_bad_costs_and_caps():
    with pytest.raises(ValueError, match=r"const_costs\[0\]"):
        allocate(10, [1.0, 1.0], const_costs=[-1.0, 0.0])
    with pytest.raises(ValueError, match=r"caps\[1\]"):
        allocate(10, [1.0, 1.0], minimum=2, caps=[None, 1])
    with pytest.raises(ValueError, match="caps has 1 entries"):
        allocate(10, [1.0, 1.0], caps=[5])


# ------------------------------------------------------------ ProportionalPolicy

def test_proportional_hysteresis_ignores_noise_and_follows_real_change():
    pol = ProportionalPolicy(120, hysteresis=0.05)
    first = pol.decide({0: 100.0, 1: 200.0, 2: 300.0})
    assert first == {0: 20, 1: 40, 2: 60}
    assert pol.decide({0: 102.0, 1: 197.0, 2: 301.0}) == first        # noise: keep
    moved = pol.decide({0: 100.0, 1: 200.0, 2: 100.0})                 # worker 2 slowed
    assert moved == {0: 30, 1: 60, 2: 30}


def test_proportional_membership_change_redistributes_global_batch():
    pol = ProportionalPolicy(100, hysteresis=0.5)
    pol.decide({0: 1.0, 1: 1.0, 2: 2.0})
    left = pol.decide({0: 1.0, 2: 2.0})                   # worker 1 left
    assert set(left) == {0, 2} and sum(left.values()) == 100
    assert left == {0: 33, 2: 67}
    joined = pol.decide({0: 1.0, 2: 2.0, 5: 1.0})         # worker 5 joined
    assert sum(joined.values()) == 100 and joined[5] == 25


def test_proportional_respects_caps_and_const_costs():
    pol = ProportionalPolicy(100, caps={2: 30})
    sizes = pol.decide({0: 1.0, 1: 1.0, 2: 10.0}, const_costs={0: 0.0, 1: 5.0, 2: 0.0})
    assert sizes[2] == 30 and sum(sizes.values()) == 100 and sizes[0] > sizes[1]
    with pytest.raises(ValueError, match="const_costs has no entry for worker 2"):
        pol.decide({0: 1.0, 2: 1.0}, const_costs={0: 0.0})


def test_proportional_state_dict_round_trip_keeps_hysteresis_memory():
    pol = ProportionalPolicy(60)
    pol.decide({0: 1.0, 1: 2.0})
    clone = ProportionalPolicy(60)
    clone.load_state_dict(pol.state_dict())
    noisy = {0: 1.01, 1: 1.98}
    assert clone.decide(noisy) == pol.decide(noisy) == {0: 20, 1: 40}
    with pytest.raises(ValueError, match="global_batch"):
        ProportionalPolicy(61).load_state_dict(pol.state_dict())


@pytest.mark.parametrize("kw, name", [({"hysteresis": 1.0}, "hysteresis"),
                                      ({"minimum": -1}, "minimum"),
                                      ({"caps": {0: 0}}, r"caps\[0\]")])
def test_proportional_config_errors(kw, name):
    with pytest.raises(ValueError, match=name):
        ProportionalPolicy(10, **kw)


# ------------------------------------------------------------ StepTuner

def run_linear(tuner, speeds, iterations):
    """Feed the tuner time_i = x_i / v_i for its own allocation; return the history."""
    sizes = tuner.decide({w: 1.0 for w in speeds})          # first call sets it up
    history = [sizes]
    for _ in range(iterations):
        sizes = tuner.decide({w: sizes[w] / v for w, v in speeds.items()})
        assert sum(sizes.values()) == tuner.global_batch
        history.append(sizes)
    return history


def test_step_tuner_converges_near_proportional_on_linear_model():
    speeds = {0: 1.0, 1: 2.3, 2: 3.1, 3: 4.2}
    tuner = StepTuner(401, step_fraction=0.05, window=5)
    history = run_linear(tuner, speeds, 1500)
    ideal = dict(zip(speeds, allocate(401, list(speeds.values()))))   # 38, 87, 117, 159
    for sizes in history[-200:]:          # settled: at most +-1 sample of jitter left
        assert all(abs(sizes[w] - ideal[w]) <= 1 for w in speeds), sizes
    times = [history[-1][w] / v for w, v in speeds.items()]
    assert max(times) <= min(times) * 1.05
    assert (tuner.step, tuner.window) == (1, 40)     # refined to the finest step


def test_step_tuner_stops_moving_once_times_are_equal():
    speeds = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
    history = run_linear(StepTuner(400, window=5), speeds, 300)
    assert history[-1] == {0: 40, 1: 80, 2: 120, 3: 160} == history[-100]


def test_step_tuner_regrows_its_step_to_follow_a_new_straggler():
    tuner = StepTuner(400, step_fraction=0.05, window=5)
    run_linear(tuner, {0: 1.0, 1: 2.3, 2: 3.1, 3: 4.2}, 400)
    assert (tuner.step, tuner.window) == (1, 40)
    swapped = {0: 4.2, 1: 2.3, 2: 3.1, 3: 1.0}           # workers 0 and 3 trade places
    sizes = tuner.allocation
    steps = []
    for _ in range(400):
        sizes = tuner.decide({w: sizes[w] / v for w, v in swapped.items()})
        steps.append(tuner.step)
    assert max(steps) == 5                               # back to the initial step
    assert abs(sizes[0] - 158) <= 1 and abs(sizes[3] - 38) <= 1


def test_step_tuner_halves_step_and_doubles_window_when_the_pair_reverses():
    tuner = StepTuner(100, step_fraction=0.2, window=1)         # step = 10
    tuner.decide({0: 1.0, 1: 1.0})
    assert tuner.step == 10
    assert tuner.decide({0: 2.0, 1: 1.0}) == {0: 40, 1: 60}     # 0 slower: 0 -> 1
    assert tuner.decide({0: 1.0, 1: 2.0}) == {0: 45, 1: 55}     # reversal: step 5
    assert (tuner.step, tuner.window) == (5, 2)
    assert tuner.decide({0: 2.0, 1: 1.0}) == {0: 45, 1: 55}     # window 2: waits
    assert tuner.decide({0: 2.0, 1: 1.0}) == {0: 43, 1: 57}     # reversal again: step 2
    assert (tuner.step, tuner.window) == (2, 4)


def test_step_tuner_respects_caps_minimum_and_membership():
    tuner = StepTuner(60, step_fraction=0.5, window=1, minimum=5, caps={1: 25})
    tuner.decide({0: 1.0, 1: 1.0, 2: 1.0})
    for _ in range(20):                       # worker 0 always slow, 1 always fastest
        sizes = tuner.decide({0: 9.0, 1: 1.0, 2: 2.0})
        assert sizes[0] >= 5 and sizes[1] <= 25 and sum(sizes.values()) == 60
    assert sizes[1] == 25
    sizes = tuner.decide({0: 1.0, 2: 1.0})    # worker 1 left
    assert set(sizes) == {0, 2} and sum(sizes.values()) == 60


def test_step_tuner_state_dict_round_trip():
    speeds = {0: 1.0, 1: 3.0}
    a = StepTuner(80, window=3)
    run_linear(a, speeds, 40)
    b = StepTuner(80, window=3)
    b.load_state_dict(a.state_dict())
    for _ in range(30):
        times = {w: a.allocation[w] / v for w, v in speeds.items()}
        assert a.decide(times) == b.decide(times)


def test_make_batch_policy_and_equal_policy():
    assert isinstance(make_batch_policy("proportional", 10), ProportionalPolicy)
    assert isinstance(make_batch_policy("step", 10, window=3), StepTuner)
    eq = make_batch_policy("equal", 10, caps={0: 2})
    assert isinstance(eq, EqualPolicy)
    assert eq.decide({3: 5.0, 0: 1.0, 1: 9.0}) == {0: 2, 1: 4, 3: 4}
    with pytest.raises(ValueError, match="'fastest'"):
        make_batch_policy("fastest", 10)


def test_iteration_time_is_the_slowest_finish():
    assert iteration_time([10, 20], [1.0, 4.0], [0.0, 1.0]) == 10.0


def test_piecewise_linear_interpolates_is_monotone_and_extrapolates():
    from equipoise.policy.batching import PiecewiseLinear

    m = PiecewiseLinear(alpha=1.0)
    m.observe(10, 1.0)
    assert m.predict(20) == pytest.approx(2.0)  # one size: time ∝ batch
    m.observe(20, 1.0)  # flat while the device is under-used
    m.observe(40, 3.0)
    assert m.predict(15) == pytest.approx(1.0) and m.predict(30) == pytest.approx(2.0)
    assert m.predict(60) == pytest.approx(5.0)  # the last segment's slope, 0.1 s a sample
    m.observe(30, 0.5)  # noise below a smaller batch's time: never less than it
    assert m.predict(30) == pytest.approx(1.0)


def test_the_model_tuner_balances_gpu_like_step_times_within_caps():
    """Step times flat up to a knee, then linear (a GPU under-used, then busy), with
    worker 2 four times slower per sample; the model tuner reaches sizes whose times
    are within a step's worth of each other, never above a worker's cap, Σ = X."""
    from equipoise.policy.batching import StepTuner

    def t(w, x):
        return max(0.05, x * (0.004 if w == 2 else 0.001))

    tuner = StepTuner(256, window=2, model=True, caps={1: 100})
    sizes = tuner.decide({0: 0.0, 1: 0.0, 2: 0.0})
    for _ in range(80):
        sizes = tuner.decide({w: t(w, x) for w, x in sizes.items()}, sizes)
        assert sum(sizes.values()) == 256 and sizes[1] <= 100
    # worker 1 (as fast as 0) is held at its cap; 0 and 2 share the other 156 samples
    # at equal times: x0 = 4·x2, so 124.8 and 31.2 (one sample moves 1–4 ms)
    assert sizes[1] == 100 and abs(sizes[2] - 31.2) <= 1, sizes
    plain = StepTuner(256, window=2, caps={1: 100})
    s = plain.decide({0: 0.0, 1: 0.0, 2: 0.0})
    for _ in range(10):
        s = plain.decide({w: t(w, x) for w, x in s.items()})
    fast = StepTuner(256, window=2, model=True, caps={1: 100})
    f = fast.decide({0: 0.0, 1: 0.0, 2: 0.0})
    for _ in range(10):
        f = fast.decide({w: t(w, x) for w, x in f.items()}, f)
    # after 10 iterations (5 windows) the model's moves have got further than fixed steps
    assert max(t(w, x) for w, x in f.items()) < max(t(w, x) for w, x in s.items())
