"""What a job with sparse tables may be configured as, checked before it starts."""

from __future__ import annotations

from typing import Any, Mapping

from .tables import Table

__all__ = ["tables_refusal"]

_NOT_YET = ("overlap", "backward_push", "forward_pull", "eager_update")


def tables_refusal(cfg: Any, tables: Mapping[str, Table]) -> str | None:
    """One line saying why the job cannot run its model's sparse tables as configured,
    or None. Sparse tables run under every protocol, with the plain exchange, and with the
    optimizers that have a sparse step."""
    if not tables:
        return None
    names = ", ".join(t.module for t in tables.values())
    devices = {cfg.device, *cfg.devices}
    if devices != {"cpu"}:
        return f"sparse tables ({names}) run on CPU workers so far, not {sorted(devices - {'cpu'})[0]}"
    for key in _NOT_YET:
        if getattr(cfg, key):
            return f"sparse tables ({names}) do not run with {key} = {getattr(cfg, key)!r} yet"
    if cfg.optimizer not in ("sgd", "adagrad", "adam"):
        return (f"sparse tables ({names}): optimizer {cfg.optimizer} has no sparse step "
                f"(sgd, adagrad, or adam, which steps the tables as torch.optim.SparseAdam)")
    if cfg.weight_decay:
        return f"sparse tables ({names}): weight_decay = {cfg.weight_decay} has no sparse step (use 0)"
    if cfg.clip_grad_norm:
        return f"sparse tables ({names}): clip_grad_norm is not supported with sparse tables yet"
    big = [t.module for t in tables.values() if t.rows >= 1 << 31]
    if big:
        return f"sparse tables: {big[0]} has 2^31 rows or more"
    return None
