"""The bookkeeping that lets a barrier iteration end as if a lost worker had not been
lost: slices cut among survivors, and servers told how many pushes they wait for."""

from __future__ import annotations

import pytest

from equipoise.policy.sync import BSP, PushedTwice, SSP, ServerSync, SoftSync
from equipoise.coordinator.assignments import Assignments, _cut


def test_a_cut_covers_the_slice_once_in_proportion():
    pieces = _cut(100, 10, {0: 1.0, 2: 1.0, 3: 2.0})
    # 2.5, 2.5, 5 samples: the tie for the spare sample goes to the first worker
    assert pieces == {0: (100, 3), 2: (103, 2), 3: (105, 5)}
    assert _cut(0, 1, {4: 1.0, 5: 1.0}) in ({4: (0, 1)}, {5: (0, 1)})  # no empty pieces
    with pytest.raises(ValueError):
        _cut(0, 4, {1: 0.0})


def test_a_lost_worker_slices_go_to_the_survivors_for_the_servers_behind():
    a = Assignments()
    a.begin(7, {0: (448, 16), 1: (464, 16), 2: (480, 32)})
    new = a.lose(1, {0: 16, 2: 32}, behind=[1])  # server 0 applied iteration 7 already
    assert sum(s.size for s in new) == 16 and {s.servers for s in new} == {(1,)}
    assert sorted((s.worker, s.start, s.size) for s in new) == [(0, 464, 5), (2, 469, 11)]  # 16·1/3, 16·2/3
    assert a.expected(0) == 2 and a.expected(1) == 2 + len(new)
    assert a.owed() and a.next_share(0).worker == 0
    # a survivor lost in turn: its own slice and its share go to the last one
    again = a.lose(0, {2: 32}, behind=[0, 1])
    assert {(s.worker, s.servers) for s in again} == {(2, (0, 1)), (2, (1,))}
    # server 0: worker 2's slice and worker 0's again; server 1: those and both shares
    assert a.expected(0) == 2 and a.expected(1) == 4
    assert all(s.worker == 2 for s in a.slices)


def test_a_worker_planned_no_samples_is_counted_as_a_push_and_takes_no_lost_share():
    """LB-BSP with min_batch 0: worker 2 pushes zeros every iteration. When worker 1 is
    lost, the servers behind wait for worker 0's own push, worker 0's share of the lost
    slice, and worker 2's push; worker 2 computes nothing of the lost slice."""
    a = Assignments()
    a.begin(3, {0: (192, 40), 1: (232, 24), 2: (256, 0)})
    assert a.expected(0) == 3
    planned = {s.worker: s.size for s in a.slices if s.part == 0}
    new = a.lose(1, {w: planned[w] for w in (0, 2)}, behind=[0])
    assert [(s.worker, s.start, s.size) for s in new] == [(0, 232, 24)]
    assert a.expected(0) == 3  # 0's slice, 0's share, 2's push of zeros
    # the worker planned none lost in turn: nothing to hand out, one push fewer
    assert a.lose(2, {0: 40}, behind=[0]) == [] and a.expected(0) == 2


def test_server_sync_drops_a_lost_push_and_waits_for_what_it_is_told():
    sync = ServerSync(BSP(), 3)
    sync.accept(0, 0, 16)
    dead = sync.accept(1, 0, 16)
    assert sync.lose(1, 2, drop=True) == [dead]
    sync.accept(2, 0, 32)
    assert sync.next_update() is None  # held until `expect`
    sync.expect(0, 4)
    sync.accept(0, 0, 8, part=1)
    with pytest.raises(PushedTwice):
        sync.accept(0, 0, 8, part=1)
    assert sync.next_update() is None
    sync.accept(2, 0, 8, part=2)
    update = sync.next_update()
    assert update is not None and len(update.pushes) == 4
    sync.on_applied(update)
    assert sync.expected is None and sync.version == 1
    sync.accept(0, 1, 32)
    assert sync.next_update() is None
    sync.accept(2, 1, 32)
    assert sync.next_update() is not None  # two workers from now on


def test_without_a_barrier_a_lost_worker_leaves_the_clock_and_the_group():
    sync = ServerSync(SSP(bound=1), 2)
    sync.accept(0, 0)
    sync.on_applied(sync.next_update())
    assert sync.published() == 0  # worker 1 holds the clock back
    sync.lose(1, 1, drop=True)
    assert sync.published() == 1
    soft = ServerSync(SoftSync(n=1), 3)
    soft.accept(0, 0)
    soft.accept(1, 0)
    assert soft.lose(2, 2, drop=True) == [] and soft.next_update() is not None  # λ = 2 now
    assert soft.applied[0] == 0  # counted once applied


