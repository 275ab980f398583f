"""`equipoise simulate`: validated against real runs, timed at scale, and a study at scales
no one can rent.

Presets:

* ``validate``: real jobs on this machine (Fashion-MNIST, the CNN, 4 workers): BSP with
  batches [56, 40, 16, 16] and the last worker 3× slower (the calibration run: unequal
  batches tell a from b, a stretched worker beside an unstretched one of its batch gives
  the stretch's CPU overhead, and the 56-sample worker, not the stretched one, decides
  its iterations), BSP and LB-BSP under slowdown [1, 1, 2, 4], SSP
  (s = 2) and 2-softsync, and BSP with PSLD placement and one server 4× slower, each
  ``reps`` times, interleaved (all six, then all six again, ...). Each repetition's runs
  are simulated (their own config.toml) with the cost model fitted to that repetition's
  calibration run only (``--calibrate``); compared: the medians over repetitions of the
  steady mean iteration time (after iterations 0 and 1), of the whole-run mean
  (train_s / iterations), of σ (mean, and the histogram's total variation distance) and
  of PSLD's settled iteration time, with the real runs' range. Target: within 10%.
* ``scale``: wall seconds per simulated iteration against the number of workers (10 to
  10,000, BSP, LB-BSP, ASP), and the headline 1,000 workers × 100 servers × 1,000
  iterations (target ≤ 60 s); writes docs/img/sim_scale.png with ``--plots docs/img``.
* ``study``: BSP, LB-BSP, SSP (s = 3) and ASP samples/s against the number of workers
  (10 → 10,000) under heavy-tailed, changing slowdowns (``heavy_tail_trace``), with the
  cost model calibrated in ``validate`` when its results file exists; and PSLD against
  the MXNet, BytePS and greedy placements against the number of servers.

Timings are medians over ``reps`` repetitions with their range (min, max).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (RESULTS_DIR, fmt_range, interleave, load_average, markdown_table,
                               summary as spread, write_results)

NAME = "bench_sim"


@dataclass(frozen=True)
class Spec:
    iterations: int = 60
    psld_iterations: int = 100
    workers: tuple[int, ...] = (10, 100, 1000, 10000)
    scale_iterations: int = 50
    headline: tuple[int, int, int] = (1000, 100, 1000)  # workers, servers, iterations
    reps: int = 3
    study_iterations: int = 100
    psld_servers: tuple[int, ...] = (2, 4, 8, 16, 32)
    extra: dict = field(default_factory=dict)


PRESETS = {"validate": Spec(), "scale": Spec(), "study": Spec(),
           "ci": Spec(iterations=12, psld_iterations=20, workers=(10, 100), scale_iterations=5,
                      headline=(100, 10, 20), reps=1, study_iterations=20, psld_servers=(2, 4))}


# -- validate ---------------------------------------------------------------------------------

def validation_runs(spec: Spec) -> dict[str, dict[str, Any]]:
    base = dict(dataset="fashion-mnist", model="cnn", workers=4, servers=2, global_batch=128,
                iterations=spec.iterations, eval_every=0, checkpoint_every=0, progress=False, lr=0.02,
                timeout=300.0)
    slow = [1.0, 1.0, 2.0, 4.0]
    return {  # folder name: config
        # unequal batches and one stretched worker beside an unstretched one of its batch: the
        # per-step cost a, the per-sample b and the stretch's CPU overhead can each be told
        # apart (docs/simulate.md, Calibration)
        "calibration-bsp": dict(base, protocol="bsp", batch_split=[56, 40, 16, 16], slowdown=[1.0, 1.0, 1.0, 3.0]),
        "bsp-slowdown-1124": dict(base, protocol="bsp", slowdown=slow),
        "lbbsp-slowdown-1124": dict(base, protocol="lbbsp", slowdown=slow),
        "ssp2-slowdown-1113": dict(base, protocol="ssp", staleness_bound=2, slowdown=[1.0, 1.0, 1.0, 3.0]),
        "softsync2": dict(base, protocol="softsync", softsync_n=2),
        "psld-server0-4x": dict(base, protocol="bsp", servers=4, placement="psld", block_size=32768,
                                         server_slowdown=[4.0, 1.0, 1.0, 1.0], server_rate=200.0,
                                         server_bandwidth=[200.0] * 4, psld_interval=5, psld_epsilon=0.0,
                                         iterations=spec.psld_iterations),
    }


def _numbers(summary: dict, run_dir: Path) -> dict[str, Any]:
    from equipoise.sim.calibrate import steady_iteration_s
    from equipoise.telemetry.metrics import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    servers = [r for r in records if r.get("type") == "servers" and r.get("iteration_s")]
    tail = servers[len(servers) // 2:]
    hist = {int(k): v for k, v in (summary.get("staleness_histogram") or {}).items()}
    return {"iteration_s": summary["train_s"] / summary["iterations"], "steady_iteration_s": steady_iteration_s(records),
            "staleness_mean": summary["staleness_mean"],
            "staleness_histogram": {str(k): v / max(1, sum(hist.values())) for k, v in sorted(hist.items())},
            "samples_per_s": summary["samples_per_s"], "barrier_wait_fraction": summary["barrier_wait_fraction"],
            "settled_iteration_s": statistics.fmean(r["iteration_s"] for r in tail) if tail else None,
            "block_moves": sum(len(r.get("blocks") or ()) for r in records if r.get("event") == "block_moved"),
            "workers": _per_worker_steps(records)}


def _per_worker_steps(records: list[dict]) -> list[dict[str, float]]:
    """Per worker rank, medians over the steady iterations (calibrate.py's window): batch,
    core share (cpu) and CPU milliseconds per sample (compute_s × cpu / batch) — what the
    cost model charges a step, to compare real steps with simulated ones term by term."""
    from equipoise.sim.calibrate import WARMUP

    per: dict[int, list[tuple[float, float, float]]] = {}
    for r in records:
        if r.get("type") != "iteration" or r.get("iteration", 0) < WARMUP:
            continue
        for k, (b, s, c) in enumerate(zip(r["batch"], r.get("compute_s") or [], r.get("cpu") or [])):
            if b and s is not None and c is not None:
                per.setdefault(k, []).append((b, s, c))
    return [{"batch": statistics.median(b for b, _, _ in rows),
             "cpu": statistics.median(c for _, _, c in rows),
             "cpu_ms_per_sample": statistics.median(1e3 * s * c / b for b, s, c in rows)}
            for _, rows in sorted(per.items())]


def _error(sim: float | None, real: float | None, floor: float = 0.0) -> float | None:
    """Relative error of sim against real; None without both. σ means below `floor`
    (BSP's 0) are compared absolutely."""
    if sim is None or real is None or (isinstance(real, float) and math.isnan(real)):
        return None
    return abs(sim - real) if abs(real) <= floor else abs(sim - real) / abs(real)


def _tv(p: dict[str, float], q: dict[str, float]) -> float:
    """Total variation distance of two σ histograms (fractions): the share of pushes
    that would have to change σ to turn one into the other."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


QUANTITIES = ("steady_iteration_s", "iteration_s", "staleness_mean", "settled_iteration_s")


def run_validate(spec: Spec, real_runs: str | None = None) -> dict[str, Any]:
    """Every validation run for real, `spec.reps` times interleaved (calibration, A, B, ...,
    calibration, A, B, ...; a run whose directory `real_runs` already holds is read
    instead, so that a model change can be validated again on the same real runs). Each
    repetition's runs are then simulated with the model calibrated on that repetition's
    calibration run, the real run nearest in time and load. Compared: the median over
    repetitions of the simulated value against the median of the real one, with the real
    runs' range beside it (is a miss within their own spread?)."""
    import equipoise

    out: dict[str, Any] = {"runs": {}, "real_runs_reused": [], "calibrations": []}
    configs = validation_runs(spec)
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as name:
        tmp = Path(name)
        root = Path(real_runs) if real_runs else tmp
        rep = {label: 0 for label in configs}

        def real(label: str) -> dict[str, Any]:
            real_dir = root / f"rep{rep[label]}" / label
            rep[label] += 1
            t0 = time.perf_counter()
            if (real_dir / "summary.json").exists():
                summary = json.loads((real_dir / "summary.json").read_text())
                out["real_runs_reused"].append(str(real_dir.relative_to(root)))
            else:
                summary = equipoise.train(configs[label], out=real_dir)
            print(f"  real {real_dir.parent.name} {label}: {summary['train_s'] / summary['iterations']:.4f} s/it")
            return {"dir": real_dir, "summary": summary, "wall_s": time.perf_counter() - t0,
                    "loadavg": load_average()}

        reals = interleave({label: (lambda label=label: real(label)) for label in configs}, spec.reps)
        first = next(iter(configs))
        per: dict[str, dict[str, list]] = {label: {"real": [], "sim": []} for label in configs}
        for i in range(spec.reps):
            calib_dir = reals[first][i]["dir"]
            for label in configs:
                r = reals[label][i]
                sim = equipoise.simulate(r["dir"] / "config.toml", out=tmp / f"sim{i}-{label}", calibrate=calib_dir)
                if label == first:
                    out["calibrations"].append(json.loads((Path(sim["run_dir"]) / "calibration.json").read_text()))
                per[label]["real"].append({**_numbers(r["summary"], r["dir"]), "wall_s": r["wall_s"],
                                           "loadavg": r["loadavg"]})
                per[label]["sim"].append({**_numbers(sim, Path(sim["run_dir"])), "sim_s": sim["sim_s"]})
    out["calibration"] = out["calibrations"][0]
    for label, runs in per.items():
        entry: dict[str, Any] = {"config": configs[label], "reps": runs}
        for q in QUANTITIES:
            for side in ("real", "sim"):
                vals = [v[q] for v in runs[side] if v[q] is not None]
                entry[f"{side}_{q}"] = spread(vals) if vals else None
            r, s = entry[f"real_{q}"], entry[f"sim_{q}"]
            entry[f"{q}_error"] = (_error(s["median"], r["median"], floor=0.05 if q == "staleness_mean" else 0.0)
                                   if r and s else None)
        if any(v["staleness_mean"] > 0 for v in runs["real"]):
            entry["histogram_tv"] = spread([_tv(a["staleness_histogram"], b["staleness_histogram"])
                                             for a, b in zip(runs["real"], runs["sim"])])
        out["runs"][label] = entry

    def cell(entry: dict, q: str) -> str:
        return fmt_range(entry[f"real_{q}"]) if entry[f"real_{q}"] else "–"

    def sim_cell(entry: dict, q: str) -> Any:
        return entry[f"sim_{q}"]["median"] if entry[f"sim_{q}"] else None

    rows = [[k, cell(v, "steady_iteration_s"), sim_cell(v, "steady_iteration_s"), v["steady_iteration_s_error"],
             cell(v, "iteration_s"), sim_cell(v, "iteration_s"), v["iteration_s_error"],
             cell(v, "staleness_mean"), sim_cell(v, "staleness_mean"), v["staleness_mean_error"],
             v["histogram_tv"]["median"] if "histogram_tv" in v else None,
             cell(v, "settled_iteration_s"), sim_cell(v, "settled_iteration_s"), v["settled_iteration_s_error"]]
            for k, v in out["runs"].items()]
    out["table"] = markdown_table(["run", "real steady s/it median (range)", "sim", "error",
                                   "real s/it whole run (range)", "sim", "error", "real σ mean (range)", "sim",
                                   "error", "σ histogram TV", "real settled s/it (range)", "sim", "error"], rows)
    errors = [v["steady_iteration_s_error"] for k, v in out["runs"].items() if k != first] + [
        v["staleness_mean_error"] for v in out["runs"].values()
        if v["staleness_mean_error"] is not None and v["real_staleness_mean"]["median"] > 0.05]
    out["within_10_percent"] = sum(e <= 0.10 for e in errors)
    out["compared"] = len(errors)
    return out


# -- scale ------------------------------------------------------------------------------------

def _timed_sim(cfg: dict[str, Any], reps: int) -> dict[str, Any]:
    import equipoise

    times, summary = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        summary = equipoise.simulate(cfg, write=False)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps,
            "iteration_s": summary["iteration_s_mean"], "samples_per_s": summary["samples_per_s"]}


def scale_config(protocol: str, workers: int, servers: int, iterations: int) -> dict[str, Any]:
    return dict(protocol=protocol, workers=workers, servers=servers, worker_batch=32, iterations=iterations,
                block_size=max(256, 421_642 // max(4 * servers, 1)), eval_every=0, checkpoint_every=0)


def run_scale(spec: Spec, plots: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"curve": [], "headline": {}, "warmup": True}
    _timed_sim(scale_config("bsp", 10, 1, 2), 1)  # imports torch and builds the model once
    for protocol in ("bsp", "lbbsp", "asp"):
        for n in spec.workers:
            servers = min(100, max(1, n // 10))
            r = _timed_sim(scale_config(protocol, n, servers, spec.scale_iterations), 1)
            out["curve"].append({"protocol": protocol, "workers": n, "servers": servers,
                                 "iterations": spec.scale_iterations, **r,
                                 "wall_s_per_iteration": r["median_s"] / spec.scale_iterations})
            print(f"  {protocol} {n} workers: {r['median_s']:.2f} s")
    n, s, it = spec.headline
    for protocol, reps in (("bsp", spec.reps), ("lbbsp", 1), ("asp", 1)):
        out["headline"][protocol] = {"workers": n, "servers": s, "iterations": it,
                                     **_timed_sim(scale_config(protocol, n, s, it), reps)}
        print(f"  headline {protocol}: {out['headline'][protocol]['median_s']:.1f} s")
    out["table"] = markdown_table(
        ["protocol", "workers", "servers", "iterations", "wall s (median)", "range", "target ≤ 60 s"],
        [[p, h["workers"], h["servers"], h["iterations"], h["median_s"], f"{h['min_s']:.1f}–{h['max_s']:.1f}",
          "met" if h["median_s"] <= 60 else "missed"] for p, h in out["headline"].items()])
    if plots:
        out["plot"] = str(plot_scale(out["curve"], Path(plots) / "sim_scale.png"))

    return out


def plot_scale(curve: list[dict], path: Path, warmup: bool = True) -> Path:
    """Wall ms per simulated iteration against workers; without a warm-up (results written
    before it was added) the first point also paid for importing torch and building the
    model, and is drawn hollow, apart from its line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    cold = None if warmup else curve[0]
    for protocol in sorted({c["protocol"] for c in curve}):
        pts = [c for c in curve if c["protocol"] == protocol and c is not cold]
        line, = ax.plot([c["workers"] for c in pts], [1e3 * c["wall_s_per_iteration"] for c in pts], marker="o",
                        label=protocol)
        if cold is not None and cold["protocol"] == protocol:
            ax.plot([cold["workers"]], [1e3 * cold["wall_s_per_iteration"]], marker="o", mfc="none",
                    color=line.get_color(), linestyle="none",
                    label=f"{protocol}, first call (imports torch, builds the model)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("simulated workers (servers = workers / 10, at most 100)")
    ax.set_ylabel("wall ms per simulated iteration")
    ax.set_title("equipoise simulate: cost of one simulated iteration")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# -- study ------------------------------------------------------------------------------------

def heavy_tail_trace(path: Path, ranks: int, iterations: int, column: str = "worker", seed: int = 0,
                     hold: float = 20.0, alpha: float = 1.5, scale: float = 0.3, cap: float = 50.0) -> Path:
    """An iteration-unit trace: each rank's slowdown factor is 1 + Lomax(alpha, scale),
    capped at `cap`, redrawn after exponentially distributed holding times of mean `hold`
    iterations. With alpha = 1.5 and scale = 0.3 the median factor is 1.18, the mean about
    1.6, and 1.8% of machines are more than 5× slower at any moment (a power-law tail)."""
    rng = np.random.default_rng(seed)
    rows = [f"iteration,{column},factor"]
    for r in range(ranks):
        at = 0.0
        while at < iterations:
            f = min(cap, 1.0 + scale * (rng.pareto(alpha)))
            rows.append(f"{int(at)},{r},{f:.4g}")
            at += max(1.0, rng.exponential(hold))
    path.write_text("\n".join(rows) + "\n")
    return path


# A cluster of machines of their own on 10 GbE: 1,250 MB/s links and server NICs, 50 µs
# one way. Compute is this machine's, from the validate preset's calibration.
CLUSTER = {"sim_link_mbps": 1250.0, "sim_server_mbps": 1250.0, "sim_latency_s": 50e-6, "sim_cpu_share": 1.0}


def study_cost() -> dict[str, Any]:
    """The study's cost model: per-sample compute from the validate preset's calibration
    (its workers' mean b × the CPU share of a step: one core's own time, without this
    shared box's contention) and its noise, on `CLUSTER`'s network; the defaults' compute
    when no validate results exist."""
    path = RESULTS_DIR / f"{NAME}_validate.json"
    keys = dict(CLUSTER)
    if path.exists():
        fitted = json.loads(path.read_text())["validate"]["calibration"]["keys"]
        keys["sim_sample_s"] = [statistics.fmean(fitted["sim_sample_s"]) * fitted["sim_cpu_share"]]
        keys["sim_compute_s"] = [statistics.fmean(fitted["sim_compute_s"]) * fitted["sim_cpu_share"]]
        keys["sim_noise"] = fitted["sim_noise"]
    return keys


def run_study(spec: Spec) -> dict[str, Any]:
    import equipoise

    cost = study_cost()
    out: dict[str, Any] = {"cost_model": cost, "protocols": [], "placements": []}
    protocols = {"bsp": {}, "lbbsp": {}, "ssp": {"staleness_bound": 3}, "asp": {}}
    with tempfile.TemporaryDirectory(prefix="bench-sim-study-") as name:
        tmp = Path(name)
        for n in spec.workers:
            iterations = min(spec.study_iterations, 300_000 // n)  # 10,000 workers: 30 iterations
            trace = heavy_tail_trace(tmp / f"trace-{n}.csv", n, iterations)
            servers = max(1, n // 10)
            base = dict(cost, workers=n, servers=servers, worker_batch=128, iterations=iterations,
                        block_size=max(256, 421_642 // (2 * servers)), eval_every=0, checkpoint_every=0)
            ideal = equipoise.simulate(dict(base, protocol="bsp"), write=False)["samples_per_s"]
            for p, extra in protocols.items():
                t0 = time.perf_counter()
                s = equipoise.simulate(dict(base, protocol=p, trace=str(trace), **extra), write=False)
                out["protocols"].append({"workers": n, "servers": servers, "protocol": p, "iterations": iterations,
                                         "samples_per_s": s["samples_per_s"], "vs_no_stragglers": s["samples_per_s"] / ideal,
                                         "staleness_mean": s["staleness_mean"], "sim_s": time.perf_counter() - t0})
                print(f"  {n} workers {p}: {s['samples_per_s']:.0f} samples/s ({time.perf_counter() - t0:.1f} s)")
        for servers in spec.psld_servers:
            trace = heavy_tail_trace(tmp / f"servers-{servers}.csv", servers, 3 * spec.study_iterations,
                                     column="server", seed=1, hold=50.0)
            for placement in ("mxnet", "byteps", "greedy", "psld"):
                s = equipoise.simulate(dict(cost, protocol="bsp", workers=32, servers=servers, placement=placement,
                                            global_batch=32 * 128, iterations=3 * spec.study_iterations,
                                            block_size=32768, server_trace=str(trace), server_rate=200.0,
                                            server_bandwidth=[200.0] * servers, psld_interval=5,
                                            psld_epsilon=0.05, eval_every=0, checkpoint_every=0), write=False)
                out["placements"].append({"servers": servers, "placement": placement,
                                          "iteration_s": s["iteration_s_mean"], "samples_per_s": s["samples_per_s"]})
    by = {(r["workers"], r["protocol"]): r for r in out["protocols"]}
    out["protocol_table"] = markdown_table(
        ["workers"] + [f"{p} samples/s (× no stragglers)" for p in protocols],
        [[n] + [f"{by[(n, p)]['samples_per_s']:,.0f} ({by[(n, p)]['vs_no_stragglers']:.2f})" for p in protocols]
         for n in spec.workers])
    pl = {(r["servers"], r["placement"]): r for r in out["placements"]}
    names = ("mxnet", "byteps", "greedy", "psld")
    out["placement_table"] = markdown_table(
        ["servers"] + [f"{p} s/iteration" for p in names] + ["mxnet / psld", "byteps / psld", "greedy / psld"],
        [[s] + [pl[(s, p)]["iteration_s"] for p in names] +
         [pl[(s, p)]["iteration_s"] / pl[(s, "psld")]["iteration_s"] for p in names[:3]] for s in spec.psld_servers])
    return out


def run(preset: str, results_path: str | None = None, plots: str | None = None,
        real_runs: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average()}
    t0 = time.perf_counter()
    if preset in ("validate", "ci"):
        result["validate"] = run_validate(spec, real_runs)
        print(result["validate"]["table"])
    if preset in ("scale", "ci"):
        result["scale"] = run_scale(spec, plots)
        print(result["scale"]["table"])
    if preset in ("study", "ci"):
        result["study"] = run_study(spec)
        print(result["study"]["protocol_table"] + "\n\n" + result["study"]["placement_table"])
    result["bench_s"] = time.perf_counter() - t0
    if preset != "ci" or results_path:
        print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--results", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument("--plots", default=None, help="folder for sim_scale.png (e.g. docs/img)")
    parser.add_argument("--real-runs", default=None, help="validate: folder of the real run directories, "
                        "written there, or read from there if a run is already in it")
    args = parser.parse_args()
    run(args.preset, args.results, args.plots, args.real_runs)


if __name__ == "__main__":
    main()
