"""Reading and writing config keys as TOML: a config file, one ``--set KEY=VALUE``, and
the config.toml a run directory holds."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Mapping


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the value."""


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """Parse one ``KEY=VALUE``; VALUE is read as TOML (``lr=0.1``, ``slowdown=[1,2]``),
    falling back to a bare string (``protocol=asp``)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r} is not of the form KEY=VALUE")
    key, raw = (s.strip() for s in item.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def to_toml(values: Mapping[str, Any]) -> str:
    """Write a flat mapping of scalars and lists of scalars as TOML."""
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())


# TOML tables grouping keys (docs/configuration.md): [table] key -> the flat key. Every
# flat key stays valid on its own; a key given both ways is refused.
TABLES: dict[str, dict[str, str]] = {
    "data": {"name": "dataset", "dataset": "dataset", "dir": "data_dir", "loss": "loss", "metrics": "metrics",
             "collate": "collate", "loader_workers": "loader_workers", "model": "model"},
    "eval": {"every": "eval_every", "samples": "eval_samples", "batch": "eval_batch", "target": "target",
             "stop_at_target": "stop_at_target", "checkpoint_every": "checkpoint_every"},
    "servers": {"count": "servers", "slowdown": "server_slowdown", "trace": "server_trace",
                "rate": "server_rate", "speeds": "server_speeds", "bandwidth": "server_bandwidth", "events": "server_events",
                "resources": "server_resources", "placement": "placement", "block_size": "block_size",
                "replication": "replication", "psld_interval": "psld_interval",
                "psld_epsilon": "psld_epsilon", "psld_max_servers": "psld_max_servers"},
    "ray": {"address": "ray_address", "strategy": "ray_strategy", "data": "ray_data",
            "worker_resources": "worker_resources", "server_resources": "server_resources"},
    "sim": {},  # filled by config.py: every sim_* key without its prefix
}


USER_CODE = ("model", "dataset", "loss", "metrics", "collate", "lr_schedule")


def absolute_specs(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every user-code spec naming a script by a relative path made
    absolute (from the current directory, as `--set` and the Python API do), so the run
    directory's config.toml works from anywhere (a resume, a Ray node)."""
    from .spec import absolute_spec

    return {k: absolute_spec(v) if k in USER_CODE and isinstance(v, str) else v for k, v in values.items()}


def flatten_tables(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every TOML table of TABLES expanded into its flat keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in TABLES and isinstance(value, Mapping):
            for sub, v in value.items():
                flat = TABLES[key].get(sub)
                if flat is None:
                    raise ConfigError(f"unknown key {sub!r} in [{key}] (known: {', '.join(TABLES[key])})")
                if flat in out or (flat in values and flat != key):
                    raise ConfigError(f"{flat} is given twice: as {key}.{sub} and on its own")
                out[flat] = v
        else:
            if key in out:
                raise ConfigError(f"{key} is given twice: in a table and on its own")
            out[key] = value
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):  # inline table; None means "absent"
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


__all__ = ["TABLES", "USER_CODE", "absolute_specs", "flatten_tables", "ConfigError", "parse_override", "read_toml", "to_toml"]
