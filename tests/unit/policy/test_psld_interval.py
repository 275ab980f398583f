"""How PSLD's interval is timed and measured at the coordinator (coordinator/measurement.py,
ServerManager): a server's time is the larger of its busy time and the workers' exchanges
with it; an interval runs from barrier to barrier; the coordinator's holds count at what
they cost the workers (``policy.measure.hold_cost``)."""

import pytest


def _manager_at(barriers):
    from types import SimpleNamespace

    from equipoise.coordinator.server_manager import ServerManager
    from equipoise.wire import Message

    manager = object.__new__(ServerManager)
    stats = {0: Message("stats", {"busy_s": 0.01, "bytes": 1_000_000, "load_bytes": 400, "blocks": 1})}
    manager.settings = SimpleNamespace(psld_interval=5)
    manager.pool = SimpleNamespace(broadcast=lambda msg, kind: stats, version=1, round_trip_s=0.001)
    manager._barrier_at, manager.workers, manager._exchange_s = dict(enumerate(barriers)), 2, {}
    manager._held, manager._reached, records = set(), None, []
    manager._record, manager._elapsed = records.append, lambda: barriers[-1]
    return manager, records


def test_a_servers_time_is_the_larger_of_its_busy_time_and_the_workers_exchanges_with_it():
    """A server behind a slow link (the kernel's, not an emulation) is busy as briefly
    as the others, but every worker spends longer in its exchanges: its throughput is
    its bytes over that longer time, so PSLD sees it as the slow one."""
    from types import SimpleNamespace

    from equipoise.coordinator.server_manager import ServerManager
    from equipoise.wire import Message

    manager = object.__new__(ServerManager)
    records = []
    stats = {r: Message("stats", {"busy_s": 0.01, "bytes": 1_000_000, "load_bytes": 400, "blocks": 1})
             for r in (0, 1)}
    manager.settings = SimpleNamespace(psld_interval=5)
    # no server's exchanges are small (1 MB over 2 workers × 10): the fixed cost is a stats
    # request's round trip of 1 ms, 10 exchanges an interval: 0.01 s no byte caused
    manager.pool = SimpleNamespace(broadcast=lambda msg, kind: stats, version=1, round_trip_s=0.001)
    manager._barrier_at, manager.workers, manager._exchange_s, manager._held = {0: 0.0, 5: 5.0}, 2, {}, set()
    manager._record, manager._elapsed = records.append, lambda: 5.0
    manager.observe_exchange({0: 0.02, 1: 0.5})  # worker 0's report
    manager.observe_exchange({0: 0.02, 1: 0.5})  # worker 1's
    throughput, iteration_s = manager._measure(5)
    assert iteration_s == 1.0
    # mean exchange: 0.02 s and 0.5 s, less the fixed cost
    assert throughput == {0: 1_000_000 / 0.01, 1: 1_000_000 / 0.49}
    assert records[0]["exchange_s"] == [0.02, 0.5] and manager._exchange_s == {}
    assert records[0]["fixed_s"] == 0.01 and records[0]["share"] == pytest.approx(0.096)  # 0.5 − 0.02 s of 5 × 1 s
    assert records[0]["reach"] == pytest.approx(0.098)  # its bytes: 0.5 − 0.01 s of 5 × 1 s
    manager.observe_exchange({0: 0.001, 1: 0.001})  # faster than their busy time: busy decides
    # (less at most half of it)
    assert manager._measure(5)[0] == {0: 1_000_000 / 0.005, 1: 1_000_000 / 0.005}



def test_an_interval_runs_from_barrier_to_barrier_the_coordinators_holds_included():
    """A barrier is stamped when every worker reached it (`reached`), before the
    coordinator's own work there: a snapshot's 20 ms at iteration 5 counts in the next
    interval, whose wall time it is, and a later stamp of the same barrier changes nothing."""
    manager, records = _manager_at([0.0, 0.013, 0.026, 0.039, 0.052, 0.065])
    manager._reached = 5
    manager.reached(5)  # again, after the snapshot: the first stamp stands
    assert manager._barrier_at[5] == 0.065
    assert manager._measure(5)[1] == pytest.approx(0.013)
    assert records[0]["noise"] == pytest.approx(0.0, abs=1e-12)  # five iterations of 13 ms
    manager._barrier_at.update({6: 0.098, 7: 0.111, 8: 0.124, 9: 0.137, 10: 0.150})  # 6 held 20 ms
    assert manager._measure(10)[1] == pytest.approx(0.017)  # a hold the coordinator did not make: counted
    manager._reached, manager._held = 10, {5, 9, 10}
    manager.reached(9)  # reached anew (a rollback): stamped now, not kept from before
    assert manager._barrier_at[9] > 0.137
    assert manager._held == {5}  # the holds of the lost timeline are gone


