"""The live per-worker and per-server view of a job, built from its metrics records.

`ClusterState` takes the records the coordinator writes to metrics.jsonl, one at a time
(`feed`), and keeps what the view shows: each worker's recent batch size, speed, time
split, staleness and state; each server's last measurement; the last events. The
coordinator feeds it the records as it writes them (no message to any process);
`equipoise watch` feeds it the same records read back from the file, so a job seen from
another terminal, or a finished one, looks the same. `render` draws the state as rich
tables, `plain_line` as one line for logs.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

WINDOW = 10  # iterations a worker's speed, time split and staleness are averaged over
SLOW = 0.6  # a worker computing at less than this fraction of the workers' median speed is "slow"
WAITING = 0.5  # a worker spending more than this share of its time waiting is "waiting"
EVENTS = 5  # events shown
QUIET_EVENTS = ("started", "checkpoint")  # not worth a line of the view


class ClusterState:
    """What the live view shows, updated record by record (thread-safe: the evaluation
    thread writes records too, and rich draws from its own thread)."""

    def __init__(self, total: int | None = None):
        self.total = total
        self._lock = threading.Lock()
        self.iteration = 0  # iterations done (the last iteration record's + 1)
        self.samples_per_s = self.loss = self.accuracy = self.elapsed = None
        self.metrics: dict[str, float] = {}  # the last evaluation's, by the user's names
        self.last_time: float | None = None  # Unix time of the last record
        self.started: float | None = None  # Unix time of the last `started` event
        self.workers: dict[int, deque] = {}  # rank -> (batch, compute, wait, comm, staleness) per iteration
        self.gone: dict[int, str] = {}  # worker rank -> "failed" or "left"
        self.servers: dict[str, Any] = {}  # the last "servers" record
        self.servers_gone: dict[int, str] = {}  # server rank -> "lost" or "removed"
        self.events: deque = deque(maxlen=EVENTS)
        self.status = "running"  # or the summary's status once the job ended

    def feed(self, rec: dict) -> None:
        """Take one record; a malformed one (a file edited by hand) is skipped."""
        kind = rec.get("type")
        with self._lock:
            try:
                if kind == "iteration":
                    self._iteration(rec)
                elif kind == "eval":
                    self.accuracy = rec.get("test_accuracy", self.accuracy)
                    self.metrics = {k[len("test_"):]: v for k, v in rec.items()
                                    if k.startswith("test_") and k != "test_samples" and _ok(v)}
                elif kind == "servers":
                    self.servers = rec
                    for s in rec.get("servers") or ():
                        self.servers_gone.pop(s, None)
                elif kind == "event":
                    self._event(rec)
            except (KeyError, TypeError, ValueError, IndexError):
                return
            self.last_time = rec.get("time", self.last_time)

    def _iteration(self, rec: dict) -> None:
        self.iteration = int(rec["iteration"]) + 1
        self.samples_per_s, self.loss = rec.get("samples_per_s"), rec.get("loss")
        self.elapsed = rec.get("elapsed", self.elapsed)
        n = len(rec.get("workers") or ())
        columns = [rec.get(k) or [None] * n for k in ("batch", "compute_s", "wait_s", "comm_s", "staleness",
                                                        "data_s", "h2d_s", "d2h_s")]
        for i, w in enumerate(rec.get("workers") or ()):
            self.workers.setdefault(w, deque(maxlen=WINDOW)).append(tuple(c[i] for c in columns))
            self.gone.pop(w, None)

    def _event(self, rec: dict) -> None:
        name = rec.get("event")
        if name == "started":
            self.started = rec.get("time")
        elif name == "failure" and rec.get("role") == "worker":
            self.gone[rec.get("rank")] = "failed"
        elif name == "failure" and rec.get("role") == "server":
            self.servers_gone[rec.get("rank")] = "lost"
        elif name == "worker_left":
            self.gone[rec.get("worker")] = "left"
        elif name == "server_removed":
            self.servers_gone[rec.get("server")] = "removed"
        if name not in QUIET_EVENTS:
            self.events.append(rec)

    # -- what the view shows --------------------------------------------------------------
    def worker_rows(self) -> list[dict]:
        """One dict per worker seen: rank, batch, speed (samples/s of compute), compute,
        wait and comm shares, staleness (mean σ), state."""
        with self._lock:
            rows = [_worker_row(w, list(hist), self.gone.get(w)) for w, hist in sorted(self.workers.items())]
        speeds = [r["speed"] for r in rows if r["state"] == "running" and r["speed"]]
        median = statistics.median(speeds) if len(speeds) >= 2 else None
        for r in rows:
            if r["state"] != "running":
                continue
            if median and r["speed"] and r["speed"] < SLOW * median:
                r["state"] = "slow"
            elif (r["wait"] or 0.0) > WAITING:
                r["state"] = "waiting"
        return rows

    def server_rows(self) -> list[dict]:
        """One dict per server of the last measurement (and lost or removed ones): rank,
        blocks, MB held, busy share, link rate (MB/s while busy), state."""
        with self._lock:
            rec, gone = self.servers, dict(self.servers_gone)
        ranks = list(rec.get("servers") or ())
        rows = []
        for i, s in enumerate(ranks):
            def col(key: str) -> float | None:
                values = rec.get(key)
                v = values[i] if isinstance(values, list) and i < len(values) else None
                return v if _ok(v) else None
            load = col("load_bytes")
            rows.append({"rank": s, "blocks": col("blocks"), "held_mb": load / 1e6 if load is not None else None,
                         "busy": col("busy_share"), "link_mbps": col("throughput_mbps"),
                         "state": gone.get(s, "running")})
        rows += [{"rank": s, "blocks": None, "held_mb": None, "busy": None, "link_mbps": None, "state": why}
                 for s, why in sorted(gone.items()) if s not in ranks]
        return rows

    def recent_events(self) -> list[str]:
        with self._lock:
            return [describe_event(e) for e in self.events]


def _worker_row(rank: int, hist: list[tuple], gone: str | None) -> dict:
    batch = next((h[0] for h in reversed(hist) if _ok(h[0])), None)
    sums = [sum(h[k] for h in hist if len(h) > k and _ok(h[k])) for k in range(8)]
    total = sums[1] + sums[2] + sums[3] + sums[5]
    stale = [h[4] for h in hist if _ok(h[4])]
    return {"rank": rank, "batch": batch,
            "speed": sum(h[0] for h in hist if _ok(h[0]) and _ok(h[1])) / sums[1] if sums[1] > 0 else None,
            "compute": sums[1] / total if total > 0 else None, "wait": sums[2] / total if total > 0 else None,
            "comm": sums[3] / total if total > 0 else None, "data": sums[5] / total if total > 0 else None,
            # host <-> device copies (a GPU worker), part of its communication time
            "copy": (sums[6] + sums[7]) / total if total > 0 and sums[6] + sums[7] > 0 else None,
            "staleness": sum(stale) / len(stale) if stale else None, "state": gone or "running"}


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def describe_event(e: dict) -> str:
    """One short line for an event record."""
    name, t = e.get("event"), e.get("iteration")
    if name == "failure":
        what = f"{e.get('role')}{e.get('rank')} lost ({e.get('reason')}): {e.get('action')}"
    elif name == "block_moved":
        what = (f"blocks {e.get('blocks')} {e.get('from')} → {e.get('to')}, "
                f"{(e.get('bytes') or 0) / 1e6:.1f} MB in {1000 * (e.get('pause_s') or 0):.0f} ms")
    else:
        skip = {"type", "event", "iteration", "time", "table_version", "path"}
        what = ", ".join(f"{k} {v}" for k, v in e.items() if k not in skip)
    return f"it {t}  {name}" + (f": {what}" if what else "")


# -- drawing -----------------------------------------------------------------------------------

_STYLE = {"slow": "bold red", "failed": "bold red", "lost": "bold red", "left": "dim", "removed": "dim",
          "waiting": "yellow"}


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def headline(state: ClusterState) -> str:
    """Iteration, throughput, loss, the last evaluation's metrics (accuracy, or up to
    three of the user's) and status in one line."""
    total = f"/{state.total}" if state.total else ""
    parts = [f"iteration {state.iteration}{total}", f"{_num(state.samples_per_s)} samples/s",
             f"loss {_num(state.loss, '{:.3f}')}"]
    metrics = dict(state.metrics or {})
    if state.accuracy is not None or not metrics:  # a classifier's (or nothing evaluated yet)
        parts.append(f"acc {_num(state.accuracy and 100 * state.accuracy, '{:.1f}%')}")
    others = [(k, v) for k, v in metrics.items() if k != "accuracy" and (k != "loss" or len(metrics) == 1)]
    parts += [f"test {k} {v:.4g}" for k, v in others[:3]]
    if state.status != "running":
        parts.append(state.status)
    return "  ".join(parts)


