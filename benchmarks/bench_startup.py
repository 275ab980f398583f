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

Preset ``replace`` (bench_startup_replace.json): a job of 4 workers and 2 servers (the MLP
on digits, each worker stretched 20×, ``worker_restarts = 1``) run in a thread of the
harness; worker 1's process is killed (SIGKILL) once iteration 10 is recorded. Per run:
seconds from the kill to the coordinator's failure event (detection), to the
replacement's registration (``worker_joined``) and to the first iteration it took part
in, cold against warm.

Preset ``ray-replace`` (bench_startup_ray-replace.json): the ``replace`` job under the
Ray launcher over 200 iterations (a local Ray instance the harness starts once, 8 CPUs), worker 1's actor
process killed once iteration 10 is recorded and the standby on its node is ready
(standbys.json lists it; launch/ray_standby.py): the same three times, the replacement in a
fresh actor (cold: ``EQUIPOISE_WARM=0``, no standbys) against the standby (warm).

Preset ``plain`` (bench_startup_plain.json): time to result against a plain PyTorch loop.
The default job from the command line (warm children, as shipped) against
benchmarks/plain_loop.py, the same model, batch, epoch and evaluation points in one
process with two threads, interleaved: each command's wall seconds, its training and
evaluation seconds and final accuracy, and per round equipoise's wall time over the
plain loop's.

