"""Pushes streamed while backward runs (`backward_push`): the worker's fragments, the
server's assembly of them into one push, and a whole job against the reference."""

import json
import math

import pytest
import torch

from equipoise.config import Config
from equipoise.data import load_dataset
from equipoise.reference import train_reference
from equipoise.device import DeviceLink
from equipoise.launch.threads import run_threads
from equipoise.server.core import Server
from equipoise.server.store import OptimizerSpec
from equipoise.wire import InMemoryTransport, Message

pytestmark = pytest.mark.timeout(120)
SPEC = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()


@pytest.fixture
def server():
    """A BSP server for one worker, with blocks 0 and 1 of two zeros each; `server.sent`
    records its replies."""
    s = Server(0, InMemoryTransport(), "nowhere")
    s.sent = []
    s.listener.send = lambda peer, msg: s.sent.append((peer, msg)) or (lambda: True)
    s.handle(b"coord", Message("init", {"blocks": [[0, "w", 0, 2, "param", 4], [1, "w", 2, 4, "param", 4]],
                                        "optimizer": SPEC, "version": 0, "samples": 0, "protocol": "bsp",
                                        "workers": 1}, {"b0": torch.zeros(2), "b1": torch.zeros(2)}))
    assert s.sent.pop()[1].type == "ready"
    yield s
    s.listener.close()


def fragment(seq, **tensors):
    return Message("fragment", {"worker": 0, "epoch": 0, "seq": seq}, tensors)


def ending(seq, n, **tensors):
    return Message("push", {"worker": 0, "version": 0, "samples": 1, "epoch": 0, "seq": seq, "fragments": n},
                   tensors)


def replies(s, msg):
    s.sent.clear()
    s.handle(b"w", msg)
    return [m for _, m in s.sent]


def test_fragments_and_their_ending_push_are_one_update(server):
    assert replies(server, fragment(1, g1=torch.ones(2))) == []  # no reply to a fragment
    assert server.store.version == 0
    (ack,) = replies(server, ending(1, 1, g0=torch.full((2,), 2.0)))
    assert ack.type == "ack" and server.store.version == 1
    assert server.store.values[0].tolist() == [-2.0, -2.0] and server.store.values[1].tolist() == [-1.0, -1.0]


@pytest.mark.parametrize("bad", ["nan", "stray", "count", "repeat", "seq", "tags"])
def test_a_bad_fragment_or_ending_is_refused_and_nothing_is_applied(server, bad):
    if bad == "nan":  # refused as it comes, while the worker still computes
        (r,) = replies(server, fragment(1, g1=torch.tensor([1.0, math.nan])))
        assert r.type == "error" and "non-finite" in r.fields["message"]
    elif bad == "tags":  # the push's tags it carries (eager_update weighs its gradients by them)
        for tags, word in (({"samples": 0}, "samples"), ({"samples": 2, "count": math.inf}, "count"),
                           ({"samples": 2, "start": "x"}, "start")):
            msg = fragment(1, g1=torch.ones(2))
            msg.fields.update(tags)
            (r,) = replies(server, msg)
            assert r.type == "error" and word in r.fields["message"] and len(server.fragments) == 0
    elif bad == "stray":
        (r,) = replies(server, fragment(1, g7=torch.ones(2)))
        assert r.type == "error" and "wrong blocks" in r.fields["message"]
    else:
        replies(server, fragment(1, g1=torch.ones(2)))
        end = {"count": ending(1, 2, g0=torch.ones(2)), "repeat": ending(1, 1, g0=torch.ones(2), g1=torch.ones(2)),
               "seq": ending(2, 1, g0=torch.ones(2))}[bad]
        (r,) = replies(server, end)
        assert r.type == "error" and ("fragments" in r.fields["message"] or "repeats" in r.fields["message"])
    assert server.store.version == 0 and len(server.fragments) == 0 or bad in ("nan", "stray", "tags")
    assert server.store.values[0].tolist() == [0.0, 0.0] and server.store.values[1].tolist() == [0.0, 0.0]


