"""Rudra's study reproduced (Gupta, Zhang and Wang, ICDM 2016): accuracy, staleness and speed of hardsync
and n-softsync with and without staleness-dependent learning-rate modulation, plus SSP
between BSP and ASP under a slow worker, plus the effect of overlapping communication
with compute (Rudra-adv*).

Sections (a preset picks which run and at what size):

* "study": λ workers, μ·λ constant, one hardsync (BSP) run, then n ∈ `ns` ×
  lr_modulation ∈ {none, per_gradient, mean}, every run at the same α0 for the same
  number of epochs. Each softsync run is also repeated with `overlap = true` for the
  modulation in `overlap_modulation`.
* "ssp": `ssp_workers` workers at `cpu` CPUs each (cgroup quota: separate machines),
  worker slowdowns `ssp_slowdown`: BSP, SSP for each s in `bounds`, ASP (at α/λ).

All runs of one preset run one after another in one invocation, so their numbers are
comparable; none overlaps another on the machine.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import preset_main, load_average, markdown_table, write_results

NAME = "bench_rudra"
MODULATIONS = ("none", "per_gradient", "mean")


@dataclass(frozen=True)
class Spec:
    dataset: str = "fashion-mnist"
    model: str = "mlp"
    workers: int = 8
    worker_batch: int = 16          # μ; μ·λ = 128 for λ = 8
    epochs: float = 2.0
    lr: float = 0.3                 # α0: hardsync trains well, async without modulation does not
    momentum: float = 0.0           # Rudra's update rule: plain SGD steps of the averaged gradient
    study_cpu: float = 0.2          # CPUs per learner (cgroup quota): λ small machines
    servers: int = 1
    ns: tuple[int, ...] = (1, 2, 4, 8)
    overlap_modulation: str = "per_gradient"
    eval_every: int = 100
    # the SSP section
    ssp_model: str = "cnn"
    ssp_workers: int = 4
    ssp_batch: int = 128
    ssp_iterations: int = 150
    ssp_slowdown: tuple[float, ...] = (1.0, 1.0, 1.0, 4.0)
    ssp_lr: float = 0.05
    ssp_momentum: float = 0.9
    cpu: float = 0.4
    bounds: tuple[int, ...] = (0, 1, 4)
    ssp_rotate: int = 0             # > 0: the slow worker changes every this many iterations
    sections: tuple[str, ...] = ("study", "ssp")
    transport: str = "ipc"
    seed: int = 0


PRESETS = {
    "ci": Spec(dataset="digits", workers=4, worker_batch=8, epochs=1.0, ns=(1, 2, 4), eval_every=0,
               study_cpu=0.4, ssp_model="mlp", ssp_iterations=20, ssp_batch=64, bounds=(0, 1)),
    "study": Spec(sections=("study",)),
    "study-long": Spec(sections=("study",), epochs=6.0, eval_every=300),
    "ssp": Spec(sections=("ssp",)),
    # A transient straggler: the 4× slowdown moves to the next worker every 4 iterations.
    "ssp-rotating": Spec(sections=("ssp",), ssp_rotate=4),
    "full": Spec(),
}


def run_job(tmp: Path, label: str, **cfg: Any) -> dict[str, Any]:
    import equipoise

    out = tmp / f"{label}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    try:
        summary = equipoise.train(dict(progress=False, checkpoint_every=0, timeout=300.0, **cfg), out=out)
    except Exception as exc:  # noqa: BLE001 - a diverged run is a result, reported as such
        return {"label": label, "error": f"{type(exc).__name__}: {exc}"[:200], "wall_s": time.perf_counter() - t0,
                "final_accuracy": math.nan, "samples_per_s": math.nan, "staleness_mean": math.nan,
                "staleness_max": None}
    return {"label": label, "final_accuracy": summary["final_accuracy"],
            "staleness_mean": summary["staleness_mean"], "staleness_max": summary["staleness_max"],
            "samples_per_s": summary["samples_per_s"], "wall_s": time.perf_counter() - t0,
            "train_s": summary["train_s"], "barrier_wait_fraction": summary["barrier_wait_fraction"],
            "run_dir": str(out)}


def study(spec: Spec, tmp: Path) -> list[dict[str, Any]]:
    base = dict(dataset=spec.dataset, model=spec.model, workers=spec.workers, worker_batch=spec.worker_batch,
                epochs=spec.epochs, lr=spec.lr, momentum=spec.momentum, servers=spec.servers,
                eval_every=spec.eval_every, transport=spec.transport, seed=spec.seed,
                cpu_limit=[spec.study_cpu] * spec.workers)
    rows = [dict(run_job(tmp, "hardsync", protocol="bsp", **base), n=0, modulation="–", overlap=False)]
    for n in spec.ns:
        for mod in MODULATIONS:
            r = run_job(tmp, f"softsync-{n}-{mod}", protocol="softsync", softsync_n=n, lr_modulation=mod, **base)
            rows.append(dict(r, n=n, modulation=mod, overlap=False))
    for n in spec.ns:
        r = run_job(tmp, f"softsync-{n}-{spec.overlap_modulation}-overlap", protocol="softsync", softsync_n=n,
                    lr_modulation=spec.overlap_modulation, overlap=True, **base)
        rows.append(dict(r, n=n, modulation=spec.overlap_modulation, overlap=True))
    return rows


def ssp(spec: Spec, tmp: Path) -> list[dict[str, Any]]:
    base = dict(dataset=spec.dataset, model=spec.ssp_model, workers=spec.ssp_workers,
                global_batch=spec.ssp_batch, iterations=spec.ssp_iterations, lr=spec.ssp_lr,
                momentum=spec.ssp_momentum, servers=2, eval_every=0, transport=spec.transport, seed=spec.seed,
                slowdown=list(spec.ssp_slowdown), cpu_limit=[spec.cpu] * spec.ssp_workers)
    if spec.ssp_rotate:
        n, slow = spec.ssp_workers, max(spec.ssp_slowdown)
        rows = ["iteration,worker,factor"]
        for k in range(0, spec.ssp_iterations * 2, spec.ssp_rotate):
            rows += [f"{k},{w},{slow if w == (k // spec.ssp_rotate) % n else 1.0}" for w in range(n)]
        (tmp / "rotate.csv").write_text("\n".join(rows) + "\n")
        del base["slowdown"]
        base["trace"] = str(tmp / "rotate.csv")
    rows = [run_job(tmp, "bsp", protocol="bsp", **base)]
    # SSP and ASP apply every gradient as its own update, λ times as many updates as BSP:
    # at BSP's α they diverge here (NaN within ~20 iterations), so they run at α/λ.
    per_gradient = {**base, "lr": spec.ssp_lr / spec.ssp_workers}
    rows += [dict(run_job(tmp, f"ssp s={s}", protocol="ssp", staleness_bound=s, **per_gradient), bound=s)
             for s in spec.bounds]
    rows.append(run_job(tmp, "asp", protocol="asp", **per_gradient))
    rows.append(run_job(tmp, "asp overlap", protocol="asp", overlap=True, **per_gradient))
    return rows


def study_table(rows: list[dict[str, Any]]) -> str:
    hard = rows[0]["final_accuracy"]
    out = []
    for r in rows:
        name = "hardsync (bsp)" if r["n"] == 0 else f"{r['n']}-softsync" + (" + overlap" if r["overlap"] else "")
        acc = r["final_accuracy"]
        out.append([name, r["modulation"], "failed: " + r["error"][:40] if "error" in r else acc,
                    (acc - hard) * 100 if "error" not in r and acc is not None and hard is not None else None,
                    r["staleness_mean"], r["staleness_max"], r["samples_per_s"], r["wall_s"]])
    return markdown_table(["protocol", "lr_modulation", "final acc", "Δ vs hardsync (points)",
                           "mean σ", "max σ", "samples/s", "wall s"], out)


def ssp_table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(["protocol", "samples/s", "mean σ", "max σ", "barrier wait", "final acc"],
                          [[r["label"], r["samples_per_s"], r["staleness_mean"], r["staleness_max"],
                            r.get("barrier_wait_fraction"), r["final_accuracy"]] for r in rows])


def plot_study(rows: list[dict[str, Any]], path: Path) -> Path:
    """Final test accuracy against n, one line per modulation, hardsync as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    hard = rows[0]["final_accuracy"]
    for mod in MODULATIONS:
        pts = [(r["n"], r["final_accuracy"]) for r in rows
               if r["n"] and r["modulation"] == mod and not r["overlap"]]
        pts = [(n, 100 * (a if a is not None and math.isfinite(a) else 0.1)) for n, a in pts]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"softsync, lr_modulation={mod}")
    if hard is not None:
        ax.axhline(100 * hard, color="black", linestyle="--", linewidth=1, label="hardsync")
        ax.axhspan(100 * hard - 1, 100 * hard + 1, color="grey", alpha=0.15, label="hardsync ± 1 point")
    ax.set_xscale("log", base=2)
    ax.set_xticks([r for r in sorted({r["n"] for r in rows if r["n"]})])
    ax.set_xticklabels([str(r) for r in sorted({r["n"] for r in rows if r["n"]})])
    ax.set_xlabel("n (n-softsync; n = λ is async)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("Rudra study: accuracy vs n at constant μ·λ")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench-rudra-") as name:
        tmp = Path(name)
        if "study" in spec.sections:
            rows = study(spec, tmp)
            result["study"] = rows
            print(f"## Rudra study, preset {preset}: {spec.model} on {spec.dataset}, λ = {spec.workers}, "
                  f"μ = {spec.worker_batch} (μ·λ = {spec.workers * spec.worker_batch}), α0 = {spec.lr}, "
                  f"momentum {spec.momentum}, {spec.epochs} epochs, {spec.study_cpu} CPU per learner\n")
            print(study_table(rows))
            if plots:
                result["plot"] = str(plot_study(rows, Path(plots) / "rudra-accuracy-vs-n.png"))
        if "ssp" in spec.sections:
            rows = ssp(spec, tmp)
            result["ssp"] = rows
            who = (f"the {max(spec.ssp_slowdown)}× slowdown moving to the next worker every {spec.ssp_rotate} "
                   "iterations" if spec.ssp_rotate else f"slowdown {list(spec.ssp_slowdown)}")
            print(f"\n## SSP under a slow worker, preset {preset}: {spec.ssp_model}, {spec.ssp_workers} workers at "
                  f"{spec.cpu} CPU, {who}, X = {spec.ssp_batch}, {spec.ssp_iterations} iterations\n")
            print(ssp_table(rows))
    for section in ("study", "ssp"):
        for r in result.get(section, []):
            r.pop("run_dir", None)  # temporary
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for the accuracy-vs-n plot (e.g. docs/img)")
