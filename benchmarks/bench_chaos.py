"""Chaos: short BSP jobs whose workers and servers are killed at random moments, each of
which must complete and end where the single-process oracle ends.

Each repetition runs one job (digits, MLP, 4 workers, 2 or 3 servers, 60 iterations,
every worker slowed so an iteration takes some milliseconds; heartbeat_s 1,
snapshot_every 10, worker_restarts 2) in a thread of this process, and a schedule drawn
from a generator seeded by (seed, repetition): 1–3 blows, each a role (worker or
server), the number of iteration records to wait for, a delay below an iteration, the
signal (SIGKILL, or now and then SIGSTOP: a frozen process the heartbeat must detect),
and a number in [0, 1) that picks the victim among the processes of that role alive at
that moment (a replaced worker has a new rank, a replaced server its old rank and a new
pid: the victim is found by command line, never by remembered pid). With at most 3
blows and 2 replacements, at least 3 workers remain.

Checks, per repetition: the job's status is "completed" with all 60 iterations, and its
final weights are within 1e-5 of `train_reference` on the run's own splits
(`equipoise.reference.oracle_diff`; tests/integration/test_recovery.py argues the
tolerance) while training moved them by more than 1e-3. Recorded: the schedule as
carried out, summary.json's `recovered` and `lost_updates`, the max |difference|, the
wall time.

    python -m benchmarks.bench_chaos --reps 20 [--seed S]

The asynchronous variant, `--protocol async` (results in bench_chaos_async.json), draws
softsync (n = 2), ssp (s = 2) or asp for each repetition and no worker replacements.
There is no oracle without a barrier; its check is the accounting instead: every gradient
owed to a server (one per plan handed out) is applied there at most once, and what a
server never applied — a lost worker's last plan, a gradient in flight when the
snapshot a rollback restores was taken — is within a bound argued from those causes
(`bound`: one per lost worker, workers + 1 per rollback) and is `lost_updates`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import git_state, load_average, write_results

NAME = "bench_chaos"
ITERATIONS = 60
TOLERANCE = 1e-5
JOB = dict(dataset="digits", model="mlp", global_batch=64, workers=4, iterations=ITERATIONS,
           eval_every=0, checkpoint_every=0, lr=0.05, optimizer="sgd", momentum=0.9, progress=False,
           timeout=60.0, heartbeat_s=1.0, snapshot_every=10, worker_restarts=2,
           slowdown=[10.0, 10.0, 10.0, 10.0])
WAIT_S = 120.0  # for an iteration record, and for the job to end after the last blow


# The asynchronous variant (--protocol async): each repetition draws one of these. No
# replacement workers (they join at a barrier), so up to 3 of the 4 workers may be lost.
ASYNC = [dict(protocol="softsync", softsync_n=2), dict(protocol="ssp", staleness_bound=2), dict(protocol="asp")]


def draw(seed: int, rep: int, protocol: str = "bsp") -> tuple[dict, list[dict]]:
    """Repetition `rep`'s job config and schedule of blows (sorted by `at`); `protocol`
    "async" draws one of ASYNC for the job."""
    rng = random.Random(f"chaos-{seed}-{rep}" if protocol == "bsp" else f"chaos-{protocol}-{seed}-{rep}")
    cfg = dict(JOB, servers=rng.choice([2, 3]), seed=rng.randrange(1000))
    if protocol == "async":
        cfg.update(rng.choice(ASYNC), worker_restarts=0)
    ats = sorted(rng.sample(range(3, 50), rng.randint(1, 3)))
    blows = [{"role": rng.choice(["worker", "server"]), "at": at, "delay_ms": round(rng.uniform(0, 10), 1),
              "signal": "SIGSTOP" if rng.random() < 0.15 else "SIGKILL", "pick": round(rng.random(), 3)}
             for at in ats]
    return cfg, blows


def _iterations(run: Path) -> int:
    """Iteration records in the run's metrics.jsonl so far (replays included)."""
    try:
        text = (run / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return 0
    return text.count('"type":"iteration"')


def _alive(role: str) -> list[tuple[int, int]]:
    """(rank, pid) of this process's live children running `role`, by rank."""
    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = p.cmdline()
            if p.status() == psutil.STATUS_ZOMBIE or "equipoise.launch.proc" not in cmd:
                continue
        except psutil.NoSuchProcess:
            continue
        i = cmd.index("equipoise.launch.proc")
        if cmd[i + 1:i + 2] == [role]:
            out.append((int(cmd[i + 2]), p.pid))
    return sorted(out)


def repetition(seed: int, rep: int, run: Path, protocol: str = "bsp") -> dict[str, Any]:
    """Run repetition `rep` into `run`; its record (see the module docstring). `ok` says
    whether every check held."""
    import equipoise
    from equipoise.config import Config
    from equipoise.reference import oracle_diff

    cfg, blows = draw(seed, rep, protocol)
    record: dict[str, Any] = {"rep": rep, "servers": cfg["servers"], "seed": cfg["seed"], "schedule": []}
    result: dict[str, Any] = {}

    def job() -> None:
        try:
            result.update(equipoise.train(cfg, out=run))
        except BaseException as exc:  # recorded, not raised: the other repetitions go on
            result["error"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    thread = threading.Thread(target=job, name=f"chaos-{rep}")
    thread.start()
    for blow in blows:
        deadline = time.monotonic() + WAIT_S
        while thread.is_alive() and _iterations(run) < blow["at"] and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(blow["delay_ms"] / 1e3)
        alive = _alive(blow["role"]) if thread.is_alive() else []
        done = dict(blow, records=_iterations(run))
        if alive:
            rank, pid = alive[int(blow["pick"] * len(alive))]
            try:
                os.kill(pid, getattr(signal, blow["signal"]))
                done.update(rank=rank, pid=pid)
            except ProcessLookupError:
                done["missed"] = "the process ended before the signal"
        else:
            done["missed"] = "no such process alive (the job had ended)"
        record["schedule"].append(done)
    thread.join(WAIT_S)
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    if thread.is_alive():  # the job hangs: stop its processes so that its thread ends
        for p in psutil.Process(os.getpid()).children(recursive=True):
            p.kill()
        thread.join(30)
        result.setdefault("error", f"the job had not ended {WAIT_S:g} s after the last blow")
    record.update(status=result.get("status", "failed"), iterations=result.get("iterations"),
                  error=result.get("error"), recovered=result.get("recovered", []),
                  lost_updates=result.get("lost_updates"), diff=None, moved=None)
    record["protocol"] = cfg.get("protocol", "bsp")
    record["unaccounted"] = unaccounted(record["schedule"], record["recovered"])
    completed = record["status"] == "completed" and record["iterations"] == ITERATIONS
    if protocol == "async":
        # No oracle without a barrier: every gradient owed to a server is applied there
        # once, or counted lost — a lost worker's last plan, or in flight at a rollback's
        # snapshot (lost_updates). `gap`: the most any block is short.
        grads = result.get("gradients") or {}
        short = [grads["owed"] - grads["applied_min"], grads["owed"] - grads["applied_max"]] if grads else []
        lost = Counter(e["role"] for e in record["recovered"])
        record["gap"] = max(short, default=None)
        # At most one plan per lost worker; per rollback, one plan per worker in flight at
        # the snapshot plus a softsync group's c − 1 (≤ 1 at n = 2 of 4).
        record["bound"] = lost["worker"] + lost["server"] * (JOB["workers"] + 1)
        record["ok"] = (completed and bool(short) and min(short) >= 0 and record["gap"] == record["lost_updates"]
                        and record["lost_updates"] <= record["bound"])
        return record
    if record["status"] == "completed":
        try:
            record["diff"], record["moved"] = oracle_diff(Config.from_dict(cfg), run)
        except Exception as exc:
            record["error"] = f"oracle: {type(exc).__name__}: {exc}"
    record["ok"] = (completed and record["diff"] is not None and record["diff"] <= TOLERANCE
                    and record["moved"] > 100 * TOLERANCE)
    return record


def unaccounted(schedule: list[dict], recovered: list[dict]) -> list[str]:
    """The blows that landed and that `recovered` does not list (by role and rank)."""
    left = Counter((e["role"], e["rank"]) for e in recovered)
    out = []
    for b in schedule:
        if "missed" not in b:
            if left[b["role"], b["rank"]] > 0:
                left[b["role"], b["rank"]] -= 1
            else:
                out.append(f"{b['signal']} {b['role']} {b['rank']} @{b['at']}")
    return out


def totals(reps: list[dict]) -> dict[str, Any]:
    blows = [b for r in reps for b in r["schedule"]]
    landed = [b for b in blows if "missed" not in b]
    walls = [r["wall_s"] for r in reps]
    diffs = [r["diff"] for r in reps if r["diff"] is not None]
    count = lambda items, key: {k: sum(1 for x in items if x[key] == k) for k in sorted({x[key] for x in items})}
    return {"reps": len(reps), "ok": sum(r["ok"] for r in reps),
            "completed": sum(r["status"] == "completed" for r in reps),
            "blows": len(blows), "blows_landed": len(landed), "blows_by_role": count(landed, "role"),
            "blows_by_signal": count(landed, "signal"),
            "recovered": sum(len(r["recovered"]) for r in reps),
            "blows_unaccounted": sum(len(r["unaccounted"]) for r in reps),
            "recovered_by_role": count([e for r in reps for e in r["recovered"]], "role"),
            "lost_updates": sum(r["lost_updates"] or 0 for r in reps),
            "max_gap": max((r["gap"] for r in reps if r.get("gap") is not None), default=None),
            "max_diff": max(diffs, default=None), "min_moved": min((r["moved"] for r in reps if r["moved"]), default=None),
            "wall_s": {"median": round(statistics.median(walls), 2), "max": max(walls), "sum": round(sum(walls), 1)}}


def run(reps: int, seed: int = 0, keep: Path | None = None, protocol: str = "bsp") -> list[dict]:
    """`reps` repetitions, each in a fresh run directory (under `keep`, else deleted)."""
    out: list[dict] = []
    root = keep or Path(tempfile.mkdtemp(prefix="equipoise-chaos-"))
    try:
        for rep in range(reps):
            record = repetition(seed, rep, root / f"rep{rep:02d}", protocol)
            out.append(record)
            blows = ", ".join(f"{b['signal']} {b['role']} {b.get('rank', '?')} @{b['at']}+{b['delay_ms']}ms"
                              + (" (missed)" if "missed" in b else "") for b in record["schedule"])
            check = f"gap {record['gap']}" if protocol == "async" else f"diff {record['diff']}"
            print(f"rep {rep:2d}: {'ok  ' if record['ok'] else 'FAIL'} {record['protocol']} {record['status']} "
                  f"{check} lost_updates {record['lost_updates']} recovered {len(record['recovered'])} "
                  f"{record['wall_s']} s  [{blows}]" + (f"  {record['error']}" if record["error"] else ""),
                  flush=True)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", choices=["bsp", "async"], default="bsp",
                        help="async: each repetition draws softsync (n = 2), ssp (s = 2) or asp")
    parser.add_argument("--keep", default=None, help="keep the run directories under this folder")
    parser.add_argument("--results", default=None, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args(argv)
    load_at_start, git_at_start = load_average(), git_state()
    reps = run(args.reps, args.seed, Path(args.keep) if args.keep else None, args.protocol)
    summary = totals(reps)
    payload = {"command": ["python", "-m", "benchmarks.bench_chaos", *(sys.argv[1:] if argv is None else argv)],
               "loadavg_at_start": load_at_start, "git_at_start": git_at_start, "seed": args.seed,
               "job": JOB, "tolerance": TOLERANCE, "totals": summary, "repetitions": reps}
    path = write_results(NAME if args.protocol == "bsp" else f"{NAME}_async", payload, args.results)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")
    return 0 if summary["ok"] == summary["reps"] else 1


if __name__ == "__main__":
    sys.exit(main())
