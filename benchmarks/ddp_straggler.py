"""PyTorch DDP (gloo) with equal batches under the same stragglers as equipoise's
LB-BSP benchmark: each rank stretched by the same slowdown factor with the same hooks as
an equipoise worker (equipoise.runtime.stretch), and held to the same cgroup CPU quota if
the benchmark uses one. Rank 0 snapshots the weights every `eval_every` iterations with
the training seconds so far, and evaluates the snapshots after training, so time to accuracy
is measured like equipoise's (whose evaluation runs beside training)."""

from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from typing import Any

import torch

from benchmarks.common import free_port, scoped_env


def _rank(rank: int, spec: Any, port: int, cgroups: list[str], results: Any) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from equipoise.data import SliceSampler, load_dataset
    from equipoise.models import build_model
    from equipoise.runtime.evaluate import evaluate
    from equipoise.runtime.stretch import Stretch

    if cgroups:
        with open(os.path.join(cgroups[rank], "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=spec.workers, timeout=timedelta(seconds=300))
    try:
        data = load_dataset(spec.dataset, seed=spec.seed)
        torch.manual_seed(spec.seed)
        net = build_model(spec.model, data.input_shape, data.num_classes)
        model = DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
        sampler = SliceSampler(len(data), spec.global_batch, spec.seed)
        mu = spec.global_batch // spec.workers
        stretch = Stretch(net)
        stretch.factor = spec.base * float(spec.slowdown[rank])
        snapshots = []
        dist.barrier()
        t0 = time.perf_counter()
        for t in range(spec.iterations):
            model.train()
            x, y = data.train_batch(sampler.slice(t, rank * mu, mu))
            stretch.start(len(y))
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP all-reduces inside; that wait is not counted as compute
            stretch.finish()
            opt.step()
            if rank == 0 and spec.eval_every and (t + 1) % spec.eval_every == 0:
                snapshots.append((t + 1, time.perf_counter() - t0,
                                  {k: v.clone() for k, v in net.state_dict().items()}))
        dist.barrier()
        seconds = time.perf_counter() - t0
        if rank == 0:
            results.put(_score(spec, data, net, snapshots, seconds, evaluate))
    finally:
        dist.destroy_process_group()


def _score(spec, data, net, snapshots, seconds, evaluate) -> dict[str, float]:
    final = evaluate(net, data)[1]  # the weights after the last iteration
    reached = math.nan
    for t, elapsed, state in snapshots:
        net.load_state_dict(state)
        if evaluate(net, data, limit=spec.eval_samples)[1] >= 0.85:
            reached = elapsed
            break
    return {"samples_per_s": spec.iterations * spec.global_batch / seconds,
            "time_to_accuracy_s": reached, "final_accuracy": final,
            "train_s": seconds, "barrier_wait_fraction": None, "predictor_mape": None}


def run_ddp_straggler(spec: Any) -> dict[str, Any]:
    import torch.multiprocessing as torch_mp

    from equipoise.runtime.launch.cgroup import CpuLimit

    limits = [CpuLimit(f"equipoise-bench-ddp-{os.getpid()}-{r}", spec.cpu)
              for r in range(spec.workers)] if spec.cpu else []
    ctx = torch_mp.get_context("spawn")
    results = ctx.SimpleQueue()
    try:
        with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"):
            torch_mp.start_processes(_rank, args=(spec, free_port(), [str(l.path) for l in limits], results),
                                     nprocs=spec.workers, join=True, start_method="spawn")
    finally:
        for limit in limits:
            limit.remove()
    return dict(results.get())
