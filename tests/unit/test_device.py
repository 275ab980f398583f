"""Workers on devices, run on a machine without a GPU: the device and precision rules
(with a stand-in for torch.cuda), and every copy of the GPU path (staging through host
buffers allocated once) on CPU, where the result must stay bit-equal to the reference."""

import json

import pytest
import torch

from equipoise.config import Config, ConfigError
from equipoise.data import load_dataset
from equipoise.models import build_model
from equipoise.reference import train_reference
from equipoise import device as device_mod
from equipoise.worker import probes as probes_mod
from equipoise.protocol.blocks import model_blocks, read_pushes
from equipoise.device import DeviceError, DeviceLink, check_local, check_precision, resolve
from equipoise.launch.threads import run_threads
from equipoise.worker.loop import Worker

pytestmark = pytest.mark.timeout(120)


class FakeCuda:
    """torch.cuda as a machine with `count` GPUs of compute capability `cap` would answer."""

    def __init__(self, count=1, cap=(9, 0)):
        self.count, self.cap = count, cap

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def get_device_capability(self, device):
        return self.cap

    def get_device_name(self, device):
        return "Old GPU" if self.cap[0] < 8 else "New GPU"


def test_devices_this_machine_has_not_are_named_in_one_line():
    with pytest.raises(DeviceError, match=r"worker 1: device = 'cuda:1', but this machine has 1 CUDA device"):
        resolve("cuda:1", "worker 1", cuda=FakeCuda(1))
    with pytest.raises(DeviceError, match="no CUDA device"):
        resolve("cuda", "worker 0", cuda=FakeCuda(0))
    assert resolve("auto", "w", cuda=FakeCuda(0)) == torch.device("cpu")
    assert resolve("auto", "w", cuda=FakeCuda(2)) == torch.device("cuda", 0)
    assert resolve("cuda:1", "w", cuda=FakeCuda(2)) == torch.device("cuda", 1)
    cfg = Config.from_dict({"workers": 3, "devices": ["cuda:0", "cuda:1", "cpu"]})
    check_local(cfg, cuda=FakeCuda(2))  # a mixed job that fits
    with pytest.raises(DeviceError, match="worker 1"):
        check_local(cfg, cuda=FakeCuda(1))


def test_bf16_on_a_pre_ampere_gpu_is_refused_naming_the_worker_and_its_device():
    with pytest.raises(DeviceError, match=r"worker 2: precision = \"bf16-mixed\" on cuda:0 \(Old GPU, compute "
                                          r"capability 7\.0\)"):
        check_precision("bf16-mixed", torch.device("cuda", 0), "worker 2", cuda=FakeCuda(1, (7, 0)))
    check_precision("bf16-mixed", torch.device("cuda", 0), "w", cuda=FakeCuda(1, (8, 0)))
    check_precision("bf16-mixed", torch.device("cpu"), "w")  # CPU autocast has bfloat16
    cfg = Config.from_dict({"workers": 2, "devices": ["cuda:0", "cuda:1"], "precisions": ["bf16-mixed", "32"]})
    check_local(cfg, cuda=FakeCuda(2, (8, 6)))


def test_device_keys_are_validated():
    for bad, word in (({"device": "tpu"}, "device"), ({"workers": 2, "devices": ["cpu"]}, "devices"),
                      ({"precision": "fp16"}, "precision"), ({"workers": 1, "precisions": ["64"]}, r"precisions\[0\]"),
                      ({"eval_device": "cuda:x"}, "eval_device")):
        with pytest.raises(ConfigError, match=word):
            Config.from_dict(bad)


def test_the_staged_copies_equal_the_model_and_reuse_their_buffers():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    blocks = model_blocks(model, 100)
    link = DeviceLink(model, blocks, torch.device("cpu"), depth=1, staged=True)
    x = torch.randn(4, 1, 8, 8)
    model(x).sum().backward()
    first = link.read()
    assert all(torch.equal(first[k], t) for k, t in read_pushes(model, blocks).items())
    assert all(first[k].data_ptr() != t.data_ptr() for k, t in read_pushes(model, blocks).items())
    second, third = link.read(), link.read()  # overlap: two sets in turn, the first again
    assert {k: t.data_ptr() for k, t in third.items()} == {k: t.data_ptr() for k, t in first.items()}
    assert all(second[k].data_ptr() != first[k].data_ptr() for k in first)
    values = {b.key: torch.full((b.stop - b.start,), float(b.key)) for b in blocks[:-1]}
    link.write(values)  # the last block has no value: it keeps its own
    pulled = {b.key: t for b, t in zip(blocks, device_mod.read_pushes(model, blocks).values())}
    got = {b.key: dict(model.named_parameters())[b.name].detach().view(-1)[b.start:b.stop] for b in blocks}
    assert all(torch.equal(got[k], v) for k, v in values.items()) and pulled
    times = link.take_times()
    assert times["h2d_s"] > 0 and times["d2h_s"] > 0 and link.take_times() == {"h2d_s": 0.0, "d2h_s": 0.0}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def job(**kw):
    base = dict(dataset="digits", model="mlp", global_batch=48, workers=3, servers=2, iterations=8,
                eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=2000, batch_split=[5, 30, 13])
    return Config.from_dict({**base, **kw})


