"""LB-BSP under worker stragglers: BSP, LB-BSP, ASP and PyTorch DDP against the ideal.

Four emulated machines on this 2-core box. Each is `base` times slower than one core
here (every step stretched in-process, equipoise.worker.stretch: the forward and backward
passes and the step's other local work — unpacking pulled weights, packing pushes, the
report — charged on their usual CPU time), so the four together use about 0.7 of a core
and fit the box as four separate machines would; worker i is `slowdown[i]` times slower
again, and with `noise` > 0 each of its steps is noisier in proportion to its factor.

Each repetition ("round") runs every system once, in turn (BSP, LB-BSP, ASP, DDP, then
the standalone runs), and `reps` rounds are interleaved. Every throughput is measured on
a steady window: samples over the iterations after `warmup`, divided by the time from
the end of iteration `warmup − 1` to the end of the last (metrics.jsonl's iteration
records; DDP's rank 0 clock over the same window). Ratios are computed within a round
and summarised over rounds (median, min–max).

The ideal is the sum of the workers' standalone speeds: in each round, each distinct
factor's worker run alone (one worker, one server) at the batch LB-BSP gave workers of
that factor in the same round (the median over LB-BSP's steady window), for `warmup` +
`standalone_iterations` iterations, measured on the same steady window. ASP, which has
no barrier, is the other bound: LB-BSP is reported against both.

LB-BSP computes exactly BSP's updates (the oracle tests show the weights equal), so its
accuracy after any number of iterations is BSP's and its time to accuracy is BSP's scaled
by the throughput ratio; this benchmark reports throughput only (and each run's final
training loss, as a check that ASP, which computes different updates, trained).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import (
    fmt_range,
    git_state,
    interleave,
    load_average,
    markdown_table,
    preset_main,
    ratio,
    summary,
    write_results,
)
from benchmarks.ddp_straggler import run_ddp_straggler
from equipoise.report.replay import replay_mape

NAME = "bench_lbbsp"
SYSTEMS = ("bsp", "lbbsp", "asp", "ddp")


@dataclass(frozen=True)
class Spec:
    model: str = "cnn"
    dataset: str = "fashion-mnist"
    workers: int = 4
    servers: int = 2
    global_batch: int = 512
    iterations: int = 120
    lr: float = 0.1
    momentum: float = 0.9
    slowdown: tuple[float, ...] = (1.0, 1.0, 2.0, 4.0)
    base: float = 4.0  # every emulated machine is this many times slower than one core here
    noise: float = 0.0  # slowdown_noise of every worker
    predictor: str = "ewma"
    warmup: int = 20  # iterations left out of every steady window
    standalone_iterations: int = 100  # steady iterations of each standalone run
    reps: int = 3
    systems: tuple[str, ...] = SYSTEMS
    ideal: bool = True  # run the standalone workers (needs "lbbsp" in systems)
    noise_levels: tuple[float, ...] = ()  # sensitivity: every system at each of these noises
    variants: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # (system name, LB-BSP config keys)
    transport: str = "ipc"
    seed: int = 0

    def job(self, **kw: Any) -> dict[str, Any]:
        base = dict(model=self.model, dataset=self.dataset, workers=self.workers,
                    servers=self.servers, global_batch=self.global_batch, iterations=self.iterations,
                    lr=self.lr, momentum=self.momentum, slowdown=[self.base * f for f in self.slowdown],
                    slowdown_noise=self.noise, predictor=self.predictor, eval_every=0,
                    checkpoint_every=0, progress=False, transport=self.transport, seed=self.seed,
                    timeout=300.0)
        base.update(kw)
        return base


_EAGER = (("backward_push", True), ("forward_pull", True), ("eager_update", True))
PRESETS = {
    "ci": Spec(dataset="digits", model="mlp", global_batch=64, iterations=30, warmup=5,
               standalone_iterations=20, reps=1),
    "full": Spec(),
    # How the ratios move when the slow machines are noisy as well as slow.
    # (LB-BSP against ASP, the barrier-free bound; BSP's 16×-slow pace makes it too costly here.)
    "noise": Spec(iterations=60, warmup=15, systems=("lbbsp", "asp"), ideal=False, noise_levels=(0.0, 0.3)),
    # What LB-BSP's batch-size hysteresis (default 0.05) costs against ASP.
    "hysteresis": Spec(iterations=90, systems=("lbbsp", "lbbsp-h0.01", "lbbsp-h0", "asp"), ideal=False,
                       variants=(("lbbsp-h0.01", (("hysteresis", 0.01),)), ("lbbsp-h0", (("hysteresis", 0.0),)))),
    # What the exchange hidden behind the backward pass (backward_push, forward_pull,
    # eager_update, blocks sized from the model) gives LB-BSP against ASP.
    "overlap": Spec(iterations=90, systems=("lbbsp", "lbbsp-eager", "lbbsp-eager-auto", "asp"), ideal=False,
                    variants=(("lbbsp-eager", _EAGER), ("lbbsp-eager-auto", (*_EAGER, ("block_size", 0), ("fragment_kb", 0))))),
}


# -- measurements ------------------------------------------------------------------------

def steady_window(metrics: Path, warmup: int) -> dict[str, Any]:
    """From a run's iteration records: samples/s over the iterations after `warmup`, each
    worker's median batch and median compute seconds over them, and where an iteration's
    time goes (means over the window, as shares of the mean iteration): `compute` (the
    workers' mean compute), `imbalance` (the slowest worker's compute beyond the mean)
    and `rest` (the barrier: the last push, the update, the pulls, unpacking)."""
    recs = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    recs = sorted((r for r in recs if r.get("type") == "iteration"), key=lambda r: r["iteration"])
    if len(recs) <= warmup or warmup < 1:
        raise ValueError(f"{metrics}: {len(recs)} iteration records, need more than warmup = {warmup}")
    window = recs[warmup:]
    # Under ASP an iteration's record is written when its last report arrives, so records
    # may finish out of order: the window runs from the last of the warm-up ones to the last.
    seconds = max(r["elapsed"] for r in recs) - max(r["elapsed"] for r in recs[:warmup])
    samples = sum(sum(b for b in r["batch"] if b) for r in window)
    per: dict[int, dict[str, list[float]]] = {}
    for r in window:
        for w, b, c in zip(r["workers"], r["batch"], r.get("compute_s") or [None] * len(r["workers"])):
            if b:
                per.setdefault(int(w), {"batch": [], "compute_s": []})["batch"].append(b)
                if c is not None:
                    per[int(w)]["compute_s"].append(c)
    computes = [[c for c, b in zip(r.get("compute_s") or [], r["batch"]) if b] for r in window]
    mean_c = statistics.fmean(statistics.fmean(c) for c in computes if c) if any(computes) else float("nan")
    max_c = statistics.fmean(max(c) for c in computes if c) if any(computes) else float("nan")
    iteration = seconds / len(window)
    split = {"iteration_s": iteration, "compute": mean_c / iteration, "imbalance": (max_c - mean_c) / iteration,
             "rest": 1.0 - max_c / iteration}
    return {"samples_per_s": samples / seconds if seconds > 0 else float("nan"), "split": split,
            "final_train_loss": statistics.fmean(r["loss"] for r in recs[-10:]),
            "batch": {w: statistics.median(v["batch"]) for w, v in sorted(per.items())},
            "compute_s": {w: statistics.median(v["compute_s"]) if v["compute_s"] else None
                          for w, v in sorted(per.items())}}


def run_equipoise(spec: Spec, protocol: str, tmp: Path, **kw: Any) -> dict[str, Any]:
    import equipoise

    out = tmp / f"{protocol}-{time.monotonic_ns()}"
    s = equipoise.train(spec.job(protocol=protocol, **kw), out=out)
    result = steady_window(out / "metrics.jsonl", spec.warmup)
    result.update(whole_run_samples_per_s=s["samples_per_s"], barrier_wait_fraction=s["barrier_wait_fraction"],
                  run_dir=str(out))
    if protocol == "lbbsp":
        result["predictor_mape"] = replay_mape(out)
    return result


def run_system(spec: Spec, name: str, tmp: Path) -> dict[str, Any]:
    if name == "ddp":
        return run_ddp_straggler(spec)
    if name in dict(spec.variants):
        return run_equipoise(spec, "lbbsp", tmp, **dict(dict(spec.variants)[name]))
    if name == "asp":
        # ASP at the BSP rate diverges here (stale momentum-SGD steps; NaN within ~20
        # iterations), so it runs at α/λ, the rate of its λ-times-more-frequent updates.
        out = run_equipoise(spec, "asp", tmp, lr=spec.lr / spec.workers)
        out.pop("split")  # no barrier: an iteration record is not a round of every worker
        return out
    return run_equipoise(spec, name, tmp)


def standalone(spec: Spec, lbbsp: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Each distinct factor's worker alone at the batch LB-BSP gave that factor's workers
    (median over them); the ideal is the sum over workers of their factor's speed."""
    import equipoise

    speeds, batches = {}, {}
    for factor in sorted(set(spec.slowdown)):
        ranks = [w for w, f in enumerate(spec.slowdown) if f == factor]
        batch = max(1, round(statistics.median(lbbsp["batch"][w] for w in ranks)))
        cfg = spec.job(protocol="bsp", workers=1, servers=1, global_batch=batch,
                       iterations=spec.warmup + spec.standalone_iterations, slowdown=[spec.base * factor])
        out = tmp / f"standalone-{factor}-{time.monotonic_ns()}"
        equipoise.train(cfg, out=out)
        speeds[str(factor)] = steady_window(out / "metrics.jsonl", spec.warmup)["samples_per_s"]
        batches[str(factor)] = batch
    return {"speeds": speeds, "batches": batches,
            "samples_per_s": sum(speeds[str(f)] for f in spec.slowdown)}


