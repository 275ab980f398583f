"""A block handed over between two servers while workers run (no barrier): the old owner
fences it, the new one serves it, and every gradient is applied once — the ones that
reached the old owner by an older table are forwarded. Driven message by message on
two in-process servers, so each case happens for certain (in a whole job it depends on
timing); plain SGD at lr 1, so every value is a sum of gradients, exactly."""

import threading

import pytest
import torch

from equipoise.policy.sync import ServerSync, make_sync_policy
from equipoise.server.core import Server
from equipoise.server.store import OptimizerSpec
from equipoise.wire import InMemoryTransport, Message

pytestmark = pytest.mark.timeout(60)
SPEC = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()


def block(key):
    return [key, "w", 2 * key, 2 * key + 2, "param", 8]


def init(keys, protocol, **extra):
    return Message("init", {"blocks": [block(k) for k in keys], "optimizer": SPEC, "version": 0, "samples": 0,
                            "protocol": protocol, "workers": 2, **extra},
                   {f"b{k}": torch.zeros(2) for k in keys})


def grads(**by_key):
    return {f"g{k[1:]}": torch.tensor(v, dtype=torch.float32) if isinstance(v, list) else torch.full((2,), float(v))
            for k, v in by_key.items()}


class Pair:
    """Server A, driven by the test's calls, and server B, running its own loop in a
    thread (A's hand-over waits for B's answer)."""

    def __init__(self, protocol, a_keys, b_keys, **extra):
        self.transport = InMemoryTransport()
        self.a, self.b = Server(0, self.transport, "nowhere"), Server(1, self.transport, "nowhere")
        self.sent = []
        self.a.listener.send = lambda peer, msg: self.sent.append((peer, msg)) or (lambda: True)
        self.a.handle(b"coord", init(a_keys, protocol, **extra))
        self.coord_b = self.transport.connect(self.b.listener.address)
        self.thread = threading.Thread(target=self.b._loop, daemon=True)
        self.thread.start()
        self.ask_b(init(b_keys, protocol, **extra), "ready")

    def ask_a(self, msg, peer=b"w"):
        self.sent.clear()
        self.a.handle(peer, msg)
        return [m for p, m in self.sent if p == peer]

    def ask_b(self, msg, kind):
        self.coord_b.send(msg)
        reply = self.coord_b.recv(timeout=10)
        assert reply.type == kind, reply.fields
        return reply

    def push_b(self, fields, tensors):
        conn = self.transport.connect(self.b.listener.address)
        conn.send(Message("push", fields, tensors))
        reply = conn.recv(timeout=10)
        conn.close()
        return reply

    def values_b(self):
        self.ask_b(Message("ping", {}), "pong")  # after everything sent before it
        return {k: v.tolist() for k, v in self.b.store.values.items()}

    def close(self):
        stop = self.ask_b(Message("stop", {"reason": "test"}), "ack")
        self.thread.join(timeout=10)
        self.coord_b.close()
        return stop


def test_a_block_handed_over_under_asp_gets_every_gradient_once():
    pair = Pair("asp", [0, 1], [2])
    (ack,) = pair.ask_a(Message("push", {"worker": 0, "version": 0, "samples": 4}, grads(g0=1, g1=1)))
    assert ack.type == "ack"
    (ack,) = pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    assert ack.type == "ack" and set(pair.a.store.blocks) == {0}
    # worker 1 still routes by the old table: block 1's gradient reaches A, which forwards it
    (ack,) = pair.ask_a(Message("push", {"worker": 1, "version": 0, "samples": 4}, grads(g0=2, g1=2)))
    assert ack.type == "ack" and pair.a.handover.sent == 1
    assert pair.a.store.values[0].tolist() == [-3.0, -3.0]
    # ... and its push to B lacks block 1: block 2 is stepped, block 1 is not
    assert pair.push_b({"worker": 1, "version": 0, "samples": 4}, grads(g2=1)).type == "ack"
    # worker 0 routes by the new table: block 1 and 2 at B, which it has not read from
    reply = pair.push_b({"worker": 0, "version": 1, "samples": 4, "borrowed": True}, grads(g1=4, g2=4))
    assert reply.type == "ack"
    assert pair.values_b() == {1: [-7.0, -7.0], 2: [-5.0, -5.0]}  # 1 + 2 + 4 and 1 + 4: each once
    # a pull that reaches A by the old table says the block left (the worker keeps its own)
    (params,) = pair.ask_a(Message("pull", {"worker": 1, "min_version": 0}))
    assert params.fields["moved"] == [1] and set(params.tensors) == {"b0"}
    stop = pair.close()
    assert dict(stop.fields["block_gradients"]) == {1: 3, 2: 2}
    (stop_a,) = pair.ask_a(Message("stop", {"reason": "test"}), b"coord")
    assert dict(stop_a.fields["block_gradients"]) == {0: 2} and stop_a.fields["forwarded"] == 1


def test_a_forward_with_a_non_finite_gradient_is_refused_at_the_old_owner():
    pair = Pair("asp", [0, 1], [2])
    pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    (r,) = pair.ask_a(Message("push", {"worker": 1, "version": 0, "samples": 4}, grads(g0=1, g1=float("nan"))))
    assert r.type == "error" and "block 1" in r.fields["message"] and pair.a.handover.sent == 0
    assert pair.a.store.values[0].tolist() == [0.0, 0.0]  # nothing of the push applied
    (r,) = pair.ask_a(Message("push", {"worker": 1, "version": 0, "samples": 4}, grads(g0=1, g7=1)))
    assert r.type == "error" and "unexpected [7]" in r.fields["message"]
    pair.close()


