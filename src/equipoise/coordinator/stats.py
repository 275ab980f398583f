"""Aggregates worker reports into metrics records and the run summary."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from ..config import Config
from ..protocol.fields import read_field
from ..protocol.steps import StepTotals
from ..sparse.tables import tables_summary
from .rpc import JobError

REPORT_KEYS = ("iteration", "samples", "loss", "compute_s", "wait_s", "comm_s")


TIMELINE_KINDS = ("fragment", "push", "pull", "part", "early", "applied", "plan", "rows")  # a report's wire events (worker/client.py)
_INT = frozenset({int})  # a timeline event's blocks: ints only (bool is not one)


def check_report(worker: int, report: dict) -> list | None:
    """ValueError naming what is wrong with a worker's report; returns (and takes out of
    it) its optional `server_s`, [server, seconds] of its exchanges with each server."""
    missing = [k for k in REPORT_KEYS if not isinstance(report.get(k), (int, float))]
    if missing:
        raise ValueError(f"report of worker {worker} lacks numeric {missing}")
    stale = report.get("staleness")
    if not isinstance(stale, list) or not all(isinstance(x, int) and x >= 0 for x in stale):
        raise ValueError(f"report of worker {worker}: staleness must be a list of σ ≥ 0")
    exchange = report.pop("server_s", None)
    if exchange is not None and (not isinstance(exchange, list) or not all(
            isinstance(e, list) and len(e) == 2 and type(e[0]) is int and e[0] >= 0
            and type(e[1]) in (int, float) and math.isfinite(e[1]) and e[1] >= 0 for e in exchange)):
        raise ValueError(f"report of worker {worker}: server_s must list [server, seconds ≥ 0]")
    timeline = report.get("timeline", [])
    if not isinstance(timeline, list) or not all(
            isinstance(e, list) and len(e) == 5 and e[0] in TIMELINE_KINDS and type(e[1]) is int
            and type(e[2]) in (int, float) and math.isfinite(e[2])
            and (e[3] is None or (type(e[3]) in (int, float) and math.isfinite(e[3])))
            and isinstance(e[4], list) and _INT.issuperset(map(type, e[4])) for e in timeline):
        raise ValueError(f"report of worker {worker}: timeline must list [kind, server, sent, arrived, blocks]")
    for key in ("wire_bytes", "rows"):  # optional: bytes sent and received; a table's rows pulled and pushed
        pair = report.get(key, [0, 0])
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(x) is int and x >= 0 for x in pair)):
            raise ValueError(f"report of worker {worker}: {key} must be [int ≥ 0, int ≥ 0]")
    for key in ("count", "data_s", "gap_s"):  # optional: a worker's step and input pipeline
        read_field(report, key, float, who=f"report of worker {worker}", least=0)
    return exchange


@dataclass
class ServerTotals:
    """What the servers' stop acknowledgements say of the whole job, summed: σ of every
    gradient applied, async_scaling's steps, DC-ASGD's corrections, the gradients applied
    to each block, and (no barrier) pushes whose handed-over blocks an old owner sent on."""

    histogram: dict[int, int] = field(default_factory=dict)
    steps: StepTotals = field(default_factory=StepTotals)
    compensated: int = 0
    applied: dict[int, int] = field(default_factory=dict)
    forwarded: int = 0
    duplicates: int = 0  # block gradients a server dropped: their push id was taken already
    too_old: int = 0     # dropped: their id below a server's window (lost)

    @classmethod
    def of(cls, acks: dict) -> "ServerTotals":
        """The totals of every server's stop `ack` (rank → message)."""
        out = cls()
        owner: dict[int, int] = {}
        for rank, ack in acks.items():
            f = ack.fields
            for k, n in f.get("block_gradients", []):
                if int(k) in owner:  # a block has one owner at the end: two counts would hide a loss
                    raise JobError(f"block {k}'s gradients are counted by server {owner[int(k)]} and by "
                                     f"server {rank}: the count cannot be trusted")
                owner[int(k)], out.applied[int(k)] = rank, int(n)
            for sigma, count in f.get("histogram", []):
                out.histogram[int(sigma)] = out.histogram.get(int(sigma), 0) + int(count)
            got = StepTotals.from_wire(f.get("steps"))
            if got is not None:
                out.steps += got
            out.compensated += int(f.get("compensated", 0))
            out.forwarded += int(f.get("forwarded", 0))
            out.duplicates += int(f.get("duplicates", 0))
            out.too_old += int(f.get("too_old", 0))
        return out