def test_a_push_sent_whole_drops_what_an_abandoned_stream_left(server):
    """A step that ran out of memory after sending fragments: the worker's next push is
    sent whole (fragments = 0) and the abandoned fragments are not added to it."""
    replies(server, fragment(1, g1=torch.full((2,), 5.0)))
    (ack,) = replies(server, Message("push", {"worker": 0, "version": 0, "samples": 1, "epoch": 0},
                                     {"g0": torch.ones(2), "g1": torch.ones(2)}))
    assert ack.type == "ack" and server.store.values[1].tolist() == [-1.0, -1.0] and len(server.fragments) == 0


def test_a_lost_worker_s_fragments_are_dropped_and_its_later_ones_refused(server):
    replies(server, fragment(1, g1=torch.ones(2)))
    server.handle(b"coord", Message("lose", {"worker": 0, "workers": 1}))
    assert len(server.fragments) == 0
    (r,) = replies(server, fragment(2, g1=torch.ones(2)))
    assert r.type == "error" and "declared lost" in r.fields["message"] and len(server.fragments) == 0


def test_a_fragment_block_handed_over_and_adopted_back_is_checked_at_the_ending_push(server):
    """A block this server had handed over when its fragment came is kept unchecked;
    if the block comes back before the push ends, the ending push checks it."""
    block = server.store.blocks.pop(1)
    server.handover.moved[1] = "elsewhere"
    assert replies(server, fragment(1, g1=torch.tensor([1.0, math.nan]))) == []  # kept, not checked
    server.store.blocks[1] = block
    server.handover.moved.pop(1)
    (r,) = replies(server, ending(1, 1, g0=torch.ones(2)))
    assert r.type == "error" and "non-finite" in r.fields["message"]
    assert server.store.version == 0 and server.store.values[1].tolist() == [0.0, 0.0]


def mlp_bn(input_shape, num_classes):
    """The digits MLP with batch norm: running statistics are buffer blocks that its
    forward updates in place and autograd saves."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128),
                               torch.nn.ReLU(), torch.nn.Linear(128, num_classes))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_a_streamed_job_is_the_reference_bit_for_bit_and_shows_its_fragments(tmp_path, digits, monkeypatch,
                                                                            protocol):
    """Three workers staging every copy as a GPU worker does, their gradients streamed
    in fragments of at least 1 KiB (the MLP's blocks of 2,000 floats: every parameter
    tensor's blocks leave during backward). BSP, its weights also pulled in parts of
    1 KiB and written per layer as its forward reaches them (batch norm's running
    statistics too, which the forward updates in place), and each block updated by its
    server once every worker's gradient of it is in and sent ahead of the version
    (eager_update), ends where single-process SGD ends;
    under ASP with overlap (a push in flight while the next backward runs: the fragments
    are copies) every gradient reaches every server once. Each iteration's timeline shows
    a worker's fragments leaving (under BSP before the push that ends them)."""
    init = DeviceLink.__init__
    monkeypatch.setattr(DeviceLink, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "staged": True}))
    base = dict(dataset="digits", model="mlp", global_batch=48, workers=3, servers=2, iterations=8,
                eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=2000,
                backward_push=True, fragment_kb=1)
    if protocol == "bsp":  # and the weights taken per layer during the forward, batch norm's too
        cfg = Config.from_dict({**base, "batch_split": [5, 30, 13], "forward_pull": True, "eager_update": True,
                                "model": f"{__file__}:mlp_bn", "momentum": 0.9})
    else:
        cfg = Config.from_dict({**base, "protocol": "asp", "overlap": True, "lr": 0.02})
    summary = run_threads(cfg, tmp_path, digits)
    if protocol == "bsp":
        ref = train_reference(cfg, data=digits).state_dict()
        got = torch.load(tmp_path / "model.pt", weights_only=True)
        # floating point tensors: batch norm's integer step counter is not a block
        # (protocol/blocks.py), so it is never synchronised
        assert all(torch.equal(got[k], ref[k]) for k in ref if ref[k].is_floating_point())
        assert any("running_mean" in k for k in ref)
    else:
        assert sum(summary["staleness_histogram"].values()) == 8 * 3 * 2  # 8 iterations × 3 workers × 2 servers
    iters = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    iters = [r for r in iters if r.get("type") == "iteration"]
    if protocol == "bsp":  # the last layer's blocks came ahead of the versions, to a pull sent before the fragments
        early = [(e, events) for r in iters for events in r["timeline"] for e in events if e[0] == "early"]
        assert early and all(e[2] < min(f[2] for f in events if f[0] == "fragment") for e, events in early)
        # each reply says when its server computed its blocks: placed after the pull was
        # sent by the server's own time since the pull reached it, which comes out early by
        # the pull's trip, so never after those blocks arrived; early blocks were computed
        # after the pull (sent ahead of the fragments) reached the server
        # (a record may hold the early parts of two pulls: its own step's, arriving during
        # its forward, and the next step's)
        for events in (events for r in iters for events in r["timeline"]):
            applied = [a for a in events if a[0] == "applied"]
            assert all(a[3] is None for a in applied)
            for e in (e for e in events if e[0] == "early"):
                assert any(a[1:2] + a[4:] == e[1:2] + e[4:] and e[2] <= a[2] <= e[3] for a in applied), e
        # the weights came in parts, each recorded as it came; every block was updated, and said so
        events = [e for r in iters for events in r["timeline"] for e in events]
        pulled = {k for e in events if e[0] == "pull" for k in e[4]}
        assert {k for e in events if e[0] in ("part", "early") for k in e[4]} == pulled
        assert {k for e in events if e[0] == "applied" for k in e[4]} == pulled
    else:  # each pull's reply says when its blocks were last updated (under ASP, often before the pull)
        assert any(e[0] == "applied" for r in iters for events in r["timeline"] for e in events)
    for r in iters[1:]:
        for events in r["timeline"]:
            fragments = [e for e in events if e[0] == "fragment"]
            # with overlap a push is waited, and its end recorded, with the next step's report
            ends = [e for e in events if e[0] == "push"] if protocol == "bsp" else [["push", 0, math.inf, 0.0]]
            assert fragments and ends and max(e[2] for e in fragments) <= min(e[2] for e in ends)
        if protocol == "bsp":  # the weights were read as they came: during the plan's wait or the forward
            assert all(e[3] is not None and e[3] >= e[2] for events in r["timeline"] for e in events
                       if e[0] == "pull")
            # the report and the plan this forward ran: one round trip to the coordinator, before it
            plans = [[e for e in events if e[0] == "plan"] for events in r["timeline"]]
            assert all(len(p) == 1 and p[0][1] == -1 and p[0][2] <= p[0][3] <= 0 for p in plans)
        # a worker's first step has no gap (under ASP it may be in any record)
        assert all((g is None and protocol == "asp") or g >= 0 for g in r["gap_s"])


