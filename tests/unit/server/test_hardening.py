"""Fixes found by fuzzing a live server (benchmarks/bench_fuzz.py), each driven here on
one in-process server: bad control messages are refused without effect, held requests
are bounded, and refusals are logged once per kind and peer, not once per message."""

import logging
import math

import pytest
import torch

from equipoise.server import core as server_mod
from equipoise.server.core import MAX_AHEAD, MAX_HELD_PER_PEER, Server
from equipoise.server.store import OptimizerSpec
from equipoise.wire import InMemoryTransport, Message, PeerTimeout
from equipoise.wire.transport import QuietLog, kind_of

pytestmark = pytest.mark.timeout(60)
SPEC = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()


def init(**extra):
    return Message("init", {"blocks": [[0, "w", 0, 2, "param", 4]], "optimizer": SPEC, "version": 0,
                            "samples": 0, "protocol": "bsp", "workers": 1, **extra}, {"b0": torch.zeros(2)})


def started(**extra) -> Server:
    """A server of one block of two zeros (`init(**extra)`); `server.sent` records its replies."""
    s = Server(0, InMemoryTransport(), "nowhere")
    s.sent = []
    s.listener.send = lambda peer, msg: s.sent.append((peer, msg)) or (lambda: True)
    s.handle(b"coord", init(**extra))
    assert s.sent.pop()[1].type == "ready"
    return s


@pytest.fixture
def server():
    """A BSP server with one block of two zeros; `server.sent` records its replies."""
    s = started()
    yield s
    s.listener.close()


def reply(s, peer, msg):
    s.sent.clear()
    s.handle(peer, msg)
    return [m for p, m in s.sent if p == peer]


def test_non_finite_or_odd_numbers_in_control_messages_are_refused_not_fatal(server):
    # int(inf) raised OverflowError, which the server did not catch: it died
    (r,) = reply(server, b"x", Message("members", {"workers": 1, "retired": [math.inf]}))
    assert r.type == "error" and "OverflowError" in r.fields["message"]
    (r,) = reply(server, b"x", Message("migrate", {"keys": [math.inf], "to": "nowhere"}))
    assert r.type == "error"
    assert server.sync.workers == 1 and set(server.store.blocks) == {0}


@pytest.mark.parametrize("straggler", [{"factor": math.nan}, {"factor": 0.0}, {"rate_mbps": 0},
                                       {"rate_mbps": -math.inf}, {"bandwidth_mbps": math.inf},
                                       {"factor": "slow"}, {"factor": True}, "slow", [1.0]])
def test_bad_straggler_settings_are_refused_and_change_nothing(server, straggler):
    server.handle(b"w", Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.ones(2)}))
    store = server.store
    # an init with bad settings used to replace the store first (values lost), then fail
    (r,) = reply(server, b"coord", init(straggler=straggler))
    assert r.type == "error" and "straggler" in r.fields["message"]
    assert server.store is store and store.values[0].tolist() == [-1.0, -1.0]
    (r,) = reply(server, b"coord", Message("straggle", straggler if isinstance(straggler, dict) else {"factor": straggler}))
    assert r.type == "error" and "straggler" in r.fields["message"]
    # rate 0 divided by zero (fatal) and nan/inf slept forever on the next push
    assert (server.factor, server.rate, server.bucket) == (1.0, 1000e6, None)
    (r,) = reply(server, b"w", Message("push", {"worker": 0, "version": 1, "samples": 1}, {"g0": torch.ones(2)}))
    assert r.type == "ack" and r.fields["version"] == 2


def test_held_requests_are_bounded_per_peer_in_all_and_in_how_far_ahead(server, monkeypatch):
    (r,) = reply(server, b"p", Message("pull", {"worker": 0, "min_version": MAX_AHEAD + 1}))
    assert r.type == "error" and "ahead" in r.fields["message"]
    (r,) = reply(server, b"p", Message("state_req", {"version": 2**64 - 1}))
    assert r.type == "error" and "ahead" in r.fields["message"] and not server.held
    for _ in range(MAX_HELD_PER_PEER):
        assert reply(server, b"p", Message("pull", {"worker": 0, "min_version": MAX_AHEAD})) == []
    (r,) = reply(server, b"p", Message("pull", {"worker": 0, "min_version": 1}))
    assert r.type == "error" and "too many requests held" in r.fields["message"]
    monkeypatch.setattr(server_mod, "MAX_HELD", MAX_HELD_PER_PEER + 2)
    assert reply(server, b"q", Message("pull", {"worker": 0, "min_version": 1})) == []
    assert reply(server, b"r", Message("pull", {"worker": 0, "min_version": 1})) == []
    (r,) = reply(server, b"s", Message("pull", {"worker": 0, "min_version": 1}))
    assert r.type == "error" and len(server.held) == MAX_HELD_PER_PEER + 2
    # a pull that can be answered now is never refused, and the held ones still are answered
    assert [m.type for m in reply(server, b"s", Message("pull", {"worker": 0, "min_version": 0}))] == ["params"]
    reply(server, b"w", Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.ones(2)}))
    assert sorted(p for p, m in server.sent if m.type == "params") == [b"q", b"r"]
    assert reply(server, b"w", Message("ping", {}))[0].fields["held"] == MAX_HELD_PER_PEER


