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
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import interleave, load_average, summary, write_results

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=["movielens"])
    args = parser.parse_args()
    result = bench_movielens()
    for key in ("rmse", "wall_s", "samples_per_s"):
        r = result[key]
        print(f"{key}: equipoise {r['equipoise']['median']:.4g} ({r['equipoise']['min']:.4g}–"
              f"{r['equipoise']['max']:.4g}), plain {r['plain']['median']:.4g}")
    print(f"wrote {write_results(f'bench_sparse_{args.preset}', result)}")


if __name__ == "__main__":
    main()
