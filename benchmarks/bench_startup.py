"""Time to result: where a job's wall time goes, with children started cold (a fresh
interpreter each, importing torch) and warm (forked from the job's template,
launch/warm.py), interleaved (cold, warm, cold, warm, ...).

Preset ``start`` (bench_startup_start.json): ``equipoise train`` of 4 workers and 2
servers for 20 iterations without evaluation; per run the summary's ``startup_s``
(from the command's process start to the first iteration), ``train_s``, ``eval_s``,
``shutdown_s`` and ``total_s``, and the command's wall seconds. Preset ``default``
(bench_startup_default.json): the default job (``equipoise train`` with no arguments: the
CNN on Fashion-MNIST, 4 workers, 2 servers, an evaluation every 100 iterations), the same
figures and its final accuracy; the target is a wall time within 1.15× the training
time. Each run is a separate ``equipoise`` process from the command line, as a user
starts it.

    python -m benchmarks.bench_startup start [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import fmt_range, interleave, load_average, summary, write_results

PRESETS = {
    "start": ["--set", "workers=4", "--set", "servers=2", "--set", "iterations=20", "--set", "eval_every=0",
              "--set", "checkpoint_every=0"],
    "default": [],
}
FIGURES = ("startup_s", "train_s", "eval_s", "shutdown_s", "total_s", "wall_s_command")


def run_cli(args: list[str], warm: bool, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{'warm' if warm else 'cold'}-{time.monotonic_ns()}"
    env = dict(os.environ, EQUIPOISE_WARM="1" if warm else "0")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "equipoise.cli", "train", "--quiet", "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"equipoise train exited {done.returncode}: {done.stderr.strip()[-500:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"startup_s": s["startup_s"], "train_s": s["train_s"], "eval_s": s["eval_s"],
            "shutdown_s": s["shutdown_s"], "total_s": s["total_s"], "wall_s_command": wall,
            "wall_over_train": wall / s["train_s"], "final_accuracy": s.get("final_accuracy"),
            "evaluations": s.get("evaluations")}


def bench(preset: str, reps: int) -> dict[str, Any]:
    args = PRESETS[preset]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        runs = interleave({"cold": lambda: run_cli(args, False, tmp), "warm": lambda: run_cli(args, True, tmp)}, reps)
    out: dict[str, Any] = {"preset": preset, "args": args, "reps": reps, "loadavg_at_start": load_average(),
                           "runs": runs}
    for key in FIGURES + ("wall_over_train",):
        out[key] = {k: summary([r[key] for r in v]) for k, v in runs.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    result = bench(args.preset, args.reps)
    for key in ("startup_s", "wall_s_command", "wall_over_train"):
        print(f"{key}: cold {fmt_range(result[key]['cold'])}, warm {fmt_range(result[key]['warm'])}")
    print(f"wrote {write_results(f'bench_startup_{args.preset}', result, args.results)}")


if __name__ == "__main__":
    main()
