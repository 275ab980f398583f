"""User workloads: the input pipeline, memory on a dataset larger than memory wants, and
the language model against plain PyTorch and PyTorch DDP.

Three parts, each written to its own results file:

* ``loader`` (bench_workloads_loader.json): a dataset whose ``__getitem__`` costs about
  1 ms a sample (a sleep, as a file read or a decoder that releases the GIL would),
  trained with ``loader_workers = 0`` and ``= 2``, interleaved (0, 2, 0, 2, …), 3
  repetitions; per run the median of every worker's ``data_s`` per iteration and the
  steady samples/s (iterations after the first five).
* ``memory`` (bench_workloads_memory.json): ≥ 2 GB of shard files (examples/workloads/
  shards.py, read item by item with ``os.pread``) trained by 4 workers; each worker's RSS
  (the ``mem`` share of each iteration record × the machine's memory) after the first
  iteration and at the end: the growth must stay under 10%. Three runs, sequential
  (there is nothing to interleave with).
* ``lm`` (bench_workloads_lm.json): the byte-level GPT of examples/workloads/
  fortunes_lm.py (1.3 M parameters, Adam, global batch 32) — (a) equipoise BSP on 4
  workers vs PyTorch DDP (gloo, 4 ranks, one thread each), same model, data, slices and
  global batch, interleaved, 3 repetitions, steady samples/s over the same window; (b)
  one longer equipoise job against the same model and data in one plain PyTorch
  process (same seed, same samples, same global batch): both validation losses against
  the text's byte-unigram entropy. ``lm-seeds`` (bench_workloads_lm-seeds.json) repeats
  (b) at seeds 0, 1 and 2, equipoise and plain PyTorch interleaved, for the spread that
  chance alone gives.
* ``lm-recipe`` (bench_workloads_lm-recipe.json): the same 600 iterations with the
  recipe of nanoGPT (AdamW with weight decay 0.1, linear warm-up over the first 10% of
  iterations, cosine decay to a tenth of the learning rate, gradients clipped to norm
  1.0), equipoise BSP (4 workers, 2 servers) and plain PyTorch with the same recipe
  (torch.optim.AdamW, SequentialLR of LinearLR and CosineAnnealingLR, clip_grad_norm_)
  interleaved at seeds 0, 1, 2: their validation losses, beside the plain Adam recipe's
  (``lm``, ``lm-seeds``).

Run from the repository root::

    python -m benchmarks.bench_workloads loader
    python -m benchmarks.bench_workloads memory --dir /var/tmp/shards
    python -m benchmarks.bench_workloads lm
    python -m benchmarks.bench_workloads lm-seeds   # (b) at seeds 0, 1, 2: the spread by chance
    python -m benchmarks.bench_workloads lm-recipe  # nanoGPT's recipe, equipoise and plain PyTorch
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (fmt_range, free_port, git_state, interleave, load_average, markdown_table,
                               median, ratio, scoped_env, summary, write_results)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "workloads"
LM = str(EXAMPLES / "fortunes_lm.py")
SHARDS = str(EXAMPLES / "shards.py")


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("type") == kind]


def _steady(its: list[dict], first: int, global_batch: int) -> float:
    """Samples/s between the end of iteration first−1 and the end of the last one."""
    ends = {int(r["iteration"]): float(r["time"]) for r in its}
    last = max(ends)
    return (last - first + 1) * global_batch / (ends[last] - ends[first - 1])


def _job(cfg: dict) -> tuple[dict, Path, tempfile.TemporaryDirectory]:
    import equipoise

    tmp = tempfile.TemporaryDirectory(prefix="bench-workloads-")
    run_dir = Path(tmp.name) / "run"
    return equipoise.train(cfg, out=run_dir), run_dir, tmp


# -- loader --------------------------------------------------------------------------------
SLOW_DATASET = '''
import time
import torch

class Slow(torch.utils.data.Dataset):
    """2,048 samples of 64 features; every __getitem__ sleeps `delay` seconds first."""
    def __init__(self, delay):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 64, generator=g)
        self.y = (self.x[:, :10].argmax(1))
        self.delay = delay
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]

def provide():
    return Slow(0.001)

def model():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
'''


def bench_loader(reps: int = 3, iterations: int = 60) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        path = Path(tmp) / "slow.py"
        path.write_text(SLOW_DATASET)
        base = dict(dataset=f"{path}:provide", model=f"{path}:model", workers=4, servers=2, global_batch=128,
                    iterations=iterations, lr=0.05, eval_every=0, checkpoint_every=0, progress=False)

        def run(loaders: int) -> dict:
            s, run_dir, t = _job({**base, "loader_workers": loaders})
            try:
                its = _records(run_dir, "iteration")
                data = [v for r in its[5:] for v in r["data_s"]]
                compute = [v for r in its[5:] for v in r["compute_s"]]
                return {"data_s_median": median(data), "compute_s_median": median(compute),
                        "steady_samples_per_s": _steady(its, 5, base["global_batch"]),
                        "samples_per_s": s["samples_per_s"]}
            finally:
                t.cleanup()

        runs = interleave({"loader_workers=0": lambda: run(0), "loader_workers=2": lambda: run(2)}, reps)
    out = {name: {k: summary([r[k] for r in rs]) for k in rs[0]} for name, rs in runs.items()}
    pairs = [ratio(b["steady_samples_per_s"], a["steady_samples_per_s"])
             for a, b in zip(runs["loader_workers=0"], runs["loader_workers=2"])]
    return {"spec": {**base, "dataset": "a 1 ms/sample __getitem__ (sleep)", "model": "mlp 64-256-10"},
            "reps": reps, "systems": out, "pair_speedup": summary(pairs), "runs": runs}


def loader_table(result: dict) -> str:
    rows = [[name, fmt_range(s["data_s_median"]), fmt_range(s["compute_s_median"]),
             fmt_range(s["steady_samples_per_s"])] for name, s in result["systems"].items()]
    return markdown_table(["", "data_s per iteration, s", "compute_s, s", "steady samples/s"], rows)


# -- memory --------------------------------------------------------------------------------
def bench_memory(directory: Path, gigabytes: float = 2.0, reps: int = 3, iterations: int = 400) -> dict:
    import psutil

    shards = _example("shards")
    samples = math.ceil(gigabytes * 2**30 / shards.RECORD)
    meta = directory / "meta.json"
    if not meta.exists() or sum(json.loads(meta.read_text())["train"]) != samples:
        shutil.rmtree(directory, ignore_errors=True)
        t0 = time.perf_counter()
        shards.write_shards(directory, samples, per_shard=500_000)
        print(f"wrote {samples:,} records in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    on_disk = sum(p.stat().st_size for p in directory.glob("train-*.bin"))
    total = psutil.virtual_memory().total
    cfg = dict(dataset=f"{SHARDS}:shards", data_dir=str(directory), model=f"{SHARDS}:linear", workers=4,
               servers=2, global_batch=256, iterations=iterations, lr=0.1, eval_every=0,
               checkpoint_every=0, progress=False, loader_workers=2)
    runs = []
    for _ in range(reps):
        s, run_dir, t = _job(cfg)
        try:
            its = _records(run_dir, "iteration")
            first = {w: m * total for w, m in zip(its[0]["workers"], its[0]["mem"])}
            peak = {w: max(r["mem"][r["workers"].index(w)] for r in its if w in r["workers"]) * total
                    for w in first}
            last = {w: m * total for w, m in zip(its[-1]["workers"], its[-1]["mem"])}
            runs.append({"rss_first_mb": {w: v / 2**20 for w, v in first.items()},
                         "rss_peak_mb": {w: v / 2**20 for w, v in peak.items()},
                         "rss_last_mb": {w: v / 2**20 for w, v in last.items()},
                         "growth": {w: peak[w] / first[w] - 1 for w in first},
                         "samples_read": s["samples"], "samples_per_s": s["samples_per_s"]})
        finally:
            t.cleanup()
    growth = [g for r in runs for g in r["growth"].values()]
    return {"spec": {**cfg, "data_dir": "(a temporary folder)"}, "bytes_on_disk": on_disk, "records": samples,
            "reps": reps, "runs": runs, "growth": summary(growth), "meets_target": max(growth) < 0.10}


# -- the language model --------------------------------------------------------------------
def _ddp_rank(rank: int, workers: int, global_batch: int, iterations: int, warmup: int, lr: float, seed: int,
              port: int, results: Any) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from equipoise.data import SliceSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=workers,
                            timeout=timedelta(seconds=120))
    try:
        lm = _example("fortunes_lm")
        data = lm.blocks()["train"]
        torch.manual_seed(seed)
        model = DistributedDataParallel(lm.gpt())
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        sampler = SliceSampler(len(data), global_batch, seed)
        mu = global_batch // workers

        def step(t: int) -> None:
            torch.default_generator.manual_seed(seed * 1_000_003 + t * global_batch + rank * mu)
            opt.zero_grad(set_to_none=False)
            lm.next_byte_loss(model, data.get_batch(sampler.slice(t, rank * mu, mu))).backward()
            opt.step()

        for t in range(warmup):
            step(t)
        dist.barrier()
        t0 = time.perf_counter()
        for t in range(warmup, iterations):
            step(t)
        dist.barrier()
        if rank == 0:
            results.put({"samples_per_s": (iterations - warmup) * global_batch / (time.perf_counter() - t0)})
    finally:
        dist.destroy_process_group()


def _run_ddp(workers: int, global_batch: int, iterations: int, warmup: int, lr: float, seed: int) -> dict:
    import torch.multiprocessing as torch_mp

    ctx = torch_mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"):
        torch_mp.start_processes(_ddp_rank, args=(workers, global_batch, iterations, warmup, lr, seed, free_port(),
                                                  results), nprocs=workers, join=True, start_method="spawn")
    return results.get()


def _plain(iterations: int, global_batch: int, lr: float, seed: int) -> dict:
    """The same job in one process: the same initial weights (the coordinator seeds with
    `seed` and builds the model), the same samples per iteration, Adam on the whole
    global batch's mean loss."""
    from equipoise.data import SliceSampler

    lm = _example("fortunes_lm")
    data = lm.blocks()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = lm.gpt()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sampler = SliceSampler(len(data["train"]), global_batch, seed)
    t0 = time.perf_counter()
    for t in range(iterations):
        opt.zero_grad()
        lm.next_byte_loss(model, data["train"].get_batch(sampler.batch(t))).backward()
        opt.step()
    seconds = time.perf_counter() - t0
    return {"val_loss": lm.evaluate(model, data["eval"]), "train_s": seconds}


