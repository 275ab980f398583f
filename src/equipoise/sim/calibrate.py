"""Fitting the simulator's cost model (cost.py) to a real run directory.

``calibrate`` fits each worker's a and b, the CPU share of a step, the noise and the
servers' cost per byte from the run's metrics.jsonl, then the latency by simulating the
run's own config until it takes the real mean iteration time (docs/simulate.md,
Calibration).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, ConfigError, read_toml
from ..scenario import Scenario
from ..telemetry.metrics import read_metrics
from .cost import MB, model_tensors_of
from .engine import Simulation

WARMUP = 2  # iterations of a real run left out of a fit (process start, first allocations)


def calibrate(run_dir: str | Path) -> dict[str, Any]:
    """Fit the cost model to a real run directory: returns ``{"keys": {sim_* key: value},
    "fit": {...what was fitted from what...}}``. Raises ConfigError naming the directory
    when it is not a usable run (no config.toml or no iteration records)."""
    run = Path(run_dir)
    if not (run / "config.toml").is_file() or not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"--calibrate {str(run)!r} is not a run directory (needs config.toml and metrics.jsonl)")
    try:
        cfg = Config.from_dict(read_toml(run / "config.toml"))
    except ConfigError as exc:
        raise ConfigError(f"--calibrate {str(run)!r}: its config.toml: {exc}") from None
    records = read_metrics(run / "metrics.jsonl")
    iters = {r["iteration"]: r for r in records if r.get("type") == "iteration"}
    rows = [iters[t] for t in sorted(iters) if t >= WARMUP] or [iters[t] for t in sorted(iters)]
    if not rows:
        raise ConfigError(f"--calibrate {str(run)!r}: metrics.jsonl has no iteration records")
    scenario = Scenario.of(cfg)
    of = _factors(iters, scenario)
    factors = [of[r["iteration"]] for r in rows]
    cores = _emulation_host(run)
    # (iteration, rank, batch, compute_s, cpu, factor) of each step that computed
    steps = [(k, w, float(r["batch"][i]), float(r["compute_s"][i]), float((r.get("cpu") or [0.0] * len(fs))[i]), f)
             for k, (r, fs) in enumerate(zip(rows, factors)) for i, (w, f) in enumerate(zip(r["workers"], fs))
             if r["compute_s"][i] and r["batch"][i]]
    # the CPU share of an unslowed step (the `cpu` its worker reported); 1 if none was
    plain = [c for _, _, _, _, c, f in steps if f == 1.0 and c]
    share = min(1.0, max(0.01, statistics.median(plain))) if plain else 1.0
    ranks = range(max(w for _, w, *_ in steps) + 1)
    overhead, overhead_from = 0.0, "not fitted: separate machines (a slowdown of their own costs no extra CPU)"
    if cores and plain:  # one machine: fit its steps' CPU seconds, the host model shares them out
        points, overhead, overhead_from = _cpu_points(steps, share)
    else:
        points = [(k, w, x, y / (1.0 + (f - 1.0) * share)) for k, w, x, y, _, f in steps]
    xs: dict[int, list[float]] = {}
    ys: dict[int, list[float]] = {}
    for _, w, x, y in points:
        xs.setdefault(w, []).append(x)
        ys.setdefault(w, []).append(y)
    fits = {w: _line(xs[w], ys[w]) for w in xs}
    if cores:  # one machine: its workers differ only by chance, so one line for all
        pooled = _line([p[2] for p in points], [p[3] for p in points])
        a, b = [pooled[0]] * len(ranks), [pooled[1]] * len(ranks)
    else:
        a = [fits[w][0] if w in fits else statistics.fmean(f[0] for f in fits.values()) for w in ranks]
        b = [fits[w][1] if w in fits else statistics.fmean(f[1] for f in fits.values()) for w in ranks]
    shared, noise, corr = _noise([(k, math.log(y / (a[w] + b[w] * x))) for k, w, x, y in points if a[w] + b[w] * x > 0])
    server_s, servers_from = _server_cost(cfg, records, scenario)
    tensors = model_tensors_of(cfg)
    keys = {"sim_compute_s": [round(v, 9) for v in a], "sim_sample_s": [round(v, 11) for v in b],
            "sim_noise": round(noise, 6), "sim_noise_shared": round(shared, 6),
            "sim_noise_shared_corr": round(corr, 4), "sim_cpu_share": round(share, 4),
            "sim_stretch_cpu": round(overhead, 4), "sim_host_cores": cores, "sim_host_load": 0.0,
            "sim_server_mbps": round(1.0 / (server_s * MB), 3) if server_s > 0 else 0.0}
    target = steady_iteration_s(records)
    if target is None:
        raise ConfigError(f"--calibrate {str(run)!r}: needs more than {WARMUP} iterations")
    load_from = "not fitted: separate machines"
    for _ in range(2 if cores and plain else 1):  # the load and the latency move each other's fit a little
        if cores and plain:
            keys["sim_host_load"] = round(_fit_load(cfg.replace(**keys), tensors, len(iters), statistics.fmean(plain)), 4)
            load_from = f"the mean core share of {len(plain)} unslowed steps"
        elif cores:
            load_from = "not fitted: no unslowed step reported its cpu"
        keys["sim_latency_s"] = round(_fit_latency(cfg.replace(**keys), tensors, len(iters), target), 9)
    fit = {"run_dir": str(run), "protocol": cfg.protocol, "workers": cfg.workers, "iterations_used": len(rows),
           "steady_iteration_s": target, "server_cost_from": servers_from, "stretch_cpu_from": overhead_from,
           "host_load_from": load_from,
           "compute_fit": {str(w): {"a": fits[w][0], "b": fits[w][1], "points": len(xs[w]),
                                    "batch_range": [min(xs[w]), max(xs[w])]} for w in sorted(fits)}}
    return {"keys": keys, "fit": fit}


def _cpu_points(steps: list[tuple], share: float) -> tuple[list[tuple[int, int, float, float]], float, str]:
    """An emulation host's steps as points (iteration, rank, batch, CPU seconds ÷ ρ) of
    one line a + b·x, and the stretch's CPU overhead κ (cost.py). The line is fitted to
    the unstretched steps (a run whose steps have several batch sizes tells a from b),
    κ to the stretched ones' excess over it: CPU = (a + b·x)·(1 + κ·(1 − 1/f)), the
    median over the stretched steps, ≥ 0; their points are then divided by that
    factor. With no stretched step, or no unstretched one, κ = 0."""
    plain = [(x, c * y) for _, _, x, y, c, f in steps if f == 1.0 and c]
    stretched = [(x, c * y, f) for _, _, x, y, c, f in steps if f > 1.0 and c]
    overhead, source = 0.0, "not fitted: the run has no stretched step"
    if plain and stretched:
        a, b = _line([x for x, _ in plain], [c for _, c in plain])
        excess = [(c / (a + b * x) - 1.0) / (1.0 - 1.0 / f) for x, c, f in stretched if a + b * x > 0]
        if excess:
            overhead = max(0.0, statistics.median(excess))
            source = f"{len(excess)} stretched steps against {len(plain)} unstretched ones"
    elif stretched:
        source = "not fitted: the run has no unstretched step"
    points = [(k, w, x, c * y / share / (1.0 + overhead * (1.0 - 1.0 / max(f, 1.0))))
              for k, w, x, y, c, f in steps if c]
    return points, overhead, source


def _factors(iters: dict[int, dict], scenario: Scenario) -> dict[int, list[float]]:
    """Each iteration record's workers' scenario factors as the run applied them: at the
    iteration and at the elapsed time it began (the previous record's end)."""
    out, prev = {}, 0.0
    for t in sorted(iters):
        out[t] = [scenario.worker_factor(w, elapsed=prev, iteration=t) for w in iters[t]["workers"]]
        prev = iters[t].get("elapsed") or prev
    return out


def _fit_load(cfg: Config, tensors, iterations: int, target: float) -> float:
    """``sim_host_load``: the other runnable processes at which the simulated run's
    unstretched steps get the core share (mean ``cpu``) the real ones got, by bisection
    (the share falls as the load grows); 0 if the simulation's is already lower."""
    scenario = Scenario.of(cfg)

    def share(load: float) -> float:
        records: list[dict] = []
        Simulation(cfg.replace(sim_host_load=load), tensors, iterations, emit=records.append).run()
        iters = {r["iteration"]: r for r in records if r.get("type") == "iteration"}
        of = _factors(iters, scenario)
        vals = [c for t, r in iters.items() if t >= WARMUP for c, f in zip(r["cpu"], of[t]) if f == 1.0]
        return statistics.fmean(vals) if vals else 1.0

    lo, hi = 0.0, float(cfg.workers + cfg.servers + 1)
    if share(lo) <= target:
        return 0.0
    while share(hi) > target and hi < 1e4:
        hi *= 2
    for _ in range(25):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) > target else (lo, mid)
    return (lo + hi) / 2


