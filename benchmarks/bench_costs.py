"""What surviving failures and keeping strangers out cost: equipoise BSP throughput
with authentication off, plain (the default) and CURVE, with in-memory snapshots for
server rollback never, every 10 iterations (the default) and every iteration, and with
`replication = 1` (a lockstep backup of every server) — the variants interleaved in one invocation (A, B, C, …, A, B, C, …), medians with min–max.

    python -m benchmarks.bench_costs --preset full

The job is bench_ddp's (CNN on Fashion-MNIST, 4 workers, 2 servers, global batch 128);
the rate is the steady one (iterations after the warm-up, from metrics.jsonl). Each
variant's ratio is to "bare" (no authentication, no snapshots, no heartbeats).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.bench_ddp import Spec, run_equipoise
from benchmarks.common import git_state, load_average, write_results

NAME = "bench_costs"

VARIANTS: dict[str, dict[str, Any]] = {
    "bare": dict(auth="off", snapshot_every=0, heartbeat_s=0.0),
    "default": {},  # auth = "plain", snapshot_every = 10, heartbeat_s = 2
    "curve": dict(auth="curve"),
    "snapshot every iteration": dict(snapshot_every=1),
    "replication 1": dict(replication=1),
}


@dataclass(frozen=True)
class Preset:
    iterations: int
    reps: int


PRESETS = {"ci": Preset(iterations=12, reps=1), "full": Preset(iterations=200, reps=3)}


def run(preset: str, *, reps: int | None = None, results_path: str | None = None) -> dict[str, Any]:
    p = PRESETS[preset]
    spec = Spec(iterations=p.iterations)
    load_at_start, git_at_start = load_average(), git_state()
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(reps or p.reps):
        for name, extra in VARIANTS.items():
            rate = run_equipoise(spec, **extra)["steady_samples_per_s"]
            runs[name].append(rate)
            print(f"{name}: {rate:.1f} samples/s", flush=True)
    base = statistics.median(runs["bare"])
    table = {name: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r,
                    "ratio_to_bare": statistics.median(r) / base} for name, r in runs.items()}
    result = {"preset": preset, "spec": spec.__dict__, "variants": VARIANTS, "results": table,
              "loadavg_at_start": load_at_start, "git_at_start": git_at_start}
    print("\n| variant | samples/s median (min–max) | × bare |\n| --- | --- | --- |")
    for name, row in table.items():
        print(f"| {name} | {row['median']:.0f} ({row['min']:.0f}–{row['max']:.0f}) | {row['ratio_to_bare']:.3f} |")
    print(f"wrote {write_results(NAME, result, results_path)}")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    run(args.preset, reps=args.reps, results_path=args.results)
