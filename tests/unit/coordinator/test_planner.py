"""The coordinator's plan decisions, without processes."""

from equipoise.config import Config
from equipoise.coordinator.planner import REMEASURE_EVERY, Planner


def report(samples, compute, comm=0.001):
    return {"samples": samples, "compute_s": compute, "comm_s": comm, "cpu": 0.5, "mem": 0.1}


def test_bsp_splits_equally_or_as_configured():
    assert Planner(Config(workers=3, global_batch=10), [0, 1, 2]).sizes() == {0: 4, 1: 3, 2: 3}
    cfg = Config(workers=2, global_batch=10, batch_split=(7, 3))
    assert Planner(cfg, [0, 1]).sizes() == {0: 7, 1: 3}
    assert Planner.slices({0: 7, 1: 3}) == {0: (0, 7), 1: (7, 3)}


def test_lbbsp_sizes_follow_observed_speeds_and_sum_to_x():
    cfg = Config(protocol="lbbsp", workers=4, global_batch=128, predictor="last", hysteresis=0.0)
    p = Planner(cfg, [0, 1, 2, 3])
    assert p.sizes() == {0: 32, 1: 32, 2: 32, 3: 32}  # nothing observed yet
    # speeds 1000, 1000, 500, 250 samples/s (slowdown 1, 1, 2, 4)
    p.observe({w: report(32, 32 / v) for w, v in zip(range(4), (1000, 1000, 500, 250))})
    sizes = p.sizes()
    assert sum(sizes.values()) == 128
    assert abs(sizes[0] - sizes[1]) <= 1 and min(sizes[0], sizes[1]) > sizes[2] > sizes[3]
    assert abs(sizes[2] - 2 * sizes[3]) <= 2 and abs(sizes[0] - 2 * sizes[2]) <= 2
    assert set(p.mape()) == {"last"}  # only the predictor that drives sizes, by default
    shadowed = Planner(Config(protocol="lbbsp", shadow_predictors=True), [0, 1])
    assert set(shadowed.mape()) == {"last", "ewma", "narx"}


def test_membership_change_redistributes_the_global_batch():
    cfg = Config(protocol="lbbsp", workers=3, global_batch=90, predictor="last", hysteresis=0.0)
    p = Planner(cfg, [0, 1, 2])
    p.observe({w: report(30, 30 / 1000) for w in range(3)})
    p.set_workers([0, 2, 5])
    p.observe({w: report(30, 30 / 1000) for w in (0, 2, 5)})
    sizes = p.sizes()
    assert set(sizes) == {0, 2, 5} and sum(sizes.values()) == 90


def test_other_protocols_train_no_predictor():
    assert Planner(Config(protocol="bsp"), [0, 1, 2, 3]).mape() == {}


def test_a_worker_at_a_tiny_batch_is_not_taken_for_slow_once_its_fixed_cost_is_known():
    """Four equal workers whose step costs F + n·p (F = 5 ms, p = 0.5 ms a sample); worker
    0 last ran 2 samples. As n / compute its speed is 2 / 6 ms against 20 / 15 ms for
    the others: it would get about 64 · 333 / (333 + 3 · 1333) ≈ 5 samples, and a
    last-value speed would keep it there. With F known every speed is exactly 1 / p and
    every constant cost equal, so the split is equal: 16 each."""
    cfg = Config(protocol="lbbsp", workers=4, global_batch=64, predictor="last", hysteresis=0.0)
    sizes = (2, 20, 21, 21)
    naive = Planner(cfg, [0, 1, 2, 3])
    naive.observe({w: report(n, 0.005 + n * 0.0005) for w, n in enumerate(sizes)})
    assert naive.sizes()[0] <= 6
    p = Planner(cfg, [0, 1, 2, 3])
    for w in range(4):
        p.set_fixed_cost(w, 0.005)
    p.observe({w: report(n, 0.005 + n * 0.0005) for w, n in enumerate(sizes)})
    assert p.sizes() == {0: 16, 1: 16, 2: 16, 3: 16}


def test_lbbsp_with_min_batch_0_leaves_out_a_worker_whose_fixed_cost_exceeds_the_step():
    # Three workers at 1,000 samples/s; worker 2's step costs 0.5 s more whatever its batch. 90 samples over workers 0 and 1 take 45 ms: any sample on worker
    # 2 makes the iteration 0.5 s. With min_batch 0 it gets none; with 1, one.
    def planner(min_batch):
        cfg = Config(protocol="lbbsp", workers=3, global_batch=90, predictor="last", hysteresis=0.0,
                     min_batch=min_batch)
        p = Planner(cfg, [0, 1, 2])
        p.set_fixed_cost(2, 0.5)
        p.observe({0: report(30, 0.03), 1: report(30, 0.03), 2: report(30, 0.5 + 0.03)})
        return p

    assert planner(1).sizes() == {0: 45, 1: 44, 2: 1}
    p = planner(0)
    plans = [p.sizes() for _ in range(REMEASURE_EVERY + 1)]
    assert plans[0] == {0: 45, 1: 45, 2: 0}
    # left out REMEASURE_EVERY plans in a row, it is given one sample to be measured again
    assert [s[2] for s in plans] == [0] * (REMEASURE_EVERY - 1) + [1, 0]
    assert all(sum(s.values()) == 90 for s in plans)
    # a report of an iteration with no samples teaches no speed
    before = p.predict(2)
    p.observe({2: report(0, 0.0, comm=0.002)})
    assert p.predict(2) == before