def _noise(residuals: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(σ shared, σ own, correlation) of log(measured ÷ fitted), split into a part common
    to an iteration's steps (the host or the job slowed down for everyone: the variance
    of the iterations' means less what the steps' own spread puts into a mean), the
    steps' own spread about their iteration's mean, and the lag-1 correlation of the
    iterations' means (in [0, 0.99]; 0 without a shared part)."""
    by: dict[int, list[float]] = {}
    for k, v in residuals:
        by.setdefault(k, []).append(v)
    groups = [by[k] for k in sorted(by) if len(by[k]) > 1]
    if not groups:
        return 0.0, statistics.pstdev([v for _, v in residuals]) if len(residuals) > 1 else 0.0, 0.0
    own = statistics.fmean(statistics.variance(g) for g in groups)
    means = [statistics.fmean(g) for g in groups]
    common = statistics.pvariance(means) - own / statistics.fmean(len(g) for g in groups) if len(means) > 1 else 0.0
    corr = 0.0
    if common > 0 and len(means) > 2:
        corr = min(0.99, max(0.0, float(np.corrcoef(means[:-1], means[1:])[0, 1])))
    return math.sqrt(max(0.0, common)), math.sqrt(own), corr


def _emulation_host(run: Path) -> int:
    """The cores of this machine if every worker of the run ran on it (its summary's
    "nodes"): the run was an emulation, its workers shared these cores; else 0 (each
    worker had a machine of its own, or the run's host is not known)."""
    try:
        nodes = json.loads((run / "summary.json").read_text(encoding="utf-8"))["nodes"]
        hosts = {v["hostname"] for k, v in nodes.items() if k.startswith("worker")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
    return len(os.sched_getaffinity(0)) if hosts == {socket.gethostname()} else 0


def steady_iteration_s(records: list[dict]) -> float | None:
    """Mean seconds per iteration after the first ``WARMUP`` (their records' last
    ``elapsed`` minus that of iteration WARMUP − 1, over the iterations between): the
    steady window, without the processes' start-up, which a simulation does not model.
    None with too few iteration records."""
    its = [r for r in records if r.get("type") == "iteration" and r.get("elapsed") is not None]
    n = 1 + max((r["iteration"] for r in its), default=-1)
    if n <= WARMUP:
        return None
    start = max(r["elapsed"] for r in its if r["iteration"] < WARMUP)
    return (max(r["elapsed"] for r in its) - start) / (n - WARMUP)


def _fit_latency(cfg: Config, tensors, iterations: int, target: float) -> float:
    """The one-way latency at which the simulation of the run's own config takes the
    real steady mean iteration time (``steady_iteration_s``): everything of an exchange
    that the fitted compute and server costs do not explain (messages, serialisation,
    the coordinator) is charged as latency. The simulated time grows with the latency,
    so bisection finds it; 0 if the simulation is already slower."""
    def mean_s(latency: float) -> float:
        records: list[dict] = []
        Simulation(cfg.replace(sim_latency_s=latency), tensors, iterations, emit=records.append).run()
        return steady_iteration_s(records)

    lo, hi = 0.0, max(target, 1e-6)
    if mean_s(lo) >= target:
        return 0.0
    while mean_s(hi) < target:
        hi *= 2
    for _ in range(30):  # to 1e-9 of the bracket
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_s(mid) < target else (lo, mid)
    return (lo + hi) / 2


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares a + b·x ≥ 0; with (almost) one batch size a line cannot be told from a
    proportion, so a = 0 and b = mean(y) / mean(x)."""
    xa, ya = np.asarray(x), np.asarray(y)
    if len(xa) < 3 or xa.max() - xa.min() < max(1.0, 0.1 * xa.mean()):
        return 0.0, float(ya.mean() / xa.mean())
    b, a = np.polyfit(xa, ya, 1)
    if a < 0 or b < 0:  # noise pushed the line through a negative cost: a proportion instead
        return (0.0, float(ya.mean() / xa.mean())) if a < 0 else (float(ya.mean()), 0.0)
    return float(a), float(b)


def _server_cost(cfg: Config, records: list[dict], scenario: Scenario) -> tuple[float, str]:
    """Seconds per byte a server at factor 1 spends, from the "servers" records (busy
    seconds over bytes, less the emulated slowdown it was charged) of servers without a
    bandwidth cap (behind one, the cap's time hides the server's own); the configured
    rate when the run has none (non-barrier protocols are not measured)."""
    per_byte = []
    for r in records:
        if r.get("type") != "servers":
            continue
        for s, busy, nbytes in zip(r["servers"], r["busy_s"], r["bytes"]):
            capped = s < len(scenario.server_bandwidth) and scenario.server_bandwidth[s] > 0
            if busy > 0 and nbytes > 0 and not capped:
                f = scenario.server_factor(s, r.get("elapsed") or 0.0, r["iteration"])
                per_byte.append(max(0.0, busy / nbytes - (f - 1.0) / (scenario.server_rate * MB)))
    if per_byte:
        return statistics.median(per_byte), f"{len(per_byte)} server measurements"
    return (1.0 / (cfg.sim_server_mbps * MB) if cfg.sim_server_mbps else 0.0), "the configured sim_server_mbps"


def write_calibration(path: Path, fitted: dict[str, Any]) -> None:
    path.write_text(json.dumps(fitted, indent=2) + "\n", encoding="utf-8")


__all__ = ["WARMUP", "calibrate", "steady_iteration_s", "write_calibration"]
