"""Reading a message's optional fields: one typed reader instead of hand checks.

The wire schema (wire/schema.py) checks the fields every message of a type carries; the
optional ones a handler reads itself, each through `read_field`: absent (or null) gives the
default, anything else must be of the kind asked — an integer (never a boolean) or a
finite number — and at least `least`, or `FieldError` names the sender, the field and
the value in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class FieldError(ValueError):
    """A message field of the wrong type or out of range; the text names it."""


def read_field(f: Mapping[str, Any], name: str, kind: type, *, who: str, least: float | None = None,
          default: Any = None, required: bool = False) -> Any:
    """Field `name` of the fields `f` of a message from `who` (its text leads the error,
    if any):
    `kind` int (an integer, not a boolean) or float (a finite number, returned as float),
    at least `least`; absent or null: `default`, or FieldError if `required`."""
    x = f.get(name)
    if x is None:
        if required:
            raise FieldError(f"{who}: {name} is missing" if who else f"{name} is missing")
        return default
    if kind is int:
        ok = isinstance(x, int) and not isinstance(x, bool)
        what = "an integer"
    else:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
        what = "a finite number"
    if not ok or (least is not None and x < least):
        bound = "" if least is None else f" ≥ {least:g}"
        text = f"{name} = {x!r} is not {what}{bound}"
        raise FieldError(f"{who}: {text}" if who else text)
    return x if kind is int else float(x)


__all__ = ["FieldError", "read_field"]
