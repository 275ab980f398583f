"""When the coordinator keeps an in-memory snapshot for a rollback
(coordinator/recovery.py `SnapshotPace`): every `snapshot_every`-th iteration, spaced
out, in multiples of it, while the last fetch held the workers for more than
`snapshot_budget` of the training since the one before. A clock of our own, and times
and budgets that are powers of two: the arithmetic is exact."""

import pytest

from equipoise.config import Config, ConfigError
from equipoise.coordinator.recovery import SnapshotPace


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _run(pace, clock, iterations, iteration_s, cost_s):
    """Train `iterations` iterations of `iteration_s` each, fetching a snapshot that
    takes `cost_s` wherever `pace` says one is due; the iterations it was taken at."""
    taken = []
    for t in range(1, iterations + 1):
        clock.now += iteration_s
        if pace.due(t):
            started = clock.now
            clock.now += cost_s
            pace.taken(t, started)
            taken.append(t)
    return taken


def test_cheap_snapshots_keep_their_spacing():
    clock = _Clock()
    pace = SnapshotPace(10, 1 / 16, clock)
    # snapshots of 1/16 s after iterations of 1/8 s: 8 iterations' worth within the budget
    assert _run(pace, clock, 60, 1 / 8, 1 / 16) == [10, 20, 30, 40, 50, 60]
    assert pace.spacing == 10


def test_a_costly_snapshot_is_spaced_to_the_budget_in_multiples_of_snapshot_every():
    clock = _Clock()
    pace = SnapshotPace(10, 1 / 16, clock)
    # 3/16 s a snapshot, 1/32 s an iteration: (3/16) / ((1/16) · (1/32)) = 96 iterations
    # apart, rounded up to 100, once one interval was measured (the first snapshot has
    # nothing before it to weigh)
    assert _run(pace, clock, 250, 1 / 32, 3 / 16) == [10, 20, 120, 220]
    assert pace.spacing == 100 and pace.cost_s == 3 / 16 and pace.iteration_s == 1 / 32
    # exactly 64 iterations' worth: 70
    pace = SnapshotPace(10, 1 / 16, clock)
    assert _run(pace, clock, 250, 1 / 32, 1 / 8) == [10, 20, 90, 160, 230]


def test_the_spacing_comes_back_when_snapshots_get_cheaper():
    clock = _Clock()
    pace = SnapshotPace(10, 1 / 16, clock)
    _run(pace, clock, 20, 1 / 32, 3 / 16)
    assert pace.spacing == 100
    clock.now += 100 / 32
    started = clock.now
    clock.now += 1 / 1024
    assert pace.taken(120, started)  # changed
    assert pace.spacing == 10 and pace.due(130) and not pace.due(125)


def test_budget_zero_is_every_snapshot_every_iterations_and_zero_every_is_none():
    clock = _Clock()
    assert _run(SnapshotPace(10, 0.0, clock), clock, 40, 1 / 32, 1.0) == [10, 20, 30, 40]
    assert _run(SnapshotPace(0, 1 / 16, clock), clock, 40, 1 / 32, 0.0) == []


def test_after_a_rollback_the_next_snapshot_weighs_no_interval():
    clock = _Clock()
    pace = SnapshotPace(10, 1 / 16, clock)
    _run(pace, clock, 20, 1 / 32, 3 / 16)
    spacing = pace.spacing
    pace.rolled_back()  # the lost run and the recovery are no iteration's time
    clock.now += 1000.0
    started = clock.now
    clock.now += 3 / 16
    assert not pace.taken(120, started) and pace.spacing == spacing and pace.next == 120 + spacing


def test_one_slow_fetch_does_not_push_the_next_far_out():
    clock = _Clock()
    pace = SnapshotPace(10, 1 / 16, clock)
    _run(pace, clock, 20, 1 / 32, 1 / 64)  # cheap: (1/64) / ((1/16)(1/32)) = 8 iterations' worth
    assert pace.spacing == 10
    clock.now += 10 / 32
    started = clock.now
    clock.now += 4.0  # one fetch of 4 s: weighed at the lesser of it and the one before
    pace.taken(30, started)
    assert pace.spacing == 10
    clock.now += 10 / 32
    started = clock.now
    clock.now += 4.0  # two in a row: believed, 2048 iterations' worth
    pace.taken(40, started)
    assert pace.spacing == 2050


@pytest.mark.parametrize("budget", [-0.1, 1.5, float("nan")])
def test_a_budget_outside_zero_to_one_is_refused_by_name(budget):
    with pytest.raises(ConfigError, match="snapshot_budget") as info:
        Config.from_dict({"snapshot_budget": budget})
    assert "\n" not in str(info.value)


def test_a_snapshot_is_kept_where_the_state_is_fetched_anyway_and_never_without_a_rollback():
    from equipoise.coordinator.recovery import Memory, Recovery

    def recovery(**cfg):
        r = Recovery(Config(**cfg), None, None, None, recovers_servers=True, event=lambda *a, **k: None,
                     elapsed=lambda: 0.0, note=lambda line: None)
        r.memory = Memory(0, None, [])
        r.pace.next = 100  # spaced out: not due before iteration 100
        return r

    r = recovery(snapshot_every=10)
    assert not r.memory_due(20, 200)
    assert r.memory_due(20, 200, fetching=True)  # an evaluation's fetch: free
    assert not r.memory_due(25, 200, fetching=True)  # not at a multiple of snapshot_every
    assert r.memory_due(100, 200) and not r.memory_due(200, 200, fetching=True)  # the final iteration: none
    assert not recovery(snapshot_every=0).memory_due(20, 200, fetching=True)
    assert not recovery(snapshot_every=10, replication=1).memory_due(100, 200)