class RunStats:
    def __init__(self, global_batch: int):
        self.global_batch = global_batch
        self.t_start: float | None = None
        self.began_at: float | None = None
        self.t_last = 0.0
        self.samples = 0
        self.busy = {"compute_s": 0.0, "wait_s": 0.0, "comm_s": 0.0}
        self.data_s = 0.0  # waiting for samples (not in `busy`: barrier_wait_fraction is unchanged)
        self.wire = [0, 0, 0]  # bytes the workers sent (pushes, rows asked), received (weights, rows); reports
        self.last_loss = float("nan")
        self.last_at: float | None = None
        self._t_prev_record: float | None = None

    def begin(self) -> None:
        if self.t_start is None:
            self.t_start = self._t_prev_record = time.perf_counter()
            self.began_at = time.time()  # the first iteration's start, on the wall clock (summary's startup_s)

    def elapsed(self) -> float:
        """Seconds since training started (0 before it has)."""
        return 0.0 if self.t_start is None else time.perf_counter() - self.t_start

    def add(self, report: dict) -> None:
        self.t_last = report["received_at"] = time.perf_counter()  # its iteration ends with its last report
        self.last_at = time.time()  # the last report, on the wall clock (training's end for eval_s)
        self.samples += int(report["samples"])
        for k in self.busy:
            self.busy[k] += float(report[k])
        self.data_s += float(report.get("data_s", 0.0))
        sent, received = report.get("wire_bytes", (0, 0))
        self.wire = [self.wire[0] + sent, self.wire[1] + received, self.wire[2] + 1]

    def marks(self, evaluated: float) -> dict:
        """Wall-clock times of the first iteration, the last report and the last
        evaluation (`evaluated`), which api.timing_split turns into the summary's split."""
        trained = self.last_at or evaluated
        return {"first_iteration": self.began_at or trained, "trained": trained, "evaluated": evaluated}

    def iteration_record(self, t: int, reports: list[dict]) -> dict:
        """One metrics.jsonl record for iteration t from its workers' reports, timed by
        the last of them to arrive: the record may be written later (the coordinator
        digests an iteration's reports after the next plans are out, and after a
        snapshot taken at that barrier)."""
        now = time.perf_counter()
        at = max((r.get("received_at", now) for r in reports), default=now)
        elapsed = at - (self._t_prev_record or at)
        self._t_prev_record = max(at, self._t_prev_record or at)
        # In slice order when a lost worker's slices were cut among others (barrier
        # protocols: the same as worker order otherwise), so `batch` lists the splits.
        recovered = any(r.get("recovery") for r in reports)
        reports = sorted(reports, key=lambda r: (r.get("start", 0), r["worker"]) if recovered else r["worker"])
        samples = sum(r["samples"] for r in reports)
        counts = [float(r.get("count", r["samples"])) for r in reports]  # the units each loss averaged over
        loss = (sum(r["loss"] * c for r, c in zip(reports, counts)) / sum(counts) if sum(counts) > 0
                else float("nan"))
        self.last_loss = loss
        stale = [s for r in reports for s in r["staleness"]]
        record = {"type": "iteration", "iteration": t, "time": time.time() - (now - at),
                  "elapsed": 0.0 if self.t_start is None else at - self.t_start,
                  "workers": [r["worker"] for r in reports],
                  "batch": [r["samples"] for r in reports], "loss": loss,
                  "samples_per_s": samples / elapsed if elapsed > 0 else None,
                  "staleness_mean": sum(stale) / len(stale) if stale else None,
                  "staleness_max": max(stale) if stale else None,
                  "staleness": [sum(r["staleness"]) / len(r["staleness"]) if r["staleness"] else None
                                for r in reports]}
        for key in ("compute_s", "data_s", "h2d_s", "d2h_s", "wait_s", "comm_s", "cpu", "mem", "version", "gap_s"):
            record[key] = [r.get(key) for r in reports]
        if any("rows" in r for r in reports):  # sparse tables: the rows each worker pulled and pushed
            record["rows_pulled"], record["rows_pushed"] = ([r.get("rows", (0, 0))[i] for r in reports] for i in (0, 1))
        if any(r.get("timeline") for r in reports):  # each worker's wire events (worker/loop.py)
            record["timeline"] = [r.get("timeline", []) for r in reports]
        if any(r.get("lost") for r in reports):  # a lost worker's slice, applied everywhere, never reported
            record["lost"] = [bool(r.get("lost")) for r in reports]
        if any("table_wait_s" in r for r in reports):  # blocks moved during this iteration
            record["table_wait_s"] = [r.get("table_wait_s", 0.0) for r in reports]
        return record

    def summary(self, cfg: Config, iterations: int, final_eval: dict, *, wall_s: float,
                staleness: dict[int, int] | None = None, blocks: list | None = None) -> dict:
        """The run summary; `staleness` is the servers' histogram of σ over every gradient
        applied (one count per gradient and server); `blocks` the job's (its sparse tables)."""
        hist = Counter(staleness or {})
        train_s = max(self.t_last - (self.t_last if self.t_start is None else self.t_start), 1e-9)
        total = sum(self.busy.values())
        n = sum(hist.values())
        return {
            "status": "completed",
            "protocol": cfg.protocol, "workers": cfg.workers, "servers": cfg.servers,
            "iterations": iterations, "global_batch": cfg.global_batch,
            "samples": self.samples,
            "final_accuracy": final_eval.get("test_accuracy"),
            "final_test_loss": final_eval.get("test_loss"),
            "final_metrics": {k[len("test_"):]: v for k, v in final_eval.items()
                              if k.startswith("test_") and k != "test_samples"},
            "final_train_loss": self.last_loss,
            "samples_per_s": self.samples / train_s,
            "train_s": train_s, "wall_s": wall_s,
            "barrier_wait_fraction": self.busy["wait_s"] / total if total > 0 else 0.0,
            "compute_s": self.busy["compute_s"], "wait_s": self.busy["wait_s"],
            "comm_s": self.busy["comm_s"], "data_s": self.data_s,
            "staleness_mean": sum(k * v for k, v in hist.items()) / n if n else 0.0,
            "staleness_max": max(hist, default=0),
            "staleness_histogram": {str(k): v for k, v in sorted(hist.items())},
            "lost_updates": 0, "recovered": [],
            # mean per worker and iteration: what a worker sent (gradients, rows asked for)
            # and received (weights, rows)
            "wire_bytes_per_iteration": {"push": self.wire[0] / max(1, self.wire[2]),
                                         "pull": self.wire[1] / max(1, self.wire[2])},
            **({"sparse_tables": tables_summary(blocks)} if any(b.kind == "rows" for b in blocks or ()) else {}),
        }
