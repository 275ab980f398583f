"""Tests for equipoise.scenario (run conditions as data) and equipoise.neighbour (burner)."""
import math
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from equipoise.neighbour import start_burner
from equipoise.config import Config
from equipoise.scenario import (BlockMove, NoisyNeighbour, Scenario, ServerAdd, ServerRemove,
                                ServerSlowdown, Slowdown, Trace, WorkerJoin, WorkerLeave)


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------ static factors

def test_slowdown_factors_and_validation():
    s = Slowdown([1, 2.5])
    assert s.factors == (1.0, 2.5)
    assert (s.factor(1), s.factor(7)) == (2.5, 1.0)           # beyond the list: normal
    for bad in (0, -1.0, math.nan, math.inf, "2"):
        with pytest.raises(ValueError, match=r"slowdown\[1\]"):
            Slowdown((1.0, bad))
    with pytest.raises(ValueError, match=r"server_slowdown\[0\]"):
        ServerSlowdown([0.0])
    assert ServerSlowdown([3.0]).factor(0) == 3.0


# ------------------------------------------------------------ traces

def test_trace_lookup_is_piecewise_constant_per_worker():
    t = Trace(((10.0, 0, 3.0), (0.0, 0, 2.0), (5.0, 1, 4.0), (10.0, 0, 1.5)), "time")
    assert t.rows[0] == (0.0, 0, 2.0)                         # kept sorted by `at`
    assert t.factor(0, 0.0) == 2.0
    assert t.factor(0, 9.99) == 2.0
    assert t.factor(0, 10.0) == 1.5                           # later row at same time wins
    assert t.factor(0, 1e9) == 1.5
    assert t.factor(1, 4.9) == 1.0                            # before its first row
    assert t.factor(1, 5.0) == 4.0
    assert t.factor(2, 5.0) == 1.0                            # not in the trace
    with pytest.raises(ValueError, match="unit"):
        Trace((), "seconds")
    with pytest.raises(ValueError, match="row 0: factor"):
        Trace(((0.0, 0, -2.0),), "time")
    with pytest.raises(ValueError, match="row 0: worker"):
        Trace(((0.0, 1.5, 2.0),), "time")


def test_trace_from_csv_time_and_iteration(tmp_path):
    t = Trace.from_csv(write(tmp_path, "time,worker,factor\n0.5,1,2\n\n# comment\n3,1,1\n"))
    assert t.unit == "time" and t.rows == ((0.5, 1, 2.0), (3.0, 1, 1.0))
    assert t.factor(1, 1.0) == 2.0 and t.factor(1, 3.0) == 1.0
    it = Trace.from_csv(write(tmp_path, " iteration , worker , factor \n100, 0, 3.5\n"))
    assert it.unit == "iteration" and it.factor(0, 99) == 1.0 and it.factor(0, 100) == 3.5


@pytest.mark.parametrize("body, where, value", [
    ("0,0,abc\n", ":2:", "'abc'"),
    ("0,0,1\n# note\n5,x,2\n", ":4:", "'x'"),
    ("0,0,-1\n", ":2:", "'-1'"),
    ("0,0,nan\n", ":2:", "'nan'"),
    ("-3,0,2\n", ":2:", "'-3'"),
    ("0,0\n", ":2:", "3 fields"),
    ("0,0,1,9\n", ":2:", "3 fields"),
])
def test_trace_from_csv_errors_name_file_line_and_value(tmp_path, body, where, value):
    path = write(tmp_path, "time,worker,factor\n" + body)
    with pytest.raises(ValueError) as err:
        Trace.from_csv(path)
    message = str(err.value)
    assert f"{path}{where}" in message and value in message and "\n" not in message


def test_trace_from_csv_header_errors(tmp_path):
    with pytest.raises(ValueError, match=":1: header"):
        Trace.from_csv(write(tmp_path, "seconds,worker,factor\n0,0,1\n"))
    with pytest.raises(ValueError, match="empty trace"):
        Trace.from_csv(write(tmp_path, "\n# nothing\n"))
    with pytest.raises(ValueError, match=r":2: bad iteration '1.5'"):
        Trace.from_csv(write(tmp_path, "iteration,worker,factor\n1.5,0,2\n"))


# ------------------------------------------------------------ scenario

