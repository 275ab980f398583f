"""equipoise on one GPU: the checks a CPU machine cannot make, in one prepared script of
at most 8 minutes (one H200 here; torch 2.11, Python 3.12). Writes one results file.

(a) BSP with 4 workers sharing the GPU against the single-process reference (on CPU):
    an MLP, so that no TF32 convolution enters (torch's default for cuDNN); float32
    sums in another order differ by a few ulps a step, ~1e-7 relative, which 20 SGD steps
    at lr 0.05 cannot grow past 1e-5 absolute on these weights (|w| < 1): the tolerance
    of the CPU tests that compare splits.
(b) The framework's overhead on a fast device: 1 equipoise worker (and one CPU server)
    against a plain PyTorch loop on the same GPU, same model, batch and optimizer, for
    ResNet-20 (synthetic CIFAR-sized images: benchmarks/gpu_data.py) and the byte-level
    GPT of examples/workloads/fortunes_lm.py (on the fortunes text if it travelled,
    .gpu-data/fortunes, else skipped). Samples/s over a steady window (the first
    iterations dropped), 3 interleaved rounds; goal ≥ 0.9× the plain loop.
(c) LB-BSP against BSP with 4 workers slowed [1, 1, 2, 4] on the GPU (ResNet-20):
    samples/s over the steady window, 3 interleaved rounds; goal ≥ 2×.
(d) The memory cap: 2 workers, worker 0 limited to `memory_limit` GiB (torch enforces
    it: above, a step runs out of memory), its cap from the probe below its equal share;
    it must get at most its cap and the job must complete.

What the machine lacks travels with the script (benchmarks/gpu_wheels.sh makes
.gpu-wheels/ and .gpu-data/ here; both are ignored by git):

    pip install -q --no-index --no-deps .gpu-wheels/*.whl && \\
        PYTHONPATH=src:. python benchmarks/gpu_check.py --out $OUT/gpu_check.json --commit <sha>

`--dry-run` runs every part tiny on CPU (device = "cpu"), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FORTUNES = ROOT / ".gpu-data" / "fortunes"
IMAGES = "benchmarks/gpu_data.py:images"
LM = "examples/workloads/fortunes_lm.py"


def steady_rate(run: Path, skip: int) -> float:
    """Samples/s over the iterations after the first `skip` (elapsed between records)."""
    iters = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in iters if r.get("type") == "iteration"]
    if len(iters) <= skip + 1:
        return math.nan
    window = iters[skip:]
    seconds = window[-1]["elapsed"] - window[0]["elapsed"]
    return sum(sum(r["batch"]) for r in window[1:]) / seconds if seconds > 0 else math.nan


def train(cfg: dict, tmp: Path) -> tuple[dict, Path]:
    import equipoise

    out = tmp / f"run-{time.monotonic_ns()}"
    return equipoise.train(cfg, out=out), out


def base(device: str, **kw) -> dict:
    return {**dict(dataset=IMAGES, model="resnet20", device=device, eval_every=0, checkpoint_every=0,
                   progress=False, timeout=300.0, heartbeat_s=10.0, transport="ipc", optimizer="sgd",
                   lr=0.05, momentum=0.9), **kw}


# -- (a) ---------------------------------------------------------------------------------
def part_a(device: str, tmp: Path, small: bool) -> dict:
    from equipoise.config import Config
    from equipoise.reference import train_reference

    cfg = base(device, model="mlp", workers=4, servers=2, global_batch=128, iterations=4 if small else 20,
               deterministic=True)
    summary, run = train(cfg, tmp)
    ref = train_reference(Config.from_dict(cfg)).state_dict()
    got = torch.load(run / "model.pt", weights_only=True)
    diff = max(float((got[k] - ref[k]).abs().max()) for k in ref)
    return {"status": summary["status"], "max_abs_diff": diff, "tolerance": 1e-5, "ok": diff <= 1e-5}


# -- (b) ---------------------------------------------------------------------------------
def plain_loop(model_name: str, device: str, batch: int, iterations: int, skip: int) -> float:
    """A plain PyTorch loop: batches from the same dataset, moved to the device, forward,
    backward, step; samples/s after `skip` iterations."""
    from equipoise.config import Config
    from equipoise.models import build_model
    from equipoise.workload import load_workload

    cfg = Config.from_dict(workload(model_name, device, batch, iterations))
    data = load_workload(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
    opt = (torch.optim.Adam(model.parameters(), lr=cfg.lr) if cfg.optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum))
    loader = torch.utils.data.DataLoader(data.train, batch_size=batch, shuffle=True, drop_last=True,
                                         collate_fn=data.collate)
    it, t0, done = iter(loader), None, 0
    for step in range(iterations):
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        from equipoise.device import to_device
        b = to_device(b, torch.device(device), non_blocking=True)
        opt.zero_grad(set_to_none=False)
        data.loss_of(model, b, batch).objective.backward()
        opt.step()
        if step == skip:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        elif step > skip:
            done += batch
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return done / (time.perf_counter() - t0)


def workload(model_name: str, device: str, batch: int, iterations: int) -> dict:
    if model_name == "gpt":
        return base(device, dataset=f"{LM}:blocks", data_dir=str(FORTUNES), model=f"{LM}:gpt",
                    loss=f"{LM}:next_byte_loss", metrics=f"{LM}:metrics", optimizer="adam", lr=0.003,
                    workers=1, servers=1, global_batch=batch, iterations=iterations, block_size=65536)
    return base(device, workers=1, servers=1, global_batch=batch, iterations=iterations)


def part_b(device: str, tmp: Path, small: bool) -> dict:
    from benchmarks.common import interleave, summary

    iterations, skip, reps = (6, 2, 1) if small else (150, 30, 3)
    out: dict[str, Any] = {}
    for name, batch in (("resnet20", 128), ("gpt", 32)):
        if name == "gpt" and not FORTUNES.is_dir():
            out[name] = {"skipped": f"{FORTUNES.relative_to(ROOT)} is missing (benchmarks/gpu_wheels.sh copies it)"}
            continue
        cfg = workload(name, device, batch, iterations)
        runs = interleave({"plain": lambda: plain_loop(name, device, batch, iterations, skip),
                           "equipoise": lambda: steady_rate(train(cfg, tmp)[1], skip)}, reps)
        ratios = [e / p for e, p in zip(runs["equipoise"], runs["plain"])]
        out[name] = {"batch": batch, "iterations": iterations, "skip": skip,
                     "plain_samples_per_s": summary(runs["plain"]), "equipoise_samples_per_s": summary(runs["equipoise"]),
                     "ratio": summary(ratios), "goal": 0.9}
    return out


# -- (c) ---------------------------------------------------------------------------------
def part_c(device: str, tmp: Path, small: bool) -> dict:
    from benchmarks.common import interleave, summary

    iterations, skip, reps = (6, 2, 1) if small else (40, 10, 3)
    cfg = base(device, workers=4, servers=2, global_batch=256, iterations=iterations, slowdown=[1.0, 1.0, 2.0, 4.0])
    runs = interleave({p: (lambda p=p: steady_rate(train({**cfg, "protocol": p}, tmp)[1], skip))
                       for p in ("bsp", "lbbsp")}, reps)
    return {"iterations": iterations, "skip": skip, "slowdown": [1, 1, 2, 4],
            "bsp_samples_per_s": summary(runs["bsp"]), "lbbsp_samples_per_s": summary(runs["lbbsp"]),
            "ratio": summary([lb / b for lb, b in zip(runs["lbbsp"], runs["bsp"])]), "goal": 2.0}


# -- (d) ---------------------------------------------------------------------------------
def part_d(device: str, tmp: Path, small: bool, limit_gib: float) -> dict:
    cfg = base(device, workers=2, servers=1, global_batch=2048, iterations=2 if small else 8,
               memory_limits=[limit_gib, 0.0])
    summary, run = train(cfg, tmp)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    caps = {r["worker"]: r["cap"] for r in records if r.get("event") == "memory_cap"}
    ooms = [r for r in records if r.get("event") == "out_of_memory"]
    batches = [r["batch"][r["workers"].index(0)] for r in records if r.get("type") == "iteration" and 0 in r["workers"]]
    cap = caps.get(0)
    return {"status": summary["status"], "memory_limit_gib": limit_gib, "cap": caps, "equal_share": 1024,
            "worker0_batches": batches, "out_of_memory_events": ooms,
            # the check only means something if the probe capped worker 0 below its share
            "ok": summary["status"] == "completed" and cap is not None and cap < 1024
                  and max(batches, default=0) <= cap}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the results file to write")
    ap.add_argument("--commit", default="", help="the commit this checkout is (the GPU machine has no git)")
    ap.add_argument("--dry-run", action="store_true", help="every part tiny, on CPU")
    ap.add_argument("--parts", default="abcd")
    ap.add_argument("--memory-limit", type=float, default=0.25, help="(d): GiB worker 0 may use")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (use --dry-run to check the script on CPU)", file=sys.stderr)
        return 2
    from benchmarks.common import machine_info

    result: dict[str, Any] = {
        "benchmark": "gpu_check", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv,
        "commit": args.commit, "machine": machine_info(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "dry_run": args.dry_run, "parts": {}}
    t_start = time.perf_counter()
    parts = {"a": lambda tmp: part_a(device, tmp, args.dry_run), "b": lambda tmp: part_b(device, tmp, args.dry_run),
             "c": lambda tmp: part_c(device, tmp, args.dry_run),
             "d": lambda tmp: part_d(device, tmp, args.dry_run, args.memory_limit)}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as name:
        for key in args.parts:
            t0 = time.perf_counter()
            try:
                result["parts"][key] = parts[key](Path(name))
            except Exception as exc:  # one part failing keeps the others' results
                result["parts"][key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            result["parts"][key]["seconds"] = time.perf_counter() - t0
            Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")  # after every part
            print(f"part {key}: {json.dumps(result['parts'][key], default=str)[:400]}", flush=True)
    result["seconds"] = time.perf_counter() - t_start
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
