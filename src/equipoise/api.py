"""The public Python API: `train(config)` runs a job and returns its summary."""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from .config import Config, ConfigError, EquipoiseWarning, read_toml, to_toml
from .data import load_dataset
from .runtime.checkpoint import load_checkpoint
from .runtime.launch.local import run_local
from .telemetry.metrics import json_safe

ConfigLike = Config | Mapping[str, Any] | str | Path | None


def resolve_config(config: ConfigLike = None, **overrides: Any) -> Config:
    """A Config from a Config, a mapping of keys, or a TOML path, plus keyword overrides.
    `model` may also be a callable (a function or nn.Module class) returning the model."""
    if "model" in overrides:
        overrides["model"] = model_spec(overrides["model"])
    if isinstance(config, Mapping) and "model" in config:
        config = {**config, "model": model_spec(config["model"])}
    if isinstance(config, Config):
        return config.replace(**overrides) if overrides else config
    if isinstance(config, (str, Path)):
        return Config.load(config, overrides)
    return Config.from_dict({**(config or {}), **overrides})


def train(config: ConfigLike = None, *, out: str | Path | None = None,
          resume: str | Path | None = None, **overrides: Any) -> dict:
    """Run a training job and return its summary (also in summary.json): on this machine,
    or on a Ray cluster with ``launcher="ray"``.

    `config` is a `Config`, a dict of config keys, or a TOML path; keyword arguments
    override single keys (``train(protocol="asp", workers=2)``). With `resume`, the job
    continues from that run directory's checkpoint, using its config.toml plus overrides.
    """
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.toml").exists():
            raise ConfigError(f"--resume {str(run_dir)!r} is not a run directory (no config.toml)")
        extra = _as_dict(config, overrides)
        if "model" in extra:
            extra["model"] = model_spec(extra["model"])
        cfg = Config.load(run_dir / "config.toml", extra)
        ckpt = load_checkpoint(run_dir)
    else:
        cfg = resolve_config(config, **overrides)
        run_dir = _new_run_dir(out, cfg)
        ckpt = None
    for advice in cfg.warnings():
        warnings.warn(advice, EquipoiseWarning, stacklevel=2)
    data = load_dataset(cfg.dataset, cfg.data_dir or None, seed=cfg.seed)
    if cfg.global_batch > len(data):
        raise ConfigError(f"global_batch = {cfg.global_batch} is more than the {len(data)} "
                          f"training samples of dataset {cfg.dataset!r}")
    if cfg.launcher == "ray":
        from .runtime.launch.ray_cluster import preflight
        preflight(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg.to_dict()), encoding="utf-8")
    try:
        if cfg.launcher == "ray":
            from .runtime.launch.ray_cluster import run_ray
            summary = run_ray(cfg, run_dir, data, resume=ckpt)
        else:
            summary = run_local(cfg, run_dir, data, resume=ckpt)
    except BaseException as exc:
        _write_summary(run_dir, {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                 "protocol": cfg.protocol})
        raise
    summary["run_dir"] = str(run_dir)
    summary["warnings"] = cfg.warnings()
    _write_summary(run_dir, summary)
    return summary


def control(run_dir: str | Path, action: str, **fields: int) -> None:
    """Ask a running job to change its servers at its next barrier (BSP/LB-BSP):
    ``control(run, "add_server")``, ``control(run, "remove_server", server=2)`` or
    ``control(run, "move", block=5, to=1)``. The request is appended to
    run_dir/control.jsonl; the outcome appears as an event in metrics.jsonl."""
    from .policy.psld import parse_control

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
    if isinstance(model, str):
        path, sep, attr = model.rpartition(":")
        if sep and path.endswith(".py"):
            return f"{Path(path).resolve()}:{attr}"
        return model
    if not callable(model):
        raise ConfigError(f"model = {model!r} is neither a name, a spec nor a callable")
    module = getattr(model, "__module__", None)
    qualname = getattr(model, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise ConfigError(f"model = {model!r} must be defined at the top level of a module or script")
    if module == "__main__":
        main = sys.modules["__main__"]
        if not getattr(main, "__file__", None):
            raise ConfigError(f"model = {model!r} is defined interactively; put it in a file")
        return f"{Path(main.__file__).resolve()}:{qualname}"
    return f"{module}:{qualname}"


def _as_dict(config: ConfigLike, overrides: Mapping[str, Any]) -> dict:
    if isinstance(config, Config):
        raise ConfigError("with resume, pass overrides as a dict, not a Config")
    if isinstance(config, (str, Path)):
        return {**read_toml(config), **overrides}
    return {**(config or {}), **overrides}


def _new_run_dir(out: str | Path | None, cfg: Config) -> Path:
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{stamp}-{cfg.protocol}"
    path = Path(out)
    if (path / "metrics.jsonl").exists():
        raise ConfigError(f"--out {str(path)!r} already holds a run: use --resume {path} or another folder")
    return path


def _write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n", encoding="utf-8")