def test_a_hold_counts_at_what_it_cost_the_workers_not_its_wall_time():
    """A snapshot at barrier 5 (`note_hold`) that held the workers 40 ms: iteration 6
    ran 105 ms against the others' 65, and the interval counts 65 ms an iteration, as
    the one before it without a snapshot did (counted whole, 73 ms: intervals
    alternating by 12%, which the keep bar read as noise). A hold the workers' pulls hid
    (iteration 6 no longer than the others) costs nothing, and nothing is taken off."""
    barriers = [0.0, 0.065, 0.130, 0.195, 0.260, 0.325, 0.430, 0.495, 0.560, 0.625, 0.690]
    manager, records = _manager_at(barriers)
    assert manager._measure(5)[1] == pytest.approx(0.065)
    manager.note_hold(5)
    assert manager._measure(10)[1] == pytest.approx(0.065)
    assert records[-1]["hold_s"] == pytest.approx(0.040)
    assert records[-1]["noise"] == pytest.approx(0.0, abs=1e-9)  # five equal iterations once the hold is out
    hidden = [0.0, 0.27, 0.54, 0.81, 1.08, 1.35, 1.62, 1.89, 2.16, 2.43, 2.70]  # 0.27 s each, hold or not
    manager, records = _manager_at(hidden)
    manager.note_hold(5)
    assert manager._measure(10)[1] == pytest.approx(0.27)
    assert records[-1]["hold_s"] == pytest.approx(0.0, abs=1e-9)


def test_hold_cost_is_a_held_iterations_excess_over_the_median_of_the_others():
    from equipoise.policy.measure import hold_cost

    durations = {1: 0.065, 2: 0.105, 3: 0.064, 4: 0.066, 5: 0.065}
    assert hold_cost(durations, {2}) == pytest.approx({2: 0.040})
    assert hold_cost(durations, {3}) == {3: 0.0}  # shorter than the others: costs nothing, adds nothing
    assert hold_cost({1: 0.2}, {1}) == {}  # nothing to compare with
    assert hold_cost(durations, set()) == {} and hold_cost(durations, {9}) == {}


def test_a_decision_barrier_and_a_snapshot_are_holds_and_old_ones_are_forgotten():
    """At each decision barrier (every `psld_interval` iterations) the measurement, the
    decision and any probe hold the workers: `at_barrier` marks it. A barrier between
    decisions is a hold only if the coordinator marked it (a snapshot); marks older than
    the interval to be measured are dropped. The interval measured at 10 is judged less
    the 40 ms by which the iteration after the decision barrier 5 ran long."""
    from types import SimpleNamespace

    barriers = [0.0, 0.065, 0.130, 0.195, 0.260, 0.325, 0.430, 0.495, 0.560, 0.625, 0.690]
    manager, records = _manager_at(barriers)
    manager.settings = SimpleNamespace(psld_interval=5, timeout=60.0)
    manager.done_at, manager.psld, manager.total = None, None, 0
    manager.scenario = SimpleNamespace(server_trace=None, server_events=[])
    manager.control = SimpleNamespace(actions=lambda refused: [])
    manager.arrivals = SimpleNamespace(joining=lambda t: [], arrived=lambda: [])
    manager.note_hold(0)
    held = {}
    for t in range(5, 11):
        manager._reached = t  # stamped already (the barriers above): at_barrier's stamp stands
        assert manager.at_barrier(t) == []
        held[t] = set(manager._held)
        if t == 6:
            manager.note_hold(6)  # a snapshot there, costing nothing
    assert held[5] == {0, 5} and held[6] == {5} and held[9] == {5, 6} and held[10] == {5, 6, 10}
    assert [r["iteration"] for r in records] == [5, 10]
    assert records[-1]["hold_s"] == pytest.approx(0.040) and records[-1]["iteration_s"] == pytest.approx(0.073)
