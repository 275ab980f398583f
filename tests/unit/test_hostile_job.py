"""A live job under `auth = "off"` fed malformed messages at the coordinator and at every
server, while it trains: nothing stops, nothing changes (bit-equal to the same job
undisturbed), and what was refused is logged in bounded lines."""

import logging
import threading

import msgpack
import pytest
import torch

from equipoise.config import Config
from equipoise.data import load_dataset
from equipoise.launch.threads import run_threads
from equipoise.wire import InMemoryTransport
from equipoise.wire.message import WIRE_VERSION, encode
from equipoise.wire import Message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _header(t, f, x=()):
    return msgpack.packb({"v": WIRE_VERSION, "t": t, "f": f, "x": list(x)}, use_bin_type=True)


# Each a message no check lets through: bytes that are no message, shapes whose element
# count overflows (a zero beside huge dimensions), and well-formed types whose fields the
# handlers refuse (a worker nobody registered, counts of the wrong type, a NaN norm, a
# block nobody holds).
HOSTILE = [
    [b"\xc1garbage"],
    [b""],
    [_header("ping", {}, [["a", "float32", [2**62, 2**62, 0]]]), b""],
    [_header("ping", {}, [["a", "uint8", [2**31, 2**31, 2**31, 0]]]), b""],
    [_header("ping", {}, [["a", "float32", [2**62]]]), b"\0" * 8],
    [_header("plan_req", {"worker": 0, "step": "x", "report": []})],  # the schema refuses it
    [_header("norm_req", {"version": "x"})],
    encode(Message("plan_req", {"worker": 10**9, "step": 0, "report": {}, "epoch": "x"})),
    encode(Message("plan_req", {"worker": 0, "step": 1, "report": {"oom": "x"}, "epoch": "x"})),
    encode(Message("table_req", {"worker": 10**9, "epoch": 0})),
    encode(Message("table_req", {"worker": 0, "epoch": "x"})),
    encode(Message("push", {"worker": 0, "version": 0, "samples": 1, "count": "x"}, {"g0": torch.zeros(3)})),
    encode(Message("push", {"worker": 0, "version": 0, "samples": 1, "read": -4}, {"g0": torch.zeros(3)})),
    encode(Message("clip", {"version": 0, "norm": -1.0})),
    encode(Message("migrate", {"keys": [10**6], "to": "nowhere"})),
    encode(Message("fragment", {"worker": 0, "seq": -1})),
]


def job(**kw):
    base = dict(dataset="digits", model="mlp", global_batch=48, workers=2, servers=2, iterations=15,
                eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=2000, auth="off",
                momentum=0.9)
    base.update(kw)
    return Config.from_dict(base)


def test_malformed_messages_at_every_listener_change_nothing(tmp_path, monkeypatch, caplog):
    data = load_dataset("digits")
    (tmp_path / "quiet").mkdir()
    run_threads(job(), tmp_path / "quiet", data)

    listeners: list[tuple[InMemoryTransport, str]] = []
    listen = InMemoryTransport.listen

    def recording(self, *args, **kw):
        got = listen(self, *args, **kw)
        listeners.append((self, got.address))
        return got

    monkeypatch.setattr(InMemoryTransport, "listen", recording)
    sent, done = [0], threading.Event()

    def hostile():
        i = 0
        while not done.is_set():
            for transport, address in list(listeners):
                if transport.inject(address, HOSTILE[i % len(HOSTILE)], peer=b"hostile%d" % (i % 3)):
                    sent[0] += 1
            i += 1
            done.wait(0.002)

    caplog.set_level(logging.WARNING)
    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    (tmp_path / "hostile").mkdir()
    try:
        summary = run_threads(job(), tmp_path / "hostile", data)
    finally:
        done.set()
        thread.join(5)
    assert summary["status"] == "completed"
    assert len({a for _, a in listeners}) == 3  # the coordinator's and two servers'
    assert sent[0] >= 3 * len(HOSTILE)  # every kind reached every listener at least once
    quiet = torch.load(tmp_path / "quiet" / "model.pt", weights_only=True)
    hostile_run = torch.load(tmp_path / "hostile" / "model.pt", weights_only=True)
    assert all(torch.equal(quiet[k], hostile_run[k]) for k in quiet)
    # bounded: a line for each kind of refusal from each of the 3 hostile peers at each
    # listener, not one per message
    refused = [r for r in caplog.records if "refused" in r.getMessage() or "dropped" in r.getMessage()]
    assert len(refused) <= 3 * 3 * len(HOSTILE) + 10, len(refused)
    assert len(refused) < sent[0]


METRICS = '''
import torch.nn.functional as F
CALLS = [0]


def metrics(model, batch):
    CALLS[0] += 1
    if CALLS[0] == 3:
        raise ZeroDivisionError("the third evaluation")
    x, y = batch
    return {"loss": float(F.cross_entropy(model(x), y))}
'''


def test_a_metrics_function_that_raises_ends_the_job_at_once_naming_it(tmp_path):
    """Raised at the third evaluation (iteration 6 of 60): the job fails then, in one
    line naming the iteration and the exception, not after training."""
    from equipoise.coordinator.rpc import JobError

    spec = tmp_path / "raising_metrics.py"
    spec.write_text(METRICS)
    data = load_dataset("digits")
    (tmp_path / "run").mkdir()
    cfg = job(iterations=60, eval_every=2, metrics=f"{spec}:metrics", eval_batch=2000)
    with pytest.raises(JobError) as info:
        run_threads(cfg, tmp_path / "run", data)
    text = str(info.value)
    assert "\n" not in text and "evaluation at iteration 6" in text and "ZeroDivisionError" in text, text
    import json
    done = [json.loads(line)["iteration"] for line in open(tmp_path / "run" / "metrics.jsonl")
            if '"type":"iteration"' in line]
    assert max(done) < 60  # it did not train on to the end first