def test_auto_blocks_and_parts_stream_a_layer_in_several_parts_and_equal_the_reference(tmp_path, digits):
    """block_size = 0 and fragment_kb = 0: the digits CNN (53,002 floats on 2 servers)
    in blocks of 16,384 floats (the floor: 53,002 / 32 is less), its classifier's 32,768
    in two, each part of a push or pull one block's 64 KiB. A BSP job with eager_update
    ends where single-process SGD ends, and every step sends its gradients in several
    fragments."""
    from equipoise.models import build_model
    from equipoise.protocol.blocks import model_blocks

    cfg = Config.from_dict(dict(dataset="digits", model="cnn", global_batch=32, workers=2, servers=2, iterations=4,
                                eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=0,
                                fragment_kb=0, backward_push=True, forward_pull=True, eager_update=True))
    blocks = model_blocks(build_model("cnn", digits.input_shape, digits.num_classes), 0, 2)
    assert max(b.numel for b in blocks) == 16_384 and len(blocks) > len({b.name for b in blocks})
    run_threads(cfg, tmp_path, digits)
    ref = train_reference(cfg, data=digits).state_dict()
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(got[k], ref[k]) for k in ref if ref[k].is_floating_point())
    iters = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if r.get("type") == "iteration"]
    assert all(sum(e[0] == "fragment" for e in events) >= 2 for r in iters for events in r["timeline"])


