"""`ServerSync`, one server's synchronisation state machine, driven with plain numbers
for each protocol; and the server's emulated slowdown on a virtual clock."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from equipoise.clock import SystemClock, VirtualClock
from equipoise.policy.placement import Block
from equipoise.policy.sync import (SSP, AheadOfPublished, NotIdle, PushedTwice, ServerSync, SyncFault,
                                   UnknownWorker, WrongVersion, make_sync_policy)
from equipoise.server.core import Server
from equipoise.server.store import OptimizerSpec
from equipoise.wire import InMemoryTransport, Message

pytestmark = pytest.mark.timeout(60)


def sync(protocol, workers, **knobs):
    return ServerSync(make_sync_policy(protocol, **knobs), workers)


def drain(s):
    """Apply every complete group; the updates as (workers, σ) pairs."""
    out = []
    while (u := s.next_update()) is not None:
        s.on_applied(u)
        out.append(([p.worker for p in u.pushes], list(u.sigmas)))
    return out


def test_bsp_waits_for_one_gradient_from_every_worker():
    s = sync("bsp", 3)
    for w in (2, 0):
        s.accept(w, 0, samples=4)
        assert s.next_update() is None
    assert not s.pull_ready(1) and s.pull_ready(0)
    tokens = [p.token for p in s.pending] + [s.accept(1, 0, samples=8)]
    u = s.next_update()
    assert u.tokens == tokens and [p.samples for p in u.pushes] == [4, 4, 8] and u.sigmas == (0, 0, 0)
    assert s.published() == 0  # published once applied
    s.on_applied(u)
    assert s.published() == 1 and s.pull_ready(1) and not s.pull_ready(2)
    assert [s.take_staleness(w) for w in range(3)] == [[0], [0], [0]] and s.take_staleness(0) == []


def test_bsp_refusals_change_nothing():
    s = sync("lbbsp", 2)
    s.accept(0, 0)
    with pytest.raises(WrongVersion, match="worker 1 computed on version 1, but the server is at version 0"):
        s.accept(1, 1)
    with pytest.raises(PushedTwice, match="worker 0 pushed twice for version 0"):
        s.accept(0, 0)
    with pytest.raises(NotIdle, match="1 pushes pending"):
        s.members(1)
    assert s.flush() is None and not s.can_migrate() and s.unapplied == 1
    assert issubclass(WrongVersion, SyncFault) and issubclass(SyncFault, ValueError)
    assert drain(s) == [] and s.workers == 2
    s.accept(1, 0)
    assert drain(s) == [([0, 1], [0, 0])] and s.can_migrate()
    s.members(1)  # at a barrier: one worker left, so a group is one gradient
    s.accept(1, 1)
    assert drain(s) == [([1], [0])] and s.published() == 2


def test_softsync_groups_floor_lambda_over_n_from_any_workers():
    s = sync("softsync", 4, softsync_n=2)  # c = 2
    s.accept(0, 0)
    assert s.next_update() is None
    s.accept(0, 0)  # a fast worker may supply two gradients of one group
    assert drain(s) == [([0, 0], [0, 0])]
    s.accept(2, 0)
    s.accept(1, 1)
    assert drain(s) == [([2, 1], [1, 0])]  # σ = version now − version read
    s.accept(2, 2)
    assert drain(s) == [] and not s.can_migrate()
    u = s.flush()  # the half-filled group, so no gradient is lost
    assert u.sigmas == (0,) and s.unapplied == 0
    s.on_applied(u)
    assert s.flush() is None and s.published() == 3
    assert s.take_staleness(2) == [1, 0] and s.histogram == {0: 4, 1: 1}


def test_one_softsync_waits_for_lambda_gradients_a_worker_may_supply_two():
    s = sync("softsync", 3, softsync_n=1)
    for w in (0, 0, 1):
        s.accept(w, 0)
    assert drain(s) == [([0, 0, 1], [0, 0, 0])]


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 6), n=st.integers(1, 6), order=st.lists(st.integers(0, 5), max_size=40))
def test_softsync_applies_every_gradient_once_in_groups_of_c(workers, n, order):
    n = min(n, workers)
    s, c = sync("softsync", workers, softsync_n=n), max(1, workers // n)
    sizes = []
    for w in order:
        s.accept(w % workers, s.published())  # each push read the newest version
        while (u := s.next_update()) is not None:
            sizes.append(len(u.pushes))
            s.on_applied(u)
    assert s.unapplied == len(order) % c and all(size == c for size in sizes)
    if (u := s.flush()) is not None:
        s.on_applied(u)
    assert sum(s.histogram.values()) == len(order) and s.unapplied == 0


def test_asp_applies_on_arrival_with_sigma_of_versions_since_the_read():
    s = sync("asp", 3)
    for w in range(3):
        s.accept(w, 0)
        assert s.pull_ready(10 ** 6)  # async pulls never wait
        assert drain(s) == [([w], [w])]
    assert s.published() == 3 and s.flush() is None
    with pytest.raises(AheadOfPublished, match="worker 1 claims version 4, but the server has only published 3"):
        s.accept(1, 4)


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 4), bound=st.integers(0, 3), order=st.lists(st.integers(0, 3), max_size=60))
def test_ssp_clock_is_the_slowest_worker_and_sigma_never_exceeds_s(workers, bound, order):
    """Workers follow the worker's rule: read once the pull for their next iteration is
    ready, then push a gradient computed on the clock read."""
    policy = SSP(bound=bound)
    s = ServerSync(policy, workers)
    pushes, read = [0] * workers, [None] * workers
    for w in (w % workers for w in order):
        if read[w] is None:
            if s.pull_ready(policy.pull_version(pushes[w], 0)):
                read[w] = s.published()
            continue
        s.accept(w, read[w])
        ((applied, (sigma,)),) = drain(s)  # one gradient per update
        assert applied == [w] and sigma == pushes[w] - read[w] <= bound
        pushes[w], read[w] = pushes[w] + 1, None
        assert s.published() == min(pushes) and max(pushes) - min(pushes) <= bound + 1
    assert sum(s.histogram.values()) == sum(pushes)


def test_ssp_retired_workers_stop_holding_the_clock_back():
    s = sync("ssp", 2, staleness_bound=1)
    s.accept(0, 0)
    s.accept(1, 0)
    drain(s)
    s.accept(0, 1)
    assert drain(s) == [([0], [0])] and s.published() == 1
    assert not s.pull_ready(2)  # worker 0 has pushed two, worker 1 one
    with pytest.raises(UnknownWorker, match="worker 5, which is not a worker of this server"):
        s.accept(5, 0)
    s.members(1, retired=[1])
    assert s.published() == 2 and s.pull_ready(2) and s.retired == {1: 1}
    s.accept(1, 0)  # a retired worker's last push: σ against its own clock, 1 − 0
    assert drain(s) == [([1], [1])] and s.published() == 2  # and it does not count
    with pytest.raises(AheadOfPublished):
        s.accept(0, 3)
    s.members(0, retired=[0])
    assert s.published() == s.version == 4  # no worker active: the updates applied


def test_join_moves_the_base_version_only_when_idle():
    s = sync("asp", 2)
    s.join(7)
    assert s.published() == 7
    s = sync("softsync", 2, softsync_n=1)
    s.accept(0, 0)
    with pytest.raises(NotIdle):
        s.join(3)


# -- the server's emulated slowdown on virtual time ------------------------------------

def test_charge_sleeps_factor_minus_one_bytes_over_rate_on_the_injected_clock():
    clock = VirtualClock(start=100.0)
    server = Server(0, InMemoryTransport(), "nowhere", clock=clock)
    server._straggle({"factor": 3.0, "rate_mbps": 2.0})
    t0 = clock.now()
    server.charge(500_000, t0)
    # (3 − 1)·500000 B / 2e6 B/s = 0.5 s, every operand exact in binary floating point
    assert clock.now() - t0 == 0.5 and server.busy_s == 0.5 and server.bytes == 500_000
    server._straggle({"factor": 1.0})
    server.charge(123, clock.now())
    assert clock.now() == 100.5 and server.busy_s == 0.5 and server.bytes == 500_123
    server.listener.close()


def test_a_bandwidth_cap_delays_by_the_token_bucket_on_the_injected_clock():
    clock = VirtualClock(start=10.0)
    server = Server(0, InMemoryTransport(), "nowhere", clock=clock)
    server._straggle({"factor": 1.0, "rate_mbps": 1000.0, "bandwidth_mbps": 4.0})
    # The bucket starts full with 5 ms at 4e6 B/s = 20,000 B of burst: 20,000 B pass at
    # once, 60,000 more wait 40,000 / 4e6 = 0.01 s (the debt) — exact in binary.
    server.charge(20_000, clock.now())
    assert clock.now() == 10.0
    server.charge(40_000, clock.now())
    assert clock.now() == 10.01 and server.bytes == 60_000
    server._straggle({"bandwidth_mbps": 0.0})  # 0 lifts the cap
    assert server.bucket is None
    server.listener.close()


def test_a_slow_server_books_its_emulated_time_per_push_on_the_injected_clock():
    clock, transport = VirtualClock(), InMemoryTransport()
    coord = transport.listen()
    server = Server(0, transport, coord.address, timeout=30, clock=clock)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    _, hello = coord.recv(timeout=30)  # the server warms torch up first
    admin, worker = (transport.connect(hello.fields["address"]) for _ in range(2))
    spec = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 4).to_dict()
    admin.send(Message("init", {"blocks": [Block(0, "w", 0, 250).to_list()], "optimizer": spec, "version": 0,
                                "samples": 0, "protocol": "asp", "workers": 1,
                                "straggler": {"factor": 5.0, "rate_mbps": 1.0}}, {"b0": torch.zeros(250)}))
    assert admin.recv(timeout=5).type == "ready"
    worker.send(Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.ones(250)}))
    assert worker.recv(timeout=5).fields["staleness"] == [0]
    admin.send(Message("stats_req", {}))
    stats = admin.recv(timeout=5).fields
    # 250 float32 = 1000 B: (5 − 1)·1000 / 1e6 = 4 ms of virtual time, and nothing else
    assert stats["bytes"] == 1000 and stats["busy_s"] == pytest.approx(0.004, rel=1e-12)
    admin.send(Message("stop", {"reason": "test"}))
    assert admin.recv(timeout=5).fields["histogram"] == [[0, 1]]
    thread.join(timeout=5)
    transport.close()


def test_system_clock_is_monotonic_and_skips_non_positive_sleeps():
    c = SystemClock()
    a = c.now()
    c.sleep(0)
    c.sleep(-1)
    assert c.now() >= a
    v = VirtualClock()
    with pytest.raises(ValueError):
        v.advance(-1)
