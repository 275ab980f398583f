"""A block migration passes the emulated links of both servers, as pushes and pulls do:
the bytes moved take the sending and the receiving server's token-bucket tokens, and
the slowdown factor's extra time, on a virtual clock (no wall time measured)."""

import pytest
import torch

from equipoise.clock import VirtualClock
from equipoise.server.core import Server
from equipoise.server.store import OptimizerSpec
from equipoise.wire import InMemoryTransport, Message

pytestmark = pytest.mark.timeout(60)
SPEC = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()
N = 4096                      # float32 elements of the moved block: 16,384 bytes
RATE = 1e6                    # bytes/s of both links (1 MB/s); burst 5 ms = 5,000 bytes


def server(key: int, clock: VirtualClock, factor: float) -> Server:
    s = Server(key, InMemoryTransport(), "nowhere", clock=clock)
    s.sent = []
    s.listener.send = lambda peer, msg: s.sent.append((peer, msg))
    s.handle(b"coord", Message("init", {"blocks": [[key, f"w{key}", 0, N, "param", 4]], "optimizer": SPEC,
                                        "version": 0, "samples": 0, "protocol": "bsp", "workers": 1},
                               {f"b{key}": torch.zeros(N)}))
    assert s.sent.pop()[1].type == "ready"
    s._straggle({"factor": factor, "rate_mbps": RATE / 1e6, "bandwidth_mbps": RATE / 1e6})
    return s


class Wire:
    """A connection from the sender straight into the receiver's handler."""

    def __init__(self, receiver: Server):
        self.receiver = receiver

    def send(self, msg: Message) -> None:
        self.receiver.handle(b"sender", msg)

    def recv(self, timeout: float) -> Message:
        return self.receiver.sent.pop()[1]

    def close(self) -> None:
        pass


def test_a_migration_takes_the_tokens_of_both_links_and_the_slow_factor():
    src_clock, dst_clock = VirtualClock(), VirtualClock()
    src, dst = server(0, src_clock, factor=4.0), server(1, dst_clock, factor=1.0)
    src.transport.connect = lambda address: Wire(dst)
    burst = src.bucket.burst
    assert burst == dst.bucket.burst == RATE * 0.005 and src.bucket.tokens == burst

    src.handle(b"coord", Message("migrate", {"keys": [0], "to": "mem://dst"}))
    (peer, ack), = src.sent
    nbytes = N * 4  # SGD without momentum: the values only
    assert ack.type == "ack" and ack.fields["bytes"] == nbytes and 1 in dst.store.blocks
    # Each bucket spent its burst and went nbytes − burst into debt (no time passed
    # before the charge on either clock), so each waited (nbytes − burst)/RATE; the 4×
    # slow sender also spent (4 − 1)·nbytes/RATE more.
    for s in (src, dst):
        assert s.bucket.tokens == pytest.approx(burst - nbytes, rel=1e-12)
        assert s.bytes == nbytes
    link = (nbytes - burst) / RATE
    assert dst_clock.now() == pytest.approx(link, rel=1e-12)
    assert src_clock.now() == pytest.approx(link + 3.0 * nbytes / RATE, rel=1e-12)
    assert ack.fields["seconds"] == pytest.approx(src_clock.now(), rel=1e-12)
    assert src.busy_s == pytest.approx(src_clock.now(), rel=1e-12)


def test_a_probe_takes_the_link_and_slow_factor_a_push_would_and_books_nothing():
    """A probe of N floats on the 4x-slower server: its bytes drain the bucket's burst,
    then wait out the rest at RATE, and the factor adds 3 × bytes / RATE (a push's
    charge); the busy time and bytes PSLD's next stats report are left as they were, and
    only the coordinator may send one."""
    clock = VirtualClock()
    s = server(0, clock, factor=4.0)
    nbytes = N * 4
    s.handle(b"coord", Message("probe", {}, {"p": torch.zeros(N)}))
    assert s.sent.pop()[1].type == "pong"
    assert clock.now() == pytest.approx((nbytes - 5000) / RATE + 3.0 * nbytes / RATE, rel=1e-12)
    assert s.busy_s == 0.0 and s.bytes == 0 and s.block_bytes == {}
    s.handle(b"w", Message("probe", {}, {"p": torch.zeros(N)}, origin="worker"))
    reply = s.sent.pop()[1]
    assert reply.type == "error" and "'probe' from a worker" in reply.fields["message"]
