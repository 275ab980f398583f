"""The optimizers a server steps its blocks with: `SGD` (torch's arithmetic, without
torch.optim's import cost), torch's Adam, AdamW and Adagrad for dense blocks, and for a
sparse table's blocks torch's sparse step (only the rows a gradient touches move)."""

from __future__ import annotations

import math

import torch

from ..protocol.optimizer import OptimizerSpec

__all__ = ["SGD", "make_optimizer", "make_rows_optimizer"]


class SGD:
    """`torch.optim.SGD`'s arithmetic on CPU tensors, step for step (its single-tensor path,
    dampening 0, not Nesterov: w −= lr·(g + wd·w), through the momentum buffer
    buf = μ·buf + g when μ ≠ 0, the first buffer a copy of g), with the `param_groups` and
    `state` (param → {"momentum_buffer": buf}) the store reads and writes. Not
    torch.optim's: building the first torch.optim optimizer of a process imports about
    1.5 s of torch, which every server would pay at start, and its step has a per-call
    overhead the update does not need."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        for name, x in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x >= 0):
                raise ValueError(f"optimizer sgd: {name} = {x!r} must be a finite number ≥ 0")
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum,
                              "weight_decay": weight_decay}]
        self.state: dict[torch.nn.Parameter, dict] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, decay = float(group["lr"]), group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:  # dense also for a sparse table's gradient (it travels as state)
                        buf = state["momentum_buffer"] = grad.to_dense() if grad.is_sparse else grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1)
                    grad = buf
                p.add_(grad, alpha=-lr)


def make_optimizer(spec: OptimizerSpec, params: list[torch.nn.Parameter]) -> "SGD | torch.optim.Optimizer":
    if not params:  # a server may hold only buffers; optimizers refuse an empty list
        params = [torch.nn.Parameter(torch.zeros(0))]
    if spec.name == "sgd":
        return SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.name == "adamw":  # decoupled weight decay: w -= lr·λ·w, then Adam's step
        return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.name == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay)
    raise ValueError(f"optimizer = {spec.name!r} is not one of sgd, adam, adamw, adagrad")


def make_rows_optimizer(spec: OptimizerSpec, params: list[torch.nn.Parameter]):
    """The optimizer of a server's table blocks: torch's sparse step for `spec`."""
    if not params:
        return None
    if spec.name == "sgd":
        return SGD(params, lr=spec.lr, momentum=spec.momentum)
    if spec.name == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr)
    if spec.name == "adam":
        return torch.optim.SparseAdam(params, lr=spec.lr)
    raise ValueError(f"optimizer = {spec.name!r} cannot step sparse tables (sgd, adagrad, adam)")