def test_a_pull_in_parts_sends_the_blocks_in_key_order_and_marks_the_last():
    s = Server(0, InMemoryTransport(), "nowhere")
    s.sent = []
    s.listener.send = lambda peer, msg: s.sent.append((peer, msg)) or (lambda: True)
    blocks = [[k, "w", 256 * k, 256 * (k + 1), "param", 4] for k in (2, 0, 1)]  # 1 KiB each
    s.handle(b"coord", Message("init", {"blocks": blocks, "optimizer": SPEC, "version": 0, "samples": 0,
                                        "protocol": "asp", "workers": 1},
                               {f"b{k}": torch.full((256,), float(k)) for k in range(3)}))
    s.sent.clear()
    s.handle(b"w", Message("pull", {"worker": 0, "min_version": 0, "epoch": 0, "part_kb": 1}))
    parts = [m for _, m in s.sent]
    assert [sorted(m.tensors) for m in parts] == [["b0"], ["b1"], ["b2"]]
    assert [m.fields["last"] for m in parts] == [False, False, True]
    assert all(m.tensors[f"b{k}"][0].item() == k for k, m in enumerate(parts))
    s.sent.clear()
    s.handle(b"w", Message("pull", {"worker": 0, "min_version": 0, "epoch": 0, "part_kb": True}))
    assert s.sent[-1][1].type == "error" and "part_kb" in s.sent[-1][1].fields["message"]
    s.listener.close()


class _OneBlockAtATime:
    """A pull whose blocks arrive one per `progress` call, in key order."""

    def __init__(self, values):
        self.values, self.queue, self.out = values, sorted(values.items()), {}

    def arrived(self, ticket):
        out, self.out = self.out, {}
        return out

    def progress(self, ticket, deadline, limit):
        key, value = self.queue.pop(0)
        self.out[key] = value
        return not self.queue

    def wait(self, ticket):
        from equipoise.worker.client import Pulled
        return Pulled(dict(self.values), {}, 0.0)


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def test_forward_pull_waits_for_a_weight_a_module_reads_from_its_child():
    """torch's `nn.MultiheadAttention` hands its child's `out_proj.weight` to an operation
    without calling the child, after its own `in_proj_weight`: a wait per module would
    let it read the child's weight before it arrived. Blocks arriving one at a time as
    the forward waits: its output is the output on the weights written whole."""
    from equipoise.protocol.blocks import model_blocks, read_values
    from equipoise.worker.forward_pull import ForwardPull

    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(2, 3, 8)
    blocks = model_blocks(model, 1 << 20)
    new = {k: torch.randn_like(v) for k, v in read_values(model, blocks).items()}
    link = DeviceLink(model, blocks, torch.device("cpu"))
    old = {k: v.clone() for k, v in read_values(model, blocks).items()}
    link.write(new)
    with torch.no_grad():
        whole = model(x)
    link.write(old)
    client = _OneBlockAtATime(new)
    lazy = ForwardPull(model, blocks, link, client, timeout=5.0)
    lazy.arm(object())
    with lazy.guard(), torch.no_grad():
        streamed = model(x)
    assert client.queue == []  # the last block (out_proj.bias) was waited for, not found written
    assert torch.equal(streamed, whole)
    lazy.finish()
    assert all(torch.equal(v, new[k]) for k, v in read_values(model, blocks).items())


def test_reading_a_weight_s_gradient_or_shape_does_not_wait_for_it():
    """`model.zero_grad` reads every parameter's `.grad`; metadata is not the values, so
    nothing waits for a block (a wait here would wait for the whole pull first)."""
    from equipoise.protocol.blocks import model_blocks, read_values
    from equipoise.worker.forward_pull import ForwardPull

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model(torch.ones(1, 4)).sum().backward()
    blocks = model_blocks(model, 1 << 20)
    client = _OneBlockAtATime({k: v + 1 for k, v in read_values(model, blocks).items()})
    lazy = ForwardPull(model, blocks, DeviceLink(model, blocks, torch.device("cpu")), client, timeout=5.0)
    lazy.arm(object())
    with lazy.guard():
        model.zero_grad(set_to_none=False)
        shapes = [p.shape for p in model.parameters()]
    assert len(client.queue) == len(blocks) and lazy.written == set() and len(shapes) == 4
    with lazy.guard():
        model[0](torch.ones(1, 4))  # the first layer's weight and bias: two blocks, no more
    assert len(client.queue) == len(blocks) - 2