def test_a_push_of_a_lost_worker_that_arrives_late_is_refused():
    from equipoise.policy.sync import LostWorker

    sync = ServerSync(BSP(), 2)
    sync.lose(1, 1, drop=True)
    with pytest.raises(LostWorker):
        sync.accept(1, 0, 32)  # queued behind the `lose`: its slice was given to others
    assert sync.pending == []


def test_a_worker_lost_after_its_slice_was_applied_everywhere_keeps_its_slice_in_the_record():
    """It pushed to every server (all applied iteration 5) but died before its report,
    which rides on its next plan request: the coordinator records its slice itself, so
    the iteration's `batch` still lists the split that was applied (summing to X)."""
    from types import SimpleNamespace

    from equipoise.coordinator.pacings import BarrierCoordinator
    from equipoise.coordinator.stats import RunStats
    from equipoise.wire import Message

    class Stub(BarrierCoordinator):
        def __init__(self):
            self.assign, self.iteration, self.waiting = Assignments(), 6, {}
            self.assign.begin(5, {0: (240, 16), 1: (256, 16), 2: (272, 16)})
            self.servers = SimpleNamespace(expect=lambda *a: None)
            self.planner = SimpleNamespace(cap=lambda worker: None)  # no caps
            self.reports = {5: [{"worker": 0, "start": 240, "samples": 16, "loss": 1.0, "compute_s": 0.1,
                                 "wait_s": 0.0, "comm_s": 0.0, "staleness": []}]}

        def _collect(self, worker, report):
            self.reports.setdefault(report["iteration"], []).append({**report, "worker": worker})

    stub = Stub()
    replies = {r: Message("ack", {"at": 6}) for r in (0, 1)}  # both servers are past iteration 5
    action = stub.after_loss(1, delivered=False, active=[0, 2], replies=replies)
    assert "applied everywhere" in action
    stub.reports[5].append({"worker": 2, "start": 272, "samples": 16, "loss": 3.0, "compute_s": 0.1,
                            "wait_s": 0.0, "comm_s": 0.0, "staleness": []})
    record = RunStats(48).iteration_record(5, stub.reports[5])
    assert record["batch"] == [16, 16, 16] and record["workers"] == [0, 1, 2]
    assert record["loss"] == 2.0  # the lost worker's unknown loss weighs nothing
    assert record["lost"] == [False, True, False]  # metrics.jsonl says whose slice was never reported


def test_a_fail_over_past_the_iteration_in_flight_records_the_reports_it_cut_off():
    """Every server had applied iteration 5 (its backup holds version 6 of the lost
    server's blocks), so the fail-over restarts from 6 and 5 is not replayed; worker 1 was
    still waiting on the lost server for its pull and had not sent its report. The
    record of 5 lists its slice all the same (a Ray test saw `splits[7] = [16, 16]`)."""
    from types import SimpleNamespace

    from equipoise.coordinator.recovery import Memory
    from equipoise.coordinator.pacings import BarrierCoordinator

    class Stub(BarrierCoordinator):
        def __init__(self):
            self.cfg, self.assign, self.iteration, self.ended = SimpleNamespace(global_batch=48), Assignments(), 6, 4
            self.assign.begin(5, {0: (240, 16), 1: (256, 16), 2: (272, 16)})
            self.reports = {5: [{"worker": w, "start": 240 + 16 * w, "samples": 16} for w in (0, 2)]}

        def _collect(self, worker, report):
            self.reports.setdefault(report["iteration"], []).append({**report, "worker": worker})

    stub = Stub()
    stub._rewind(Memory(6, None, []))
    assert sorted((r["worker"], r["start"], bool(r.get("lost"))) for r in stub.reports[5]) == [
        (0, 240, False), (1, 256, True), (2, 272, False)]
    assert (stub.iteration, stub.ended) == (6, 4)
    again = Stub()  # a rollback to the start of 5 replays it: its reports are dropped, none made up
    again._rewind(Memory(5, None, []))
    assert again.reports == {} and again.iteration == 5


