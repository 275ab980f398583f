"""A run directory's records, parsed: `load_run` turns metrics.jsonl, summary.json and
config.toml into a `Run` (iterations, evaluations and events, continuous across
resumed sessions), which the plots and the HTML report draw."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..telemetry.metrics import read_metrics

MEMBERSHIP = ("worker_left", "worker_joined")


class ReportError(ValueError):
    """A run directory that cannot be reported on (missing, or without metrics)."""


@dataclass
class Run:
    """The parsed records of one run directory.

    `iterations`: "iteration" records, one per iteration (the later record wins when a
    resumed run repeated one), sorted by iteration.  `evals`: "eval" records, likewise.
    `events`: "event" records in file order.  `elapsed` is made continuous across resumes
    (each resumed session restarts its clock at 0; its records are shifted to continue
    from where the checkpoint was taken).  `summary`: summary.json, or {} if absent.
    `config`: config.toml as a dict, or {} if absent.
    """

    path: Path
    iterations: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    @property
    def protocol(self) -> str | None:
        return self.summary.get("protocol") or self.config.get("protocol")

    @property
    def label(self) -> str:
        """A short name for legends and titles: the directory name and protocol."""
        name, proto = self.path.name, self.protocol
        return f"{name} ({proto})" if proto and proto not in name else name

    @property
    def workers(self) -> list[int]:
        """Every worker rank that appears in an iteration record."""
        return sorted({int(w) for rec in self.iterations for w in rec.get("workers") or ()})

    def per_worker(self, key: str) -> dict[int, list[tuple[dict, float]]]:
        """rank -> [(iteration record, that worker's value of `key`)], null values left out."""
        out: dict[int, list[tuple[dict, float]]] = {w: [] for w in self.workers}
        for rec in self.iterations:
            values = rec.get(key)
            if not isinstance(values, list):
                continue
            for w, v in zip(rec.get("workers") or (), values):
                if _number(v) is not None:
                    out[int(w)].append((rec, float(v)))
        return out

    def markers(self) -> list[dict]:
        """Membership changes and resumes: {kind, iteration, elapsed, text}."""
        out = []
        for ev in self.events:
            kind = ev.get("event")
            if kind == "started" and ev.get("resumed"):
                kind, text = "resumed", "resumed"
            elif kind in MEMBERSHIP:
                who = ev.get("worker")
                text = f"w{who} {'left' if kind == 'worker_left' else 'joined'}" if who is not None else kind
            else:
                continue
            t = _int(ev.get("iteration"))
            if t is None:
                continue
            out.append({"kind": kind, "iteration": t, "elapsed": self.elapsed_at(t), "text": text})
        return out

    def elapsed_at(self, t: int) -> float:
        """Training seconds at the barrier before iteration t (the end of iteration t-1)."""
        before = [r["elapsed"] for r in self.iterations
                  if r["iteration"] < t and _number(r.get("elapsed")) is not None]
        return before[-1] if before else 0.0

    def iteration_starts(self) -> dict[int, float]:
        """iteration -> training seconds when it started (the previous record's elapsed)."""
        out, prev = {}, 0.0
        for rec in self.iterations:
            out[rec["iteration"]] = prev
            if _number(rec.get("elapsed")) is not None:
                prev = rec["elapsed"]
        return out


# -- reading --------------------------------------------------------------------------------

def load_run(run_dir: str | Path) -> Run:
    """Parse a run directory's metrics.jsonl (and summary.json, config.toml if present)."""
    path = Path(run_dir)
    if path.is_file() and path.name == "metrics.jsonl":
        path = path.parent
    if not path.is_dir():
        raise ReportError(f"run directory {str(path)!r} does not exist")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(f"{str(path)!r} is not a run directory: it has no metrics.jsonl")
    try:
        records = [r for r in read_metrics(metrics) if isinstance(r, dict)]
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"cannot read {str(metrics)!r}: {exc}") from None
    run = Run(path, summary=_read_json(path / "summary.json"), config=_read_toml(path / "config.toml"))
    run.iterations, run.evals, run.events = _merge_sessions(records)
    return run


def _merge_sessions(records: Iterable[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """Iterations, evals and events of a metrics file that resumed runs appended to.

    A resumed session (a "started" event with resumed = true at iteration r) replaces what
    the previous sessions wrote after its checkpoint: their iterations >= r and their evals
    and events after r.  Its clock restarts at 0, so its elapsed values are shifted by the
    elapsed of the last iteration kept; and the membership events it replays at r (the
    coordinator re-applies the ones that happened before r) are dropped."""
    iters: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    events: list[dict] = []
    offset, resumed_at = 0.0, None
    for rec in records:
        kind, t = rec.get("type"), _int(rec.get("iteration"))
        if kind == "event" and rec.get("event") == "started" and rec.get("resumed") and t is not None:
            iters = {k: v for k, v in iters.items() if k < t}
            evals = {k: v for k, v in evals.items() if k <= t}
            events = [e for e in events if (_int(e.get("iteration")) or 0) <= t]
            offset = max((v["elapsed"] for v in iters.values() if _number(v.get("elapsed")) is not None),
                         default=offset)
            resumed_at = t
            events.append(rec)
        elif kind == "iteration" and t is not None:
            iters[t] = _shifted(rec, t, offset)
        elif kind == "eval" and t is not None:
            evals[t] = _shifted(rec, t, offset)
        elif kind == "event":
            if (rec.get("event") in MEMBERSHIP and t is not None and t == resumed_at
                    and any(e.get("event") == rec["event"] and e.get("worker") == rec.get("worker")
                            for e in events)):
                continue  # a replay of a membership change that happened before the resume
            events.append(rec)
    return ([iters[k] for k in sorted(iters)], [evals[k] for k in sorted(evals)], events)


def _shifted(rec: dict, t: int, offset: float) -> dict:
    rec = dict(rec, iteration=t)
    elapsed = _number(rec.get("elapsed"))
    rec["elapsed"] = None if elapsed is None else elapsed + offset
    return rec


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_toml(path: Path) -> dict:
    """A run's config.toml as flat keys (its group tables expanded); {} if unreadable."""
    import tomllib

    from ..config_toml import ConfigError, flatten_tables
    try:
        with path.open("rb") as fh:
            return flatten_tables(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError, ConfigError):
        return {}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    n = _number(v)
    return int(n) if n is not None else None


# -- drawing helpers ------------------------------------------------------------------------


__all__ = ["MEMBERSHIP", "ReportError", "Run", "load_run"]
