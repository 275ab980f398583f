"""What changes a run's conditions, as data: one format for the runtime, a simulator
and the tests.

A ``Scenario`` says how much slower each worker computes, statically (``Slowdown``),
over time or iterations (``Trace``), through a real CPU-burning competitor
(``NoisyNeighbour``, carried out by ``equipoise.neighbour.start_burner``); how slow each
parameter server is (``ServerSlowdown``, a server ``Trace``, the rate the slowdown is
charged at and per-server link caps); and which membership changes happen at which
iteration (``WorkerJoin``, ``WorkerLeave``, ``ServerAdd``, ``ServerRemove``,
``BlockMove``).  Factors are time multipliers: 1 is normal, 2 is twice as slow.  Pure
data and validation; imports no runtime code.
"""
from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Mapping

__all__ = ["Slowdown", "Trace", "ServerSlowdown", "NoisyNeighbour", "WorkerJoin", "WorkerLeave",
           "ServerAdd", "ServerRemove", "BlockMove", "MembershipEvent", "ServerEvent", "Scenario"]

_UNITS = ("time", "iteration")
DEFAULT_SERVER_RATE_MBPS = 1000.0  # Config.server_rate's default


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

    def covers(self, worker: int) -> bool:
        """Whether any row names ``worker`` (a worker or server id)."""
        return worker in self._index

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
        rows = [_parse_row(path, n, next(csv.reader([line])), cols[0], column)
                for n, line in lines[1:]]
        return cls(tuple(rows), cols[0])


def _parse_row(path: Path, n: int, cells: list[str], unit: str,
               column: str) -> tuple[float, int, float]:
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
        raise ValueError(f"{where}: bad {column} {worker_s!r}") from None
    try:
        factor = float(factor_s)
    except ValueError:
        raise ValueError(f"{where}: bad factor {factor_s!r}") from None
    if worker < 0:
        raise ValueError(f"{where}: bad {column} {worker_s!r} (must be >= 0)")
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



# -- membership and placement events, each due at the barrier of its iteration -----------

def _check_counts(event) -> None:
    for name, value in vars(event).items():
        if not _is_int(value) or value < 0:
            raise ValueError(f"{type(event).__name__}.{name} must be an int >= 0, got {value!r}")


@dataclass(frozen=True)
class WorkerJoin:
    """``count`` new workers join at iteration ``iteration``."""
    iteration: int
    count: int

    __post_init__ = _check_counts


@dataclass(frozen=True)
class WorkerLeave:
    """Worker ``worker`` leaves at iteration ``iteration``."""
    iteration: int
    worker: int

    __post_init__ = _check_counts


@dataclass(frozen=True)
class ServerAdd:
    """``count`` new servers join at iteration ``iteration`` (their processes start with
    the job, so the join costs an initialisation, not a process start)."""
    iteration: int
    count: int

    __post_init__ = _check_counts


@dataclass(frozen=True)
class ServerRemove:
    """Server ``server`` hands its blocks to the others and leaves at ``iteration``."""
    iteration: int
    server: int

    __post_init__ = _check_counts


@dataclass(frozen=True)
class BlockMove:
    """Parameter block ``block`` moves to server ``to`` at ``iteration``."""
    iteration: int
    block: int
    to: int

    __post_init__ = _check_counts


MembershipEvent = WorkerJoin | WorkerLeave
ServerEvent = ServerAdd | ServerRemove | BlockMove

# Config table forms: keys -> (event class, the table's key of each field after iteration)
_MEMBERSHIP_FORMS = {frozenset({"iteration", "join"}): (WorkerJoin, ("join",)),
                     frozenset({"iteration", "leave"}): (WorkerLeave, ("leave",))}
_SERVER_FORMS = {frozenset({"iteration", "add"}): (ServerAdd, ("add",)),
                 frozenset({"iteration", "remove"}): (ServerRemove, ("remove",)),
                 frozenset({"iteration", "move", "to"}): (BlockMove, ("move", "to"))}


def _event(where: str, ev, forms: dict, expected: str):
    if isinstance(ev, Mapping) and frozenset(ev) in forms:
        cls, keys = forms[frozenset(ev)]
        try:
            return cls(ev["iteration"], *(ev[k] for k in keys))
        except ValueError as exc:
            raise ValueError(f"scenario: {where} = {dict(ev)!r}: {exc}") from None
    raise ValueError(f"scenario: {where} = {ev!r} must be {expected}")


