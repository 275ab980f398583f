"""Stragglers as data: one format for the runtime, the simulator and the tests.

A ``Scenario`` says how much slower each worker computes, statically (``Slowdown``),
over time or iterations (``Trace``), through a real CPU-burning competitor
(``NoisyNeighbour``, carried out by ``equipoise.neighbour.start_burner``), and how slow
each parameter server is (``ServerSlowdown``).  Factors are compute-time multipliers:
1 is normal, 2 is twice as slow.  Pure data and validation; imports no runtime code.
"""
from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Mapping

__all__ = ["Slowdown", "Trace", "ServerSlowdown", "NoisyNeighbour", "Scenario"]

_UNITS = ("time", "iteration")


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _check_factor(name: str, value) -> float:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_factors(name: str, factors) -> tuple[float, ...]:
    if isinstance(factors, (str, bytes)) or not hasattr(factors, "__iter__"):
        raise ValueError(f"{name} must be a list of numbers, got {factors!r}")
    return tuple(_check_factor(f"{name}[{i}]", f) for i, f in enumerate(factors))


@dataclass(frozen=True)
class Slowdown:
    """Static per-worker compute-time multipliers, indexed by worker id."""
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "factors", _check_factors("slowdown", self.factors))

    def factor(self, worker: int) -> float:
        """This worker's multiplier; 1.0 for workers beyond the list."""
        return self.factors[worker] if 0 <= worker < len(self.factors) else 1.0


@dataclass(frozen=True)
class ServerSlowdown:
    """Static per-server service-time multipliers, indexed by server id."""
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "factors", _check_factors("server_slowdown", self.factors))

    def factor(self, server: int) -> float:
        """This server's multiplier; 1.0 for servers beyond the list."""
        return self.factors[server] if 0 <= server < len(self.factors) else 1.0


@dataclass(frozen=True)
class Trace:
    """Piecewise-constant factors: row (at, worker, factor) holds from ``at`` until that
    worker's next row.  ``unit`` is "time" (seconds since start) or "iteration".
    Rows are kept sorted by ``at`` (stable, so of two rows at the same ``at`` the later
    one in the input wins)."""
    rows: tuple[tuple[float, int, float], ...]
    unit: str = "time"
    _index: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.unit not in _UNITS:
            raise ValueError(f"trace unit must be one of {_UNITS}, got {self.unit!r}")
        rows = tuple(sorted((self._check_row(i, r) for i, r in enumerate(self.rows)),
                            key=lambda r: r[0]))
        index: dict[int, tuple[list[float], list[float]]] = {}
        for at, worker, factor in rows:
            ats, factors = index.setdefault(worker, ([], []))
            ats.append(at)
            factors.append(factor)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "_index", index)

    @staticmethod
    def _check_row(i: int, row) -> tuple[float, int, float]:
        try:
            at, worker, factor = row
        except (TypeError, ValueError):
            raise ValueError(f"trace row {i} must be (at, worker, factor), got {row!r}")
        if not _is_real(at) or not math.isfinite(at) or at < 0:
            raise ValueError(f"trace row {i}: at must be finite >= 0, got {at!r}")
        if not _is_int(worker) or worker < 0:
            raise ValueError(f"trace row {i}: worker must be an int >= 0, got {worker!r}")
        return float(at), int(worker), _check_factor(f"trace row {i}: factor", factor)

    def factor(self, worker: int, at: float) -> float:
        """The worker's factor at ``at`` (in this trace's unit); 1.0 before its first row."""
        if worker not in self._index:
            return 1.0
        ats, factors = self._index[worker]
        k = bisect.bisect_right(ats, at)
        return factors[k - 1] if k else 1.0

    @classmethod
    def from_csv(cls, path: str | Path, column: str = "worker") -> "Trace":
        """Read ``time,worker,factor`` or ``iteration,worker,factor`` CSV (with header);
        ``column = "server"`` reads a server trace (``time,server,factor``).

        Blank lines and lines starting with '#' are skipped.  Any bad row raises
        ValueError naming ``file:line`` and the offending value.
        """
        path = Path(path)
        with path.open(newline="") as fh:
            lines = [(n, line) for n, line in enumerate(fh, start=1)
                     if line.strip() and not line.lstrip().startswith("#")]
        if not lines:
            raise ValueError(f"{path}: empty trace, expected a header 'time,{column},factor'")
        n, header = lines[0]
        cols = [c.strip() for c in header.strip().split(",")]
        if len(cols) != 3 or cols[0] not in _UNITS or cols[1:] != [column, "factor"]:
            raise ValueError(f"{path}:{n}: header must be 'time,{column},factor' or "
                             f"'iteration,{column},factor', got {header.strip()!r}")
        rows = [_parse_row(path, n, next(csv.reader([line])), cols[0])
                for n, line in lines[1:]]
        return cls(tuple(rows), cols[0])