def render(state: ClusterState, *, header: bool = False) -> Group:
    """The view: [the headline,] the workers' table, the servers' table, the last events."""
    workers = Table(title=f"workers (last {WINDOW} iterations)", title_justify="left", box=None, pad_edge=False)
    for name in ("worker", "batch", "samples/s", "compute", "data", "wait", "comm", "copy", "staleness", "state"):
        workers.add_column(name, justify="left" if name in ("worker", "state") else "right")
    for r in state.worker_rows():
        style = _STYLE.get(r["state"], "")
        workers.add_row(f"w{r['rank']}", _num(r["batch"]), _num(r["speed"]), _pct(r["compute"]),
                        _pct(r["data"]), _pct(r["wait"]), _pct(r["comm"]), _pct(r["copy"]), _num(r["staleness"], "{:.1f}"), Text(r["state"], style=style))
    parts: list[Any] = [Text(headline(state), style="bold")] if header else []
    parts.append(workers if workers.row_count else Text("workers: no iteration recorded yet", style="dim"))
    server_rows = state.server_rows()
    if server_rows:
        servers = Table(title=f"servers (at iteration {state.servers.get('iteration', '–')})", title_justify="left",
                        box=None, pad_edge=False)
        for name in ("server", "blocks", "MB held", "busy", "link MB/s", "state"):
            servers.add_column(name, justify="left" if name in ("server", "state") else "right")
        for r in server_rows:
            servers.add_row(f"s{r['rank']}", _num(r["blocks"]), _num(r["held_mb"], "{:.2f}"), _pct(r["busy"]),
                            _num(r["link_mbps"]), Text(r["state"], style=_STYLE.get(r["state"], "")))
        parts.append(servers)
    events = state.recent_events()
    if events:
        parts.append(Text("events\n" + "\n".join(f"  {e}" for e in events)))
    return Group(*parts)


