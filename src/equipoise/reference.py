"""Single-process SGD with the global batch, computed the way a BSP job's servers compute it.

This is the oracle for BSP and LB-BSP: a job on any number of workers and servers, with
any split of the global batch, must end where this loop ends. Mathematically the loop is
plain SGD with the mean loss over the global batch X; arithmetically it follows the job's
operations one by one, so that the comparison holds on any machine and for optimizers
that amplify rounding (Adam turns a rounding difference in a near-zero gradient into a
step of up to the learning rate):

- iteration t's samples [tX, (t+1)X) are cut into the workers' slices, in worker order;
  each slice's gradient is the job's step (`Workload.loss_of`: the mean loss over the
  slice's units) computed on its own (same shapes, same `cfg.threads`, same per-slice
  seed as a worker, hence the same kernels);
- the slice gradients are combined as a server combines them: weights cᵢ/Σc in worker
  order, cᵢ the units slice i's loss averaged over (its samples nᵢ unless the loss
  returns (sum, count)), out = g₀·w₀, then out += gᵢ·wᵢ (floating point buffers
  likewise, weighted nᵢ/X);
- the optimizer is the job's `torch.optim` optimizer stepping the model's tensors cut into
  the job's blocks, with the learning rate of the samples applied so far.

It uses no transport, server, coordinator or sync policy: only the block cut and the
views between a model and its blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from .config import Config
from .data import SliceSampler
from .data.sampler import SEED_STRIDE
from .models import build_model
from .policy.batching import equal_split
from .policy.sync import SyncPolicy
from .protocol.blocks import model_blocks, read_pushes, read_values, write_values
from .protocol.optimizer import OptimizerSpec, user_schedule
from .sparse.tables import sparse_tables
from .telemetry.metrics import read_metrics
from .workload import as_workload


def train_reference(cfg: Config, iterations: int | None = None, data=None,
                    splits: Sequence[Sequence[int]] | None = None) -> nn.Module:
    """Run `iterations` (default: the job's total) steps; return the model. `data`: the
    job's `Workload` (or a built-in `Dataset` in memory), else it is built from `cfg`.

    `splits[t]` lists the batch size of each worker at iteration t, in worker order (a
    run's `run_splits`); it must sum to the global batch. Without it, a BSP job's fixed
    split: `batch_split`, else the global batch cut equally among `workers`."""
    data = as_workload(cfg, data)
    total = cfg.total_iterations(len(data))
    steps = total if iterations is None else iterations
    if splits is None:
        if steps and (cfg.protocol != "bsp" or cfg.membership):
            raise ValueError("the batch sizes of a job under LB-BSP or with membership changes "
                             "are not known in advance: pass splits = run_splits(run_dir)")
        fixed = list(cfg.batch_split) or equal_split(cfg.global_batch, cfg.workers)
        splits = [fixed] * steps
    if len(splits) < steps:
        raise ValueError(f"splits covers {len(splits)} iterations, {steps} are needed")
    X = cfg.global_batch
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.model_args)
    if sparse_tables(model):  # their oracle is torch's own sparse training (tests/unit/test_sparse_jobs.py)
        raise ValueError("train_reference does not train sparse tables; compare with torch's sparse embedding")
    model.train()
    blocks = model_blocks(model, cfg.block_size, cfg.servers)
    values = {k: v.detach().clone().contiguous() for k, v in read_values(model, blocks).items()}
    params = {b.key: nn.Parameter(values[b.key], requires_grad=False) for b in blocks if b.kind == "param"}
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(params.values(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "adagrad":
        opt = torch.optim.Adagrad(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rates, user = OptimizerSpec.of(cfg, total), user_schedule(cfg.lr_schedule)
    sampler = SliceSampler(len(data), X, cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # a GEMM's reduction order may depend on it
    try:
        for t in range(steps):
            sizes = [int(n) for n in splits[t] if n > 0]
            if sum(sizes) != X:
                raise ValueError(f"splits[{t}] = {list(splits[t])} does not sum to {X}")
            pushes, counts, start = [], [], t * X
            for n in sizes:
                write_values(model, blocks, values)  # the weights (and buffers) a worker pulls
                torch.default_generator.manual_seed(cfg.seed * SEED_STRIDE + start)  # before the read, as a worker
                batch = data.fetch(data.train, sampler.positions(start, n))
                model.zero_grad(set_to_none=False)
                step = data.loss_of(model, batch, n)
                step.objective.backward()
                pushes.append({k: p.clone() for k, p in read_pushes(model, blocks).items()})
                counts.append(step.count)
                start += n
            weights = SyncPolicy.weights(counts)
            by_samples = SyncPolicy.weights([float(n) for n in sizes])
            for b in blocks:
                combined = _weighted_sum([p[b.key] for p in pushes],
                                         weights if b.kind == "param" else by_samples)
                if b.kind == "param":
                    params[b.key].grad = combined
                else:
                    values[b.key].copy_(combined)
            if cfg.clip_grad_norm:  # torch's own, over the update's gradient of every block, on
                torch.set_num_threads(1)  # one thread as the servers take the norms (store.grad_norms)
                torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.clip_grad_norm)
                torch.set_num_threads(cfg.threads)
            for g in opt.param_groups:  # a server's progress: samples applied (t·X) / X
                g["lr"] = rates.rate(t * X / X, user)
            opt.step()
    finally:
        torch.set_num_threads(threads)
    write_values(model, blocks, values)
    return model


def _weighted_sum(tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Σ wᵢ·tᵢ in the servers' order of operations (a lone t·1.0 is t exactly)."""
    if len(tensors) == 1 and weights[0] == 1.0:
        return tensors[0]
    out = torch.mul(tensors[0], weights[0])
    for t, w in zip(tensors[1:], weights[1:]):
        out.add_(t, alpha=w)
    return out


def run_splits(run_dir: str | Path) -> list[list[int]]:
    """Each iteration's batch sizes, in worker order, from a run's metrics.jsonl."""
    rows = {r["iteration"]: r["batch"] for r in read_metrics(Path(run_dir) / "metrics.jsonl")
            if r.get("type") == "iteration"}
    if sorted(rows) != list(range(len(rows))):
        raise ValueError(f"{run_dir}: the iteration records are not 0, 1, …, {len(rows) - 1}")
    return [rows[t] for t in range(len(rows))]


def oracle_diff(cfg: Config, run_dir: str | Path) -> tuple[float, float]:
    """(max |difference|, max |movement|): how far a BSP/LB-BSP run's final weights
    (model.pt) are from `train_reference` on the run's own splits, and how far training
    moved the run's weights from their initial values (a comparison within a tolerance
    far below the movement is not vacuous). Each is the largest over every tensor."""
    ref = train_reference(cfg, splits=run_splits(run_dir)).state_dict()
    got = torch.load(Path(run_dir) / "model.pt", weights_only=True)
    if ref.keys() != got.keys():
        raise ValueError(f"{run_dir}/model.pt holds {sorted(got)}, the model {sorted(ref)}")
    start = train_reference(cfg, iterations=0).state_dict()
    diff = max((got[n] - ref[n]).abs().max().item() for n in ref)
    moved = max((got[n] - start[n]).abs().max().item() for n in ref)
    return diff, moved


__all__ = ["train_reference", "run_splits", "oracle_diff"]