def test_a_worker_may_send_no_coordinator_only_message(server):
    # The impostors of bench_fuzz: well-formed, each would take effect from the coordinator.
    attacks = [Message("stop", {"reason": "x"}), init(), Message("members", {"workers": 2}),
               Message("straggle", {"factor": 1e6}), Message("migrate", {"keys": [0], "to": "tcp://127.0.0.1:9"}),
               Message("lose", {"worker": 0, "workers": 1}), Message("expect", {"version": 0, "pushes": 2}),
               Message("replicate", {"backup": "tcp://127.0.0.1:9"}),
               Message("replica_req", {"primary": 0, "version": 0}),
               Message("flush", {}), Message("state_req", {"version": 0}), Message("stats_req", {})]
    store = server.store
    for msg in attacks:
        msg.origin = "worker"
        (r,) = reply(server, b"w", msg)
        assert r.type == "error" and f"{msg.type!r} from a worker" in r.fields["message"]
    assert not server.done and server.store is store and server.replication is None and server.factor == 1.0
    push = Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.ones(2)}, origin="worker")
    (r,) = reply(server, b"w", push)
    assert r.type == "ack" and r.fields["version"] == 1 and store.values[0].tolist() == [-1.0, -1.0]
    # the coordinator's own are still obeyed
    stop = Message("stop", {"reason": "x"}, origin="coordinator")
    assert reply(server, b"c", stop)[0].type == "ack" and server.done


def test_refusals_are_logged_once_per_kind_and_peer(server, caplog):
    caplog.set_level(logging.WARNING, logger="equipoise.server")
    for peer in (b"a", b"b"):
        for v in range(50):  # one kind: pushes for another version
            server.handle(peer, Message("push", {"worker": 0, "version": v + 5, "samples": 1},
                                        {"g0": torch.ones(2)}))
        server.handle(peer, Message("hello", {"role": "x", "rank": 0, "address": "", "pid": 1}))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and sum("computed on version 5," in m for m in lines) == 2
    assert server.refusals.quiet == 98
    assert sum(m.type == "error" for _, m in server.sent) == 102  # every sender is still told


def test_role_refusals_are_logged_boundedly_even_from_fresh_identities(server, caplog):
    # A worker's DEALER that reconnects (e.g. after ZeroMQ dropped it for an oversized
    # frame) comes back with a new identity: one line per identity grew without end.
    caplog.set_level(logging.WARNING, logger="equipoise.server")
    for i in range(500):
        for mtype in ("stats_req", "flush"):
            (r,) = reply(server, b"id%d" % i, Message(mtype, {}, origin="worker"))
            assert r.type == "error"
    lines = [r.getMessage() for r in caplog.records]
    bound = 2 * server.refusals.max_keys
    assert 0 < len(lines) <= bound + 2 and len(server.refusals.seen) <= bound
    assert "'stats_req'" in lines[0] and "a worker" in lines[0]


def test_quiet_log_sums_up_each_period_and_bounds_its_memory(caplog):
    caplog.set_level(logging.WARNING, logger="t")
    q = QuietLog(logging.getLogger("t"), every=3600.0, max_keys=4)
    for peer in range(100):
        for _ in range(3):
            q(peer, "kind", "refused %s", peer)
    assert len(caplog.records) == 5 and len(q.seen) == 5  # 4 peers, then one line for all others
    q.every = 0.0
    q(0, "kind", "refused %s", 0)
    assert "295 more refusals" in caplog.records[-2].getMessage() and len(q.seen) == 1
    assert kind_of("tensor 'g0' frame has 12 bytes, expected 16") == "tensor # frame has # bytes, expected #"


def test_malformed_frames_are_logged_once_per_kind_by_the_transport(caplog):
    caplog.set_level(logging.WARNING, logger="equipoise.wire")
    t = InMemoryTransport()
    listener = t.listen()
    for i in range(200):
        t.inject(listener.address, [b"\xc1garbage%d" % i], peer=b"evil")
    assert listener.recv(timeout=0) is None
    assert len(caplog.records) == 1 and b"evil".hex() in caplog.records[0].getMessage()
    t.close()


