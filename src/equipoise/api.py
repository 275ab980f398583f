"""The public Python API: `train(config)` runs a job and returns its summary."""

from __future__ import annotations

import gc
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from .config import (DEFAULT_JOB, USER_CODE, Config, ConfigError, EquipoiseWarning, absolute_specs, flatten_tables,
                     read_toml)
from .data import DataError
from .models import build_model
from .protocol.checkpoint import load_checkpoint, write_atomic
from .launch.local import run_local
from .spec import callable_spec, one_line
from .sparse.checks import tables_refusal
from .sparse.tables import TableError, sparse_tables
from .telemetry.metrics import json_safe
from .workload import SampleError, StepError, Workload, load_workload

ConfigLike = Config | Mapping[str, Any] | str | Path | None


def resolve_config(config: ConfigLike = None, **overrides: Any) -> Config:
    """A Config from a Config, a mapping of keys, or a TOML path, plus keyword overrides.
    `model`, `dataset`, `loss`, `metrics` and `collate` may also be top-level callables
    (a function, an nn.Module or Dataset class): they become specs every process imports.
    No config at all is the default job (config.DEFAULT_JOB), keyword overrides on top."""
    overrides = _specs(flatten_tables(overrides))
    if config is None:
        config = dict(DEFAULT_JOB)
    if isinstance(config, Mapping):
        config = _specs(flatten_tables(config))
    if isinstance(config, Config):
        return config.replace(**overrides) if overrides else config
    if isinstance(config, (str, Path)):
        return Config.load(config, overrides)
    return Config.from_dict({**(config or {}), **overrides})


def train(config: ConfigLike = None, *, out: str | Path | None = None,
          resume: str | Path | None = None, started_at: float | None = None, **overrides: Any) -> dict:
    """Run a training job and return its summary (also in summary.json): on this machine,
    or on a Ray cluster with ``launcher="ray"``.

    `config` is a `Config`, a dict of config keys, or a TOML path; keyword arguments
    override single keys (``train(protocol="asp", workers=2)``). With `resume`, the job
    continues from that run directory's checkpoint, using its config.toml plus overrides.
    `started_at` (``time.time()``; default: now) is when the command started, from which
    the summary's `startup_s` counts.
    """
    started_at = time.time() if started_at is None else float(started_at)
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.toml").exists():
            raise ConfigError(f"--resume {str(run_dir)!r} is not a run directory (no config.toml)")
        extra = _specs(_as_dict(config, overrides))
        cfg = Config.load(run_dir / "config.toml", extra)
        ckpt = load_checkpoint(run_dir)
    else:
        cfg = resolve_config(config, **overrides)
        run_dir = _new_run_dir(out, cfg)
        ckpt = None
    from .launch import warm

    if cfg.launcher != "ray":  # its imports run beside the checks below (launch/warm.py)
        warm.prestart(cfg.threads, min(cfg.timeout, 120.0))
    try:
        return _train(cfg, run_dir, ckpt, started_at)
    finally:
        warm.discard_early()  # not adopted: the job was refused before it started
        _return_freed_memory()