def _at(trace: Trace, elapsed: float, iteration: int) -> float:
    return elapsed if trace.unit == "time" else iteration


@dataclass(frozen=True)
class Scenario:
    """Everything that changes a run's conditions: slow workers and servers, link caps,
    and the membership and placement events due at given iterations.

    ``server_rate`` (MB/s) is what a server at factor 1 is charged for a slowdown: a
    server at factor f spends (f - 1) * bytes / rate extra per message.
    ``server_bandwidth`` holds one link cap per server in MB/s (0: none); servers beyond
    the list have no cap.  ``servers`` is the number of servers the run starts with, if
    known (``added_servers`` numbers the added ones after them)."""
    slowdown: Slowdown | None = None
    trace: Trace | None = None
    neighbours: tuple[NoisyNeighbour, ...] = ()
    server_slowdown: ServerSlowdown | None = None
    server_trace: Trace | None = None
    server_rate: float = DEFAULT_SERVER_RATE_MBPS
    server_bandwidth: tuple[float, ...] = ()
    membership: tuple[MembershipEvent, ...] = ()
    server_events: tuple[ServerEvent, ...] = ()
    servers: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "neighbours", tuple(self.neighbours))
        object.__setattr__(self, "server_rate", _check_factor("server_rate", self.server_rate))
        caps = self.server_bandwidth
        if isinstance(caps, (str, bytes)) or not hasattr(caps, "__iter__"):
            raise ValueError(f"server_bandwidth must be a list of numbers, got {caps!r}")
        caps = tuple(caps)
        for i, cap in enumerate(caps):
            if not _is_real(cap) or not math.isfinite(cap) or cap < 0:
                raise ValueError(f"server_bandwidth[{i}] must be a finite number >= 0 (0: no cap),"
                                 f" got {cap!r}")
        object.__setattr__(self, "server_bandwidth", tuple(float(c) for c in caps))
        for name, kinds in (("membership", (WorkerJoin, WorkerLeave)),
                            ("server_events", (ServerAdd, ServerRemove, BlockMove))):
            events = tuple(getattr(self, name))
            for i, ev in enumerate(events):
                if not isinstance(ev, kinds):
                    raise ValueError(f"{name}[{i}] must be one of "
                                     f"{', '.join(k.__name__ for k in kinds)}, got {ev!r}")
            object.__setattr__(self, name, events)
        if self.servers is not None and (not _is_int(self.servers) or self.servers < 1):
            raise ValueError(f"servers must be None or an int >= 1, got {self.servers!r}")

    # -- workers ---------------------------------------------------------------------
    def worker_factor(self, worker: int, *, elapsed: float, iteration: int) -> float:
        """Static factor x trace factor (looked up by elapsed seconds or iteration,
        whichever the trace's unit is).  Neighbours are real processes, not a factor."""
        static = self.slowdown.factor(worker) if self.slowdown else 1.0
        if self.trace is None:
            return static
        return static * self.trace.factor(worker, _at(self.trace, elapsed, iteration))

    # -- servers ---------------------------------------------------------------------
    def server_factor(self, server: int, elapsed: float, iteration: int) -> float:
        """The server's service-time multiplier: the static factor (1.0 if none), unless
        the server trace has rows for this server, whose factor then replaces it (1.0
        before the server's first row; looked up by elapsed seconds or iteration,
        whichever the trace's unit is)."""
        if self.server_trace is not None and self.server_trace.covers(server):
            return self.server_trace.factor(server, _at(self.server_trace, elapsed, iteration))
        return self.server_slowdown.factor(server) if self.server_slowdown else 1.0

    def server_straggle(self, server: int, elapsed: float, iteration: int) -> dict[str, float]:
        """The fields of the "straggle" message for this server now: ``factor``,
        ``rate_mbps`` and, if a cap is listed for the server, ``bandwidth_mbps``."""
        out = {"factor": self.server_factor(server, elapsed, iteration),
               "rate_mbps": self.server_rate}
        if 0 <= server < len(self.server_bandwidth):
            out["bandwidth_mbps"] = self.server_bandwidth[server]
        return out

    def added_servers(self) -> dict[int, int]:
        """Rank -> join iteration of every server a ``ServerAdd`` brings, ranks numbered
        from ``servers`` on in order of iteration (then of the list)."""
        if self.servers is None:
            raise ValueError("added_servers needs the initial number of servers (servers=None)")
        adds = sorted((e for e in self.server_events if isinstance(e, ServerAdd)),
                      key=lambda e: e.iteration)
        iterations = [e.iteration for e in adds for _ in range(e.count)]
        return {self.servers + i: t for i, t in enumerate(iterations)}

    # -- events ----------------------------------------------------------------------
    def events_at(self, iteration: int) -> tuple[MembershipEvent | ServerEvent, ...]:
        """The membership events then the server events due at ``iteration``, each in
        the order given."""
        return tuple(e for e in self.membership + self.server_events if e.iteration == iteration)

    # -- construction ----------------------------------------------------------------
    @classmethod
    def from_config(cls, d: Mapping, *, base_dir: str | Path | None = None) -> "Scenario":
        """Build from a config mapping: ``slowdown`` (list), ``trace`` (CSV path of
        ``time|iteration,worker,factor``), ``neighbours`` (list of mappings with keys
        worker/start/stop/share), ``server_slowdown`` (list), ``server_trace`` (CSV path
        of ``time|iteration,server,factor``), ``server_rate`` (MB/s), ``server_bandwidth``
        (list of MB/s, 0: no cap), ``membership`` (list of ``{iteration, leave = rank}``
        or ``{iteration, join = count}``), ``server_events`` (list of ``{iteration, add =
        count}``, ``{iteration, remove = rank}`` or ``{iteration, move = block, to =
        rank}``), ``servers`` (initial count).  Trace paths are relative to ``base_dir``
        if given; a path of None or "" means no trace.  Unknown keys raise ValueError."""
        known = {"slowdown", "trace", "neighbours", "server_slowdown", "server_trace",
                 "server_rate", "server_bandwidth", "membership", "server_events", "servers"}
        for key in d:
            if key not in known:
                raise ValueError(f"scenario: unknown key {key!r} (known: {sorted(known)})")

        def trace(key: str, column: str) -> Trace | None:
            if not d.get(key):
                return None
            path = Path(d[key])
            return Trace.from_csv(Path(base_dir) / path if base_dir else path, column=column)

        return cls(
            slowdown=Slowdown(d["slowdown"]) if d.get("slowdown") is not None else None,
            trace=trace("trace", "worker"),
            neighbours=tuple(_neighbour(i, n) for i, n in enumerate(d.get("neighbours") or ())),
            server_slowdown=(ServerSlowdown(d["server_slowdown"])
                             if d.get("server_slowdown") is not None else None),
            server_trace=trace("server_trace", "server"),
            server_rate=d.get("server_rate", DEFAULT_SERVER_RATE_MBPS),
            server_bandwidth=d.get("server_bandwidth") or (),
            membership=tuple(
                _event(f"membership[{i}]", ev, _MEMBERSHIP_FORMS,
                       "{iteration = N, leave = RANK} or {iteration = N, join = COUNT}")
                for i, ev in enumerate(d.get("membership") or ())),
            server_events=tuple(
                _event(f"server_events[{i}]", ev, _SERVER_FORMS,
                       "{iteration = N, add = COUNT}, {iteration = N, remove = RANK} or "
                       "{iteration = N, move = BLOCK, to = RANK}")
                for i, ev in enumerate(d.get("server_events") or ())),
            servers=d.get("servers"))

    @classmethod
    def of(cls, cfg) -> "Scenario":
        """Build from an equipoise ``Config`` (its attributes are read, so this module
        need not import config.py).  Trace paths are opened as given, relative to the
        current directory, as the runtime opens them."""
        return cls.from_config({
            "slowdown": list(cfg.slowdown) or None,
            "trace": cfg.trace,
            "neighbours": [dict(n) for n in cfg.neighbours],
            "server_slowdown": list(cfg.server_slowdown) or None,
            "server_trace": cfg.server_trace,
            "server_rate": cfg.server_rate,
            "server_bandwidth": list(cfg.server_bandwidth),
            "membership": [dict(e) for e in cfg.membership],
            "server_events": [dict(e) for e in cfg.server_events],
            "servers": cfg.servers})


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