def test_a_frozen_parameter_gets_no_hook_and_its_blocks_go_with_the_ending_push():
    from equipoise.protocol.blocks import model_blocks
    from equipoise.worker.backward_push import BackwardPush

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    blocks = model_blocks(model, 1 << 20)
    stream = BackwardPush(model, blocks, DeviceLink(model, blocks, torch.device("cpu")), fragment_bytes=1)
    sent = []
    stream.arm({b.key: 0 for b in blocks}, lambda r, tensors, seq: sent.append(sorted(tensors)), copy=True)
    model(torch.ones(1, 4)).sum().backward()
    _, keys = stream.finish()
    trained = {b.key for b in blocks if b.name.startswith("1.")}
    assert keys == trained and sorted(k for s in sent for k in s) == sorted(trained)


def eager_server(eager=True):
    """A BSP server for two workers (eager_update), SGD with momentum, blocks 0 and 1 of
    256 floats each."""
    s = Server(0, InMemoryTransport(), "nowhere")
    s.sent = []
    s.listener.send = lambda peer, msg: s.sent.append((peer, msg)) or (lambda: True)
    spec = OptimizerSpec("sgd", 0.1, 0.9, 0.0, "constant", 100, 10, 0.1, 4).to_dict()
    s.handle(b"coord", Message("init", {"blocks": [[k, "w", 256 * k, 256 * (k + 1), "param", 4] for k in (0, 1)],
                                        "optimizer": spec, "version": 0, "samples": 0, "protocol": "bsp",
                                        "workers": 2, "eager_update": eager},
                               {"b0": torch.ones(256), "b1": torch.ones(256)}))
    s.sent.clear()
    return s


def test_a_block_is_updated_and_sent_ahead_once_every_worker_s_gradient_of_it_is_in():
    """eager_update: block 1's gradients, streamed by both workers, make its update;
    the pull held for the next version gets it as an early part, and the reply once the
    version is published brings the rest (kept). Values over two versions: those of a
    server updating whole. If a worker is lost after the early part went, the update is
    made again without its gradient and the reply sends every block (not kept)."""
    gen = torch.Generator().manual_seed(1)
    grads = [[{f"g{k}": torch.randn(256, generator=gen) for k in (0, 1)} for _ in range(2)] for _ in range(2)]

    def run(s, version, lose=False):
        out = []
        s.sent.clear()
        for w in (0, 1):
            s.handle(bytes([w]), Message("fragment", {"worker": w, "epoch": 0, "seq": version + 1, "samples": 2,
                                                      "start": 2 * w}, {"g1": grads[version][w]["g1"]}))
        s.handle(b"p", Message("pull", {"worker": 0, "min_version": version + 1, "epoch": 0, "part_kb": 1,
                                        "early": True}))
        out += [m for _, m in s.sent if m.type == "params"]
        s.sent.clear()
        if lose:
            s.handle(b"coord", Message("lose", {"worker": 1, "workers": 1}))
            s.handle(b"coord", Message("expect", {"version": version, "pushes": 1}))
        for w in (0, 1)[:1 if lose else 2]:
            s.handle(bytes([w]), Message("push", {"worker": w, "version": version, "samples": 2, "start": 2 * w,
                                                  "epoch": 0, "seq": version + 1, "fragments": 1},
                                         {"g0": grads[version][w]["g0"]}))
        return out + [m for _, m in s.sent if m.type == "params"]

    for lose in (False, True):
        eager, whole = eager_server(), eager_server(eager=False)
        for v in (0, 1):
            got, ref = run(eager, v, lose and v == 1), run(whole, v, lose and v == 1)
            kept = not (lose and v == 1)
            assert [m.fields.get("early", False) for m in got] == [True, False] + [False] * (not kept)
            assert sorted(got[0].tensors) == ["b1"]
            assert all("early" not in m.fields and "kept" not in m.fields for m in ref)
            assert got[1].fields["kept"] is kept
            final = {name for m in got[1:] for name in m.tensors}
            assert final == ({"b0"} if kept else {"b0", "b1"})
            for k in (0, 1):
                assert torch.equal(eager.store.values[k], whole.store.values[k])
            assert eager.store.committed == ({1} if kept else set())
        for s in (eager, whole):
            s.listener.close()