def test_a_lost_workers_report_that_comes_after_its_iterations_record_is_not_counted_twice():
    """Its plan request (with its report of iteration 5) was on the wire when it was
    declared lost: the record of 5 was written with its slice (as above); the report that
    arrives then must not count its samples again."""
    from equipoise.coordinator.pacings import BarrierCoordinator
    from equipoise.coordinator.stats import RunStats

    coord = object.__new__(BarrierCoordinator)
    coord.stats, coord.reports, coord.ended = RunStats(48), {}, 5
    report = {"iteration": 5, "start": 256, "samples": 16, "loss": 1.0, "compute_s": 0.1, "wait_s": 0.0,
              "comm_s": 0.0, "staleness": []}
    coord._collect(1, dict(report))
    assert coord.reports == {} and coord.stats.samples == 0
    coord._collect(1, dict(report, iteration=6))
    assert [r["worker"] for r in coord.reports[6]] == [1] and coord.stats.samples == 16


def test_a_lost_workers_shares_are_held_to_the_survivors_caps():
    a = Assignments()
    a.begin(0, {0: (0, 16), 1: (16, 16), 2: (32, 16)})
    # worker 2's memory holds 4 samples: its share of 8 comes in two pieces
    new = a.lose(1, {0: 16, 2: 16}, behind=[0, 1], caps={2: 4})
    assert sorted((s.worker, s.start, s.size) for s in new) == [(0, 16, 8), (2, 24, 4), (2, 28, 4)]
    assert a.expected(0) == 2 + 3


def test_a_worker_lost_after_a_restart_does_not_leave_the_barrier_waiting_for_it():
    """A server's fail-over restarted every worker (nothing in flight); the survivor
    asked for its plan, then the other worker's loss (its host went with the server)
    was seen: the survivor is the only one left, so the barrier is passed at once. (On
    the testbed this stalled the job until `timeout`.)"""
    from types import SimpleNamespace

    from equipoise.coordinator.pacings import BarrierCoordinator
    from equipoise.wire import Message

    class Stub(BarrierCoordinator):
        def __init__(self):
            self.assign, self.iteration, self.waiting = Assignments(), 20, {1: (b"w1", 0.0)}
            self.expected = []
            self.servers = SimpleNamespace(expect=lambda ranks, version, pushes: self.expected.append(
                (sorted(ranks), version, pushes(0))))
            self.passed = 0

        def _advance_barrier(self):
            self.passed += 1

    stub = Stub()
    action = stub.after_loss(0, delivered=False, active=[1], replies={0: Message("ack", {"at": 20})})
    assert "no slice" in action and stub.expected == [([0], 20, None)] and stub.passed == 1
    stub.waiting = {}
    stub.after_loss(0, delivered=False, active=[1], replies={})
    assert stub.passed == 1  # nobody waits: the survivor's request passes it when it comes


def test_a_reports_exchange_seconds_go_to_the_server_manager_and_a_malformed_list_is_refused():
    from types import SimpleNamespace

    from equipoise.coordinator.pacings import BarrierCoordinator
    from equipoise.coordinator.stats import RunStats

    coord = object.__new__(BarrierCoordinator)
    seen = []
    coord.stats, coord.reports, coord.ended = RunStats(48), {}, -1
    coord.servers = SimpleNamespace(observe_exchange=seen.append)
    report = {"iteration": 0, "start": 0, "samples": 16, "loss": 1.0, "compute_s": 0.1, "wait_s": 0.0,
              "comm_s": 0.0, "staleness": []}
    coord._collect(1, {**report, "server_s": [[0, 0.25], [1, 0.5]]})
    assert seen == [{0: 0.25, 1: 0.5}] and "server_s" not in coord.reports[0][0]
    for bad in ([[0, -1.0]], [[0]], "x", [["0", 1.0]], [[0, float("nan")]]):
        with pytest.raises(ValueError, match="server_s"):
            coord._collect(2, {**report, "start": 16, "server_s": bad})


def test_the_servers_final_counts_are_summed_and_a_block_counted_twice_fails_loudly():
    from equipoise.coordinator.rpc import JobError
    from equipoise.coordinator.stats import ServerTotals
    from equipoise.wire import Message

    def ack(blocks, hist):
        return Message("ack", {"version": 3, "block_gradients": blocks, "histogram": hist, "forwarded": 1})

    totals = ServerTotals.of({0: ack([[0, 5], [2, 5]], [[0, 4]]), 1: ack([[1, 5]], [[0, 2], [1, 1]])})
    assert totals.applied == {0: 5, 1: 5, 2: 5} and totals.histogram == {0: 6, 1: 1} and totals.forwarded == 2
    with pytest.raises(JobError, match="block 2's gradients are counted by server 0 and by server 1"):
        ServerTotals.of({0: ack([[0, 5], [2, 5]], []), 1: ack([[2, 4]], [])})