def test_the_fence_applies_a_half_filled_softsync_group_before_the_hand_over():
    pair = Pair("softsync", [0, 1], [2], softsync_n=1)  # groups of 2
    pair.ask_a(Message("push", {"worker": 0, "version": 0, "samples": 4}, grads(g0=2, g1=2)))
    assert pair.a.sync.unapplied == 1
    pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    assert pair.a.sync.unapplied == 0 and pair.a.store.values[0].tolist() == [-2.0, -2.0]
    assert pair.values_b()[1] == [-2.0, -2.0]  # block 1 left with its gradient applied
    pair.close()


def test_an_empty_server_adopting_under_ssp_takes_the_clocks_and_counts_forwarded_steps():
    pair = Pair("ssp", [0, 1], [], staleness_bound=0)
    for w in (0, 1):
        pair.ask_a(Message("push", {"worker": w, "version": 0, "samples": 4, "step": 0}, grads(g0=1, g1=1)))
    assert pair.a.sync.published() == 1
    pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    pair.values_b()
    assert pair.b.sync.clocks == {0: 1, 1: 1}
    # worker 0's step 1 by the old table: A forwards block 1's part, which counts at B
    pair.ask_a(Message("push", {"worker": 0, "version": 1, "samples": 4, "step": 1}, grads(g0=1, g1=1)))
    pair.values_b()
    assert pair.b.sync.clocks == {0: 2, 1: 1} and pair.b.sync.published() == 1
    # worker 1's step 1 by the new table, straight to B
    pair.push_b({"worker": 1, "version": 1, "samples": 4, "step": 1, "borrowed": True}, grads(g1=1))
    assert pair.b.sync.published() == 2 and pair.values_b()[1] == [-4.0, -4.0]
    pair.close()


def test_a_step_arriving_twice_counts_once_on_the_ssp_clock():
    sync = ServerSync(make_sync_policy("ssp", staleness_bound=1), 2)
    sync.accept(0, 0, 4, step=0)
    sync.on_applied(sync.next_update())
    sync.forwarded(0, 0)  # the old owner's forward of the same step
    assert sync.pushed[0] == sync.clocks[0] == 1
    sync.forwarded(0, 1)  # a step whose own push comes later
    sync.accept(0, 0, 4, step=1)
    update = sync.next_update()
    assert not update.pushes[0].counted
    sync.on_applied(update)
    assert sync.pushed[0] == sync.clocks[0] == 2


def test_a_later_steps_forward_counted_first_does_not_raise_sigma_past_the_bound():
    """Under SSP (s = 1) worker 0 reads version 1 for its step 2 (allowed: 2 - 1), and
    the old owner's forward of its step 3 reaches the new owner before the step-2 push
    does: σ is 2 - 1 = 1, measured against the step, not against the three steps now
    counted (it was 2, over the bound, once in the suite)."""
    sync = ServerSync(make_sync_policy("ssp", staleness_bound=1), 2)
    for worker in (0, 1):
        sync.accept(worker, 0, 4, step=0)
        sync.on_applied(sync.next_update())
    sync.accept(0, 1, 4, step=1)
    sync.on_applied(sync.next_update())
    assert sync.published() == 1 and sync.pushed[0] == 2
    sync.forwarded(0, 3)
    sync.accept(0, 1, 4, step=2)
    update = sync.next_update()
    assert update.sigmas == (1,) and update.pushes[0].counted
    sync.on_applied(update)
    assert sync.pushed[0] == sync.clocks[0] == 4 and sync.histogram == {0: 3, 1: 1}


def test_a_refused_push_forwards_nothing_and_a_bad_forward_applies_nothing():
    pair = Pair("asp", [0, 1], [2])
    pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    pair.ask_a(Message("lose", {"worker": 1, "workers": 1}), b"coord")
    (r,) = pair.ask_a(Message("push", {"worker": 1, "version": 0, "samples": 4}, grads(g0=1, g1=1)))
    assert r.type == "error" and "lost" in r.fields["message"] and pair.a.handover.sent == 0
    (r,) = pair.ask_a(Message("push", {"worker": 0, "version": 0, "samples": 4}, grads(g0=1, g1=[1, 2, 3])))
    assert r.type == "error" and "block 1 has shape" in r.fields["message"]
    assert pair.a.store.values[0].tolist() == [0.0, 0.0] and pair.values_b()[1] == [0.0, 0.0]
    conn = pair.transport.connect(pair.b.listener.address)
    for fields, tensors in (({"worker": 0, "samples": 4, "step": "x"}, grads(g1=1)),
                            ({"worker": 0, "samples": 4}, {})):
        conn.send(Message("forward", fields, tensors))
        assert conn.recv(timeout=10).type == "error"
    assert pair.values_b()[1] == [0.0, 0.0] and pair.b.block_grads[1] == 0
    conn.close()
    pair.close()


def test_an_empty_push_is_refused_under_a_barrier():
    pair = Pair("bsp", [0, 1], [2])
    (r,) = pair.ask_a(Message("push", {"worker": 0, "version": 0, "samples": 4}, {}))
    assert r.type == "error" and "wrong blocks" in r.fields["message"] and pair.a.sync.unapplied == 0
    pair.close()


def test_an_adopt_with_malformed_clocks_changes_nothing():
    pair = Pair("ssp", [0], [], staleness_bound=1)
    conn = pair.transport.connect(pair.b.listener.address)
    conn.send(Message("adopt", {"blocks": [block(1)], "version": 7, "samples": 28,
                                "clocks": {"clocks": [[0, 1]], "pushed": [[0, "x"]]}}, {"b1": torch.ones(2)}))
    assert conn.recv(timeout=10).type == "error"
    pair.values_b()
    assert not pair.b.store.blocks and pair.b.store.version == 0 and pair.b.sync.clocks == {0: 0, 1: 0}
    conn.close()
    pair.close()