def test_worker_factor_multiplies_static_and_trace_by_unit():
    by_time = Scenario(slowdown=Slowdown((2.0, 1.0)),
                       trace=Trace(((5.0, 0, 3.0),), "time"))
    assert by_time.worker_factor(0, elapsed=4.0, iteration=999) == 2.0
    assert by_time.worker_factor(0, elapsed=5.0, iteration=0) == 6.0
    assert by_time.worker_factor(1, elapsed=5.0, iteration=0) == 1.0
    by_iter = Scenario(trace=Trace(((5, 1, 3.0),), "iteration"))
    assert by_iter.worker_factor(1, elapsed=100.0, iteration=4) == 1.0
    assert by_iter.worker_factor(1, elapsed=0.0, iteration=5) == 3.0
    assert Scenario().worker_factor(3, elapsed=1.0, iteration=1) == 1.0
    assert Scenario().server_factor(0, 1.0, 1) == 1.0


def test_from_config_builds_everything(tmp_path):
    write(tmp_path, "iteration,worker,factor\n10,1,2\n", "t.csv")
    s = Scenario.from_config({
        "slowdown": [1.0, 1.5], "trace": "t.csv", "server_slowdown": [1, 4],
        "neighbours": [{"worker": 1, "start": 2.0, "stop": 8.0, "share": 0.5}]},
        base_dir=tmp_path)
    assert s.slowdown.factors == (1.0, 1.5) and s.server_factor(1, 0.0, 0) == 4.0
    assert s.neighbours == (NoisyNeighbour(1, 2.0, 8.0, 0.5),)
    assert s.worker_factor(1, elapsed=0.0, iteration=10) == 3.0
    assert Scenario.from_config({}) == Scenario()


@pytest.mark.parametrize("config, match", [
    ({"slowdwn": [1.0]}, "unknown key 'slowdwn'"),
    ({"neighbours": [{"worker": 0, "cpu": 1}]}, r"neighbours\[0\] unknown key 'cpu'"),
    ({"neighbours": [{"start": 1.0}]}, r"neighbours\[0\] needs a 'worker'"),
    ({"neighbours": [{"worker": 0, "share": 1.5}]}, "share must be in"),
    ({"neighbours": [{"worker": 0, "start": 5, "stop": 5}]}, "stop must be"),
    ({"slowdown": 2.0}, "slowdown must be a list"),
    ({"server_rate": 0}, "server_rate must be"),
    ({"server_bandwidth": [10, -1]}, r"server_bandwidth\[1\]"),
    ({"membership": [{"iteration": 3, "leave": 1, "join": 2}]}, r"membership\[0\] = .* must be"),
    ({"membership": [{"iteration": -1, "join": 2}]}, r"membership\[0\] = .*iteration must be"),
    ({"server_events": [{"iteration": 3, "move": 1}]}, r"server_events\[0\] = .* must be"),
    ({"server_events": [{"iteration": 3, "remove": True}]}, r"ServerRemove.server must be"),
    ({"servers": 0}, "servers must be"),
])
def test_from_config_errors(config, match):
    with pytest.raises(ValueError, match=match):
        Scenario.from_config(config)


def test_server_factor_takes_the_trace_over_the_static_factor_for_servers_it_names():
    s = Scenario(server_slowdown=ServerSlowdown((2.0, 3.0, 5.0)),
                 server_trace=Trace(((4.0, 1, 8.0), (6.0, 1, 1.5)), "time"))
    assert [s.server_factor(0, t, 0) for t in (0.0, 5.0)] == [2.0, 2.0]   # not in the trace
    assert [s.server_factor(1, t, 0) for t in (0.0, 4.0, 6.0)] == [1.0, 8.0, 1.5]
    assert s.server_factor(7, 5.0, 0) == 1.0                             # beyond both
    by_iter = Scenario(server_trace=Trace(((10, 0, 4.0),), "iteration"))
    assert (by_iter.server_factor(0, 99.0, 9), by_iter.server_factor(0, 0.0, 10)) == (1.0, 4.0)


def test_server_straggle_is_the_straggle_message_fields():
    s = Scenario(server_slowdown=ServerSlowdown((1.0, 3.0, 1.0)), server_rate=200.0,
                 server_bandwidth=(50.0, 0.0))
    assert s.server_straggle(1, 0.0, 0) == {"factor": 3.0, "rate_mbps": 200.0, "bandwidth_mbps": 0.0}
    assert s.server_straggle(0, 0.0, 0) == {"factor": 1.0, "rate_mbps": 200.0, "bandwidth_mbps": 50.0}
    assert s.server_straggle(2, 0.0, 0) == {"factor": 1.0, "rate_mbps": 200.0}   # no cap listed
    assert Scenario().server_straggle(0, 0.0, 0) == {"factor": 1.0, "rate_mbps": 1000.0}