def plain_line(state: ClusterState) -> str:
    """The headline and one short cell per worker and server, for logs."""
    cells = [headline(state)]
    for r in state.worker_rows():
        cells.append(f"w{r['rank']} b{_num(r['batch'])} {_num(r['speed'])}/s wait {_pct(r['wait'])} {r['state']}")
    for r in state.server_rows():
        cells.append(f"s{r['rank']} busy {_pct(r['busy'])} {r['state']}")
    return " | ".join(cells)


# -- equipoise watch ---------------------------------------------------------------------------

class WatchError(ValueError):
    """A folder that cannot be watched (no run directory)."""


class _Tail:
    """The whole lines appended to a file since the last read (a torn last line waits)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def records(self) -> list[dict]:
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def _ended(run_dir: Path, state: ClusterState) -> str | None:
    """The summary's status once this session of the job wrote it, else None."""
    path = run_dir / "summary.json"
    try:
        if state.started is not None and path.stat().st_mtime < state.started:
            return None  # a previous session's summary: a resumed job is running
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(summary.get("status", "ended")) if isinstance(summary, dict) else None


def _total(run_dir: Path) -> int | None:
    import tomllib

    from ..config_toml import ConfigError, flatten_tables
    try:
        with (run_dir / "config.toml").open("rb") as fh:
            iterations = flatten_tables(tomllib.load(fh)).get("iterations")
    except (OSError, tomllib.TOMLDecodeError, ConfigError):
        return None
    return iterations if isinstance(iterations, int) and iterations > 0 else None


def watch(run_dir: str | Path, *, idle: float = 120.0, interval: float = 1.0, plain_every: float = 10.0,
          console: Console | None = None) -> int:
    """Show the live view of the job writing `run_dir` until it ends (then its last state),
    redrawn every `interval` seconds on a terminal, else a plain line every `plain_every`
    seconds. Returns 0 when the job ended, 1 when metrics.jsonl has not grown for `idle`
    seconds (the job is gone without a summary)."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise WatchError(f"{str(run_dir)!r} is not a run directory: it has no metrics.jsonl")
    console = console or Console()
    state, tail = ClusterState(_total(run_dir)), _Tail(run_dir / "metrics.jsonl")
    last_growth = last_line = time.monotonic()

    def poll() -> bool:
        nonlocal last_growth
        records = tail.records()
        for rec in records:
            state.feed(rec)
        if records:
            last_growth = time.monotonic()
        status = _ended(run_dir, state)
        if status is not None:
            state.status = status
        return status is not None or time.monotonic() - last_growth > idle

    if console.is_terminal:
        from rich.live import Live
        with Live(render(state, header=True), console=console, refresh_per_second=1 / interval) as live:
            while not poll():
                live.update(render(state, header=True))
                time.sleep(interval)
            live.update(render(state, header=True))
    else:
        while not poll():
            if time.monotonic() - last_line >= plain_every:
                console.print(plain_line(state), markup=False, highlight=False, soft_wrap=True)
                last_line = time.monotonic()
            time.sleep(interval)
        console.print(render(state, header=True))
    if state.status == "running":
        console.print(f"no new record in {run_dir / 'metrics.jsonl'} for {idle:.0f} s and no summary.json: "
                      "the job has stopped without finishing", markup=False, highlight=False)
        return 1
    return 0
