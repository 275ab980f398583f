"""What surviving failures, keeping strangers out and watching the job cost: equipoise BSP
throughput with authentication off, plain (the default) and CURVE, with in-memory
snapshots for server rollback never, every 10 iterations (the default) and every
iteration, with `replication = 1` (a lockstep backup of every server), and with the live
view drawn or not — the variants of a preset interleaved in one invocation (A, B, C, …,
A, B, C, …), medians with min–max.

    python -m benchmarks.bench_costs --preset full   # authentication, snapshots, replication
    python -m benchmarks.bench_costs --preset live   # the live view on a terminal vs none

The job is bench_ddp's (CNN on Fashion-MNIST, 4 workers, 2 servers, global batch 128);
the rate is the steady one (iterations after the warm-up, from metrics.jsonl). Each
variant's ratio is to the preset's first variant: "bare" (no authentication, no
snapshots, no heartbeats), or for `live` "default" (no progress display, as `--quiet`).
The "live view" variant runs with `progress = true` and the display told it writes to
a terminal (FORCE_COLOR), so the progress bar and the per-worker and per-server tables
are drawn once a second as in a user's terminal; what it draws goes to /dev/null.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks.bench_ddp import Spec, run_equipoise
from benchmarks.common import git_state, load_average, scoped_env, write_results

NAME = "bench_costs"

VARIANTS: dict[str, dict[str, Any]] = {
    "bare": dict(auth="off", snapshot_every=0, heartbeat_s=0.0),
    "default": {},  # auth = "plain", snapshot_every = 10, heartbeat_s = 2, progress = false
    "curve": dict(auth="curve"),
    "snapshot every iteration": dict(snapshot_every=1),
    "replication 1": dict(replication=1),
    "live view": dict(progress=True),  # drawn as on a terminal: see `terminal`
}
COSTS = ("bare", "default", "curve", "snapshot every iteration", "replication 1")


@dataclass(frozen=True)
class Preset:
    iterations: int
    reps: int
    variants: tuple[str, ...] = COSTS
    small: bool = False  # the ci presets: the digits data set and an MLP, to check the harness quickly


PRESETS = {"ci": Preset(iterations=12, reps=1, small=True), "full": Preset(iterations=200, reps=3),
           "live-ci": Preset(iterations=12, reps=1, variants=("default", "live view"), small=True),
           "live": Preset(iterations=200, reps=5, variants=("default", "live view"))}


@contextlib.contextmanager
def terminal() -> Iterator[None]:
    """The progress display believes stderr is a 120-column terminal; stderr goes to /dev/null."""
    with open(os.devnull, "w") as sink, scoped_env(FORCE_COLOR="1", COLUMNS="120"), \
            contextlib.redirect_stderr(sink):
        yield


def _run_variant(spec: Spec, extra: dict[str, Any]) -> float:
    with terminal() if extra.get("progress") else contextlib.nullcontext():
        return run_equipoise(spec, **extra)["steady_samples_per_s"]


def run(preset: str, *, reps: int | None = None, results_path: str | None = None) -> dict[str, Any]:
    p = PRESETS[preset]
    spec = Spec(iterations=p.iterations, **(dict(model="mlp", dataset="digits", global_batch=64) if p.small else {}))
    variants = {name: VARIANTS[name] for name in p.variants}
    load_at_start, git_at_start = load_average(), git_state()
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps or p.reps):
        for name, extra in variants.items():
            rate = _run_variant(spec, extra)
            runs[name].append(rate)
            print(f"{name}: {rate:.1f} samples/s", flush=True)
    first = p.variants[0]
    base = statistics.median(runs[first])
    table = {name: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r,
                    f"ratio_to_{first.replace(' ', '_')}": statistics.median(r) / base} for name, r in runs.items()}
    result = {"preset": preset, "spec": spec.__dict__, "variants": variants, "results": table,
              "loadavg_at_start": load_at_start, "git_at_start": git_at_start}
    print(f"\n| variant | samples/s median (min–max) | × {first} |\n| --- | --- | --- |")
    for name, row in table.items():
        print(f"| {name} | {row['median']:.0f} ({row['min']:.0f}–{row['max']:.0f}) | "
              f"{row['median'] / base:.3f} |")
    print(f"wrote {write_results(NAME if preset in ('ci', 'full') else f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    run(args.preset, reps=args.reps, results_path=args.results)
