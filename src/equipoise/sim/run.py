"""``simulate``: resolve a config, optionally calibrate its cost model from a real run,
simulate, and write the same run-directory files a real job writes, marked simulated."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError
from ..coordinator.stats import RunStats
from ..telemetry.metrics import MetricsWriter
from .calibrate import calibrate as fit, write_calibration
from .cost import dataset_shape, model_tensors_of
from .engine import Simulation


def simulate(config: Any = None, *, out: str | Path | None = None, calibrate: str | Path | None = None,
             write: bool = True, **overrides: Any) -> dict:
    """Simulate a job and return its summary (also written to ``out``/summary.json).

    ``config`` and keyword overrides are as for ``equipoise.train``; the cost model is the
    ``sim_*`` keys (docs/simulate.md). With ``calibrate`` = a real run directory, the
    ``sim_*`` keys are first fitted to it (explicit overrides still win) and the fit is
    written to ``out``/calibration.json. ``write=False`` writes no run directory (the
    summary is still returned). Precedence: defaults < config < calibration < overrides."""
    from ..api import _new_run_dir, _write_summary, resolve_config

    cfg = resolve_config(config, **overrides)
    fitted = None
    if calibrate is not None:
        fitted = fit(calibrate)
        keys = dict(fitted["keys"])
        for key in ("sim_compute_s", "sim_sample_s"):  # per worker only for as many workers
            if len(keys[key]) != cfg.workers:
                keys[key] = [sum(keys[key]) / len(keys[key])]
        fitted["applied"] = keys
        cfg = resolve_config(config, **{**keys, **overrides})
    _check_simulable(cfg)
    iterations = cfg.total_iterations(dataset_shape(cfg)[2])
    run_dir = None
    if write:
        run_dir = _new_run_dir(out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-sim-{cfg.protocol}", cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(cfg.to_toml(), encoding="utf-8")
        if fitted is not None:
            write_calibration(run_dir / "calibration.json", fitted)
    writer = MetricsWriter(run_dir / "metrics.jsonl") if run_dir is not None else None
    started = time.perf_counter()
    try:
        sim = Simulation(cfg, model_tensors_of(cfg), iterations,
                         emit=(lambda rec: writer.write({**rec, "time": time.time()})) if writer else None)
        result = sim.run()
    finally:
        if writer is not None:
            writer.close()
    summary = _summary(cfg, iterations, result)
    summary["sim_s"] = time.perf_counter() - started
    summary["run_dir"] = str(run_dir) if run_dir is not None else None
    if run_dir is not None:
        _write_summary(run_dir, summary)
    return summary


def _check_simulable(cfg: Config) -> None:
    if cfg.neighbours or cfg.cpu_limit:
        raise ConfigError("neighbours and cpu_limit are real processes and cgroups, which a simulation "
                          "cannot run: describe the stragglers with slowdown or trace")
    if cfg.overlap:
        raise ConfigError("overlap = true is not simulated (exchanges are simulated one at a time)")
    if (cfg.placement == "psld" or cfg.server_events) and not cfg.has_barrier:
        raise ConfigError(f"placement = \"psld\" and server_events are simulated at barriers only (bsp, "
                          f"lbbsp), not under {cfg.protocol}: a real job hands blocks over while workers run")


def _summary(cfg: Config, iterations: int, result: dict) -> dict:
    """The summary a real job writes (RunStats.summary), on virtual time, marked simulated."""
    stats = RunStats(cfg.global_batch)
    stats.t_start, stats.t_last = 0.0, result["train_s"]
    stats.samples, stats.busy = result["samples"], result["busy"]
    summary = stats.summary(cfg, iterations, {}, wall_s=result["train_s"], staleness=result["histogram"])
    summary.update(simulated=True, warnings=cfg.warnings(), resumed_from=None,
                   iteration_s_mean=result["train_s"] / max(iterations, 1))
    if cfg.protocol == "lbbsp":
        summary.update(predictor_mape=result["planner"].mape(), predictor=cfg.predictor)
    return summary


__all__ = ["simulate"]
