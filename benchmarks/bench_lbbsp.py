"""LB-BSP under worker stragglers: BSP, LB-BSP (each predictor), ASP and PyTorch DDP.

Four emulated machines on this 2-core box. Each is `base` times slower than one core
here (every step stretched in-process, equipoise.runtime.stretch: spread through the
forward and backward passes, charged on the step's usual CPU time), so the four together
use about 0.7 of a core and fit the box as four separate machines would; worker i is
`slowdown[i]` times slower again. The ideal throughput is the sum of the workers'
standalone speeds: each factor's worker run alone (one worker, batch X/λ, the same
stretch) in the same invocation, once before the systems and once after (averaged, so a
drift of the shared host over the run does not favour either side).

Scenarios: "static" (slowdown = [1, 1, 2, 4]); "trace" (the 4× worker changes every
`period` seconds, from a generated CSV); "neighbour" (no emulated slowdown between the
workers: a real CPU burner joins one worker's cgroup at a time and competes for its CPU
quota, moving every `period` s; the ideal counts one worker at its measured speed beside
such a burner).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import preset_main, load_average, markdown_table, ratio, write_results
from benchmarks.ddp_straggler import run_ddp_straggler
from equipoise.report.replay import replay_mape

NAME = "bench_lbbsp"
ACCURACY = 0.85


@dataclass(frozen=True)
class Spec:
    scenario: str = "static"
    model: str = "cnn"
    dataset: str = "fashion-mnist"
    workers: int = 4
    servers: int = 2
    global_batch: int = 512
    iterations: int = 240
    lr: float = 0.1
    momentum: float = 0.9
    slowdown: tuple[float, ...] = (1.0, 1.0, 2.0, 4.0)
    base: float = 4.0  # every emulated machine is this many times slower than one core here
    cpu: float = 0.0  # a cgroup CPU quota per worker on top (0: none)
    period: float = 20.0
    eval_every: int = 10
    eval_samples: int = 2000
    standalone_iterations: int = 25
    transport: str = "ipc"
    seed: int = 0

    def job(self, **kw: Any) -> dict[str, Any]:
        base = dict(model=self.model, dataset=self.dataset, workers=self.workers,
                    servers=self.servers, global_batch=self.global_batch,
                    iterations=self.iterations, lr=self.lr, momentum=self.momentum,
                    cpu_limit=[self.cpu] * self.workers if self.cpu else [], eval_every=self.eval_every,
                    eval_samples=self.eval_samples, checkpoint_every=0, progress=False,
                    transport=self.transport, seed=self.seed, timeout=300.0)
        base.update(kw)
        return base


PRESETS = {
    "ci": Spec(dataset="digits", model="mlp", global_batch=64, iterations=40, eval_every=20,
               eval_samples=0, standalone_iterations=20),
    "full": Spec(),
    # X = 128: the barrier's fixed costs (last push → update → pulls) weigh 4× as much.
    "small-batch": Spec(global_batch=128, iterations=500, lr=0.05, eval_every=25,
                        standalone_iterations=60),
    "trace": Spec(scenario="trace", iterations=240, period=20.0),
    # cpu: each worker's cgroup quota, which the burner shares; the worker alone uses
    # about 1/base of it.
    "neighbour": Spec(scenario="neighbour", iterations=240, period=20.0, slowdown=(1, 1, 1, 1), cpu=0.5),
}


# -- scenario plumbing -------------------------------------------------------------------

def scenario_keys(spec: Spec, tmp: Path) -> dict[str, Any]:
    """Config keys that create the scenario's stragglers."""
    if spec.scenario == "static":
        return {"slowdown": [spec.base * f for f in spec.slowdown]}
    if spec.scenario == "trace":
        rows = ["time,worker,factor"]
        for k in range(64):  # the slow worker moves every `period` seconds
            rows += [f"{k * spec.period},{w},{spec.slowdown[(w + k) % spec.workers]}"
                     for w in range(spec.workers)]
        path = tmp / "trace.csv"
        path.write_text("\n".join(rows) + "\n")
        return {"trace": str(path), "slowdown": [spec.base] * spec.workers}  # the trace multiplies it
    if spec.scenario == "neighbour":
        return {"slowdown": [spec.base] * spec.workers,
                "neighbours": [{"worker": k % spec.workers, "start": k * spec.period,
                                "stop": (k + 1) * spec.period} for k in range(64)]}
    raise ValueError(f"scenario = {spec.scenario!r}")