def _parse_row(path: Path, n: int, cells: list[str], unit: str) -> tuple[float, int, float]:
    where = f"{path}:{n}"
    if len(cells) != 3:
        raise ValueError(f"{where}: expected 3 fields, got {len(cells)}: {','.join(cells)!r}")
    at_s, worker_s, factor_s = (c.strip() for c in cells)
    try:
        at = int(at_s) if unit == "iteration" else float(at_s)
    except ValueError:
        raise ValueError(f"{where}: bad {unit} {at_s!r}") from None
    if not math.isfinite(at) or at < 0:
        raise ValueError(f"{where}: bad {unit} {at_s!r} (must be finite >= 0)")
    try:
        worker = int(worker_s)
    except ValueError:
        raise ValueError(f"{where}: bad worker {worker_s!r}") from None
    try:
        factor = float(factor_s)
    except ValueError:
        raise ValueError(f"{where}: bad factor {factor_s!r}") from None
    if worker < 0:
        raise ValueError(f"{where}: bad worker {worker_s!r} (must be >= 0)")
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"{where}: bad factor {factor_s!r} (must be finite > 0)")
    return float(at), worker, factor


@dataclass(frozen=True)
class NoisyNeighbour:
    """A real CPU-burning competitor on ``worker``'s CPUs from ``start`` to ``stop``
    (seconds since start; None = until the end), busy ``share`` of each period."""
    worker: int
    start: float = 0.0
    stop: float | None = None
    share: float = 1.0

    def __post_init__(self) -> None:
        if not _is_int(self.worker) or self.worker < 0:
            raise ValueError(f"neighbour worker must be an int >= 0, got {self.worker!r}")
        if not _is_real(self.start) or not math.isfinite(self.start) or self.start < 0:
            raise ValueError(f"neighbour start must be finite >= 0, got {self.start!r}")
        if self.stop is not None and not (_is_real(self.stop) and self.stop > self.start):
            raise ValueError(f"neighbour stop must be None or > start={self.start},"
                             f" got {self.stop!r}")
        if not _is_real(self.share) or not 0 < self.share <= 1:
            raise ValueError(f"neighbour share must be in (0, 1], got {self.share!r}")

    def active(self, elapsed: float) -> bool:
        """Whether the neighbour should be running ``elapsed`` seconds after start."""
        return self.start <= elapsed and (self.stop is None or elapsed < self.stop)


@dataclass(frozen=True)
class Scenario:
    """Everything that makes workers or servers slow in one run."""
    slowdown: Slowdown | None = None
    trace: Trace | None = None
    neighbours: tuple[NoisyNeighbour, ...] = ()
    server_slowdown: ServerSlowdown | None = None

    def worker_factor(self, worker: int, *, elapsed: float, iteration: int) -> float:
        """Static factor x trace factor (looked up by elapsed seconds or iteration,
        whichever the trace's unit is).  Neighbours are real processes, not a factor."""
        static = self.slowdown.factor(worker) if self.slowdown else 1.0
        if self.trace is None:
            return static
        at = elapsed if self.trace.unit == "time" else iteration
        return static * self.trace.factor(worker, at)

    def server_factor(self, server: int) -> float:
        """The server's static service-time multiplier (1.0 if none given)."""
        return self.server_slowdown.factor(server) if self.server_slowdown else 1.0

    @classmethod
    def from_config(cls, d: Mapping, *, base_dir: str | Path | None = None) -> "Scenario":
        """Build from a config mapping: ``slowdown`` (list), ``trace`` (CSV path,
        relative to ``base_dir`` if given), ``neighbours`` (list of mappings with keys
        worker/start/stop/share), ``server_slowdown`` (list).  Unknown keys raise."""
        known = {"slowdown", "trace", "neighbours", "server_slowdown"}
        for key in d:
            if key not in known:
                raise ValueError(f"scenario: unknown key {key!r} (known: {sorted(known)})")
        trace = None
        if d.get("trace") is not None:
            path = Path(d["trace"])
            trace = Trace.from_csv(Path(base_dir) / path if base_dir else path)
        return cls(
            slowdown=Slowdown(d["slowdown"]) if d.get("slowdown") is not None else None,
            trace=trace,
            neighbours=tuple(_neighbour(i, n) for i, n in enumerate(d.get("neighbours") or ())),
            server_slowdown=(ServerSlowdown(d["server_slowdown"])
                             if d.get("server_slowdown") is not None else None))


def _neighbour(i: int, n) -> NoisyNeighbour:
    if not isinstance(n, Mapping):
        raise ValueError(f"scenario: neighbours[{i}] must be a mapping, got {n!r}")
    known = {"worker", "start", "stop", "share"}
    for key in n:
        if key not in known:
            raise ValueError(f"scenario: neighbours[{i}] unknown key {key!r}"
                             f" (known: {sorted(known)})")
    if "worker" not in n:
        raise ValueError(f"scenario: neighbours[{i}] needs a 'worker' key, got {dict(n)!r}")
    return NoisyNeighbour(**n)