def bench_lm(reps: int = 3, iterations: int = 60, long_iterations: int = 600) -> dict:
    lm = _example("fortunes_lm")
    train_docs, eval_docs = lm.split_docs()
    entropy = lm.unigram_entropy(eval_docs)
    base = dict(dataset=f"{LM}:blocks", model=f"{LM}:gpt", loss=f"{LM}:next_byte_loss", metrics=f"{LM}:metrics",
                optimizer="adam", lr=0.003, workers=4, servers=2, global_batch=32, block_size=65536,
                eval_every=0, checkpoint_every=0, progress=False, seed=0, threads=1)
    warmup = 5

    def equipoise_run() -> dict:
        s, run_dir, t = _job({**base, "iterations": iterations})
        try:
            return {"steady_samples_per_s": _steady(_records(run_dir, "iteration"), warmup, base["global_batch"]),
                    "samples_per_s": s["samples_per_s"]}
        finally:
            t.cleanup()

    runs = interleave({"equipoise": equipoise_run,
                       "ddp": lambda: _run_ddp(4, base["global_batch"], iterations, warmup, base["lr"], 0)}, reps)
    pairs = [ratio(e["steady_samples_per_s"], d["samples_per_s"]) for e, d in zip(runs["equipoise"], runs["ddp"])]
    s, run_dir, t = _job({**base, "iterations": long_iterations, "eval_every": long_iterations // 4})
    try:
        evals = _records(run_dir, "eval")
    finally:
        t.cleanup()
    plain = _plain(long_iterations, base["global_batch"], base["lr"], 0)
    return {"spec": base, "reps": reps, "iterations": iterations, "warmup": warmup,
            "equipoise_steady": summary([r["steady_samples_per_s"] for r in runs["equipoise"]]),
            "ddp_steady": summary([r["samples_per_s"] for r in runs["ddp"]]),
            "pair_ratio": summary(pairs), "runs": runs,
            "learning": {"iterations": long_iterations, "unigram_entropy_nats": entropy,
                         "equipoise_val_loss": s["final_test_loss"], "equipoise_train_s": s["train_s"],
                         "equipoise_evals": [{k: e[k] for k in ("iteration", "elapsed", "test_loss")} for e in evals],
                         "plain_pytorch_val_loss": plain["val_loss"], "plain_pytorch_train_s": plain["train_s"],
                         "eval_tokens": sum(min(len(d), 65) - 1 for d in eval_docs)}}


# nanoGPT's recipe (its train.py): AdamW, weight decay 0.1, warm-up, cosine decay to lr/10,
# gradients clipped to norm 1.0; the learning rate is the example's (3e-3).
RECIPE = dict(optimizer="adamw", lr=0.003, weight_decay=0.1, lr_schedule="cosine", lr_min=0.0003,
              clip_grad_norm=1.0)


def _plain_recipe(iterations: int, global_batch: int, seed: int) -> dict:
    """The recipe in one plain PyTorch process, as a nanoGPT user writes it: the same
    initial weights, samples and global batch as the equipoise job."""
    from equipoise.data import SliceSampler

    lm = _example("fortunes_lm")
    data = lm.blocks()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = lm.gpt()
    warmup = iterations // 10
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=RECIPE["weight_decay"])
    sched = torch.optim.lr_scheduler
    schedule = sched.SequentialLR(opt, [sched.LinearLR(opt, 1 / (warmup + 1), 1.0, total_iters=warmup),
                                        sched.CosineAnnealingLR(opt, iterations - warmup, eta_min=RECIPE["lr_min"])],
                                  milestones=[warmup])
    sampler = SliceSampler(len(data["train"]), global_batch, seed)
    t0 = time.perf_counter()
    clipped = 0
    for t in range(iterations):
        opt.zero_grad()
        lm.next_byte_loss(model, data["train"].get_batch(sampler.batch(t))).backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["clip_grad_norm"])) > 1.0
        opt.step()
        schedule.step()
    seconds = time.perf_counter() - t0
    return {"val_loss": lm.evaluate(model, data["eval"]), "train_s": seconds, "clipped_steps": clipped}


