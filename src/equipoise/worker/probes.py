"""What a worker measures of itself before its first step, sent with its first plan
request: the largest batch its device memory holds (`memory_cap`), and LB-BSP's fixed
cost of a step (`fixed_cost`). Each runs real steps of the job's model whose gradients
are dropped; the first pull then overwrites whatever their forwards changed (batch-norm
statistics)."""

from __future__ import annotations

import time

import torch

from ..config import Config
from ..device import autocast, probe_memory, resolve, to_device, worker_device


def memory_cap(cfg: Config, rank: int, model, loader, data, device: torch.device, precision: str) -> int | None:
    """The largest batch this worker's device memory holds, from a probe of a step's
    peak memory at two batch sizes (device.py); None off a GPU."""

    def where(r: int) -> torch.device:
        return resolve(worker_device(cfg, r), f"worker {r}")

    share = sum(where(r) == device for r in range(cfg.workers)) if cfg.launcher == "local" else 1

    def step(b: int) -> None:
        batch = to_device(loader.get(0, min(b, len(data))), device)
        with autocast(device, precision):
            out = data.loss_of(model, batch, b)
        out.objective.backward()
        model.zero_grad(set_to_none=True)

    limit = cfg.memory_limits[rank] if rank < len(cfg.memory_limits) else 0.0
    probe = probe_memory(step, device, share=share, limit_gib=limit)
    return None if probe is None else probe.cap()


def fixed_cost(cfg: Config, model, loader, data, device: torch.device, precision: str) -> float | None:
    """LB-BSP (proportional sizes): the seconds of a step that do not grow with its
    batch, F in compute = F + n / v (None under other protocols and policies). Without
    it a worker given a batch of one or two samples looks slow (its step is mostly F)
    and a last-value speed keeps it there. Timed as steps of 1 and k samples (k = X /
    workers, at most 32), the fastest of three each (a shared box only ever adds time):
    F = t₁ − (t_k − t₁)/(k − 1), at least 0."""
    if cfg.protocol != "lbbsp" or cfg.batch_policy != "proportional" or cfg.batch_split:
        return None
    k = max(2, min(32, cfg.global_batch // max(1, cfg.workers), len(data)))
    cuda = device.type == "cuda"

    def seconds(b: int) -> float:
        batch = to_device(loader.get(0, b), device)
        t0 = time.perf_counter()
        with autocast(device, precision):
            out = data.loss_of(model, batch, b)
        out.objective.backward()
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        return t

    seconds(k)  # warm-up: first calls allocate
    one = min(seconds(1) for _ in range(3))
    many = min(seconds(k) for _ in range(3))
    return max(0.0, one - (many - one) / (k - 1))


__all__ = ["fixed_cost", "memory_cap"]
