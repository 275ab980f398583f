"""A worker's calls into user code, as its heartbeat reports them (equipoise.user_code),
and how the launcher's heartbeat listener reads a report and names a stuck worker
(launch/local.py). No processes: a fake clock and a listener that is never started."""

from __future__ import annotations

import threading

from equipoise.launch.local import Heartbeats, _busy
from equipoise.user_code import Busy, UserCode
from equipoise.workload import Workload


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_longest_call_is_reported_with_its_sample_and_iteration():
    clock = Clock()
    code = UserCode(clock)
    assert code.longest() is None
    code.iteration = 14
    with code.call("the dataset's __getitem__", 3081):
        clock.t += 5
        busy = code.longest()
        assert busy == Busy("the dataset's __getitem__", 14, 3081, 5.0)
        assert busy.describe() == "the dataset's __getitem__ (sample 3081, iteration 14)"
        with code.call("the collate function"):  # nested: the outer call stands
            assert code.longest().what == "the dataset's __getitem__"
    assert code.longest() is None


def test_calls_on_several_threads_report_the_oldest():
    clock = Clock()
    code = UserCode(clock)
    entered, release = threading.Event(), threading.Event()

    def reader():
        with code.call("the dataset's __getitem__", 7):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=reader)
    t.start()
    entered.wait(10)
    clock.t += 3
    with code.call("the loss"):
        assert code.longest() == Busy("the dataset's __getitem__", -1, 7, 3.0)
    release.set()
    t.join(10)
    assert code.longest() is None


def test_a_call_that_raises_is_left():
    code = UserCode(Clock())
    try:
        with code.call("the loss"):
            raise ValueError("bad")
    except ValueError:
        pass
    assert code.longest() is None


def test_the_workload_enters_each_item_it_reads():
    seen = []

    class Spy(list):
        def __getitem__(self, i):
            from equipoise.user_code import USER_CODE
            seen.append(USER_CODE.longest())
            return list.__getitem__(self, i)

    import torch
    w = Workload.__new__(Workload)
    w.names = {"dataset": "spy"}
    w.items(Spy([10, 11, 12]), torch.tensor([2, 0]))
    assert [(b.what, b.sample) for b in seen] == [("the dataset's __getitem__", 2), ("the dataset's __getitem__", 0)]


def test_a_beats_report_is_read_or_ignored_never_trusted_blindly():
    assert _busy(["the loss", 3, -1, 2.5]) == Busy("the loss", 3, -1, 2.5)
    assert _busy(["x" * 500, 1, 2, 1.0]).what == "x" * 80
    for bad in (None, [], ["the loss", 3, -1], ["the loss", "3", -1, 1.0], ["the loss", 3, -1, float("nan")],
                [1, 3, -1, 1.0], ["the loss", True, -1, 1.0], "the loss"):
        assert _busy(bad) is None


def test_a_worker_past_stuck_s_is_named():
    beats = Heartbeats.__new__(Heartbeats)  # its thread never started: only the records
    beats.busy = {"worker1": Busy("the dataset's __getitem__", 2, 77, 4.2)}
    assert beats.stuck("worker0", 3.0) is None
    assert beats.stuck("worker1", 5.0) is None
    assert beats.stuck("worker1", 0.0) is None  # 0: never
    said = beats.stuck("worker1", 3.0)
    assert said.startswith("is stuck in the dataset's __getitem__ (sample 77, iteration 2) for 4 s (stuck_s = 3)")