def bench_lm_recipe(seeds: tuple[int, ...] = (0, 1, 2), iterations: int = 600) -> dict:
    """nanoGPT's recipe: equipoise BSP and plain PyTorch, interleaved per seed."""
    base = dict(dataset=f"{LM}:blocks", model=f"{LM}:gpt", loss=f"{LM}:next_byte_loss", metrics=f"{LM}:metrics",
                workers=4, servers=2, global_batch=32, block_size=65536, eval_every=0, checkpoint_every=0,
                progress=False, threads=1, iterations=iterations, warmup_iterations=iterations // 10, **RECIPE)
    rows = []
    for seed in seeds:
        s, run_dir, t = _job({**base, "seed": seed})
        try:
            norms = [r["grad_norm"] for r in _records(run_dir, "iteration")]
        finally:
            t.cleanup()
        plain = _plain_recipe(iterations, base["global_batch"], seed)
        rows.append({"seed": seed, "equipoise_val_loss": s["final_test_loss"], "equipoise_train_s": s["train_s"],
                     "equipoise_clipped_steps": sum(n > RECIPE["clip_grad_norm"] for n in norms),
                     "equipoise_grad_norm": summary(norms),
                     "plain_pytorch_val_loss": plain["val_loss"], "plain_pytorch_train_s": plain["train_s"],
                     "plain_pytorch_clipped_steps": plain["clipped_steps"]})
    diffs = [r["equipoise_val_loss"] - r["plain_pytorch_val_loss"] for r in rows]
    return {"spec": base, "seeds": list(seeds), "runs": rows, "difference": summary(diffs),
            "equipoise": summary([r["equipoise_val_loss"] for r in rows]),
            "plain_pytorch": summary([r["plain_pytorch_val_loss"] for r in rows])}


def bench_lm_seeds(seeds: tuple[int, ...] = (0, 1, 2), iterations: int = 600) -> dict:
    """The seed-to-seed spread of the final validation loss, equipoise BSP and plain
    PyTorch interleaved per seed (seed s sets both the initial weights and the sample
    order): how far apart two trainings of this model land by chance, the yardstick for
    the difference between equipoise's and plain PyTorch's loss at one seed."""
    base = dict(dataset=f"{LM}:blocks", model=f"{LM}:gpt", loss=f"{LM}:next_byte_loss", metrics=f"{LM}:metrics",
                optimizer="adam", lr=0.003, workers=4, servers=2, global_batch=32, block_size=65536,
                eval_every=0, checkpoint_every=0, progress=False, threads=1, iterations=iterations)
    rows = []
    for seed in seeds:
        s, run_dir, t = _job({**base, "seed": seed})
        t.cleanup()
        plain = _plain(iterations, base["global_batch"], base["lr"], seed)
        rows.append({"seed": seed, "equipoise_val_loss": s["final_test_loss"],
                     "plain_pytorch_val_loss": plain["val_loss"]})
    diffs = [r["equipoise_val_loss"] - r["plain_pytorch_val_loss"] for r in rows]
    everything = [v for r in rows for v in (r["equipoise_val_loss"], r["plain_pytorch_val_loss"])]
    return {"spec": base, "seeds": list(seeds), "runs": rows, "difference": summary(diffs),
            "equipoise": summary([r["equipoise_val_loss"] for r in rows]),
            "plain_pytorch": summary([r["plain_pytorch_val_loss"] for r in rows]),
            "spread_all": max(everything) - min(everything)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("loader", "memory", "lm", "lm-seeds", "lm-recipe"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="memory: where the shards are written (kept for reruns)")
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    load_at_start, git_at_start = load_average(), git_state()
    if args.part == "loader":
        result = bench_loader(args.reps)
        print(loader_table(result))
        print(f"\nsamples/s with 2 loaders / with none, per interleaved pair: {fmt_range(result['pair_speedup'])}")
    elif args.part == "memory":
        directory = Path(args.dir or tempfile.mkdtemp(prefix="bench-shards-"))
        result = bench_memory(directory, args.gigabytes, args.reps)
        print(f"{result['bytes_on_disk'] / 2**30:.2f} GiB on disk; per-worker RSS growth after the first "
              f"iteration: {fmt_range(result['growth'])} (target < 10%)")
        for r in result["runs"]:
            print("  first MB", {w: round(v) for w, v in r["rss_first_mb"].items()},
                  "peak MB", {w: round(v) for w, v in r["rss_peak_mb"].items()})
    elif args.part == "lm-recipe":
        result = bench_lm_recipe()
        for r in result["runs"]:
            print(f"seed {r['seed']}: validation loss equipoise {r['equipoise_val_loss']:.4f} "
                  f"({r['equipoise_clipped_steps']} of 600 steps clipped), plain PyTorch "
                  f"{r['plain_pytorch_val_loss']:.4f} ({r['plain_pytorch_clipped_steps']} clipped)")
        print(f"equipoise − plain: {fmt_range(result['difference'])}; equipoise over seeds "
              f"{fmt_range(result['equipoise'])}, plain {fmt_range(result['plain_pytorch'])}")
    elif args.part == "lm-seeds":
        result = bench_lm_seeds()
        for r in result["runs"]:
            print(f"seed {r['seed']}: validation loss equipoise {r['equipoise_val_loss']:.4f}, "
                  f"plain PyTorch {r['plain_pytorch_val_loss']:.4f}")
        print(f"equipoise − plain: {fmt_range(result['difference'])}; equipoise over seeds "
              f"{fmt_range(result['equipoise'])}, plain {fmt_range(result['plain_pytorch'])}")
    else:
        result = bench_lm(args.reps)
        learn = result["learning"]
        print(markdown_table(["", "steady samples/s"], [["equipoise BSP", fmt_range(result["equipoise_steady"])],
                                                         ["PyTorch DDP", fmt_range(result["ddp_steady"])],
                                                         ["ratio of each pair", fmt_range(result["pair_ratio"])]]))
        print(f"\nafter {learn['iterations']} iterations: validation loss equipoise {learn['equipoise_val_loss']:.4f}, "
              f"plain PyTorch {learn['plain_pytorch_val_loss']:.4f}; unigram entropy {learn['unigram_entropy_nats']:.4f} nats")
    result["part"] = args.part
    result["loadavg_at_start"], result["git_at_start"] = load_at_start, git_at_start
    print("wrote", write_results(f"bench_workloads_{args.part}", result, args.results))


if __name__ == "__main__":
    main()
