"""metrics.jsonl: one JSON object per line, appended and flushed as it happens."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence


class MetricsWriter:
    """Appends records to metrics.jsonl; each `taps` callable (the live view, TensorBoard)
    is then handed the record as written (NaN and infinity as None)."""

    def __init__(self, path: Path, taps: Sequence[Callable[[dict[str, Any]], None]] = ()):
        self.path = Path(path)
        self.taps = list(taps)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        try:  # most records hold no NaN or infinity: encoded at once, not walked in Python first
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:
            line = json.dumps(json_safe(record), separators=(",", ":"))
        self._fh.write(line + "\n")
        self._fh.flush()
        if self.taps:
            written = json.loads(line)  # as written (C-speed, where json_safe walks in Python)
            for tap in self.taps:
                tap(written)

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def json_safe(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v