# -- runs --------------------------------------------------------------------------------

def run_equipoise(spec: Spec, protocol: str, tmp: Path, **kw: Any) -> dict[str, Any]:
    import equipoise

    out = tmp / f"{protocol}-{kw.get('predictor', '')}-{time.monotonic_ns()}"
    summary = equipoise.train(spec.job(protocol=protocol, **scenario_keys(spec, tmp), **kw), out=out)
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r.get("type") == "eval"]
    return {"samples_per_s": summary["samples_per_s"],
            "barrier_wait_fraction": summary["barrier_wait_fraction"],
            "final_accuracy": summary["final_accuracy"],
            "time_to_accuracy_s": time_to_accuracy(evals),
            "train_s": summary["train_s"],
            "predictor_mape": replay_mape(out) if protocol == "lbbsp" else None,
            "staleness_mean": summary["staleness_mean"], "run_dir": str(out)}


def time_to_accuracy(evals: list[dict], target: float = ACCURACY) -> float:
    """Training seconds at the first evaluation reaching `target` (NaN if none did)."""
    for r in sorted(evals, key=lambda r: r["elapsed"]):
        if r["test_accuracy"] is not None and r["test_accuracy"] >= target:
            return float(r["elapsed"])
    return math.nan


def standalone_speeds(spec: Spec, tmp: Path, tag: str = "") -> dict[str, float]:
    """samples/s of one worker alone (batch X/λ) at each distinct slowdown factor, and in
    the neighbour scenario beside a burner for the whole run ("neighbour")."""
    import equipoise

    runs: dict[str, dict[str, Any]] = {}
    for factor in sorted(set(spec.slowdown) | {1.0}):
        runs[str(float(factor))] = {"slowdown": [spec.base * factor]}
    if spec.scenario == "neighbour":
        runs["neighbour"] = {"slowdown": [spec.base], "neighbours": [{"worker": 0, "start": 0.0}]}
    speeds = {}
    for name, keys in runs.items():
        cfg = spec.job(protocol="bsp", workers=1, global_batch=spec.global_batch // spec.workers,
                       iterations=spec.standalone_iterations, cpu_limit=[spec.cpu] if spec.cpu else [],
                       eval_every=0, **keys)
        speeds[name] = equipoise.train(cfg, out=tmp / f"standalone-{name}{tag}")["samples_per_s"]
    return speeds


def ideal_throughput(spec: Spec, speeds: dict[str, float]) -> float:
    """Σ standalone speeds. In the trace scenario the factors are a rotation of
    `slowdown`, so the sum is the same at every moment; in the neighbour scenario one
    worker at a time has the burner beside it."""
    if spec.scenario == "neighbour":
        return speeds["1.0"] * (spec.workers - 1) + speeds["neighbour"]
    return sum(speeds[str(float(f))] for f in spec.slowdown)