def one_round(spec: Spec, tmp: Path) -> dict[str, Any]:
    """Every system once, in order, then the standalone workers; ratios within the round."""
    out: dict[str, Any] = {name: _attempt(lambda n=name: run_system(spec, n, tmp)) for name in spec.systems}
    if spec.ideal and "error" not in out.get("lbbsp", {"error": 1}):
        out["ideal"] = standalone(spec, out["lbbsp"], tmp)
    lb = out.get("lbbsp", {}).get("samples_per_s", float("nan"))
    out["ratios"] = {f"lbbsp/{other}": ratio(lb, out[other]["samples_per_s"])
                     for other in ("bsp", "asp", "ddp", "ideal") if other in out and other != "lbbsp"}
    for name, _ in spec.variants:
        if "asp" in out and name in out:
            out["ratios"][f"{name}/asp"] = ratio(out[name]["samples_per_s"], out["asp"]["samples_per_s"])
    if "asp" in out and "ideal" in out:
        out["ratios"]["asp/ideal"] = ratio(out["asp"]["samples_per_s"], out["ideal"]["samples_per_s"])
    return out


def _attempt(fn) -> dict[str, Any]:
    """Run one system; a failure (e.g. divergence) becomes a row saying so."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"error": f"{type(exc).__name__}: {exc}"[:300], "samples_per_s": float("nan")}


def summarise(rounds: list[dict[str, Any]], spec: Spec) -> dict[str, Any]:
    """Median (min–max) over rounds of every system's samples/s, the ideal and the ratios;
    `results` keeps each system's median samples/s where compare_commits looks for it."""
    nan = float("nan")
    names = [n for n in (*spec.systems, "ideal") if any(n in r for r in rounds)]
    systems = {n: summary([r.get(n, {}).get("samples_per_s", nan) for r in rounds]) for n in names}
    keys = dict.fromkeys(k for r in rounds for k in r["ratios"])
    ratios = {k: summary([r["ratios"].get(k, nan) for r in rounds]) for k in keys}
    errors = {n: r[n]["error"] for r in rounds for n in names if "error" in r.get(n, {})}
    return {"systems": systems, "ratios": ratios, "errors": errors,
            "results": {n: {"samples_per_s": s["median"]} for n, s in systems.items() if n != "ideal"},
            "ideal_samples_per_s": systems["ideal"]["median"] if "ideal" in systems else None}


