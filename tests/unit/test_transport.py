"""Transport tests, run against both ZmqTransport and InMemoryTransport."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import msgpack
import pytest
import torch
import zmq

from equipoise.wire import (
    InMemoryTransport,
    JobKeys,
    Message,
    PeerTimeout,
    WireError,
    ZmqTransport,
    encode,
    generate_keys,
    make_transport,
)

pytestmark = pytest.mark.timeout(30)

PING = Message("ping")
PONG = Message("pong")


@pytest.fixture(params=["zmq", "memory"])
def transport(request):
    t = make_transport(request.param)
    yield t
    t.close()


def serve(listener, handler, count=1, timeout=5.0):
    """Answer ``count`` requests in a background thread with ``handler(msg)``."""

    def run():
        for _ in range(count):
            got = listener.recv(timeout)
            if got is None:
                return
            listener.send(got[0], handler(got[1]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_request_reply(transport):
    listener = transport.listen()
    conn = transport.connect(listener.address)
    thread = serve(listener, lambda m: Message("ack", {"version": m.fields["version"] + 1}), count=2)
    for version in (1, 5):
        reply = conn.request(Message("state_req", {"version": version}), timeout=5)
        assert reply == Message("ack", {"version": version + 1})
    thread.join(5)


def test_deferred_replies_to_two_peers(transport):
    listener = transport.listen()
    first, second = transport.connect(listener.address), transport.connect(listener.address)
    first.send(Message("pull", {"worker": 1, "min_version": 0}))
    second.send(Message("pull", {"worker": 2, "min_version": 0}))
    held = {}
    for _ in range(2):
        peer, msg = listener.recv(5)
        held[msg.fields["worker"]] = peer
    assert held[1] != held[2]
    with pytest.raises(PeerTimeout):
        first.recv(0.05)  # nothing answered yet
    for worker in (2, 1):  # answer in the opposite order, later
        params = Message("params", {"version": worker, "held_s": 0.1}, {"b0": torch.full((3,), float(worker))})
        listener.send(held[worker], params)
    assert second.recv(5).fields["version"] == 2
    got = first.recv(5)
    assert got.fields["version"] == 1 and torch.equal(got.tensors["b0"], torch.ones(3))


def test_recv_timeouts(transport):
    listener = transport.listen()
    conn = transport.connect(listener.address)
    # A timeout waits at least its length (an upper bound would time the machine).
    start = time.monotonic()
    assert listener.recv(0.2) is None
    assert time.monotonic() - start >= 0.19
    start = time.monotonic()
    with pytest.raises(PeerTimeout) as info:
        conn.recv(0.2)
    assert time.monotonic() - start >= 0.19
    assert listener.address in str(info.value) and "0.2" in str(info.value)
    assert listener.recv(0) is None
    with pytest.raises(TypeError):
        listener.recv(None)


class RawPeer:
    """Sends raw, unencoded frames to a listener as peer ``identity``."""

    def __init__(self, transport, address, identity):
        self.transport, self.address, self.identity = transport, address, identity
        self.ctx = None
        if not isinstance(transport, InMemoryTransport):
            self.ctx = zmq.Context()
            self.sock = self.ctx.socket(zmq.DEALER)
            self.sock.linger = 0
            self.sock.identity = identity
            self.sock.connect(address)

    def send(self, frames):
        if self.ctx is None:
            assert self.transport.inject(self.address, frames, peer=self.identity)
        else:
            self.sock.send_multipart(frames)

    def close(self):
        if self.ctx is not None:
            self.ctx.destroy(linger=0)


BAD_FRAMES = [
    [b"\xc1garbage"],
    [msgpack.packb({"v": 99, "t": "ping", "f": {}, "x": []})],
    [msgpack.packb({"v": 1, "t": "nope", "f": {}, "x": []})],
    [msgpack.packb({"v": 1, "t": "ack", "f": {}, "x": []})],
    [msgpack.packb({"v": 1, "t": "ping", "f": {}, "x": [["a", "float32", [4]]]}), b"\0" * 3],
]


def test_malformed_messages_are_logged_and_dropped(transport, caplog, monkeypatch):
    from equipoise.wire import transport as transport_mod

    # A fresh record of dropped messages: the module's own counts what earlier tests had
    # dropped, and would add its "N more refusals" line to this test's records.
    monkeypatch.setattr(transport_mod, "_dropped", transport_mod.QuietLog(transport_mod.log))
    caplog.set_level(logging.WARNING, logger="equipoise.wire")
    listener = transport.listen()
    raw = RawPeer(transport, listener.address, b"evil")
    for frames in BAD_FRAMES:
        raw.send(frames)
    conn = transport.connect(listener.address)
    thread = serve(listener, lambda m: PONG)
    time.sleep(0.1)  # let the bad frames arrive first
    assert conn.request(PING, timeout=5) == PONG
    thread.join(5)
    records = [r for r in caplog.records if r.name == "equipoise.wire"]
    assert len(records) == len(BAD_FRAMES)
    assert all(r.levelno == logging.WARNING and b"evil".hex() in r.getMessage() for r in records)
    reasons = " ".join(r.getMessage() for r in records)
    for needle in ("msgpack", "version", "unknown message type", "lacks field", "expected 16"):
        assert needle in reasons
    raw.close()


def test_oversized_send_is_refused(transport):
    small = type(transport)(max_bytes=1000)
    try:
        listener = small.listen()
        conn = small.connect(listener.address)
        big = Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": torch.zeros(1000)})
        with pytest.raises(WireError, match="exceeds max_bytes"):
            conn.send(big)
        conn.send(PING)
        assert listener.recv(5)[1] == PING
    finally:
        small.close()


def test_reply_to_closed_peer_is_dropped(transport):
    listener = transport.listen()
    conn = transport.connect(listener.address)
    conn.send(PING)
    peer, _ = listener.recv(5)
    conn.close()
    listener.send(peer, PONG)  # must not raise or block
    listener.send(b"\x00nobody", PONG)
    other = transport.connect(listener.address)  # and the listener still serves
    other.send(PING)
    new_peer, msg = listener.recv(5)
    assert msg == PING and new_peer != peer
    listener.send(new_peer, PONG)
    assert other.recv(5) == PONG


@pytest.mark.parametrize("kind", ["zmq", "memory"])
def test_40mb_tensor_round_trips(kind):
    with make_transport(kind) as transport:
        listener = transport.listen()
        conn = transport.connect(listener.address)
        thread = serve(listener, lambda m: Message("params", {"version": 1, "held_s": 0.0}, m.tensors))
        g0 = torch.randn(10_000_000)
        reply = conn.request(Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": g0}), 10)
        thread.join(5)
        assert reply.tensors["g0"].dtype == torch.float32 and torch.equal(reply.tensors["g0"], g0)


def test_zmq_malformed_reply_raises_wire_error():
    with ZmqTransport() as transport:
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.linger = 0
        port = router.bind_to_random_port("tcp://127.0.0.1")
        conn = transport.connect(f"tcp://127.0.0.1:{port}")
        conn.send(PING)
        assert router.poll(5000)
        peer = router.recv_multipart()[0]
        router.send_multipart([peer, b"\xc1"])
        with pytest.raises(WireError, match="msgpack"):
            conn.recv(5)
        router.send_multipart([peer, *encode(PONG)])
        assert conn.recv(5) == PONG
        ctx.destroy(linger=0)


@pytest.mark.parametrize("mode", ["curve", "plain"])
@pytest.mark.parametrize("host", ["127.0.0.1", "ipc"])
def test_zmq_auth_admits_the_job_roles_only(mode, host):
    keys, foreign = generate_keys(mode, workers=3, servers=2), generate_keys(mode)
    # the job's listening key with a client key of no role: reaches ZAP, which refuses it
    stranger = JobKeys(mode, "worker", foreign["worker0"].client, keys["worker0"].listener, {})
    with ZmqTransport(keys=keys["server0"]) as server:
        listener = server.listen(host)
        for name, role, rank in (("coordinator", "coordinator", None), ("server1", "server", 1),
                                 ("worker0", "worker", 0), ("worker2", "worker", 2)):
            with ZmqTransport(keys=keys[name]) as t:  # each process's own credentials: its role and rank
                t.connect(listener.address).send(Message("ping", {"n": name}))
                peer, msg = listener.recv(5)
                assert (msg.origin, msg.origin_rank, msg.fields["n"]) == (role, rank, name)
        for other in (ZmqTransport(send_timeout=0.3), ZmqTransport(keys=foreign["coordinator"], send_timeout=0.3),
                      ZmqTransport(keys=stranger, send_timeout=0.3)):
            with other:
                with pytest.raises(PeerTimeout):  # either send cannot queue or no reply
                    other.connect(listener.address).request(Message("stop", {"reason": "x"}), timeout=0.3)
        assert listener.recv(0.3) is None


def test_an_ipc_listener_removes_its_socket_file_when_closed():
    with ZmqTransport() as t:
        first, second = t.listen("ipc"), t.listen("ipc")
        paths = [Path(x.address[len("ipc://"):]) for x in (first, second)]
        assert all(p.exists() for p in paths)
        first.close()
        assert not paths[0].exists() and paths[1].exists()
    assert not paths[1].exists()  # closed with its transport


def test_ipc_fits_the_longest_folder_a_socket_binds_in(tmp_path, monkeypatch):
    import tempfile

    from equipoise.launch.warm import IPC_NAME_LEN, ipc_fits

    base = Path(tempfile.mkdtemp(prefix="t"))  # in TMPDIR: shorter than tmp_path (-n 2 lengthens it)
    longest = base / ("x" * (zmq.IPC_PATH_MAX_LEN - IPC_NAME_LEN - len(str(base)) - 1))
    longest.mkdir()
    assert ipc_fits(str(longest)) and not ipc_fits(str(longest) + "y")
    monkeypatch.setattr(tempfile, "tempdir", str(longest))
    with ZmqTransport() as t:  # binds (a pid of 7 digits would fill the path exactly)
        assert t.listen("ipc").address.startswith(f"ipc://{longest}/equipoise-")


def test_zap_logs_a_refused_key_once(caplog):
    keys = generate_keys("curve")
    stranger = JobKeys("curve", "coordinator", generate_keys("curve")["worker0"].client, keys["worker0"].listener, {})
    with ZmqTransport(keys=keys["server0"]) as server, ZmqTransport(keys=stranger, send_timeout=0.3) as bad:
        listener = server.listen()
        with caplog.at_level(logging.WARNING, logger="equipoise.wire"):
            for _ in range(3):  # three connections, each retrying its handshake
                bad.connect(listener.address).send(PING)
            assert listener.recv(1.0) is None
    refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1 and "unknown CURVE key" in refusals[0].getMessage()


def test_identities_name_one_process_each():
    from equipoise.wire.auth import identity, parse_identity
    assert [identity("coordinator", None), identity("worker", 3)] == ["coordinator", "worker3"]
    assert parse_identity("worker3") == ("worker", 3) and parse_identity("server0") == ("server", 0)
    assert parse_identity("coordinator") == ("coordinator", None)
    for bad in ("worker", "coordinator1", "worker03", "admin0", "worker-1", "worker123456789", None, 7):
        assert parse_identity(bad) is None, bad
    with pytest.raises(ValueError, match="each ≥ 1"):
        generate_keys("plain", workers=0)


def test_job_keys_hold_distinct_secrets_and_travel_as_json():
    for mode in ("curve", "plain"):
        keys = generate_keys(mode, workers=2, servers=2)
        assert sorted(keys) == ["coordinator", "server0", "server1", "worker0", "worker1"]
        assert [(k.role, k.rank) for k in keys.values()] == [("coordinator", None), ("server", 0), ("server", 1),
                                                            ("worker", 0), ("worker", 1)]
        assert len({k.client[1] for k in keys.values()}) == 5
        assert keys["worker0"].listener[1] == ""  # a worker cannot pass for a listener
        for k in keys.values():
            assert JobKeys.from_dict(json.loads(json.dumps(k.to_dict()))) == k
            assert all(s not in repr(k) for s in k.secrets())
    with pytest.raises(ValueError, match="malformed job keys"):
        JobKeys.from_dict({"mode": "curve"})
    with pytest.raises(ValueError, match="cannot listen"), ZmqTransport(keys=generate_keys("curve")["worker0"]) as t:
        t.listen()
    with pytest.raises(ValueError, match="no keys"):
        generate_keys("off")


def test_without_keys_origin_is_none(transport):
    listener = transport.listen()
    transport.connect(listener.address).send(PING)
    assert listener.recv(5)[1].origin is None


def test_make_transport_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("carrier-pigeon")
    with InMemoryTransport() as t, pytest.raises(ValueError):
        t.connect("tcp://127.0.0.1:1")


def test_copy_mode_allows_mutation_after_send():
    """With copy_threshold=inf, send copies, so in-place changes afterwards are safe."""
    with ZmqTransport(copy_threshold=float("inf")) as transport:
        listener = transport.listen()
        conn = transport.connect(listener.address)
        g0 = torch.ones(1_000_000)
        conn.send(Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": g0}))
        g0.zero_()
        _, got = listener.recv(5)
        assert torch.equal(got.tensors["g0"], torch.ones(1_000_000))


def test_zmq_reply_is_lent_until_every_zero_copy_frame_is_read():
    """A listener's send returns done(), which must stay False while ZeroMQ may still read
    any frame sent zero-copy — here a 40 MB frame followed by a small (copied) last one,
    so tracking only the last frame would say done at once. The peer does not read yet:
    40 MB cannot fit in loopback socket buffers, so the big frame is still being read."""
    with ZmqTransport() as transport:
        listener = transport.listen()
        conn = transport.connect(listener.address)
        conn.send(PING)
        peer, _ = listener.recv(5)
        big, small = torch.ones(10_000_000), torch.ones(2)
        done = listener.send(peer, Message("params", {"version": 1, "held_s": 0.0}, {"a": big, "b": small}))
        assert not done()
        reply = conn.recv(10)  # reading it lets ZeroMQ finish with the frames
        assert torch.equal(reply.tensors["a"], big) and torch.equal(reply.tensors["b"], small)
        deadline = time.monotonic() + 10
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done()
