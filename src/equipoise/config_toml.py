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


__all__ = ["ConfigError", "parse_override", "read_toml", "to_toml"]
