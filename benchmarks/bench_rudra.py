"""Rudra's study reproduced (Gupta, Zhang and Wang, ICDM 2016): accuracy, staleness and
speed of hardsync and n-softsync with and without staleness-dependent learning-rate
modulation, plus SSP (Ho et al., NIPS 2013) between BSP and ASP under a slow worker.

Every worker is an emulated machine `base` times slower than one core here (each step
stretched in-process by sleeping, equipoise.worker.stretch), so several emulated
machines share this 2-core box as separate machines would; a straggler is `f` times
slower again (`slowdown = [base·f …]`).

Sections (a preset picks which run and at what size):

* "study": λ learners at μ each (μ·λ constant), hardsync (BSP) and n-softsync for each
  (n, lr_modulation) in `softsync`, every run at the same α0 for the same number of
  epochs.
* "ssp": `ssp_workers` workers, one `f`× slower (`ssp_slowdown`; with `ssp_rotate` > 0 the
  slowdown moves to the next worker every `ssp_rotate` iterations, a trace): BSP, SSP
  for each s in `bounds`, ASP (SSP and ASP at α/λ). σ ≤ s is checked for every SSP run.

The systems of a section run in `reps` interleaved rounds (round r: every system once,
at seed `seed + r`), and every figure is the median (min–max) over rounds. Throughput is
samples/s on a steady window — the iterations after `warmup`, from metrics.jsonl's
iteration records (bench_lbbsp.steady_window); accuracy is the final test accuracy; σ is
each run's mean and max staleness over all gradients (summary.json).
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.bench_lbbsp import steady_window
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

NAME = "bench_rudra"
MEASURES = ("samples_per_s", "final_accuracy", "staleness_mean", "staleness_max", "barrier_wait_fraction")


@dataclass(frozen=True)
class Spec:
    dataset: str = "fashion-mnist"
    model: str = "mlp"
    workers: int = 8                # λ
    worker_batch: int = 16          # μ; μ·λ = 128 for λ = 8
    epochs: float = 1.0
    lr: float = 0.3                 # α0: hardsync trains well, async without modulation does not
    momentum: float = 0.0           # Rudra's update rule: plain SGD steps of the averaged gradient
    study_base: float = 4.0         # every learner is this many times slower than a core
    servers: int = 1
    softsync: tuple[tuple[int, str], ...] = ((1, "none"), (8, "none"), (8, "per_gradient"))  # (n, lr_modulation)
    scaled: tuple[int, ...] = ()    # n of extra softsync runs under async_scaling = "bsp" (BSP's settings carried over)
    study_eval_every: int = 0       # > 0: a test evaluation every this many iterations (the accuracy curves)
    study_warmup: int = 50          # iterations left out of the steady window
    # the SSP section
    ssp_model: str = "mlp"
    ssp_workers: int = 4
    ssp_batch: int = 512
    ssp_iterations: int = 160
    ssp_base: float = 4.0           # every worker is this many times slower than a core
    ssp_slowdown: tuple[float, ...] = (1.0, 1.0, 1.0, 4.0)  # f, on top of ssp_base
    ssp_lr: float = 0.05
    ssp_momentum: float = 0.9
    bounds: tuple[int, ...] = (1, 4)
    ssp_rotate: int = 0             # > 0: the slow worker changes every this many iterations
    ssp_warmup: int = 30
    sections: tuple[str, ...] = ("study", "ssp")
    reps: int = 3
    transport: str = "ipc"
    seed: int = 0


PRESETS = {
    "ci": Spec(dataset="digits", workers=4, worker_batch=8, softsync=((1, "none"), (4, "none"), (4, "per_gradient")),
               study_base=2.0, study_warmup=5, ssp_iterations=20, ssp_batch=64, ssp_base=2.0, ssp_warmup=5,
               ssp_rotate=4, reps=1),
    "study": Spec(sections=("study",)),
    # To convergence at BSP's own settings (lr 0.1, momentum 0.9, 3 epochs): Rudra's rules as
    # published (async_scaling = "none") for every n and modulation, and the "bsp" rule.
    "convergence": Spec(sections=("study",), epochs=3.0, lr=0.1, momentum=0.9, study_eval_every=94,
                        softsync=tuple((n, m) for n in (1, 2, 4, 8) for m in ("none", "per_gradient", "mean")),
                        scaled=(1, 2, 4, 8)),
    # A transient straggler: the 4× slowdown moves to the next worker every 4 iterations.
    "ssp": Spec(sections=("ssp",), ssp_rotate=4),
}


def run_job(tmp: Path, label: str, warmup: int, **cfg: Any) -> dict[str, Any]:
    """One training run: steady-window samples/s, final accuracy, σ mean and max; a
    failure (e.g. divergence) is a row saying so."""
    import equipoise

    out = tmp / f"{label.replace(' ', '_')}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    try:
        # Rudra's rules as published: every update at α0 (times lr_modulation's factor).
        settings = dict(progress=False, checkpoint_every=0, eval_every=0, timeout=300.0, async_scaling="none")
        s = equipoise.train({**settings, **cfg}, out=out)
        steady = steady_window(out / "metrics.jsonl", warmup)
    except Exception as exc:  # noqa: BLE001 - a diverged run is a result, reported as such
        return {"error": f"{type(exc).__name__}: {exc}"[:200], "wall_s": time.perf_counter() - t0,
                **{k: math.nan for k in MEASURES}}
    per_epoch = s["iterations"] / cfg["epochs"] if cfg.get("epochs") else 1.0  # iterations in one epoch
    curve = [[r["iteration"] / per_epoch, r["elapsed"], r["test_accuracy"]] for r in map(
             json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r.get("type") == "eval" and "test_accuracy" in r]  # [epochs, training seconds, accuracy]
    return {"curve": curve, "samples_per_s": steady["samples_per_s"], "whole_run_samples_per_s": s["samples_per_s"],
            "final_accuracy": s["final_accuracy"], "staleness_mean": s["staleness_mean"],
            "staleness_max": s["staleness_max"], "barrier_wait_fraction": s["barrier_wait_fraction"],
            "wall_s": time.perf_counter() - t0}


def rounds(systems: dict[str, Callable[[int], dict[str, Any]]], spec: Spec) -> list[dict[str, Any]]:
    """`spec.reps` interleaved rounds; round r runs every system once at seed spec.seed + r."""
    seeds = itertools.count(spec.seed)

    def one_round() -> dict[str, Any]:
        seed = next(seeds)
        print(f"  round at seed {seed}", flush=True)
        return {"seed": seed, **{name: run(seed) for name, run in systems.items()}}

    return interleave({"round": one_round}, spec.reps)["round"]


def summarise(runs: list[dict[str, Any]], names: list[str], reference: str) -> dict[str, Any]:
    """Per system: median/min/max over rounds of every measure, and per round against
    `reference` in the same round: the samples/s ratio and the accuracy difference (points)."""
    out = {}
    for name in names:
        row = {k: summary([r[name][k] for r in runs]) for k in MEASURES}
        row["speedup"] = summary([ratio(r[name]["samples_per_s"], r[reference]["samples_per_s"]) for r in runs])
        row["delta_points"] = summary([100 * (r[name]["final_accuracy"] - r[reference]["final_accuracy"])
                                       for r in runs])
        row["errors"] = [r[name]["error"] for r in runs if "error" in r[name]]
        out[name] = row
    return out


def max_sigma(row: dict[str, Any]) -> int | None:
    """The largest σ of any gradient in any round."""
    m = row["staleness_max"]["max"]
    return int(m) if math.isfinite(m) else None


# -- the study ---------------------------------------------------------------------------

def study_label(n: int, mod: str) -> str:
    return f"{n}-softsync {mod}"


def study(spec: Spec, tmp: Path) -> dict[str, Any]:
    base = dict(dataset=spec.dataset, model=spec.model, workers=spec.workers, worker_batch=spec.worker_batch,
                epochs=spec.epochs, lr=spec.lr, momentum=spec.momentum, servers=spec.servers,
                transport=spec.transport, slowdown=[spec.study_base] * spec.workers)
    job = lambda label, **kw: lambda seed: run_job(tmp, label, spec.study_warmup, seed=seed, **base, **kw)  # noqa: E731
    if spec.study_eval_every:
        base["eval_every"] = spec.study_eval_every
    systems = {"hardsync": job("hardsync", protocol="bsp")}
    for n, mod in spec.softsync:
        systems[study_label(n, mod)] = job(study_label(n, mod), protocol="softsync", softsync_n=n, lr_modulation=mod)
    for n in spec.scaled:
        systems[study_label(n, "bsp")] = job(study_label(n, "bsp"), protocol="softsync", softsync_n=n,
                                             async_scaling="bsp")
    runs = rounds(systems, spec)
    return {"systems": summarise(runs, list(systems), "hardsync"), "rounds": runs}


def study_table(systems: dict[str, Any]) -> str:
    rows = []
    for name, s in systems.items():
        proto, _, mod = name.partition(" ")
        acc = fmt_range({k: 100 * v for k, v in s["final_accuracy"].items() if k != "values"})
        if s["errors"]:
            acc += f" ({len(s['errors'])} failed: {s['errors'][0][:30]})"
        rule = "bsp" if mod == "bsp" else ("–" if proto == "hardsync" else "none (α0)")
        mod = "none" if mod == "bsp" else mod
        rows.append([proto if proto != "hardsync" else "hardsync (bsp)", rule, mod or "–", acc,
                     fmt_range(s["delta_points"]), fmt_range(s["staleness_mean"]), max_sigma(s),
                     fmt_range(s["samples_per_s"]), fmt_range(s["speedup"])])
    return markdown_table(["protocol", "async_scaling", "lr_modulation", "final acc %", "Δ vs hardsync (points)", "mean σ",
                           "max σ", "samples/s", "× hardsync"], rows)


def plot_study(systems: dict[str, Any], path: Path) -> Path:
    """Final test accuracy against n (median, min–max bars), one line per modulation,
    hardsync's median and range as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    runs = [(int(k.split("-")[0]), k.partition(" ")[2]) for k in systems if k != "hardsync"]
    for mod in dict.fromkeys(m for _, m in runs):
        ns = sorted(n for n, m in runs if m == mod)
        acc = [systems[study_label(n, mod)]["final_accuracy"] for n in ns]
        med = [100 * (a["median"] if math.isfinite(a["median"]) else 0.1) for a in acc]
        lo = [m - 100 * a["min"] if math.isfinite(a["min"]) else 0 for m, a in zip(med, acc)]
        hi = [100 * a["max"] - m if math.isfinite(a["max"]) else 0 for m, a in zip(med, acc)]
        label = "softsync, async_scaling=bsp" if mod == "bsp" else f"softsync, lr_modulation={mod}"
        ax.errorbar(ns, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
    hard = systems["hardsync"]["final_accuracy"]
    if math.isfinite(hard["median"]):
        ax.axhline(100 * hard["median"], color="black", linestyle="--", linewidth=1, label="hardsync (median)")
        ax.axhspan(100 * hard["min"], 100 * hard["max"], color="grey", alpha=0.2, label="hardsync min–max")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({n for n, _ in runs}))
    ax.set_xticklabels([str(n) for n in sorted({n for n, _ in runs})])
    ax.set_xlabel("n (n-softsync; n = λ is async)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Rudra study: accuracy vs n at constant μ·λ (median, min–max)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


COLORS = {"none": "C0", "per_gradient": "C1", "mean": "C2", "bsp": "C3"}
VARIANTS = {"none": "α0 (lr_modulation none)", "per_gradient": "α0/σ (per_gradient)", "mean": "α0/⟨σ⟩ (mean)",
            "bsp": "async_scaling = bsp"}


def plot_curves(runs: list[dict[str, Any]], systems: list[str], path: Path) -> Path | None:
    """Test accuracy against epochs (top) and against training seconds (bottom), one
    column per n: the median over rounds at each evaluation, hardsync in every column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import statistics

    def median_curve(name: str) -> tuple[list[float], list[float], list[float]] | None:
        curves = [r[name].get("curve") for r in runs if r[name].get("curve")]
        if not curves:
            return None
        k = min(len(c) for c in curves)
        col = lambda j: [statistics.median(c[i][j] for c in curves) for i in range(k)]  # noqa: E731
        return col(0), col(1), [100 * a for a in col(2)]

    ns = sorted({int(name.split("-")[0]) for name in systems if name != "hardsync"})
    if not ns:
        return None
    fig, axes = plt.subplots(2, len(ns), figsize=(3.2 * len(ns), 6.0), dpi=110, squeeze=False, sharey=True)
    hard = median_curve("hardsync")
    for j, n in enumerate(ns):
        for name in ["hardsync"] + [x for x in systems if x.startswith(f"{n}-softsync")]:
            curve = hard if name == "hardsync" else median_curve(name)
            if curve is None:
                continue
            variant = name.partition(" ")[2] or name
            style = dict(color="black", linestyle="--") if name == "hardsync" else dict(color=COLORS.get(variant))
            label = VARIANTS.get(variant, variant)
            axes[0][j].plot(curve[0], curve[2], label=label, **style)
            axes[1][j].plot(curve[1], curve[2], label=label, **style)
        axes[0][j].set_title(f"n = {n}")
        axes[0][j].set_xlabel("epochs")
        axes[1][j].set_xlabel("training seconds")
        for ax in (axes[0][j], axes[1][j]):
            ax.grid(True, alpha=0.3)
            ax.set_ylim(40, 90)
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[1][0].set_ylabel("test accuracy (%)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("n-softsync against hardsync, λ = 8: median over rounds", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


# -- SSP -----------------------------------------------------------------------------------

def ssp(spec: Spec, tmp: Path) -> dict[str, Any]:
    n = spec.ssp_workers
    base = dict(dataset=spec.dataset, model=spec.ssp_model, workers=n, global_batch=spec.ssp_batch,
                iterations=spec.ssp_iterations, lr=spec.ssp_lr, momentum=spec.ssp_momentum, servers=2,
                transport=spec.transport, slowdown=[spec.ssp_base * f for f in spec.ssp_slowdown])
    if spec.ssp_rotate:  # every worker at base; the trace multiplies one of them by f at a time
        slow = max(spec.ssp_slowdown)
        lines = ["iteration,worker,factor"]
        for k in range(0, spec.ssp_iterations * 2, spec.ssp_rotate):
            lines += [f"{k},{w},{slow if w == (k // spec.ssp_rotate) % n else 1.0}" for w in range(n)]
        (tmp / "rotate.csv").write_text("\n".join(lines) + "\n")
        base.update(slowdown=[spec.ssp_base] * n, trace=str(tmp / "rotate.csv"))
    # SSP and ASP apply every gradient as its own update, λ times as many updates as BSP:
    # at BSP's α they diverge here (NaN within ~20 iterations), so they run at α/λ.
    per_gradient = {**base, "lr": spec.ssp_lr / n}
    job = lambda label, cfg, **kw: lambda seed: run_job(tmp, label, spec.ssp_warmup, seed=seed, **cfg, **kw)  # noqa: E731
    systems = {"bsp": job("bsp", base, protocol="bsp")}
    systems.update({f"ssp s={s}": job(f"ssp s={s}", per_gradient, protocol="ssp", staleness_bound=s)
                    for s in spec.bounds})
    systems["asp"] = job("asp", per_gradient, protocol="asp")
    runs = rounds(systems, spec)
    summ = summarise(runs, list(systems), "bsp")
    violations = [f"round {i}, s={s}: max σ {r[f'ssp s={s}']['staleness_max']}" for i, r in enumerate(runs)
                  for s in spec.bounds if (r[f"ssp s={s}"]["staleness_max"] or 0) > s]
    lo, hi = summ["bsp"]["samples_per_s"]["median"], summ["asp"]["samples_per_s"]["median"]
    between = {f"ssp s={s}": lo < summ[f"ssp s={s}"]["samples_per_s"]["median"] < hi for s in spec.bounds}
    return {"systems": summ, "checks": {"staleness_bound_violations": violations, "between_bsp_and_asp": between},
            "rounds": runs}


def ssp_table(systems: dict[str, Any]) -> str:
    return markdown_table(["protocol", "samples/s", "× bsp", "mean σ", "max σ", "barrier wait", "final acc"],
                          [[name, fmt_range(s["samples_per_s"]), fmt_range(s["speedup"]),
                            fmt_range(s["staleness_mean"]), max_sigma(s),
                            fmt_range(s["barrier_wait_fraction"]), fmt_range(s["final_accuracy"])]
                           for name, s in systems.items()])


# -- the invocation ----------------------------------------------------------------------

def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average(),
                              "git_at_start": git_state()}
    with tempfile.TemporaryDirectory(prefix="bench-rudra-") as name:
        tmp = Path(name)
        if "study" in spec.sections:
            res = result["study"] = study(spec, tmp)
            print(f"## Rudra study, preset {preset}: {spec.model} on {spec.dataset}, λ = {spec.workers} learners "
                  f"each {spec.study_base}× slower than a core, μ = {spec.worker_batch} (μ·λ = "
                  f"{spec.workers * spec.worker_batch}), α0 = {spec.lr}, momentum {spec.momentum}, {spec.epochs} "
                  f"epochs; median (min–max) of {spec.reps} interleaved rounds\n")
            print(study_table(res["systems"]))
            if plots:
                stem = "rudra-accuracy-vs-n" if preset == "study" else f"rudra-{preset}-accuracy-vs-n"
                result["plot"] = str(plot_study(res["systems"], Path(plots) / f"{stem}.png"))
                if spec.study_eval_every:
                    curves = plot_curves(res["rounds"], list(res["systems"]), Path(plots) / f"rudra-{preset}-curves.png")
                    result["curves_plot"] = str(curves) if curves else None
        if "ssp" in spec.sections:
            res = result["ssp"] = ssp(spec, tmp)
            who = (f"the {max(spec.ssp_slowdown)}× slowdown moving to the next worker every {spec.ssp_rotate} "
                   "iterations" if spec.ssp_rotate else f"slowdown {list(spec.ssp_slowdown)}")
            print(f"\n## SSP under a slow worker, preset {preset}: {spec.ssp_model}, {spec.ssp_workers} workers "
                  f"each {spec.ssp_base}× slower than a core, {who}, X = {spec.ssp_batch}, {spec.ssp_iterations} "
                  f"iterations (steady after {spec.ssp_warmup}); median (min–max) of {spec.reps} rounds\n")
            print(ssp_table(res["systems"]))
            checks = res["checks"]
            print(f"\nσ ≤ s: {'held in every SSP run' if not checks['staleness_bound_violations'] else 'VIOLATED: '}"
                  + "; ".join(checks["staleness_bound_violations"]))
            print("SSP samples/s strictly between BSP's and ASP's (medians): "
                  + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks["between_bsp_and_asp"].items()))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for the accuracy-vs-n plot (e.g. docs/img)")