def test_the_gpu_path_on_cpu_is_the_reference_bit_for_bit(tmp_path, digits, monkeypatch):
    """Workers that stage every copy as a GPU worker does (host buffers, read once,
    written once) end where single-process SGD ends: copies change no bit."""
    init = DeviceLink.__init__
    monkeypatch.setattr(DeviceLink, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "staged": True}))
    cfg = job(device="auto")  # auto: the CPU here
    run_threads(cfg, tmp_path, digits)
    ref = train_reference(cfg, data=digits).state_dict()
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    iters = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    iters = [r for r in iters if r.get("type") == "iteration"]
    assert all(len(r["h2d_s"]) == 3 and min(r["d2h_s"]) > 0 for r in iters)


def test_bf16_mixed_trains_under_autocast(tmp_path, digits):
    cfg = job(precisions=["bf16-mixed", "32", "bf16-mixed"])
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["status"] == "completed"
    ref = train_reference(job(), data=digits).state_dict()
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    # the forward in bfloat16 (8 bits of mantissa) changes the gradients: not the reference
    assert not all(torch.equal(got[k], ref[k]) for k in ref)
    assert all(torch.allclose(got[k], ref[k], atol=0.05) for k in ref)


def test_deterministic_turns_on_torchs_deterministic_algorithms(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        device_mod.set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
        import os
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS's reproducible workspace
    finally:
        torch.use_deterministic_algorithms(before)


OOM_MODEL = '''
import torch
from torch import nn


IN_BACKWARD = False  # where the step runs out of memory: its forward, or its backward


def oom(n):
    raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (emulated) with {n} samples")


class Boom(torch.autograd.Function):
    """Identity whose backward runs out of memory above 20 samples: the last layer's
    gradients are final by then (streamed, with backward_push)."""

    @staticmethod
    def forward(ctx, x):
        ctx.n = x.shape[0]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.n > 20:
            oom(ctx.n)
        return g


class Limited(nn.Module):
    """An MLP whose step runs out of (emulated) device memory above 20 samples."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, num_classes))

    def forward(self, x):
        if not self.training:  # training steps only (the evaluation is batched by 1000)
            return self.net(x)
        if IN_BACKWARD:
            return self.net[3](Boom.apply(self.net[:3](x)))
        if x.shape[0] > 20:
            oom(x.shape[0])
        return self.net(x)


def build(input_shape, num_classes):
    return Limited(input_shape, num_classes)
'''


@pytest.mark.parametrize("streamed", [False, True])
def test_a_worker_running_out_of_memory_is_capped_and_its_slice_split_again(tmp_path, digits, monkeypatch,
                                                                            streamed):
    """Worker 1's slice of 30 does not fit (above 20 the model raises CUDA's
    out-of-memory error): its cap drops, the 30 samples are cut again among the workers
    within their caps, and the job ends as single-process SGD on the global batch does
    (any split of it is the same step, up to float rounding of the sums: 1e-5).
    `streamed`: the step runs out of memory in its backward, with backward_push,
    forward_pull and eager_update on: the last layer's fragments have left (the server
    drops them), and the pull for the next version, sent ahead before the backward,
    is the one the worker then takes."""
    (tmp_path / "limited.py").write_text(OOM_MODEL.replace("IN_BACKWARD = False", f"IN_BACKWARD = {streamed}"))
    extra = dict(backward_push=True, forward_pull=True, eager_update=True, fragment_kb=1) if streamed else {}
    cfg = job(model=f"{tmp_path / 'limited.py'}:build", batch_split=[5, 30, 13], **extra)
    seen = []  # at each out-of-memory: fragments sent in this step? the next pull sent ahead?
    handle = Worker._out_of_memory
    monkeypatch.setattr(Worker, "_out_of_memory", lambda self, *a: (
        seen.append((any(e[0] == "fragment" for e in self.client.timeline), self._next_pull is not None)),
        handle(self, *a))[1])
    run = tmp_path / "run"
    run.mkdir()
    summary = run_threads(cfg, run, digits)
    assert summary["status"] == "completed" and summary["samples"] == 8 * 48
    assert seen and all(s == (streamed, streamed) for s in seen), seen
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    ooms = [r for r in records if r.get("event") == "out_of_memory"]
    assert ooms and ooms[0]["worker"] == 1 and ooms[0]["batch"] == 30 and ooms[0]["cap"] == 22
    assert sum(size for _, size in ooms[0]["shares"]) == 30
    assert all(size <= 20 for r in records if r.get("type") == "iteration" for size in r["batch"])
    # the reference: the same model without the limit (the same initial weights), batches of 48
    (tmp_path / "unlimited.py").write_text(OOM_MODEL.replace("x.shape[0] > 20", "False"))
    ref = train_reference(job(model=f"{tmp_path / 'unlimited.py'}:build"), data=digits).state_dict()
    got = torch.load(run / "model.pt", weights_only=True)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)


def test_a_memory_probe_caps_a_workers_share(tmp_path, digits, monkeypatch):
    """An injected probe: worker 2's device holds 10 samples (base 100 B + 10 B a
    sample against a 200 B budget), below its equal share of 16: it gets at most 10, the
    others take the rest, and BSP still ends at the reference."""
    def probe(step, device, share=1, **kw):
        import threading
        return device_mod.MemoryProbe(100.0, 10.0, 200.0) if threading.current_thread().name == "worker2" else None

    monkeypatch.setattr(probes_mod, "probe_memory", probe)
    cfg = job(batch_split=[])
    summary = run_threads(cfg, tmp_path, digits)
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["cap"] for r in records if r.get("event") == "memory_cap"] == [10]
    iters = [r for r in records if r.get("type") == "iteration"]
    assert all(r["batch"][r["workers"].index(2)] <= 10 and sum(r["batch"]) == 48 for r in iters)
    ref = train_reference(cfg, data=digits).state_dict()
    got = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.allclose(got[k], ref[k], atol=1e-5) for k in ref)
