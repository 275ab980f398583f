"""Single-process SGD with the same model, samples, optimizer and schedule as a job.

This is the oracle for BSP: a BSP job on any number of workers and servers, with any
split of the global batch, must end where this loop ends. It deliberately uses none of
the distributed machinery — a plain model, `torch.optim` over `model.parameters()`, and
the mean loss over the whole global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import Config
from .data import SliceSampler, load_dataset
from .models import build_model
from .policy.schedule import learning_rate


def train_reference(cfg: Config, iterations: int | None = None, data=None) -> nn.Module:
    """Run `iterations` (default: the job's total) steps of single-process SGD."""
    data = data if data is not None else load_dataset(cfg.dataset, cfg.data_dir or None, seed=cfg.seed)
    total = cfg.total_iterations(len(data))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.train()
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler = SliceSampler(len(data), cfg.global_batch, cfg.seed)
    for t in range(total if iterations is None else iterations):
        x, y = data.train_batch(sampler.batch(t))
        for g in opt.param_groups:
            g["lr"] = learning_rate(cfg.lr, cfg.lr_schedule, t, total=total,
                                    step_size=cfg.lr_step_size, gamma=cfg.lr_gamma)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model