def test_the_handler_table_covers_the_schema_and_the_senders(server):
    """The server's one table of handlers: each type it handles is a wire type, every
    type a worker or another server may send it is handled, and every handler of the
    core (`_on_*`) and of its parts (`on_*`) is in the table (none reached only by name)."""
    from equipoise.server.origin import SENDERS
    from equipoise.wire.schema import SCHEMA

    table = server.handlers
    assert set(table) <= set(SCHEMA), sorted(set(table) - set(SCHEMA))
    assert set(SENDERS) <= set(table), sorted(set(SENDERS) - set(table))
    owners = [server, server.moves, server.ahead, server.streamed, server.backup, server.tables]
    methods = {(id(o), name) for o in owners for name in dir(o) if name.startswith(("_on_", "on_"))}
    assert {(id(f.__self__), f.__name__) for f in table.values()} == methods
    assert all(table[t].__name__ in (f"_on_{t}", f"on_{t}") for t in table)


@pytest.mark.parametrize("error", [RuntimeError("Storage size calculation overflowed"), PeerTimeout("slow peer")])
def test_a_handler_that_raises_what_torch_or_a_slow_peer_raise_is_refused_and_the_server_goes_on(server, error):
    def boom(peer, msg):
        raise error

    server.handlers["ping"] = boom
    server.handle(b"evil", Message("ping", {}))
    peer, reply = server.sent.pop()
    assert peer == b"evil" and reply.type == "error" and type(error).__name__ in reply.fields["message"]
    assert not server.done


def test_ten_thousand_refused_credentials_keep_memory_and_log_lines_bounded(caplog):
    import logging

    import zmq

    from equipoise.wire.auth import MAX_REFUSED, ZapHandler, generate_keys

    caplog.set_level(logging.WARNING, logger="equipoise.wire")
    ctx = zmq.Context()
    zap = ZapHandler(ctx, generate_keys("plain")["coordinator"])
    try:
        for i in range(10_000):
            reply = zap.answer([b"1.0", b"%d" % i, b"equipoise", b"10.0.0.9", b"", b"PLAIN", b"user%d" % i, b"pw"])
            assert reply[2] == b"400"
        assert len(zap.refused) == MAX_REFUSED
        assert len(caplog.records) <= MAX_REFUSED + 2
    finally:
        zap.close()
        ctx.term()


def test_a_worker_claiming_another_rank_is_refused_and_named(server, caplog):
    """Worker 1's credentials (origin_rank 1) push and pull as worker 0: refused with
    an error naming both, the block untouched, one log line for the peer."""
    import logging

    push = Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.ones(2)},
                   origin="worker", origin_rank=1)
    pull = Message("pull", {"worker": 0, "min_version": 0}, origin="worker", origin_rank=1)
    with caplog.at_level(logging.WARNING):
        for msg in (push, pull, push):
            [err] = reply(server, b"w1", msg)
            assert err.type == "error" and "worker 1's credentials claim worker 0" in err.fields["message"]
    assert torch.equal(server.store.values[0], torch.zeros(2))
    named = [r.getMessage() for r in caplog.records if "from the credentials of worker 1" in r.getMessage()]
    assert len(named) == 1 and "refused 'push' claiming worker '0'" in named[0]
    # its own rank passes the check (and is then handled as usual)
    own = Message("pull", {"worker": 1, "min_version": 0}, origin="worker", origin_rank=1)
    assert all(m.type != "error" or "credentials" not in m.fields.get("message", "") for m in reply(server, b"w1", own))


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_a_push_of_no_samples_weighs_nothing_at_a_barrier_and_is_refused_without_one(protocol):
    # Two workers; worker 1 planned no samples (LB-BSP, min_batch 0) pushes zeros.
    s = started(protocol=protocol, workers=2)
    try:
        (r,) = reply(s, b"w1", Message("push", {"worker": 1, "version": 0, "samples": 0}, {"g0": torch.zeros(2)}))
        if protocol == "asp":  # no barrier's update to leave it out of: a bad message, refused
            assert r.type == "error" and "samples = 0" in r.fields["message"]
            assert s.store.values[0].tolist() == [0.0, 0.0]
            return
        s.handle(b"w0", Message("push", {"worker": 0, "version": 0, "samples": 4}, {"g0": torch.ones(2)}))
        # lr 1: the update is worker 0's gradient alone, weighted 4 / 4
        assert s.store.values[0].tolist() == [-1.0, -1.0] and s.store.samples == 4
    finally:
        s.listener.close()
