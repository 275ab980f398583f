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


# The configuration's groups (docs/configuration.md): [group] key -> the flat key. A file
# may give a key in its group's table, as `group.key` (`--set optimizer.lr=0.1`), or flat
# on its own; a key given twice is refused. Inside a table a key may also be spelled by
# its flat name. The run directory's config.toml is written in these tables. The
# emulation and simulator groups hold what no production job sets.
GROUPS: dict[str, dict[str, str]] = {
    "scaling": {k: k for k in ("workers", "threads", "device", "devices", "precision", "precisions",
                               "memory_limits", "launcher")},
    "training": {k: k for k in ("protocol", "global_batch", "worker_batch", "reference_batch", "iterations",
                                "epochs", "seed", "deterministic", "softsync_n", "staleness_bound",
                                "lr_modulation", "async_scaling", "delay_compensation", "dc_lambda")},
    "optimizer": {"name": "optimizer", "lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay",
                  "schedule": "lr_schedule", "step_size": "lr_step_size", "gamma": "lr_gamma",
                  "warmup_iterations": "warmup_iterations", "lr_min": "lr_min", "clip_grad_norm": "clip_grad_norm"},
    "data": {"dataset": "dataset", "dir": "data_dir", "model": "model", "loss": "loss", "metrics": "metrics",
             "collate": "collate", "sparse_ids": "sparse_ids", "model_args": "model_args", "data_args": "data_args", "loss_args": "loss_args",
             "loader_workers": "loader_workers"},
    "eval": {"every": "eval_every", "samples": "eval_samples", "batch": "eval_batch", "device": "eval_device",
             "target": "target", "stop_at_target": "stop_at_target", "checkpoint_every": "checkpoint_every"},
    "batching": {"split": "batch_split", "policy": "batch_policy", "predictor": "predictor",
                 "shadow_predictors": "shadow_predictors", "min_batch": "min_batch", "max_batch": "max_batch",
                 "hysteresis": "hysteresis"},
    "exchange": {k: k for k in ("overlap", "backward_push", "forward_pull", "eager_update", "fragment_kb",
                                "transport", "host", "auth", "max_message_mb")},
    "servers": {"count": "servers", "placement": "placement", "block_size": "block_size", "speeds": "server_speeds",
                "events": "server_events", "psld_interval": "psld_interval", "psld_epsilon": "psld_epsilon",
                "psld_max_servers": "psld_max_servers", "psld_horizon": "psld_horizon"},
    "failure": {k: k for k in ("timeout", "heartbeat_s", "stuck_s", "worker_restarts", "replication", "snapshot_every",
                               "snapshot_budget")},
    "ray": {"address": "ray_address", "strategy": "ray_strategy", "data": "ray_data",
            "worker_resources": "worker_resources", "server_resources": "server_resources"},
    "observability": {k: k for k in ("progress", "tensorboard")},
    "emulation": {k: k for k in ("slowdown", "slowdown_noise", "trace", "neighbours", "cpu_limit", "membership",
                                 "server_slowdown", "server_trace", "server_rate", "server_bandwidth")},
    "sim": {},  # filled by config.py: every sim_* key without its prefix
}

# Spellings of earlier versions' tables, still read: [servers] slowdown = ... and so on.
ALIASES: dict[str, dict[str, str]] = {
    "servers": {"slowdown": "server_slowdown", "trace": "server_trace", "rate": "server_rate",
                "bandwidth": "server_bandwidth", "resources": "server_resources", "replication": "replication"},
    "data": {"name": "dataset"},
}


def _flat_key(group: str, sub: str) -> str | None:
    """The flat key `sub` names in table `group` (its group's name, an old alias, or the
    flat name itself), or None."""
    table = GROUPS[group]
    if sub in table:
        return table[sub]
    if sub in ALIASES.get(group, {}):
        return ALIASES[group][sub]
    return sub if sub in table.values() else None


USER_CODE = ("model", "dataset", "loss", "metrics", "collate", "sparse_ids", "lr_schedule")


def absolute_specs(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every user-code spec naming a script by a relative path made
    absolute (from the current directory, as `--set` and the Python API do), so the run
    directory's config.toml works from anywhere (a resume, a Ray node)."""
    from .spec import absolute_spec

    return {k: absolute_spec(v) if k in USER_CODE and isinstance(v, str) else v for k, v in values.items()}


def flatten_tables(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every group table (GROUPS) and every dotted `group.key` expanded into
    its flat keys; ConfigError naming a key unknown in its table or given twice."""
    out: dict[str, Any] = {}
    where: dict[str, str] = {}

    def put(flat: str, value: Any, spelled: str) -> None:
        if flat in out:
            raise ConfigError(f"{flat} is given twice: as {where[flat]} and as {spelled}")
        out[flat], where[flat] = value, spelled

    for key, value in values.items():
        key = str(key)
        group, dot, sub = key.partition(".")
        if dot and group in GROUPS:
            flat = _flat_key(group, sub)
            if flat is None:
                raise ConfigError(f"unknown key {sub!r} in [{group}] (known: {', '.join(GROUPS[group])})")
            put(flat, value, key)
        elif key in GROUPS and isinstance(value, Mapping):
            for sub, v in value.items():
                flat = _flat_key(key, str(sub))
                if flat is None:
                    raise ConfigError(f"unknown key {sub!r} in [{key}] (known: {', '.join(GROUPS[key])})")
                put(flat, v, f"{key}.{sub}")
        else:
            put(key, value, "a key on its own")
    return out


def to_toml_tables(values: Mapping[str, Any]) -> str:
    """Write flat config keys as TOML, each in its group's table (GROUPS, in their
    order); a key of no group stays at the top."""
    group_of = {flat: (g, sub) for g, table in GROUPS.items() for sub, flat in table.items()}
    top = {k: v for k, v in values.items() if k not in group_of}
    parts = [to_toml(top)] if top else []
    for g, table in GROUPS.items():
        mine = {sub: values[flat] for sub, flat in table.items() if flat in values}
        if mine:
            parts.append(f"[{g}]\n" + to_toml(mine))
    return "\n".join(parts)


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


__all__ = ["ALIASES", "GROUPS", "USER_CODE", "absolute_specs", "flatten_tables", "ConfigError", "parse_override",
           "read_toml", "to_toml", "to_toml_tables"]
