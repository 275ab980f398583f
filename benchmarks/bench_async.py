"""The protocols without a barrier at BSP's own settings: accuracy, delay compensation and
time to a target under a transient straggler.

A user tunes lr and momentum under BSP and switches to softsync, SSP or ASP to ride out a
straggler. With `async_scaling = "bsp"` (the default) the servers carry those settings
over (each update's rate scaled by its share of the global batch, its explicit momentum
lowered by what its measured delay implies: docs/rudra.md); `async_scaling = "none"` is
the step as it was, every update at the full rate and momentum.

Sections (a preset picks which run and at what size):

* "carry": the MLP on Fashion-MNIST, 4 workers, global batch 128, lr 0.1, momentum 0.9,
  3 epochs, nothing else set: hardsync; 4-softsync with per_gradient modulation under
  "bsp" and under "none"; SSP s = 2; ASP. The final test accuracy, and Δ against hardsync
  in the same round.
* "dc": the same at λ = 8 emulated learners (each step stretched 4×, so eight of them
  compute side by side on a 2-core box), n = 8: hardsync, Rudra's α0/σ as published
  (per_gradient under "none"), the "bsp" rule, and DC-ASGD (Zheng et al., ICML 2017,
  λ = 0.04 as in the paper's DC-ASGD-c) on top of it: accuracy and samples/s.
* "target": 4 workers, a transient 4× straggler (the slowdown moves to the next worker
  every 4 iterations), evaluation every 10 iterations, `stop_at_target`: hardsync,
  4-softsync and SSP s = 2 in time to a test accuracy (training seconds). The "target"
  preset runs it alone on emulated machines, each 4× slower than a core.

Every section runs its systems in `reps` interleaved rounds (round r: every system once,
at seed `seed + r`); figures are medians (min–max) over rounds, Δ and ratios computed
within each round. samples/s is on a steady window (the iterations after `warmup`).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_lbbsp import steady_window
from benchmarks.bench_rudra import rounds
from benchmarks.common import (
    fmt_range,
    git_state,
    load_average,
    markdown_table,
    preset_main,
    ratio,
    summary,
    write_results,
)

NAME = "bench_async"
MEASURES = ("final_accuracy", "samples_per_s", "staleness_mean", "time_to_target", "delay_mean", "momentum_mean",
            "train_s")


@dataclass(frozen=True)
class Spec:
    dataset: str = "fashion-mnist"
    model: str = "mlp"
    global_batch: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    epochs: float = 3.0
    workers: int = 4
    dc_workers: int = 8
    dc_base: float = 4.0          # each learner of the "dc" section is this many times slower than a core
    dc_lambda: float = 0.04
    target_accuracy: float = 0.82
    target_every: int = 10
    straggler: float = 4.0
    target_base: float = 1.0      # each worker of the "target" section is this many times slower than a core
    rotate: int = 4
    warmup: int = 30
    sections: tuple[str, ...] = ("carry", "dc", "target")
    reps: int = 3
    seed: int = 0


PRESETS = {
    "ci": Spec(dataset="digits", epochs=2.0, global_batch=64, dc_workers=4, dc_base=2.0, target_accuracy=0.5,
               target_every=4, warmup=3, reps=1),
    "full": Spec(),
    # The straggler on emulated machines (each step stretched 4x, so the four workers compute
    # side by side and a straggler's extra time is its own, not the shared cores').
    "target": Spec(sections=("target",), target_base=4.0),
}


def run_job(tmp: Path, label: str, warmup: int, **cfg: Any) -> dict[str, Any]:
    """One training run; a failure (a diverged run) is a row saying so."""
    import equipoise

    out = tmp / f"{label.replace(' ', '_').replace('/', '_')}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    settings = dict(progress=False, checkpoint_every=0, eval_every=0, timeout=300.0)
    settings.update(cfg)
    try:
        s = equipoise.train(settings, out=out)
        steady = steady_window(out / "metrics.jsonl", warmup)
    except Exception as exc:  # noqa: BLE001 - a diverged run is a result, reported as such
        return {"error": f"{type(exc).__name__}: {exc}"[:200], "wall_s": time.perf_counter() - t0,
                **{k: math.nan for k in MEASURES}}
    steps = s.get("async_steps") or {}
    reached = s.get("time_to_target")
    return {"final_accuracy": s["final_accuracy"], "samples_per_s": steady["samples_per_s"],
            "staleness_mean": s["staleness_mean"], "train_s": s["train_s"],
            "time_to_target": reached["elapsed"] if reached else math.nan,
            "target_iteration": reached["iteration"] if reached else None,
            "delay_mean": steps.get("delay_mean", math.nan), "momentum_mean": steps.get("momentum_mean", cfg.get("momentum")),
            "dc_compensated": s.get("dc_compensated"), "wall_s": time.perf_counter() - t0}


def summarise(runs: list[dict[str, Any]], reference: str) -> dict[str, Any]:
    names = [k for k in runs[0] if k != "seed"]
    out = {}
    for name in names:
        row = {k: summary([r[name][k] for r in runs]) for k in MEASURES}
        row["delta_points"] = summary([100 * (r[name]["final_accuracy"] - r[reference]["final_accuracy"])
                                       for r in runs])
        row["speedup"] = summary([ratio(r[name]["samples_per_s"], r[reference]["samples_per_s"]) for r in runs])
        row["time_to_target_ratio"] = summary([ratio(r[reference]["time_to_target"], r[name]["time_to_target"])
                                               for r in runs])
        row["errors"] = [r[name]["error"] for r in runs if "error" in r[name]]
        out[name] = row
    return out


def base(spec: Spec, **kw: Any) -> dict[str, Any]:
    cfg = dict(dataset=spec.dataset, model=spec.model, workers=spec.workers, global_batch=spec.global_batch,
               lr=spec.lr, momentum=spec.momentum, epochs=spec.epochs, servers=1)
    cfg.update(kw)
    return cfg


def carry(spec: Spec, tmp: Path) -> dict[str, Any]:
    b, n = base(spec), spec.workers
    job = lambda label, **kw: lambda seed: run_job(tmp, label, spec.warmup, seed=seed, **{**b, **kw})  # noqa: E731
    systems = {
        "hardsync": job("hardsync", protocol="bsp"),
        f"{n}-softsync per_gradient": job("softsync", protocol="softsync", softsync_n=n, lr_modulation="per_gradient"),
        f"{n}-softsync per_gradient, async_scaling none": job("softsync-none", protocol="softsync", softsync_n=n,
                                                             lr_modulation="per_gradient", async_scaling="none"),
        "ssp s=2": job("ssp", protocol="ssp", staleness_bound=2),
        "asp": job("asp", protocol="asp"),
    }
    runs = rounds(systems, spec)
    return {"systems": summarise(runs, "hardsync"), "rounds": runs}


def dc(spec: Spec, tmp: Path) -> dict[str, Any]:
    n = spec.dc_workers
    b = base(spec, workers=n, slowdown=[spec.dc_base] * n)
    job = lambda label, **kw: lambda seed: run_job(tmp, label, spec.warmup, seed=seed, **{**b, **kw})  # noqa: E731
    soft = dict(protocol="softsync", softsync_n=n)
    systems = {
        "hardsync": job("hardsync", protocol="bsp"),
        f"{n}-softsync α0/σ (async_scaling none)": job("rudra", **soft, lr_modulation="per_gradient",
                                                       async_scaling="none"),
        f"{n}-softsync async_scaling bsp": job("bsp-rule", **soft),
        f"{n}-softsync bsp + DC-ASGD": job("dc", **soft, delay_compensation="dc", dc_lambda=spec.dc_lambda),
    }
    runs = rounds(systems, spec)
    return {"systems": summarise(runs, "hardsync"), "rounds": runs}


def target(spec: Spec, tmp: Path) -> dict[str, Any]:
    n = spec.workers
    lines = ["iteration,worker,factor"]
    horizon = int(spec.epochs * 70_000 / spec.global_batch) + spec.rotate
    for k in range(0, horizon, spec.rotate):
        lines += [f"{k},{w},{spec.straggler if w == (k // spec.rotate) % n else 1.0}" for w in range(n)]
    trace = tmp / "rotate.csv"
    trace.write_text("\n".join(lines) + "\n")
    b = base(spec, trace=str(trace), eval_every=spec.target_every, stop_at_target=True,
             slowdown=[spec.target_base] * n,
             target={"metric": "test_accuracy", "above": spec.target_accuracy})
    job = lambda label, **kw: lambda seed: run_job(tmp, label, spec.warmup, seed=seed, **{**b, **kw})  # noqa: E731
    systems = {
        "hardsync": job("hardsync", protocol="bsp"),
        f"{n}-softsync": job("softsync", protocol="softsync", softsync_n=n),
        "ssp s=2": job("ssp", protocol="ssp", staleness_bound=2),
    }
    runs = rounds(systems, spec)
    return {"systems": summarise(runs, "hardsync"), "rounds": runs}


def accuracy_table(systems: dict[str, Any], speed: bool = False) -> str:
    rows = []
    for name, s in systems.items():
        acc = fmt_range({k: 100 * v for k, v in s["final_accuracy"].items() if k != "values"})
        if s["errors"]:
            acc += f" ({len(s['errors'])} failed: {s['errors'][0][:40]})"
        row = [name, acc, fmt_range(s["delta_points"]), fmt_range(s["staleness_mean"]),
               fmt_range(s["delay_mean"]), fmt_range(s["momentum_mean"])]
        if speed:
            row += [fmt_range(s["samples_per_s"]), fmt_range(s["speedup"])]
        rows.append(row)
    head = ["system", "final acc %", "Δ vs hardsync (points)", "mean σ", "mean delay τ̄", "explicit momentum"]
    return markdown_table(head + (["samples/s", "× hardsync"] if speed else []), rows)


def target_table(systems: dict[str, Any]) -> str:
    return markdown_table(["system", "time to target (s)", "hardsync ÷ this", "samples/s", "final acc %"],
                          [[name, fmt_range(s["time_to_target"]), fmt_range(s["time_to_target_ratio"]),
                            fmt_range(s["samples_per_s"]),
                            fmt_range({k: 100 * v for k, v in s["final_accuracy"].items() if k != "values"})]
                           for name, s in systems.items()])


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average(),
                              "git_at_start": git_state()}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as name:
        tmp = Path(name)
        if "carry" in spec.sections:
            res = result["carry"] = carry(spec, tmp)
            print(f"## BSP's settings under every protocol, preset {preset}: {spec.model} on {spec.dataset}, "
                  f"{spec.workers} workers, X = {spec.global_batch}, lr {spec.lr}, momentum {spec.momentum}, "
                  f"{spec.epochs} epochs; median (min–max) of {spec.reps} rounds\n")
            print(accuracy_table(res["systems"]))
        if "dc" in spec.sections:
            res = result["dc"] = dc(spec, tmp)
            print(f"\n## n = λ = {spec.dc_workers} emulated learners ({spec.dc_base}× a core each), preset {preset}\n")
            print(accuracy_table(res["systems"], speed=True))
        if "target" in spec.sections:
            res = result["target"] = target(spec, tmp)
            print(f"\n## Time to test accuracy {spec.target_accuracy} under a transient {spec.straggler}× straggler "
                  f"(moving every {spec.rotate} iterations), preset {preset}\n")
            print(target_table(res["systems"]))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "unused")