Preset ``single`` (bench_startup_single.json): the framework's cost where distribution
gains nothing. One worker and one server (the CNN on Fashion-MNIST, batch 128, 300
iterations, no evaluation) against the plain loop at the same batch, with the worker and
the loop on 1 and on 2 threads, interleaved: samples/s after 20 iterations (equipoise's
from its iteration records, as bench_lbbsp's steady window), and per round equipoise over
the plain loop.

Preset ``wait`` (bench_startup_wait.json): the ``single`` job on 2 threads, OpenMP's own
idle policy against its idle threads sleeping at once (the job's default), interleaved.

    python -m benchmarks.bench_startup start [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def train_command(args: list[str], out: Path, warm: bool = True) -> float:
    """`equipoise train --out OUT ARGS` as a user starts it; its wall seconds."""
    env = dict(os.environ, EQUIPOISE_WARM="1" if warm else "0")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "equipoise.cli", "train", "--quiet", "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"equipoise train exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


def run_cli(args: list[str], warm: bool, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{'warm' if warm else 'cold'}-{time.monotonic_ns()}"
    wall = train_command(args, out, warm)
    s = json.loads((out / "summary.json").read_text())
    return {"startup_s": s["startup_s"], "train_s": s["train_s"], "eval_s": s["eval_s"],
            "shutdown_s": s["shutdown_s"], "total_s": s["total_s"], "wall_s_command": wall,
            "wall_over_train": wall / s["train_s"], "final_accuracy": s.get("final_accuracy"),
            "evaluations": s.get("evaluations")}


REPLACE = dict(dataset="digits", model="mlp", global_batch=64, workers=4, servers=2, iterations=60, eval_every=0,
               checkpoint_every=0, progress=False, timeout=60.0, heartbeat_s=1.0, slowdown=[20.0] * 4,
               worker_restarts=1, seed=5)
# Under Ray over 200 iterations: the standbys start warming once every role has
# registered, beside the running job (60 ended before the one on worker 1's node was ready).
RAY_REPLACE = {**REPLACE, "launcher": "ray", "iterations": 200}
REPLACE_FIGURES = ("detected_s", "joined_s", "first_step_s")


def worker_pid(rank: int) -> int | None:
    """The pid of this process's descendant running worker `rank` (its command line, as
    launch/proc.py and launch/warm.py show it), or None."""
    import psutil

    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "equipoise.launch.proc" in cmd and cmd[cmd.index("equipoise.launch.proc") + 1:][:2] == ["worker", str(rank)]:
            return p.pid
    return None


def replacement_times(cfg: dict, label: str, warm: bool, tmp: Path, victim) -> tuple[dict[str, Any], dict]:
    """Train `cfg` in a thread of the harness, children warm or cold; once iteration 10 is
    recorded, SIGKILL the process `victim(run_dir)` names (None: not yet). The
    replacement's times from the kill, and the job's summary."""
    import signal
    import threading

    import equipoise

    out = tmp / f"{label}-{'warm' if warm else 'cold'}-{time.monotonic_ns()}"
    os.environ["EQUIPOISE_WARM"] = "1" if warm else "0"
    result: dict[str, Any] = {}
    job = threading.Thread(target=lambda: result.update(equipoise.train(cfg, out=out)))
    job.start()
    killed = None
    try:
        deadline = time.monotonic() + 300
        while killed is None and time.monotonic() < deadline and job.is_alive():
            metrics = out / "metrics.jsonl"
            done = metrics.exists() and sum(json.loads(line).get("type") == "iteration"
                                            for line in metrics.read_text().splitlines() if line.endswith("}")) >= 10
            pid = victim(out) if done else None
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = time.time()
            time.sleep(0.01)
    finally:
        job.join(timeout=600)
        os.environ.pop("EQUIPOISE_WARM", None)
    if killed is None or result.get("status") != "completed":
        raise RuntimeError(f"the {label} job did not run as planned: killed={killed}, {result.get('status')}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    failure = next(r for r in records if r.get("event") == "failure")
    joined = next(r for r in records if r.get("event") == "worker_joined")
    first = next(r for r in records if r.get("type") == "iteration" and joined["worker"] in r["workers"])
    return {"detected_s": failure["time"] - killed, "joined_s": joined["time"] - killed,
            "first_step_s": first["time"] - killed, "first_step_iteration": first["iteration"],
            "replacement": joined["worker"]}, result


def run_replace(warm: bool, tmp: Path) -> dict[str, Any]:
    """One job of REPLACE; worker 1 killed at iteration 10; the replacement's times."""
    times, _ = replacement_times(REPLACE, "replace", warm, tmp, lambda out: worker_pid(1))
    return times


def run_ray_replace(warm: bool, tmp: Path) -> dict[str, Any]:
    """One job of REPLACE under the Ray launcher; worker 1's actor killed at iteration 10
    (warm: once the standby on its node is ready); the replacement's times."""
    def victim(out: Path) -> int | None:
        where, standbys = json.loads((out / "nodes.json").read_text()), out / "standbys.json"
        if warm and not (standbys.exists() and where["worker1"]["node"] in json.loads(standbys.read_text())):
            return None
        return where["worker1"]["pid"]

    times, summary = replacement_times(RAY_REPLACE, "ray-replace", warm, tmp, victim)
    return {**times, "replacement_warm": summary["nodes"][f"worker{times['replacement']}"].get("warm")}


def bench_ray_replace(reps: int) -> dict[str, Any]:
    """The Ray instance's files in the harness's temporary folder, removed with it; the
    token a local instance writes in ~/.ray removed unless it was there before."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    token = Path.home() / ".ray" / "auth_token"
    had_token, had_folder = token.exists(), token.parent.exists()
    with tempfile.TemporaryDirectory(prefix="bsr-") as name:  # short: Ray's socket paths are made in it
        tmp = Path(name)
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp / "ray"))
        try:
            runs = interleave({"cold": lambda: run_ray_replace(False, tmp),
                               "warm": lambda: run_ray_replace(True, tmp)}, reps)
        finally:
            ray.shutdown()
            if not had_token:
                token.unlink(missing_ok=True)
            if not had_folder:
                shutil.rmtree(token.parent, ignore_errors=True)
    return {"preset": "ray-replace", "settings": RAY_REPLACE, "ray_cpus": 8, "reps": reps,
            "loadavg_at_start": load_average(), "runs": runs,
            **{k: {s: summary([r[k] for r in v]) for s, v in runs.items()} for k in REPLACE_FIGURES}}


def run_plain(*args: str) -> dict[str, Any]:
    """benchmarks/plain_loop.py as a command; its figures and the command's wall seconds."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.plain_loop", *args], capture_output=True, text=True,
                          timeout=900, cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"plain_loop exited {done.returncode}: {done.stderr.strip()[-500:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return {**r, "wall_s_command": wall, "final_accuracy": r["final_metrics"].get("accuracy")}


SINGLE = ["--set", "workers=1", "--set", "servers=1", "--set", "global_batch=128", "--set", "iterations=300",
          "--set", "eval_every=0", "--set", "checkpoint_every=0"]
SINGLE_WARMUP = 20


def run_single(threads: int, tmp: Path) -> dict[str, Any]:
    """One worker and one server on `threads` threads each; samples/s after the warm-up."""
    from benchmarks.bench_lbbsp import steady_window

    out = tmp / f"single-{threads}-{time.monotonic_ns()}"
    train_command([*SINGLE, "--set", f"threads={threads}"], out)
    w = steady_window(out / "metrics.jsonl", SINGLE_WARMUP)
    return {"steady_samples_per_s": w["samples_per_s"], "split": w["split"], "threads": threads}


def bench_single(reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        plain = ["--batch", "128", "--iterations", "300", "--eval-every", "0", "--warmup", str(SINGLE_WARMUP)]
        runs = interleave({"equipoise-1t": lambda: run_single(1, tmp),
                           "plain-1t": lambda: run_plain(*plain, "--threads", "1"),
                           "equipoise-2t": lambda: run_single(2, tmp),
                           "plain-2t": lambda: run_plain(*plain, "--threads", "2")}, reps)
    return {"preset": "single", "args": SINGLE, "warmup": SINGLE_WARMUP, "reps": reps,
            "loadavg_at_start": load_average(), "runs": runs,
            "steady_samples_per_s": {k: summary([r["steady_samples_per_s"] for r in v]) for k, v in runs.items()},
            "equipoise_over_plain": {
                f"{t}t": summary([e["steady_samples_per_s"] / p["steady_samples_per_s"]
                                  for e, p in zip(runs[f"equipoise-{t}t"], runs[f"plain-{t}t"])]) for t in (1, 2)}}


def bench_plain(reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        runs = interleave({"equipoise": lambda: run_cli([], True, tmp),
                           "plain": lambda: run_plain("--threads", "2", "--eval-every", "100")}, reps)
    keys = ("wall_s_command", "train_s", "eval_s", "final_accuracy")
    return {"preset": "plain", "reps": reps, "loadavg_at_start": load_average(), "runs": runs,
            **{k: {s: summary([r[k] for r in v]) for s, v in runs.items()} for k in keys},
            "wall_equipoise_over_plain": summary([e["wall_s_command"] / p["wall_s_command"]
                                                  for e, p in zip(runs["equipoise"], runs["plain"])])}


def bench_wait(reps: int) -> dict[str, Any]:
    """One worker and one server on 2 threads each, OpenMP's own idle policy (an empty
    OMP_WAIT_POLICY, which OpenMP reads as unset after a warning: a short spin, then
    sleep) against sleeping at once (PASSIVE, the job's default with threads > 1:
    launch/warm.py job_env), interleaved. (ACTIVE, spinning throughout, ran at about a
    fifth of PASSIVE's samples/s in a first run: bench_startup_wait-active.json.)"""
    def run(policy: str, tmp: Path) -> dict[str, Any]:
        os.environ["OMP_WAIT_POLICY"] = policy  # inherited by the command, kept by job_env
        try:
            return run_single(2, tmp)
        finally:
            os.environ.pop("OMP_WAIT_POLICY", None)

    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        runs = interleave({"default": lambda: run("", tmp), "passive": lambda: run("PASSIVE", tmp)}, reps)
    return {"preset": "wait", "args": SINGLE, "warmup": SINGLE_WARMUP, "reps": reps,
            "loadavg_at_start": load_average(), "runs": runs,
            "steady_samples_per_s": {k: summary([r["steady_samples_per_s"] for r in v]) for k, v in runs.items()},
            "passive_over_default": summary([p["steady_samples_per_s"] / a["steady_samples_per_s"]
                                             for a, p in zip(runs["default"], runs["passive"])])}


def bench(preset: str, reps: int) -> dict[str, Any]:
    if preset == "single":
        return bench_single(reps)
    if preset == "wait":
        return bench_wait(reps)
    if preset == "plain":
        return bench_plain(reps)
    if preset == "ray-replace":
        return bench_ray_replace(reps)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        if preset == "replace":
            runs = interleave({"cold": lambda: run_replace(False, tmp), "warm": lambda: run_replace(True, tmp)}, reps)
            return {"preset": preset, "settings": REPLACE, "reps": reps, "loadavg_at_start": load_average(),
                    "runs": runs, **{k: {s: summary([r[k] for r in v]) for s, v in runs.items()}
                                     for k in REPLACE_FIGURES}}
        args = PRESETS[preset]
        runs = interleave({"cold": lambda: run_cli(args, False, tmp), "warm": lambda: run_cli(args, True, tmp)}, reps)
    out: dict[str, Any] = {"preset": preset, "args": args, "reps": reps, "loadavg_at_start": load_average(),
                           "runs": runs}
    for key in FIGURES + ("wall_over_train",):
        out[key] = {k: summary([r[key] for r in v]) for k, v in runs.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS) + ["replace", "ray-replace", "plain", "single", "wait"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    result = bench(args.preset, args.reps)
    if args.preset == "single":
        print("samples/s: " + ", ".join(f"{k} {fmt_range(v)}" for k, v in result["steady_samples_per_s"].items()))
        print("equipoise / plain: " + ", ".join(f"{k} {fmt_range(v)}" for k, v in result["equipoise_over_plain"].items()))
    elif args.preset == "wait":
        print("samples/s: " + ", ".join(f"{k} {fmt_range(v)}" for k, v in result["steady_samples_per_s"].items()))
        print(f"passive / default: {fmt_range(result['passive_over_default'])}")
    elif args.preset == "plain":
        for key in ("wall_s_command", "train_s", "eval_s", "final_accuracy"):
            print(f"{key}: equipoise {fmt_range(result[key]['equipoise'])}, plain {fmt_range(result[key]['plain'])}")
        print(f"wall equipoise / plain: {fmt_range(result['wall_equipoise_over_plain'])}")
    else:
        for key in REPLACE_FIGURES if "replace" in args.preset else ("startup_s", "wall_s_command", "wall_over_train"):
            print(f"{key}: cold {fmt_range(result[key]['cold'])}, warm {fmt_range(result[key]['warm'])}")
    print(f"wrote {write_results(f'bench_startup_{args.preset}', result, args.results)}")


if __name__ == "__main__":
    main()
