"""PyTorch DDP (gloo) with equal batches under the same stragglers as equipoise's
LB-BSP benchmark: each rank stretched by the same slowdown factor, noise and hooks as an
equipoise worker (equipoise.worker.stretch), over the same window of the step.

An equipoise worker's stretch starts before it slices its batch and is slept in full
before its push leaves; its local work after the pull (the optimizer is on the servers)
is stretched too. Here the stretch starts before the batch is sliced, its rest is slept
in a DDP communication hook just before the last gradient bucket's all-reduce (the
moment DDP's "push" leaves), and the optimizer step — local work of a DDP rank — runs
inside `Stretch.local()`. Each rank logs its per-step compute (the stretched window,
without the all-reduce wait), so the two systems can be compared at equal factors.
Throughput is measured on rank 0 over the iterations after `warmup`."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

import torch

from benchmarks.common import free_port, scoped_env


def _rank(rank: int, spec: Any, port: int, results: Any) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from equipoise.data import SliceSampler, load_dataset
    from equipoise.models import build_model
    from equipoise.worker.stretch import Stretch, noise_seed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=spec.workers, timeout=timedelta(seconds=300))
    try:
        data = load_dataset(spec.dataset, seed=spec.seed)
        torch.manual_seed(spec.seed)
        net = build_model(spec.model, data.input_shape, data.num_classes)
        model = DistributedDataParallel(net)
        stretch = Stretch(net, noise=spec.noise, seed=noise_seed(spec.seed, rank))
        stretch.factor = spec.base * float(spec.slowdown[rank])
        compute: list[float] = []

        def before_last_bucket(state, bucket):  # unannotated: DDP checks hook annotations
            if bucket.is_last():  # the step's compute is done: sleep the rest, then send
                stretch.finish()
                compute.append(time.perf_counter() - t_step)
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, before_last_bucket)
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
        sampler = SliceSampler(len(data), spec.global_batch, spec.seed)
        mu = spec.global_batch // spec.workers
        dist.barrier()
        t0 = t_end = 0.0
        losses = []
        for t in range(spec.iterations):
            if t == spec.warmup:
                t0 = time.perf_counter()
            t_step = time.perf_counter()
            stretch.start(mu)
            x, y = data.train_batch(sampler.slice(t, rank * mu, mu))
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP all-reduces inside, after the hook's sleep
            with stretch.local():
                opt.step()
            losses.append(float(loss.detach()))
        t_end = time.perf_counter()
        window = spec.iterations - spec.warmup
        results.put({"rank": rank, "compute_s": statistics.median(compute[spec.warmup:]),
                     "samples_per_s": window * spec.global_batch / (t_end - t0) if rank == 0 else None,
                     "loss": statistics.fmean(losses[-10:])})
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ddp_straggler(spec: Any) -> dict[str, Any]:
    """One DDP run: samples/s over the steady window, each rank's median compute seconds
    per step and the final training loss (mean of the last 10 iterations over ranks)."""
    import torch.multiprocessing as torch_mp

    if not 0 < spec.warmup < spec.iterations:
        raise ValueError(f"warmup = {spec.warmup} must be in (0, iterations = {spec.iterations})")
    results = torch_mp.get_context("spawn").SimpleQueue()
    with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"):
        torch_mp.start_processes(_rank, args=(spec, free_port(), results),
                                 nprocs=spec.workers, join=True, start_method="spawn")
    ranks = sorted((results.get() for _ in range(spec.workers)), key=lambda r: r["rank"])
    return {"samples_per_s": ranks[0]["samples_per_s"],
            "compute_s": {r["rank"]: r["compute_s"] for r in ranks},
            "final_train_loss": statistics.fmean(r["loss"] for r in ranks)}
