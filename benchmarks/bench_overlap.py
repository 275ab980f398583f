"""Communication hidden behind computation: BSP exchanging after backward (`off`), with
each step's gradients pushed while backward runs (`push`: `backward_push = true`), and
with the next forward also started on the first layers' weights (`pipelined`: and
`forward_pull = true`), and with each block also updated by its server as soon as all
of its gradients are in (`eager`: and `eager_update = true`), interleaved in one
invocation (off, push, pipelined, eager, off, ...), per model.

For each model the same job (4 workers, 2 servers, one torch thread each, SGD or Adam as
the model's workload trains) runs `iterations` iterations; reported per run, over the
iterations after `warmup` (a steady window, no cold start):

* `samples_per_s`: samples of the window over its seconds (iteration records' `time`);
* `gap_s`: the median over workers and iterations of the time from the end of a worker's
  backward to the start of its next forward (the exchange, the barrier and the plan,
  where they are not hidden): the issue of this benchmark;
* `compute_s`: the median step (forward and backward) time.

The summary per model: medians with (min–max) of each, and the ratio of each side's
samples/s to `off` within each round. Models: `cnn` (Fashion-MNIST, the default job), `resnet20` (CIFAR-sized
images labelled by a fixed random teacher: benchmarks/gpu_data.py), `gpt` (the byte-level
GPT of examples/workloads/fortunes_lm.py on Debian's fortunes).

Run from the repository root::

    python -m benchmarks.bench_overlap --preset ci
    python -m benchmarks.bench_overlap --preset full
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (fmt_range, interleave, load_average, markdown_table, preset_main, ratio,
                               summary, write_results)

NAME = "bench_overlap"
LM = "examples/workloads/fortunes_lm.py"
IMAGES = "benchmarks/gpu_data.py:images"

WORKLOADS: dict[str, dict[str, Any]] = {
    "cnn": dict(dataset="fashion-mnist", model="cnn", global_batch=128, optimizer="sgd", lr=0.05, momentum=0.9),
    "resnet20": dict(dataset=IMAGES, model="resnet20", global_batch=64, optimizer="sgd", lr=0.05, momentum=0.9),
    "gpt": dict(dataset=f"{LM}:blocks", model=f"{LM}:gpt", loss=f"{LM}:next_byte_loss", metrics=f"{LM}:metrics",
                optimizer="adam", lr=0.003, global_batch=32, block_size=65536),
    "mlp": dict(dataset="digits", model="mlp", global_batch=64, optimizer="sgd", lr=0.05, momentum=0.9),
}


@dataclass(frozen=True)
class Preset:
    models: tuple[str, ...]
    iterations: int
    warmup: int
    reps: int


PRESETS = {"ci": Preset(("mlp",), 8, 2, 1), "full": Preset(("cnn", "resnet20", "gpt"), 40, 5, 3)}


SIDES = {"off": {}, "push": {"backward_push": True}, "pipelined": {"backward_push": True, "forward_pull": True},
         "eager": {"backward_push": True, "forward_pull": True, "eager_update": True}}


def run_job(model: str, iterations: int, warmup: int, side: str) -> dict[str, Any]:
    import equipoise

    cfg = dict(WORKLOADS[model], protocol="bsp", workers=4, servers=2, iterations=iterations, threads=1,
               eval_every=0, checkpoint_every=0, progress=False, timeout=300.0, seed=0, **SIDES[side])
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        equipoise.train(cfg, out=Path(tmp) / "run")
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in records if r.get("type") == "iteration" and r["iteration"] >= warmup - 1]
    seconds = its[-1]["time"] - its[0]["time"]
    window = its[1:]
    gaps = [g for r in window for g in r["gap_s"] if g is not None]
    return {"samples_per_s": sum(sum(r["batch"]) for r in window) / seconds if seconds > 0 else float("nan"),
            "gap_s": statistics.median(gaps), "compute_s": statistics.median(c for r in window for c in r["compute_s"]),
            "iterations": len(window)}


def compare(preset: Preset, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in preset.models:
        runs = interleave({side: (lambda m=model, side=side: run_job(m, preset.iterations, preset.warmup, side))
                           for side in SIDES}, reps)
        out[model] = {
            **{f"{side}_{k}": summary([r[k] for r in runs[side]]) for side in SIDES
               for k in ("samples_per_s", "gap_s", "compute_s")},
            **{f"{side}_ratio": summary([ratio(b["samples_per_s"], a["samples_per_s"])
                                         for a, b in zip(runs["off"], runs[side])]) for side in SIDES if side != "off"},
            "runs": runs}
    return out


def results_table(result: dict[str, Any]) -> str:
    rows = []
    for model, r in result["models"].items():
        for side in SIDES:
            rows.append([model, side, fmt_range(r[f"{side}_samples_per_s"]),
                         "1" if side == "off" else fmt_range(r[f"{side}_ratio"]),
                         fmt_range(r[f"{side}_gap_s"], 4), fmt_range(r[f"{side}_compute_s"], 4)])
    return markdown_table(["model", "exchange", "samples/s", "÷ off, per round", "gap s (end of backward "
                           "to next forward)", "step compute s"], rows)


def run(preset: str, results: str | None = None, plots: str | None = None, reps: int | None = None) -> dict:
    p = PRESETS[preset]
    load = load_average()
    result = {"preset": preset, "reps": reps or p.reps, "iterations": p.iterations, "warmup": p.warmup,
              "loadavg_at_start": load, "models": compare(p, reps or p.reps)}
    print(f"## BSP, exchanging after backward vs pipelined (preset {preset}: 4 workers, 2 servers, "
          f"{p.iterations} iterations, window after {p.warmup}, medians (min–max) of {result['reps']} "
          f"interleaved rounds)\n")
    print(results_table(result))
    print(f"wrote {write_results(NAME, result, results)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "unused", reps=True)
