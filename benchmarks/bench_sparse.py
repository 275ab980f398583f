"""Sparse embedding tables on the servers: MovieLens-100k matrix factorization, equipoise
against a plain single-process PyTorch loop.

Preset ``movielens`` (bench_sparse_movielens.json): examples/workloads/movielens.toml's job
— four ``nn.Embedding(..., sparse=True)`` tables and one dense parameter, Adam (the tables
stepped as ``torch.optim.SparseAdam``), lr 0.005, global batch 256, 4 epochs of the 90,000
training ratings (a seeded random split, a tenth held out) — as equipoise BSP (2 workers,
2 servers, local launcher) and as one plain PyTorch process with the same model, loss,
sample order, global batch, optimizers and two threads. At seeds 0, 1, 2, interleaved
(equipoise, plain, equipoise, plain, ...). Per run: the held-out RMSE at the end (the
root of the evaluation's mean squared error, predictions clipped to 1–5), wall seconds
from start to result, training seconds and samples/s; for equipoise also the bytes a
worker sent and received per iteration against what pulling and pushing the whole model
would move (its parameters' bytes each way).

    python -m benchmarks.bench_sparse movielens

Preset ``memory`` (bench_sparse_memory.json): the DLRM-style example
(examples/workloads/dlrm.py) with one table of 10⁷ rows × 32 on 4 servers, 4 workers,
against the same job with a table of 1,000 rows, interleaved: each process's peak
resident memory, sampled every 0.2 s. Preset ``dlrm`` (bench_sparse_dlrm.json):
samples/s of the same model with 4 tables of 10⁵, 10⁶ and 10⁷ rows, and with 10⁵-row
tables as dense parameters. Preset ``memory-jobs`` (bench_sparse_memory-jobs.json): two
jobs with a table of 10⁷ rows × 32 one after the other in one fresh process, the
coordinator's peak in each, under glibc's allocator as it comes and with its mmap
threshold fixed, interleaved.

Preset ``psld`` (bench_sparse_psld.json; with ``--iterations N --psld-horizon H``,
bench_sparse_psld-N-hH.json): the DLRM-style job (8 tables of 10⁵ rows × 32,
Zipf ids), 2 workers, 4 servers behind 10 MB/s emulated links, server 0 four times
slower, interleaved under the hash placement (``round_robin``: shard i on server
i mod 4), greedy (by size), PSLD (shards moved by the bytes they carried) and the oracle
(by size over the known speeds): seconds per iteration over the whole run and the last
third, the blocks PSLD moved, and how unequal the shards' traffic was (the hottest
shard's bytes over the mean shard's, from the servers' records).

Preset ``lbbsp`` (bench_sparse_lbbsp.json): the DLRM-style job (8 tables of 10⁵ rows ×
32), 4 workers stretched [1, 1, 2, 4] on top of a base of 4 (each emulated machine four
times slower than a core here, as in bench_lbbsp), 2 servers, under BSP and LB-BSP
(``min_batch = 0``),
interleaved: samples/s on the steady window after 20 iterations and LB-BSP's speed-up,
also over the whole run.

Preset ``torchrec`` (bench_sparse_torchrec.json): the DLRM-style example as shipped (8
tables of 10⁵ rows × 16, Adagrad, global batch 512, 4 workers, 4 servers), the same job
on 4 processes (2 workers, 1 server and the coordinator) and the same model, data and
global batch under TorchRec on 4 processes (benchmarks/torchrec_dlrm.py, run by the
Python of a venv of TorchRec's own), interleaved: samples/s on the steady window after
20 iterations, where each one's iteration goes, and each one's CPU milliseconds per
iteration over that window (equipoise's by role). The venv:

    python -m venv V && V/bin/pip install torch==2.13.0 fbgemm-gpu-cpu==1.8.0 tensordict \
        torchmetrics==1.0.3 tqdm pyre-extensions
    V/bin/pip install --no-deps torchrec==1.8.0   # it asks for fbgemm-gpu, the CUDA build
    python -m benchmarks.bench_sparse torchrec --torchrec-python V/bin/python

(TorchRec 1.9 and fbgemm-gpu-cpu 1.9.0 are built against a later torch: their kernels do
not load beside torch 2.13, undefined symbols; the 1.8.0 pair does.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import fmt_range, interleave, load_average, summary, write_results
from benchmarks.roles import PeakRss, steady_cpu

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "workloads"
SETTINGS = dict(protocol="bsp", workers=2, servers=2, global_batch=256, epochs=4, optimizer="adam", lr=0.005,
                momentum=0.0, eval_every=0, checkpoint_every=0, progress=False, threads=1)
SPECS = {k: f"{EXAMPLE / 'movielens.py'}:{v}" for k, v in
         (("dataset", "movielens"), ("model", "mf"), ("loss", "mse"), ("metrics", "metrics"))}


def _module():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import movielens
    finally:
        sys.path.remove(str(EXAMPLE))
    return movielens


def run_equipoise(seed: int, tmp: Path) -> dict[str, Any]:
    import equipoise

    t0 = time.perf_counter()
    out = tmp / f"equipoise-{seed}-{time.monotonic_ns()}"
    s = equipoise.train({**SETTINGS, **SPECS, "seed": seed}, out=out)
    wall = time.perf_counter() - t0
    dense = sum(t["bytes"] for t in s["sparse_tables"].values()) + 4  # + μ: the whole model, one way
    return {"seed": seed, "rmse": math.sqrt(s["final_metrics"]["mse"]), "wall_s": wall, "train_s": s["train_s"],
            "samples_per_s": s["samples_per_s"], "wire_bytes_per_iteration": s["wire_bytes_per_iteration"],
            "whole_model_bytes": dense, "sparse_tables": s["sparse_tables"]}


def run_plain(seed: int) -> dict[str, Any]:
    """The same job as a PyTorch user writes it in one process."""
    from equipoise.config import Config
    from equipoise.data import SliceSampler

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ml = _module()
        data = ml.movielens()
        x, y = data["train"].tensors
        xe, ye = data["eval"].tensors
        torch.manual_seed(seed)
        model = ml.mf()
        tables = [model.user.weight, model.item.weight, model.user_bias.weight, model.item_bias.weight]
        steps = [torch.optim.SparseAdam(tables, lr=SETTINGS["lr"]), torch.optim.Adam([model.mu], lr=SETTINGS["lr"])]
        X = SETTINGS["global_batch"]
        iterations = Config.from_dict({**SETTINGS, **SPECS}).total_iterations(len(x))  # as the job's
        sampler = SliceSampler(len(x), X, seed)
        t1 = time.perf_counter()
        for t in range(iterations):
            idx = sampler.positions(t * X, X)
            model.zero_grad()
            ml.mse(model, (x[idx], y[idx])).backward()
            for opt in steps:
                opt.step()
        train_s = time.perf_counter() - t1
        with torch.no_grad():
            mse, n = ml.metrics(model, (xe, ye))["mse"]
        rmse = math.sqrt(float(mse) / n)
    finally:
        torch.set_num_threads(threads)
    return {"seed": seed, "rmse": rmse, "wall_s": time.perf_counter() - t0, "train_s": train_s,
            "samples_per_s": iterations * X / train_s}


def bench_movielens(seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        systems = {}
        for seed in seeds:  # interleaved: equipoise, plain at seed 0, then at seed 1, ...
            systems[f"equipoise/{seed}"] = lambda seed=seed: run_equipoise(seed, tmp)
            systems[f"plain/{seed}"] = lambda seed=seed: run_plain(seed)
        runs = {k: v[0] for k, v in interleave(systems, 1).items()}
    eq = [runs[f"equipoise/{s}"] for s in seeds]
    pl = [runs[f"plain/{s}"] for s in seeds]
    out = {"settings": {**SETTINGS, **{k: Path(v).name for k, v in SPECS.items()}}, "seeds": list(seeds),
           "loadavg_at_start": load_average(), "runs": {"equipoise": eq, "plain": pl}}
    for key in ("rmse", "wall_s", "train_s", "samples_per_s"):
        out[key] = {"equipoise": summary([r[key] for r in eq]), "plain": summary([r[key] for r in pl])}
    out["rmse_difference"] = summary([a["rmse"] - b["rmse"] for a, b in zip(eq, pl)])
    wire = [r["wire_bytes_per_iteration"] for r in eq]
    out["wire_share"] = {d: summary([w[d] / r["whole_model_bytes"] for w, r in zip(wire, eq)])
                         for d in ("push", "pull")}
    return out


DLRM = {k: f"{EXAMPLE / 'dlrm.py'}:{v}" for k, v in
        (("dataset", "clicks"), ("model", "dlrm"), ("loss", "bce"), ("metrics", "metrics"))}
DLRM_SETTINGS = dict(protocol="bsp", workers=4, servers=4, global_batch=512, optimizer="sgd", lr=0.05,
                     momentum=0.0, eval_every=0, checkpoint_every=0, progress=False, threads=1, timeout=600.0)


def run_dlrm(rows: int, tables: int, dim: int, sparse: bool, iterations: int, tmp: Path,
             cpu_warmup: int = 0, **extra: Any) -> dict[str, Any]:
    """One DLRM-style job (examples/workloads/dlrm.py); its figures and peak RSS per role
    (and with `cpu_warmup`, `steady_cpu` after that many iterations)."""
    import equipoise

    cfg = {**DLRM_SETTINGS, **DLRM, **extra, "iterations": iterations,
           "model_args": {"rows": rows, "tables": tables, "dim": dim, "sparse": sparse},
           "data_args": {"rows": rows, "tables": tables, "eval": 2048}}
    if sparse:
        cfg["sparse_ids"] = f"{EXAMPLE / 'dlrm.py'}:sparse_ids"
    t0 = time.perf_counter()
    run_dir = tmp / f"dlrm-{rows}-{sparse}-{time.monotonic_ns()}"
    with PeakRss() as rss:
        s = equipoise.train(cfg, out=run_dir)
    return {"rows": rows, "sparse": sparse, "wall_s": time.perf_counter() - t0, "train_s": s["train_s"],
            "iteration_s": s["train_s"] / iterations, "run_dir": str(run_dir),
            "startup_s": s.get("startup_s"), "samples_per_s": s["samples_per_s"],
            "final_logloss": s["final_metrics"].get("logloss"),
            "wire_bytes_per_iteration": s["wire_bytes_per_iteration"],
            "table_bytes": sum(t["bytes"] for t in s.get("sparse_tables", {}).values()),
            "shards": sum(t["shards"] for t in s.get("sparse_tables", {}).values()),
            "rss_mb": {"workers": rss.of("worker"), "servers": rss.of("server"), "coordinator": rss.of("coordinator")},
            **({"cpu_ms_per_iteration": steady_cpu(rss, run_dir / "metrics.jsonl", cpu_warmup)} if cpu_warmup else {})}


def bench_memory(reps: int = 3) -> dict[str, Any]:
    """A 10⁷-row table (dim 32) on 4 servers against the same job with a 1,000-row table:
    each worker's peak RSS, interleaved rounds."""
    big, small = 10_000_000, 1_000
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        runs = interleave({"table": lambda: run_dlrm(big, 1, 32, True, 20, tmp),
                           "without": lambda: run_dlrm(small, 1, 32, True, 20, tmp)}, reps)
    for r in (r for rs in runs.values() for r in rs):
        r.pop("run_dir")  # gone with the temporary folder
    worker = {k: [max(r["rss_mb"]["workers"]) for r in v] for k, v in runs.items()}
    return {"settings": {**DLRM_SETTINGS, "tables": 1, "dim": 32, "rows": [big, small], "iterations": 20},
            "loadavg_at_start": load_average(), "runs": runs,
            "worker_peak_rss_mb": {k: summary(v) for k, v in worker.items()},
            "worker_rss_difference_mb": summary([a - b for a, b in zip(worker["table"], worker["without"])]),
            "server_peak_rss_mb": {k: summary([sum(r["rss_mb"]["servers"]) for r in v]) for k, v in runs.items()},
            "table_bytes": runs["table"][0]["table_bytes"]}