def test_events_parse_from_config_tables_and_fall_due_by_iteration():
    s = Scenario.from_config({
        "servers": 2,
        "membership": [{"iteration": 5, "leave": 3}, {"iteration": 9, "join": 2}],
        "server_events": [{"iteration": 5, "move": 4, "to": 1}, {"iteration": 9, "add": 1},
                          {"iteration": 2, "add": 2}, {"iteration": 12, "remove": 0}]})
    assert s.membership == (WorkerLeave(5, 3), WorkerJoin(9, 2))
    assert s.server_events == (BlockMove(5, 4, 1), ServerAdd(9, 1), ServerAdd(2, 2),
                               ServerRemove(12, 0))
    assert s.events_at(5) == (WorkerLeave(5, 3), BlockMove(5, 4, 1))
    assert s.events_at(9) == (WorkerJoin(9, 2), ServerAdd(9, 1))
    assert s.events_at(6) == ()
    assert s.added_servers() == {2: 2, 3: 2, 4: 9}            # ranks after the first two
    with pytest.raises(ValueError, match="servers"):
        Scenario().added_servers()


def test_of_reads_every_field_of_a_config(tmp_path):
    trace = write(tmp_path, "iteration,worker,factor\n3,0,2\n", "w.csv")
    server_trace = write(tmp_path, "time,server,factor\n1.0,1,6\n", "s.csv")
    cfg = Config.from_dict({
        "workers": 2, "servers": 2, "slowdown": [1, 1.5], "trace": str(trace),
        "neighbours": [{"worker": 1, "start": 2.0}], "server_slowdown": [3, 1],
        "server_trace": str(server_trace), "server_rate": 250.0, "server_bandwidth": [0, 40],
        "membership": [{"iteration": 4, "join": 1}],
        "server_events": [{"iteration": 6, "add": 1}, {"iteration": 8, "move": 0, "to": 2}]})
    s = Scenario.of(cfg)
    assert s.worker_factor(0, elapsed=0.0, iteration=3) == 2.0
    assert s.worker_factor(1, elapsed=0.0, iteration=0) == 1.5
    assert s.neighbours == (NoisyNeighbour(1, 2.0),)
    assert s.server_straggle(0, 5.0, 0) == {"factor": 3.0, "rate_mbps": 250.0, "bandwidth_mbps": 0.0}
    assert s.server_straggle(1, 5.0, 0) == {"factor": 6.0, "rate_mbps": 250.0, "bandwidth_mbps": 40.0}
    assert s.membership == (WorkerJoin(4, 1),)
    assert s.server_events == (ServerAdd(6, 1), BlockMove(8, 0, 2))
    assert s.added_servers() == {2: 6}
    assert Scenario.of(Config()) == Scenario(servers=Config().servers)


def test_server_trace_csv_names_the_server_column(tmp_path):
    path = write(tmp_path, "time,server,factor\n0,x,2\n")
    with pytest.raises(ValueError, match=r":2: bad server 'x'"):
        Trace.from_csv(path, column="server")
    with pytest.raises(ValueError, match=":1: header"):
        Trace.from_csv(path)                                  # a worker trace expected


def test_neighbour_active_window():
    n = NoisyNeighbour(worker=0, start=1.0, stop=3.0)
    assert [n.active(t) for t in (0.5, 1.0, 2.9, 3.0)] == [False, True, True, False]
    assert NoisyNeighbour(worker=2).active(1e9)


# ------------------------------------------------------------ real burner process

@pytest.mark.slow  # starts processes
def test_burner_is_pinned_beside_its_target_burns_and_stops_cleanly():
    """What the burner does, not how fast: it runs on exactly the target's CPUs, uses CPU
    time, and is gone after stop(). (How much it slows a neighbour depends on the host's
    load; the LB-BSP neighbour benchmark measures that.)"""
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(60)\n"])
    try:
        os.sched_setaffinity(child.pid, {cpu})
        burner = start_burner(child.pid)
        try:
            assert burner.cpus == frozenset({cpu})
            proc = psutil.Process(burner.pid)
            assert proc.cpu_affinity() == [cpu]
            deadline = time.monotonic() + 30.0  # a liveness bound, not a speed check
            while sum(proc.cpu_times()[:2]) == 0.0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sum(proc.cpu_times()[:2]) > 0.0
        finally:
            burner.stop()
        assert not burner.alive() and not psutil.pid_exists(burner.pid)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, True, "half"])
def test_burner_share_must_be_in_zero_one(share):
    with pytest.raises(ValueError, match="share"):
        start_burner(os.getpid(), share=share)


@pytest.mark.slow  # starts processes
def test_burner_dies_with_the_process_that_started_it():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\n"
         "from equipoise.neighbour import start_burner\n"
         "print(start_burner(os.getpid()).pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    burner_pid = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            if psutil.Process(burner_pid).status() == psutil.STATUS_ZOMBIE:
                break                              # exited; init will reap it
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(burner_pid, signal.SIGKILL)
        pytest.fail("burner outlived its parent")