def compute_by_factor(rounds: list[dict[str, Any]], spec: Spec) -> dict[str, Any]:
    """Median per-step compute seconds of each worker at its factor, equipoise BSP next to
    DDP (the same stretch over the same window: they should agree)."""
    out: dict[str, Any] = {}
    for name in ("bsp", "ddp"):
        per = [r[name]["compute_s"] for r in rounds if "compute_s" in r.get(name, {})]
        out[name] = {str(w): statistics.median(float(p[w]) for p in per) for w in range(spec.workers)} if per else {}
    return out


# -- the invocation ----------------------------------------------------------------------

def run_all(spec: Spec, plots: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-lbbsp-") as name:
        tmp = Path(name)
        if spec.noise_levels:  # sensitivity: the levels interleaved too
            variants = {f"noise={c:g}": (lambda c=c: one_round(replace(spec, noise=c), tmp))
                        for c in spec.noise_levels}
            runs = interleave(variants, spec.reps)
            return {"levels": {k: {**summarise(v, spec), "rounds": _slim(v)} for k, v in runs.items()}}
        rounds = interleave({"round": lambda: one_round(spec, tmp)}, spec.reps)["round"]
        result = {**summarise(rounds, spec), "compute_s_by_worker": compute_by_factor(rounds, spec)}
        if plots is not None and "error" not in rounds[-1].get("lbbsp", {"error": 1}):
            result["plots"] = [str(p) for p in make_plots(rounds[-1], plots)]
        result["rounds"] = _slim(rounds)
        return result


def _slim(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rounds without temporary run directories (they are gone after the invocation)."""
    return [{n: ({k: v for k, v in r.items() if k != "run_dir"} if isinstance(r, dict) else r)
             for n, r in rnd.items()} for rnd in rounds]


def make_plots(last: dict[str, Any], folder: Path) -> list[Path]:
    """Batch sizes and time split of the last round's BSP and LB-BSP runs, as PNGs."""
    from equipoise.report.plots import load_run, plot_batch_sizes, plot_time_split

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ("bsp", "lbbsp"):
        run = load_run(last[name]["run_dir"])
        out.append(plot_batch_sizes(run, folder / f"lbbsp-static-{name}-batch.png"))
        out.append(plot_time_split(run, folder / f"lbbsp-static-{name}-split.png"))
    return out


def table(res: dict[str, Any]) -> str:
    rows = [[n, fmt_range(s)] for n, s in res["systems"].items()]
    rows += [[k, fmt_range(s)] for k, s in res["ratios"].items()]
    return markdown_table(["system or ratio", "median (min–max) over rounds"], rows)


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    load, git = load_average(), git_state()
    result = run_all(spec, Path(plots) if plots else None)
    result.update(preset=preset, spec=asdict(spec), loadavg_at_start=load, git_at_start=git)
    print(f"## LB-BSP benchmark, preset {preset}: {spec.workers} workers, each {spec.base}× slower than a core, "
          f"slowdown {list(spec.slowdown)}, {spec.model} on {spec.dataset}, X = {spec.global_batch}, "
          f"{spec.iterations} iterations (steady window after {spec.warmup}), {spec.reps} interleaved rounds\n")
    for level, res in result.get("levels", {"": result}).items():
        print(f"{level}\n{table(res)}\n")
    print(f"wrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for PNG plots of the last round (e.g. docs/img)")
