"""What the coordinator and the servers agree on about the optimizer: its spec (name,
hyper-parameters, schedule, clipping) as the init message carries it, the user's
schedule by spec, and the global gradient norm a clipped update is scaled by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..policy.schedule import learning_rate


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    lr: float
    momentum: float
    weight_decay: float
    schedule: str
    total: int
    step_size: int
    gamma: float
    global_batch: int
    warmup: int = 0  # iterations of linear warm-up (policy.schedule)
    floor: float = 0.0  # the cosine schedule's floor
    clip: float = 0.0  # > 0: a barrier update's gradient is clipped to this global norm (the coordinator's)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping) -> "OptimizerSpec":
        optional = {"warmup", "floor", "clip"}  # a job of an earlier version has none
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d or k not in optional})

    @classmethod
    def of(cls, cfg, total: int) -> "OptimizerSpec":
        """The optimizer and schedule of config `cfg` for a job of `total` iterations."""
        return cls(cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.lr_schedule, total,
                   cfg.lr_step_size, cfg.lr_gamma, cfg.global_batch, warmup=cfg.warmup_iterations, floor=cfg.lr_min,
                   clip=cfg.clip_grad_norm)

    def rate(self, progress: float, user: Callable[[int], float] | None = None) -> float:
        """The learning rate of the update starting at `progress` iterations."""
        return learning_rate(self.lr, self.schedule, progress, total=self.total, step_size=self.step_size,
                             gamma=self.gamma, warmup=self.warmup, floor=self.floor, user=user)


def global_norm(norms: Mapping[int, float]) -> float:
    """The norm of the blocks' gradient norms (`ParameterStore.grad_norms`, gathered from
    every server) stacked in block order: `clip_grad_norm_`'s total norm, in float32."""
    if not norms:
        return 0.0
    stacked = torch.tensor([norms[k] for k in sorted(norms)], dtype=torch.float32)
    return float(torch.linalg.vector_norm(stacked, 2.0))


def user_schedule(schedule: str) -> Callable[[int], float] | None:
    """The function a user schedule spec names (None for the built-in schedules)."""
    if ":" not in schedule:
        return None
    from ..spec import resolve

    return resolve(schedule, "lr_schedule")