def _return_freed_memory() -> None:
    """Free what the job built here and hand the C allocator's freed pages back to the
    system (glibc's ``malloc_trim``; elsewhere nothing). The coordinator's objects refer
    to each other (its parts keep callbacks into it), so the job's model, a sparse
    table's initial rows and its snapshots are freed only by the cycle collector, which
    might not run for the whole next job: with a 10⁷-row table (1.28 GB) each job in one
    process peaked about that much higher than the one before (5.5, 6.7, 8.0 GB)."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


def _train(cfg: Config, run_dir: Path, ckpt, started_at: float) -> dict:
    for advice in cfg.warnings():
        warnings.warn(advice, EquipoiseWarning, stacklevel=2)
    data = check_workload(cfg)
    if cfg.launcher != "ray":
        check_specs_as_workers(cfg)
    if cfg.global_batch > len(data):
        raise ConfigError(f"global_batch = {cfg.global_batch} is more than the {len(data)} "
                          f"training samples of dataset {cfg.dataset!r}")
    if cfg.launcher == "ray":
        from .launch.ray_cluster import preflight
        preflight(cfg)
    else:  # the workers run here: the devices they ask for must be here
        check_devices(cfg)
    if cfg.progress:  # once the job is known to start: a refused one prints its error alone
        print(f"equipoise: {cfg.optimizer_line()}", file=sys.stderr)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.toml", cfg.to_toml())
    try:
        if cfg.launcher == "ray":
            from .launch.ray_cluster import run_ray
            summary = run_ray(cfg, run_dir, data, resume=ckpt)
        else:
            summary = run_local(cfg, run_dir, data, resume=ckpt)
    except BaseException as exc:
        _write_summary(run_dir, {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                 "protocol": cfg.protocol})
        raise
    summary.update(timing_split(started_at, time.time(), summary.pop("marks", None)))
    summary["run_dir"] = str(run_dir)
    summary["warnings"] = cfg.warnings()
    _write_summary(run_dir, summary)
    return summary


def timing_split(started: float, ended: float, marks: dict | None) -> dict:
    """Where a job's wall time went (summary.json): `startup_s` from the command to the
    first iteration (`train_s`, first to last report, is the coordinator's), `eval_s` the
    time after training spent on evaluations it did not hide, `shutdown_s` from the last
    evaluation to the end, and `total_s` all of it. `marks` are the coordinator's wall
    clock times of the first iteration, the last report and the last evaluation."""
    total = max(0.0, ended - started)
    if not marks:
        return {"total_s": total}
    first, trained, evaluated = (float(marks[k]) for k in ("first_iteration", "trained", "evaluated"))
    return {"startup_s": max(0.0, first - started), "eval_s": max(0.0, evaluated - trained), "shutdown_s": max(0.0, ended - evaluated), "total_s": total}


def check_specs_as_workers(cfg: Config) -> None:
    """ConfigError, one line, if a spec of the user's code that this process imports
    would not import in a worker: tried in a child started as the workers are (the same
    environment and working directory, none of this process's sys.path)."""
    from .launch.local import child_env
    from .spec import check_in_child

    specs = cfg.user_specs()
    if specs:
        error = check_in_child(specs, child_env(cfg), min(cfg.timeout, 120.0))
        if error is not None:
            raise ConfigError(error)


def check_devices(cfg: Config) -> None:
    """ConfigError, one line, if a worker's device or precision is not on this machine
    (a CUDA device asked for where none exists, bf16 on a pre-Ampere GPU)."""
    from .device import DeviceError, check_local

    try:
        check_local(cfg)
    except DeviceError as exc:
        raise ConfigError(str(exc)) from None


def control(run_dir: str | Path, action: str, **fields: int) -> None:
    """Ask a running job to change its servers at its next barrier (BSP/LB-BSP; as the
    stream passes the next iteration under asp, softsync and ssp):
    ``control(run, "add_server")``, ``control(run, "remove_server", server=2)`` or
    ``control(run, "move", block=5, to=1)``. The request is appended to
    run_dir/control.jsonl; the outcome appears as an event in metrics.jsonl."""
    from .policy.actions import parse_control

    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").exists():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no config.toml)")
    line = json.dumps({"action": action, **fields})
    try:
        parse_control(line)
    except ValueError as exc:
        raise ConfigError(f"control request {line}: {exc}") from None
    with (run_dir / "control.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def model_spec(model: Any) -> str:
    """The config string for a model: names pass through; a callable becomes
    'module:qualname', or 'path/to/script.py:qualname' when defined in the running script
    (servers and workers import it from there); relative script paths become absolute."""
    return callable_spec(model, "model", ConfigError)


def _specs(values: Mapping[str, Any]) -> dict:
    """`values` with every user-code key that holds a callable turned into its spec."""
    out = dict(values)
    for key in USER_CODE:
        value = out.get(key)
        if value is None or isinstance(value, str):
            if isinstance(value, str) and ":" in value:
                out[key] = callable_spec(value, key, ConfigError)
            continue
        if key == "dataset" and not callable(value) and hasattr(value, "__getitem__"):
            raise ConfigError(f"dataset = {type(value).__name__} instance: pass its class or a function "
                              "that returns it (every worker builds its dataset in its own process)")
        out[key] = callable_spec(value, key, ConfigError)
    return out


def check_workload(cfg: Config) -> Workload:
    """Build the job's workload here and try it on a batch of two samples — a model
    built, the loss computed, the metrics on the evaluation set — so that a user's
    mistake is one line naming the spec before any process starts. Returns it. The
    caller's global RNG state is left as it was."""
    work = load_workload(cfg)
    if cfg.collate and hasattr(work.train, "get_batch"):
        raise ConfigError(f"collate = {cfg.collate!r} would not be used: dataset {cfg.dataset!r} defines "
                          "get_batch, which returns whole batches")
    names: set[str] = set()
    with torch.random.fork_rng(devices=[]):
        try:
            n = min(2, len(work))
            batch = work.fetch(work.train, torch.arange(n))
            torch.manual_seed(cfg.seed)
            model = build_model(cfg.model, work.input_shape, work.num_classes, cfg.model_args)
            model.train()
            refused = tables_refusal(cfg, sparse_tables(model))  # TableError: a module they cannot honour
            if refused:
                raise ConfigError(refused)
            step = _user_call(work, "loss", lambda: work.loss_of(model, batch, n))
            if not step.objective.requires_grad:
                raise StepError(f"loss {work.names['loss']!r} does not depend on the model's parameters "
                                "(its result has no gradient)")
            if work.eval is not None:
                m = min(2, work.num_eval)
                eval_batch = work.fetch(work.eval, torch.arange(m), "eval")
                with torch.no_grad():
                    model.eval()
                    names = set(_user_call(work, "metrics", lambda: work.batch_metrics(model, eval_batch, m)))
        except SampleError as exc:
            raise DataError(str(exc)) from None
        except TableError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.target:
        if work.eval is None:
            raise ConfigError(f"target = {cfg.target}: dataset {cfg.dataset!r} has no evaluation set")
        if cfg.target["metric"] not in {f"test_{k}" for k in names}:
            raise ConfigError(f"target metric {cfg.target['metric']!r} is not one of the evaluation's "
                              f"{', '.join(sorted(f'test_{k}' for k in names))}")
    return work


def _user_call(work: Workload, what: str, call):
    """`call()`, with an exception raised by the user's code (or the model's forward in
    it) turned into a one-line StepError naming the spec."""
    try:
        return call()
    except (StepError, DataError):
        raise
    except Exception as exc:
        raise StepError(f"{what} {work.names[what]!r} raised {type(exc).__name__} on a batch of two samples: "
                        f"{one_line(exc)}") from exc


def _as_dict(config: ConfigLike, overrides: Mapping[str, Any]) -> dict:
    if isinstance(config, Config):
        raise ConfigError("with resume, pass overrides as a dict, not a Config")
    if isinstance(config, (str, Path)):
        return {**absolute_specs(flatten_tables(read_toml(config))), **flatten_tables(overrides)}
    return {**flatten_tables(config or {}), **flatten_tables(overrides)}


def _new_run_dir(out: str | Path | None, cfg: Config) -> Path:
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{stamp}-{cfg.protocol}"
    path = Path(out)
    if (path / "metrics.jsonl").exists():
        raise ConfigError(f"--out {str(path)!r} already holds a run: use --resume {path} or another folder")
    return path


def _write_summary(run_dir: Path, summary: dict) -> None:
    write_atomic(run_dir / "summary.json", json.dumps(json_safe(summary), indent=2) + "\n")