def run_all(spec: Spec, plots: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-lbbsp-") as name:
        tmp = Path(name)
        result = _run_all(spec, tmp)
        if plots is not None:
            result["plots"] = [str(p) for p in make_plots(result, plots, spec)]
        return result


def make_plots(result: dict[str, Any], folder: Path, spec: Spec) -> list[Path]:
    """Batch sizes and time split of the BSP and LB-BSP (NARX) runs, and accuracy
    against training time of every equipoise run, as PNGs named after the scenario."""
    from equipoise.report.plots import load_run, plot_accuracy, plot_batch_sizes, plot_time_split

    folder.mkdir(parents=True, exist_ok=True)
    runs = {name: load_run(r["run_dir"]) for name, r in result["results"].items() if "run_dir" in r}
    out = [plot_accuracy(runs, folder / f"lbbsp-{spec.scenario}-accuracy.png")]
    for name in ("bsp", "lbbsp-narx", "lbbsp-ewma"):
        out.append(plot_batch_sizes(runs[name], folder / f"lbbsp-{spec.scenario}-{name}-batch.png"))
        out.append(plot_time_split(runs[name], folder / f"lbbsp-{spec.scenario}-{name}-split.png"))
    return out


def _run_all(spec: Spec, tmp: Path) -> dict[str, Any]:
    before = standalone_speeds(spec, tmp, "-before")
    systems = {
        "bsp": lambda: run_equipoise(spec, "bsp", tmp),
        "lbbsp-last": lambda: run_equipoise(spec, "lbbsp", tmp, predictor="last"),
        "lbbsp-ewma": lambda: run_equipoise(spec, "lbbsp", tmp, predictor="ewma"),
        "lbbsp-narx": lambda: run_equipoise(spec, "lbbsp", tmp, predictor="narx"),
        # ASP at the BSP rate diverges here (stale momentum-SGD steps; NaN within ~20
        # iterations), so it runs at α/λ, the rate of its λ-times-more-frequent updates.
        "asp": lambda: run_equipoise(spec, "asp", tmp, lr=spec.lr / spec.workers),
    }
    if spec.scenario == "static":
        systems["ddp"] = lambda: run_ddp_straggler(spec)
    results = {name: _attempt(fn) for name, fn in systems.items()}
    after = standalone_speeds(spec, tmp, "-after")
    speeds = {k: (before[k] + after[k]) / 2 for k in before}
    ideal = ideal_throughput(spec, speeds)
    bsp = results["bsp"]
    for r in results.values():
        r["vs_ideal"] = ratio(r["samples_per_s"], ideal)
        r["vs_bsp"] = ratio(r["samples_per_s"], bsp["samples_per_s"])
        r["time_to_accuracy_vs_bsp"] = ratio(r["time_to_accuracy_s"], bsp["time_to_accuracy_s"])
    return {"spec": asdict(spec), "standalone_speeds": speeds, "standalone_before": before,
            "standalone_after": after, "ideal_samples_per_s": ideal, "results": results}


def _attempt(fn) -> dict[str, Any]:
    """Run one system; a failure (e.g. divergence) becomes a row saying so."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"error": f"{type(exc).__name__}: {exc}"[:300], "samples_per_s": math.nan,
                "time_to_accuracy_s": math.nan, "final_accuracy": math.nan}


def table(result: dict[str, Any]) -> str:
    rows = []
    for name, r in result["results"].items():
        if "error" in r:
            rows.append([name, "failed: " + r["error"][:60]] + [None] * 6)
            continue
        rows.append([name, r["samples_per_s"], r["vs_ideal"], r["vs_bsp"],
                     r.get("barrier_wait_fraction"), r["time_to_accuracy_s"],
                     r["time_to_accuracy_vs_bsp"], r["final_accuracy"]])
    return markdown_table(["system", "samples/s", "× ideal", "× BSP", "barrier wait",
                           f"s to {ACCURACY:.0%}", "t-to-acc × BSP", "final acc"], rows)


def mape_table(result: dict[str, Any]) -> str:
    rows = []
    for name, r in result["results"].items():
        if r.get("predictor_mape"):
            m = r["predictor_mape"]
            rows.append([name, m.get("last"), m.get("ewma"), m.get("narx")])
    return markdown_table(["run (predictor driving sizes)", "MAPE last", "MAPE ewma", "MAPE narx"], rows)


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    load = load_average()
    result = run_all(spec, Path(plots) if plots else None)
    result["preset"], result["loadavg_at_start"] = preset, load
    print(f"## LB-BSP benchmark, preset {preset} (scenario {spec.scenario}, {spec.workers} workers, each "
          f"{spec.base}x slower than a core" + (f" in a {spec.cpu}-CPU quota" if spec.cpu else "") +
          f", slowdown {list(spec.slowdown)}, {spec.model} on {spec.dataset}, "
          f"X = {spec.global_batch}, {spec.iterations} iterations)\n")
    print(f"standalone speeds (samples/s, mean of before and after): "
          f"{ {k: round(v) for k, v in result['standalone_speeds'].items()} }; "
          f"ideal = {result['ideal_samples_per_s']:.0f} samples/s\n")
    print(table(result))
    print("\nPredictor error (every predictor replayed over each LB-BSP run's recorded speeds):\n")
    print(mape_table(result))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for PNG plots of the runs (e.g. docs/img)")
