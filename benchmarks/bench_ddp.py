"""Homogeneous training throughput: equipoise BSP vs PyTorch DistributedDataParallel.

Both systems train the same model on the same data with the same global batch, split
equally over the same number of worker processes (one torch thread each), for the same
number of iterations of SGD (lr 0.05, momentum 0.9), from the same initial weights and
on the same samples (rank r trains on slice r of every iteration's global batch, as
equipoise's `SliceSampler` cuts it). Start-up is excluded on both sides:

* equipoise: ``summary["samples_per_s"]``, measured from the first plan handed out to the
  last worker report (it includes the first, cold iteration). Its S server processes
  share the same cores as the workers; that is part of what is compared. Also shown:
  its *steady* rate over the same window as DDP's, from the iteration records in
  metrics.jsonl.
* DDP (gloo over loopback): rank 0 times the iterations after `warmup` warm-up ones,
  between two barriers.

equipoise runs twice per round, pushing its gradients after backward (the default) and
while backward runs (`backward_push = true`, worker/backward_push.py).

Repetitions are interleaved (equipoise, equipoise with backward_push, DDP, ...); the report is the
median of each, and the ratio equipoise/DDP of each interleaved pair over the same
steady window, median (min–max) (target ≥ 1.0), and equipoise's barrier_wait_fraction. The final training losses of both are shown as a check that
they trained the same thing (BSP is SGD on the global batch, as is DDP here); they agree
up to the drift of floating-point summation order, which grows with the iterations (after
200 iterations single-process SGD itself ends at 0.411 or 0.415 depending only on whether
the batch's gradient is summed whole or in four slices).

Run from the repository root::

    python -m benchmarks.bench_ddp --preset ci
    python -m benchmarks.bench_ddp --preset full
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    fmt_range,
    free_port,
    git_state,
    interleave,
    load_average,
    markdown_table,
    median,
    ratio,
    scoped_env,
    summary,
    write_results,
)

NAME = "bench_ddp"
TARGET_RATIO = 1.1


@dataclass(frozen=True)
class Spec:
    """One job, run identically by both systems."""

    model: str = "cnn"
    dataset: str = "fashion-mnist"
    workers: int = 4
    servers: int = 2
    global_batch: int = 128
    iterations: int = 40
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    warmup: int = 2       # DDP iterations before its clock starts (and equipoise's steady window)
    timeout: float = 120.0

    @property
    def slice_size(self) -> int:
        return self.global_batch // self.workers

    def check(self) -> None:
        if self.global_batch % self.workers:
            raise ValueError(f"global_batch = {self.global_batch} must split equally over "
                             f"workers = {self.workers}")
        if not 0 <= self.warmup < self.iterations:
            raise ValueError(f"warmup = {self.warmup} must be in [0, iterations = {self.iterations})")


@dataclass(frozen=True)
class Preset:
    iterations: int
    reps: int


PRESETS: dict[str, Preset] = {"ci": Preset(iterations=40, reps=1), "full": Preset(iterations=200, reps=5)}


# -- equipoise -----------------------------------------------------------------------------

def run_equipoise(spec: Spec, **extra: Any) -> dict[str, Any]:
    """One equipoise BSP job (`extra`: more config keys); its summary's throughput plus
    the steady-state rate over iterations [warmup, iterations) from metrics.jsonl."""
    import equipoise

    cfg = dict(protocol="bsp", workers=spec.workers, servers=spec.servers,
               global_batch=spec.global_batch, iterations=spec.iterations, model=spec.model,
               dataset=spec.dataset, lr=spec.lr, momentum=spec.momentum, optimizer="sgd",
               seed=spec.seed, threads=1, eval_every=0, checkpoint_every=0, progress=False,
               timeout=spec.timeout)
    cfg.update(extra)
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        t0 = time.perf_counter()
        summary = equipoise.train(cfg, out=Path(tmp) / "run")
        elapsed = time.perf_counter() - t0
        steady = _steady_rate(Path(tmp) / "run" / "metrics.jsonl", spec)
    busy = max(summary["compute_s"] + summary["wait_s"] + summary["comm_s"], 1e-9)
    return {"samples_per_s": summary["samples_per_s"], "steady_samples_per_s": steady,
            "barrier_wait_fraction": summary["barrier_wait_fraction"],
            "compute_fraction": summary["compute_s"] / busy, "comm_fraction": summary["comm_s"] / busy,
            "train_s": summary["train_s"], "wall_s": summary["wall_s"], "elapsed_s": elapsed,
            "final_train_loss": summary["final_train_loss"],
            "final_accuracy": summary["final_accuracy"]}


def _steady_rate(metrics: Path, spec: Spec) -> float:
    """Samples/s between the end of iteration warmup−1 and the end of the last iteration
    (DDP's window); NaN when warmup is 0 (no recorded moment starts that window)."""
    ends: dict[int, float] = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("type") == "iteration":
            ends[int(rec["iteration"])] = float(rec["time"])
    first, last = spec.warmup - 1, spec.iterations - 1
    if first < 0 or first not in ends or last not in ends or ends[last] <= ends[first]:
        return float("nan")
    return (last - first) * spec.global_batch / (ends[last] - ends[first])


# -- DDP -----------------------------------------------------------------------------------

def _ddp_rank(rank: int, spec: Spec, port: int, results: Any, master: str = "127.0.0.1") -> None:
    """One DDP rank: train `spec.iterations` iterations on slice `rank` of each global
    batch; rank 0 puts the timing of iterations [warmup, iterations) into `results`.
    `master`: rank 0's address (another host's, on the testbed)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from equipoise.data import SliceSampler, load_dataset
    from equipoise.models import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=spec.workers, timeout=timedelta(seconds=spec.timeout))
    try:
        data = load_dataset(spec.dataset, seed=spec.seed)
        torch.manual_seed(spec.seed)  # the initial weights equipoise's coordinator makes
        model = DistributedDataParallel(build_model(spec.model, data.input_shape, data.num_classes))
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
        sampler = SliceSampler(len(data), spec.global_batch, spec.seed)
        mu = spec.slice_size

        def step(t: int) -> torch.Tensor:
            x, y = data.train_batch(sampler.slice(t, rank * mu, mu))
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss.detach()

        for t in range(spec.warmup):
            step(t)
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.zeros(())
        for t in range(spec.warmup, spec.iterations):
            loss = step(t)
        dist.barrier()
        seconds = time.perf_counter() - t0
        dist.all_reduce(loss)  # equal slices: the mean over ranks is the global-batch loss
        if rank == 0:
            timed = spec.iterations - spec.warmup
            results.put({"seconds": seconds, "samples": timed * spec.global_batch,
                         "samples_per_s": timed * spec.global_batch / seconds,
                         "final_train_loss": float(loss) / spec.workers})
    finally:
        dist.destroy_process_group()


def run_ddp(spec: Spec) -> dict[str, Any]:
    """One DDP job of `spec.workers` spawned ranks (gloo over loopback, one thread each)."""
    import torch.multiprocessing as torch_mp

    ctx = torch_mp.get_context("spawn")
    results = ctx.SimpleQueue()
    t0 = time.perf_counter()
    # Children inherit the environment at spawn: one OpenMP thread, gloo on loopback.
    with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"):
        for attempt in (1, 2):
            try:
                torch_mp.start_processes(_ddp_rank, args=(spec, free_port(), results),
                                         nprocs=spec.workers, join=True, start_method="spawn")
                break
            except torch_mp.ProcessExitedException as exc:
                # Seen a few times here: a gloo rank aborts ("terminate called without an
                # active exception") right after an equipoise job; a second start works.
                print(f"DDP attempt {attempt} failed: {exc}", file=sys.stderr)
                if attempt == 2:
                    raise
    elapsed = time.perf_counter() - t0
    if results.empty():
        raise RuntimeError("DDP rank 0 reported nothing")
    out = dict(results.get())
    out["elapsed_s"] = elapsed
    return out


# -- the comparison ------------------------------------------------------------------------

def compare(spec: Spec, reps: int) -> dict[str, Any]:
    """`reps` interleaved runs of each system (equipoise, DDP, equipoise, ...); medians,
    ratios and every run's numbers."""
    spec.check()
    runs = interleave({"equipoise": lambda: run_equipoise(spec),
                       "equipoise_bp": lambda: run_equipoise(spec, backward_push=True),
                       "ddp": lambda: run_ddp(spec)}, reps)
    eq = {k: median([r[k] for r in runs["equipoise"]])
          for k in ("samples_per_s", "steady_samples_per_s", "barrier_wait_fraction",
                    "compute_fraction", "comm_fraction", "final_train_loss", "final_accuracy",
                    "elapsed_s")}
    ddp = {k: median([r[k] for r in runs["ddp"]])
           for k in ("samples_per_s", "final_train_loss", "elapsed_s")}
    r = ratio(eq["samples_per_s"], ddp["samples_per_s"])
    # Each run of equipoise and the DDP run right after it saw similar machine load; the
    # headline is the steady rate (DDP's window) of each pair, summarised.
    pairs = [ratio(e["steady_samples_per_s"], d["samples_per_s"]) for e, d in zip(runs["equipoise"], runs["ddp"])]
    steady = summary(pairs)
    bp_pairs = [ratio(e["steady_samples_per_s"], d["samples_per_s"]) for e, d in zip(runs["equipoise_bp"], runs["ddp"])]
    bp_vs_off = [ratio(b["steady_samples_per_s"], e["steady_samples_per_s"])
                 for b, e in zip(runs["equipoise_bp"], runs["equipoise"])]
    return {"equipoise_bp": {k: median([r[k] for r in runs["equipoise_bp"]])
                             for k in ("samples_per_s", "steady_samples_per_s", "barrier_wait_fraction")},
            "bp_steady_pair_ratio": summary(bp_pairs), "bp_vs_off_pair_ratio": summary(bp_vs_off),
            "bp_meets_target": bool(summary(bp_pairs)["median"] >= TARGET_RATIO),"spec": asdict(spec), "reps": reps, "target_ratio": TARGET_RATIO,
            "equipoise": eq, "ddp": ddp, "ratio": r, "pair_ratios": pairs,
            "median_pair_ratio": steady["median"], "steady_pair_ratio": steady,
            "equipoise_steady": summary([e["steady_samples_per_s"] for e in runs["equipoise"]]),
            "ddp_steady": summary([d["samples_per_s"] for d in runs["ddp"]]),
            "steady_ratio": ratio(eq["steady_samples_per_s"], ddp["samples_per_s"]),
            "meets_target": bool(steady["median"] >= TARGET_RATIO), "runs": runs}


def results_table(result: dict[str, Any]) -> str:
    eq, ddp = result["equipoise"], result["ddp"]
    rows = [
        ["samples/s (median)", eq["samples_per_s"], ddp["samples_per_s"], result["ratio"]],
        ["steady samples/s, same window as DDP", eq["steady_samples_per_s"], ddp["samples_per_s"],
         result["steady_ratio"]],
        ["barrier_wait_fraction", eq["barrier_wait_fraction"], None, None],
        ["worker time in compute / in communication",
         f"{eq['compute_fraction']:.2f} / {eq['comm_fraction']:.2f}", None, None],
        ["final train loss (same job: equal up to rounding drift)", eq["final_train_loss"],
         ddp["final_train_loss"], None],
        ["process start to finish, s", eq["elapsed_s"], ddp["elapsed_s"], None],
    ]
    table = markdown_table(["", "equipoise BSP", "PyTorch DDP", "ratio eq/DDP"], rows)
    if "equipoise_bp" in result:  # backward_push = true: the push streamed during backward
        bp = result["equipoise_bp"]
        table += "\n\n" + markdown_table(
            ["backward_push = true", "equipoise BSP", "ratio eq/DDP per pair", "ratio on/off per pair"],
            [["steady samples/s, same window as DDP", bp["steady_samples_per_s"],
              fmt_range(result["bp_steady_pair_ratio"]), fmt_range(result["bp_vs_off_pair_ratio"])]])
    return table


def run(preset: str, *, spec: Spec | None = None, reps: int | None = None,
        results_path: str | Path | None = None) -> dict[str, Any]:
    """Run the benchmark with a preset, print the Markdown table, write the JSON."""
    p = PRESETS[preset]
    spec = spec or Spec(iterations=p.iterations)
    load_at_start, git_at_start = load_average(), git_state()
    result = compare(spec, reps or p.reps)
    result["preset"] = preset
    result["loadavg_at_start"], result["git_at_start"] = load_at_start, git_at_start
    print(f"## equipoise BSP vs PyTorch DDP (preset {preset}: {spec.model} on {spec.dataset}, "
          f"{spec.workers} workers, {spec.servers} servers, global batch {spec.global_batch}, "
          f"{spec.iterations} iterations, medians of {result['reps']} interleaved reps)\n")
    print(results_table(result))
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"\nsteady samples/s equipoise {fmt_range(result['equipoise_steady'])}, DDP {fmt_range(result['ddp_steady'])}; "
          f"equipoise/DDP of each interleaved pair (same window): {fmt_range(result['steady_pair_ratio'])}, "
          f"{verdict} the target ≥ {TARGET_RATIO}")
    path = write_results(NAME, result, results_path)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--reps", type=int, default=None, help="override the preset's repetitions")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--workers", type=int, default=Spec.workers)
    parser.add_argument("--servers", type=int, default=Spec.servers)
    parser.add_argument("--global-batch", type=int, default=Spec.global_batch)
    parser.add_argument("--model", default=Spec.model)
    parser.add_argument("--dataset", default=Spec.dataset)
    parser.add_argument("--results", default=None, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args()
    chosen = replace(Spec(), iterations=args.iterations or PRESETS[args.preset].iterations,
                     workers=args.workers, servers=args.servers, global_batch=args.global_batch,
                     model=args.model, dataset=args.dataset)
    run(args.preset, spec=chosen, reps=args.reps, results_path=args.results)
