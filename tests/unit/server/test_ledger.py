"""A gradient is applied at most once, by its push id (epoch, step, part): the ledger
alone, and two in-process servers handing a block over while the same pushes and
forwards arrive twice. The oracle is the same messages without the repeats: with
plain SGD at lr 1 every value is a sum of gradients, so a gradient applied twice, or
lost, changes a value."""

import pytest
import torch

from equipoise.server.ledger import PushLedger, drop_taken
from equipoise.wire import Message

from .test_handover import Pair, grads

pytestmark = pytest.mark.timeout(60)


def test_the_ledger_drops_a_taken_id_and_keeps_the_rest():
    ledger = PushLedger(window=3)
    assert ledger.screen(0, (0, 5, 0), [1, 2]) == (set(), set())
    ledger.record(0, (0, 5, 0), [1, 2])
    assert ledger.screen(0, (0, 5, 0), [2, 3]) == ({2}, set())  # block 3 of that id is new
    assert ledger.screen(1, (0, 5, 0), [2]) == (set(), set())  # another worker's id
    assert ledger.screen(0, (0, 5, 1), [2]) == (set(), set())  # another part of the step
    assert ledger.screen(0, (1, 5, 0), [2]) == (set(), set())  # another epoch
    assert ledger.screen(0, None, [2]) == (set(), set())  # no id: nothing to tell
    for step in (6, 7, 8):  # the window holds 3 ids: step 5 goes, and with it everything up to it
        ledger.record(0, (0, step, 0), [1])
    assert ledger.screen(0, (0, 5, 0), [4]) == (set(), {4}) and ledger.screen(0, (0, 4, 0), [4]) == (set(), {4})
    assert ledger.screen(0, (0, 6, 0), [1]) == ({1}, set())
    assert (ledger.duplicates, ledger.too_old) == (2, 2)


def test_rows_go_with_the_blocks_that_leave():
    old, new = PushLedger(), PushLedger()
    old.record(0, (0, 1, 0), [1, 2])
    old.record(1, (0, 1, 0), [2])
    old.record(1, (0, 2, 0), [1])
    rows = old.rows([2])
    assert sorted(rows) == [[0, 0, 1, 0, [2]], [1, 0, 1, 0, [2]]]
    new.adopt(rows + [[0, 0, 1, 0, [9]]], [2])  # bits of blocks not handed over are ignored
    old.drop([2])
    assert new.screen(0, (0, 1, 0), [2, 9]) == ({2}, set()) and old.screen(0, (0, 1, 0), [2]) == (set(), set())
    with pytest.raises(ValueError, match="malformed ledger row"):
        new.adopt([[0, 0, 1, 0, [2]], [0, -1, 1, 0, [2]]], [2])
    assert new.screen(0, (0, 1, 0), [2]) == ({2}, set())  # the good row before the bad one: not taken twice


def test_drop_taken_removes_the_repeated_blocks_in_place():
    ledger = PushLedger()
    ledger.record(0, (0, 1, 0), [1])
    tensors = {1: torch.ones(2), 2: torch.ones(2)}
    assert drop_taken(ledger, 0, (0, 1, 0), tensors, "push") is False and set(tensors) == {2}
    assert drop_taken(ledger, 0, (0, 1, 0), {1: torch.ones(2)}, "push") is True
    assert drop_taken(ledger, 0, None, {}, "push") is False  # an empty push is not a repeat: refused elsewhere


def run(protocol, extra, repeat):
    """Worker 0 and 1 push while block 1 moves from server A to server B; with
    `repeat`, every push and forward is sent twice. Values, per-block counts, and the
    duplicates each server dropped."""
    pair = Pair(protocol, [0, 1], [2], **extra)
    times = 2 if repeat else 1

    def push_a(fields, tensors):
        for _ in range(times):
            (ack,) = pair.ask_a(Message("push", {"version": 0, "samples": 4, **fields}, tensors))
            assert ack.type == "ack", ack.fields

    def push_b(fields, tensors):
        for _ in range(times):
            ack = pair.push_b({"samples": 4, **fields}, tensors)
            assert ack.type == "ack", ack.fields

    push_a({"worker": 0, "step": 0}, grads(g0=1, g1=1))
    (ack,) = pair.ask_a(Message("migrate", {"keys": [1], "to": pair.b.listener.address}), b"coord")
    assert ack.type == "ack"
    push_a({"worker": 1, "step": 0}, grads(g0=2, g1=2))  # block 1 forwarded to B (twice: dropped there)
    conn = pair.transport.connect(pair.b.listener.address)
    for _ in range(times):  # a forward arriving twice, from outside the old owner
        conn.send(Message("forward", {"worker": 1, "samples": 4, "step": 1, "epoch": 0, "part": 0}, grads(g1=8)))
    push_b({"worker": 1, "step": 0, "version": 0}, grads(g2=16))
    push_b({"worker": 0, "step": 1, "version": 1, "borrowed": True}, grads(g1=32, g2=32))
    pair.ask_a(Message("flush", {}), b"coord")  # a half-filled softsync group applied
    pair.ask_b(Message("flush", {}), "ack")
    values_b = pair.values_b()
    conn.close()
    stop_b = pair.close()
    (stop_a,) = pair.ask_a(Message("stop", {"reason": "test"}), b"coord")
    values_a = {k: v.tolist() for k, v in pair.a.store.values.items()}
    counts = {**dict(stop_a.fields["block_gradients"]), **dict(stop_b.fields["block_gradients"])}
    return values_a, values_b, counts, stop_a.fields["duplicates"], stop_b.fields["duplicates"]


@pytest.mark.parametrize("protocol,extra", [("asp", {}), ("softsync", {"softsync_n": 1}),
                                            ("ssp", {"staleness_bound": 4})])
def test_a_push_and_a_forward_sent_twice_are_applied_once_with_a_block_moving(protocol, extra):
    once = run(protocol, extra, repeat=False)
    twice = run(protocol, extra, repeat=True)
    assert once[2] == {0: 2, 1: 4, 2: 2}  # every gradient counted: 2 pushes at A, 4 reached block 1, 2 block 2
    assert once[:3] == twice[:3]  # the same values and counts as without the repeats
    assert once[3:] == (0, 0)
    # A dropped worker 0's repeat (blocks 0, 1) and worker 1's block 0 (its block 1 went
    # on, and B dropped it); B its two own pushes' repeats (1 + 2 blocks) and two forwards
    assert twice[3:] == (3, 5)