JOBS_CHILD = """
import json, sys, tempfile
from pathlib import Path
from benchmarks.bench_sparse import run_dlrm
rows, jobs = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory(prefix="bench-sparse-") as tmp:
    peaks = [max(run_dlrm(rows, 1, 32, True, 20, Path(tmp))["rss_mb"]["coordinator"]) for _ in range(jobs)]
print(json.dumps(peaks))
"""


def bench_memory_jobs(reps: int = 3, rows: int = 10_000_000, jobs: int = 2) -> dict[str, Any]:
    """`jobs` jobs with one table of `rows` rows × 32, one after another in one fresh
    process: the coordinator's (that process's) peak resident memory in each, under
    glibc's allocator as it comes and with its mmap threshold fixed at its default
    (MALLOC_MMAP_THRESHOLD_=131072, which turns off its dynamic raising), interleaved."""
    import subprocess

    from benchmarks.compare_commits import bench_env

    root = Path(__file__).resolve().parent.parent

    def child(env: dict[str, str]) -> list[float]:
        done = subprocess.run([sys.executable, "-c", JOBS_CHILD, str(rows), str(jobs)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=1800, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    base = {k: v for k, v in bench_env(root).items() if not k.startswith("MALLOC_")}  # this checkout's code
    runs = interleave({"glibc default": lambda: child(base),
                       "threshold fixed": lambda: child({**base, "MALLOC_MMAP_THRESHOLD_": "131072"})}, reps)
    return {"settings": {**DLRM_SETTINGS, "tables": 1, "dim": 32, "rows": rows, "iterations": 20, "jobs": jobs},
            "loadavg_at_start": load_average(), "coordinator_peak_mb": runs,
            "by_job": {k: [summary([r[j] for r in v]) for j in range(jobs)] for k, v in runs.items()}}


def bench_dlrm(reps: int = 3) -> dict[str, Any]:
    """DLRM-style, 4 workers and 4 servers, 4 tables of dim 16: samples/s with tables of
    10⁵, 10⁶ and 10⁷ rows on the sparse path, and with 10⁵ rows as dense parameters
    (larger ones do not fit a dense pull a step on this machine), interleaved rounds."""
    sizes = (100_000, 1_000_000, 10_000_000)
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        systems = {f"sparse/{n}": (lambda n=n: run_dlrm(n, 4, 16, True, 60, tmp)) for n in sizes}
        systems["dense/100000"] = lambda: run_dlrm(100_000, 4, 16, False, 60, tmp)
        runs = interleave(systems, reps)
        for r in (r for rs in runs.values() for r in rs):
            r["servers"] = rows_rates(r.pop("run_dir"))
    return {"settings": {**DLRM_SETTINGS, "tables": 4, "dim": 16, "iterations": 60}, "loadavg_at_start": load_average(),
            "runs": runs, "samples_per_s": {k: summary([r["samples_per_s"] for r in v]) for k, v in runs.items()},
            "wire_bytes_per_iteration": {k: v[0]["wire_bytes_per_iteration"] for k, v in runs.items()},
            "rows_per_s_over_gather_bound": {k: summary([s["rows_per_s"] / s["gather_rows_per_s"] for r in v
                                                         for s in r["servers"] if s["gather_rows_per_s"]])
                                             for k, v in runs.items() if k.startswith("sparse")}}


def rows_rates(run_dir: str) -> list[dict[str, float]]:
    """Per server over a run (its "servers" records): the rows it served per second of its
    busy time, and per second of their gather (`index_select`) alone, the memory bound."""
    import json

    rows: dict[int, list[float]] = {}
    for line in Path(run_dir, "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "servers" and "rows" in r:
            for s, n, busy, gather in zip(r["servers"], r["rows"], r["busy_s"], r["gather_s"]):
                acc = rows.setdefault(s, [0.0, 0.0, 0.0])
                acc[0], acc[1], acc[2] = acc[0] + n, acc[1] + busy, acc[2] + gather
    return [{"server": s, "rows": n, "rows_per_s": n / busy if busy else 0.0,
             "gather_rows_per_s": n / gather if gather else 0.0} for s, (n, busy, gather) in sorted(rows.items())]


PSLD_SLOW = dict(workers=2, servers=4, server_slowdown=[4.0, 1.0, 1.0, 1.0], server_rate=10.0,
                 server_bandwidth=[10.0] * 4, psld_interval=5, psld_epsilon=0.0, heartbeat_s=10.0)


def shard_traffic(run_dir: str, shards: int, iterations: int) -> dict[str, Any]:
    """From a run's metrics: the blocks moved, the mean iteration time of each
    measurement interval in the last third, and per interval the hottest shard's bytes
    over the mean shard's (the tables' shards are the last `shards` block keys)."""
    import json

    moved, settled, heat = [], [], []
    for line in Path(run_dir, "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("event") == "block_moved":
            moved += r["blocks"]
        elif r.get("type") == "servers" and r.get("iteration_s"):
            if r["iteration"] > iterations - iterations // 3:
                settled.append(r["iteration_s"])
            b = [v for _, v in sorted(r.get("block_bytes", []))[-shards:]]
            if b and sum(b) > 0:
                heat.append(max(b) / (sum(b) / len(b)))
    return {"moved": moved, "settled_iteration_s": sum(settled) / len(settled) if settled else math.nan,
            "hottest_over_mean": heat}


def bench_psld(reps: int = 3, iterations: int = 90, horizon: int = 50) -> dict[str, Any]:
    """The hash placement, greedy, PSLD and the oracle on the DLRM-style job with a slow
    server (PSLD_SLOW), interleaved; PSLD's pauses repaid over `horizon` iterations."""
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        systems = {p: (lambda p=p: run_dlrm(100_000, 8, 32, True, iterations, tmp, placement=p, **PSLD_SLOW,
                                            psld_horizon=horizon))
                   for p in ("round_robin", "greedy", "psld", "oracle")}
        runs = interleave(systems, reps)
        for rs in runs.values():
            for r in rs:
                r.update(shard_traffic(r.pop("run_dir"), r.pop("shards"), iterations))
    def ratios(key: str, a: str, b: str) -> dict[str, Any]:
        return summary([x[key] / y[key] for x, y in zip(runs[a], runs[b])])
    heat = [h for r in runs["psld"] + runs["greedy"] for h in r["hottest_over_mean"]]
    return {"settings": {**DLRM_SETTINGS, **PSLD_SLOW, "rows": 100_000, "tables": 8, "dim": 32,
                         "iterations": iterations, "psld_horizon": horizon},
            "loadavg_at_start": load_average(), "runs": runs,
            "iteration_s": {k: summary([r["iteration_s"] for r in v]) for k, v in runs.items()},
            "psld_speed_up_x_hash": ratios("iteration_s", "round_robin", "psld"),
            "psld_speed_up_x_greedy": ratios("iteration_s", "greedy", "psld"),
            "psld_settled_x_oracle": ratios("settled_iteration_s", "psld", "oracle"),
            "shards_moved": summary([len(r["moved"]) for r in runs["psld"]]),
            "hottest_shard_over_mean": summary(heat) if heat else None}


def bench_lbbsp(reps: int = 3, iterations: int = 90, warmup: int = 20, base: float = 4.0) -> dict[str, Any]:
    """BSP against LB-BSP on the DLRM-style job with workers stretched [1, 1, 2, 4] on
    top of `base` (each emulated machine `base` times slower than one core here, as in
    bench_lbbsp: four workers and two servers on two cores would otherwise share the
    cores, and a machine's idle time would be another's compute), interleaved.
    samples/s on the steady window after `warmup` iterations (bench_lbbsp's), and over
    the whole run."""
    from benchmarks.bench_lbbsp import steady_window

    # min_batch 0: LB-BSP may leave out a worker whose fixed cost alone outlasts the others' step
    extra = dict(workers=4, servers=2, slowdown=[base * f for f in (1.0, 1.0, 2.0, 4.0)], min_batch=0)
    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        runs = interleave({p: (lambda p=p: run_dlrm(100_000, 8, 32, True, iterations, tmp, protocol=p, **extra))
                           for p in ("bsp", "lbbsp")}, reps)
        for r in (r for rs in runs.values() for r in rs):
            w = steady_window(Path(r.pop("run_dir"), "metrics.jsonl"), warmup)
            r.update(steady_samples_per_s=w["samples_per_s"], batch=w["batch"], split=w["split"])
    return {"settings": {**DLRM_SETTINGS, **extra, "rows": 100_000, "tables": 8, "dim": 32, "iterations": iterations,
                         "warmup": warmup, "base": base},
            "loadavg_at_start": load_average(), "runs": runs,
            "samples_per_s": {k: summary([r["steady_samples_per_s"] for r in v]) for k, v in runs.items()},
            "lbbsp_speed_up_x_bsp": summary([lb["steady_samples_per_s"] / b["steady_samples_per_s"]
                                             for b, lb in zip(runs["bsp"], runs["lbbsp"])]),
            "whole_run_speed_up_x_bsp": summary([b["train_s"] / lb["train_s"]
                                                 for b, lb in zip(runs["bsp"], runs["lbbsp"])])}


def run_torchrec(python: str, iterations: int, warmup: int, tmp: Path) -> dict[str, Any]:
    """One run of benchmarks/torchrec_dlrm.py by `python` (TorchRec's venv): samples/s on
    the steady window after `warmup` iterations and over the whole run, and its phases."""
    import json
    import os
    import subprocess

    out = tmp / f"torchrec-{time.monotonic_ns()}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    t0 = time.perf_counter()
    subprocess.run([python, str(ROOT / "benchmarks" / "torchrec_dlrm.py"), "--out", str(out),
                    "--iterations", str(iterations), "--warmup", str(warmup)],
                   check=True, timeout=1800, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    r = json.loads(out.read_text())
    ends, batch = r.pop("ends_s"), DLRM_SETTINGS["global_batch"]
    return {**r, "wall_s": wall, "samples_per_s": batch * iterations / ends[-1],
            "steady_samples_per_s": batch * (iterations - warmup) / (ends[-1] - ends[warmup - 1])}


def bench_torchrec(python: str, reps: int = 3, iterations: int = 90, warmup: int = 20) -> dict[str, Any]:
    """The DLRM-style example as shipped (8 tables of 10⁵ rows × 16, Adagrad 0.05, global
    batch 512, 4 workers and 4 servers), the same job on 4 processes (2 workers, 1
    server, the coordinator) and the same model, data and global batch under TorchRec on
    4 processes, interleaved: samples/s after `warmup` iterations, and CPU milliseconds
    per iteration over that window."""
    from benchmarks.bench_lbbsp import steady_window

    def ours(tmp: Path, **shape: int) -> dict[str, Any]:
        r = run_dlrm(100_000, 8, 16, True, iterations, tmp, optimizer="adagrad", cpu_warmup=warmup, **shape)
        metrics = Path(r.pop("run_dir"), "metrics.jsonl")
        w = steady_window(metrics, warmup)
        # the rollback snapshots' spacing (snapshot_budget) and what their fetches cost
        spacing = [{k: e[k] for k in ("iteration", "iterations", "cost_s", "iteration_s")}
                   for e in map(json.loads, metrics.read_text().splitlines()) if e.get("event") == "snapshot_spacing"]
        return {**r, "steady_samples_per_s": w["samples_per_s"], "split": w["split"],
                "final_train_loss": w["final_train_loss"], "snapshot_spacing": spacing}

    with tempfile.TemporaryDirectory(prefix="bench-sparse-") as name:
        tmp = Path(name)
        # and on 4 processes as TorchRec: 2 workers, 1 server and the coordinator
        runs = interleave({"equipoise": lambda: ours(tmp),
                           "equipoise-4p": lambda: ours(tmp, workers=2, servers=1),
                           "torchrec": lambda: run_torchrec(python, iterations, warmup, tmp)}, reps)
    return {"settings": {**DLRM_SETTINGS, "optimizer": "adagrad", "rows": 100_000, "tables": 8, "dim": 16,
                         "iterations": iterations, "warmup": warmup},
            "loadavg_at_start": load_average(), "runs": runs,
            "versions": {k: runs["torchrec"][0][k] for k in ("torch", "torchrec", "fbgemm_gpu")},
            "samples_per_s": {k: summary([r["steady_samples_per_s"] for r in v]) for k, v in runs.items()},
            "equipoise_x_torchrec": summary([a["steady_samples_per_s"] / b["steady_samples_per_s"]
                                             for a, b in zip(runs["equipoise"], runs["torchrec"])]),
            "equipoise_4p_x_torchrec": summary([a["steady_samples_per_s"] / b["steady_samples_per_s"]
                                                for a, b in zip(runs["equipoise-4p"], runs["torchrec"])]),
            "whole_run_equipoise_x_torchrec": summary([a["samples_per_s"] / b["samples_per_s"]
                                                       for a, b in zip(runs["equipoise"], runs["torchrec"])])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=["movielens", "memory", "memory-jobs", "dlrm", "psld", "lbbsp", "torchrec"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--torchrec-python", help="preset torchrec: the Python of TorchRec's venv")
    parser.add_argument("--iterations", type=int, default=90, help="preset psld: the job's iterations")
    parser.add_argument("--psld-horizon", type=int, default=50, help="preset psld: psld_horizon")
    args = parser.parse_args()
    name = f"bench_sparse_{args.preset}"
    if args.preset == "torchrec":
        if not args.torchrec_python:
            parser.error("preset torchrec needs --torchrec-python (the Python of a venv with TorchRec)")
        result = bench_torchrec(args.torchrec_python, args.reps)
        print(f"samples/s: equipoise {fmt_range(result['samples_per_s']['equipoise'])}, torchrec "
              f"{fmt_range(result['samples_per_s']['torchrec'])}; ratio {fmt_range(result['equipoise_x_torchrec'])}")
    elif args.preset == "memory":
        result = bench_memory(args.reps)
        print(f"worker peak RSS (MB): with the table {fmt_range(result['worker_peak_rss_mb']['table'])}, without "
              f"{fmt_range(result['worker_peak_rss_mb']['without'])}; difference "
              f"{fmt_range(result['worker_rss_difference_mb'])}")
    elif args.preset == "memory-jobs":
        result = bench_memory_jobs(args.reps)
        for k, v in result["by_job"].items():
            print(f"coordinator peak RSS (MB), {k}: " + ", ".join(f"job {j + 1} {fmt_range(s)}" for j, s in enumerate(v)))
    elif args.preset == "lbbsp":
        result = bench_lbbsp(args.reps)
        print(f"samples/s: bsp {fmt_range(result['samples_per_s']['bsp'])}, lbbsp "
              f"{fmt_range(result['samples_per_s']['lbbsp'])}; speed-up {fmt_range(result['lbbsp_speed_up_x_bsp'])}, "
              f"whole run {fmt_range(result['whole_run_speed_up_x_bsp'])}")
    elif args.preset == "psld":
        result = bench_psld(args.reps, args.iterations, args.psld_horizon)
        if (args.iterations, args.psld_horizon) != (90, 50):
            name += f"-{args.iterations}-h{args.psld_horizon}"
        print("s/iteration: " + ", ".join(f"{k} {fmt_range(v)}" for k, v in result["iteration_s"].items()))
        print(f"psld speed-up × hash {fmt_range(result['psld_speed_up_x_hash'])}, × greedy "
              f"{fmt_range(result['psld_speed_up_x_greedy'])}; settled × oracle "
              f"{fmt_range(result['psld_settled_x_oracle'])}; blocks moved {fmt_range(result['shards_moved'])}; "
              f"hottest shard / mean {fmt_range(result['hottest_shard_over_mean'])}")
    elif args.preset == "dlrm":
        result = bench_dlrm(args.reps)
        print(f"samples/s: {result['samples_per_s']}")
    else:
        result = bench_movielens()
        for key in ("rmse", "wall_s", "samples_per_s"):
            print(f"{key}: equipoise {fmt_range(result[key]['equipoise'], 4)}, plain "
                  f"{fmt_range(result[key]['plain'], 4)}")
    print(f"wrote {write_results(name, result)}")


if __name__ == "__main__":
    main()
