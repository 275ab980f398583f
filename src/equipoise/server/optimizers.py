"""The optimizers a server steps its blocks with: `SGD` (torch's arithmetic, without
torch.optim's import cost), torch's Adam, AdamW and Adagrad for dense blocks, and for a
sparse table's blocks torch's sparse step (only the rows a gradient touches move)."""

from __future__ import annotations

import math

import torch

from ..protocol.optimizer import OptimizerSpec

__all__ = ["SGD", "SparseAdam", "SparseAdagrad", "make_optimizer", "make_rows_optimizer"]


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
        return SparseAdagrad(params, lr=spec.lr)
    if spec.name == "adam":
        return SparseAdam(params, lr=spec.lr)
    raise ValueError(f"optimizer = {spec.name!r} cannot step sparse tables (sgd, adagrad, adam)")


class SparseAdagrad:
    """`torch.optim.Adagrad`'s step on sparse gradients (no learning-rate decay, eps 1e-10,
    no initial accumulator: the settings a server builds it with), operation for
    operation on the rows a gradient names: index_add where torch adds a sparse tensor
    to the dense sum and to the weights, index_select where it masks the sum, the same
    numbers (tests/unit/server/test_store.py) at about three quarters of the cost per
    shard, without torch.optim's import. State per parameter as torch's, made at once:
    "step" (a float32 tensor) and "sum"."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float = 1e-2, eps: float = 1e-10):
        self.param_groups = [{"params": list(params), "lr": lr, "eps": eps}]
        self.state: dict[torch.nn.Parameter, dict] = {p: self._fresh(p) for p in self.param_groups[0]["params"]}

    @staticmethod
    def _fresh(p: torch.nn.Parameter) -> dict:
        return {"step": torch.tensor(0.0), "sum": torch.zeros_like(p, memory_format=torch.preserve_format)}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, eps = float(group["lr"]), group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if state is None:  # a parameter added after building (not built each step: a shard's size)
                    state = self.state[p] = self._fresh(p)
                state["step"] += 1
                grad = p.grad.coalesce()  # the update is not linear: each row once
                rows, values = grad.indices()[0], grad.values()
                state["sum"].index_add_(0, rows, values.pow(2))
                std = state["sum"].index_select(0, rows).sqrt_().add_(eps)
                p.index_add_(0, rows, values / std, alpha=-lr)  # lr / (1 + (step − 1)·0): lr


class SparseAdam:
    """`torch.optim.SparseAdam`'s step, operation for operation on the rows a sparse
    gradient names (index_select and index_add where torch goes through sparse_mask and
    sparse additions, the same numbers: tests/unit/server/test_store.py), without its
    cost per tensor: a server steps every shard of its tables at every update. State per
    parameter as torch's: "step" (an int), "exp_avg", "exp_avg_sq"."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.param_groups = [{"params": list(params), "lr": lr, "betas": betas, "eps": eps}]
        self.state: dict[torch.nn.Parameter, dict] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, (beta1, beta2), eps = float(group["lr"]), group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()
                state = self.state.setdefault(p, {})
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                rows, values = grad.indices()[0], grad.values()
                if values.numel() == 0:
                    continue
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                old_avg = exp_avg.index_select(0, rows)
                avg_update = values.sub(old_avg).mul_(1 - beta1)
                exp_avg.index_add_(0, rows, avg_update)
                old_sq = exp_avg_sq.index_select(0, rows)
                sq_update = values.pow(2).sub_(old_sq).mul_(1 - beta2)
                exp_avg_sq.index_add_(0, rows, sq_update)
                numer = avg_update.add_(old_avg)
                denom = sq_update.add_(old_sq).sqrt_().add_(eps)
                step = state["step"]
                step_size = lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
                p.index_add_(0, rows, -step_size * numer.div_(denom))

