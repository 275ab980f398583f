"""What a job trains: its datasets, its training step (the loss), its collate and metrics.

One step, defined once. A worker computing its slice's gradient, `reference.train_reference`
replaying the job in one process and the evaluation of a snapshot all go through the same
`Workload`, so nothing else in equipoise knows what a batch is or how a loss is computed.

* **Datasets.** ``dataset`` is a built-in name (`equipoise.data.DATASETS`) or the spec of
  a *provider*: ``"path/file.py:fn"`` or ``"pkg.mod:fn"``, a function or a
  `torch.utils.data.Dataset` class, called with the keywords it accepts of ``seed`` and
  ``data_dir``. It returns a map-style dataset for training, or ``(train, eval)``, or
  ``{"train": ..., "eval": ...}``. Every worker calls it in its own process and reads
  only the indices of its slices, so nothing needs the whole dataset in memory. A dataset
  may define ``get_batch(indices)`` returning the collated batch at once (the built-ins
  do); otherwise items are read one by one and collated.
* **The step.** ``loss(model, batch)`` returns a scalar tensor, the mean over the batch,
  or ``(loss_sum, count)`` when what a batch averages over varies (tokens, masked
  positions). A worker then back-propagates ``loss_sum / count`` and the servers weight
  its gradient by ``count`` (not by its sample count), so the update is the gradient of
  the mean over every unit of the global batch: single-process SGD over the same units.
  Default: cross-entropy of ``model(x)`` against ``y`` for a batch ``(x, y)``.
* **Determinism.** A BSP or LB-BSP job equals `reference.train_reference` bit for bit
  when an item depends only on its index: random augmentation should draw from a
  generator seeded by the index, not from torch's global generator (the worker seeds that
  per slice before reading it, but with ``loader_workers > 0`` the reads run on other
  threads, at times that vary). With loader threads, ``__getitem__`` is called from
  several threads at once: it must be thread-safe.
* **Metrics.** ``metrics(model, batch)`` returns a dict; each value is ``(sum, count)``,
  reduced as Σsum/Σcount over the evaluation set, or a number, taken as the batch's mean
  and weighted by its sample count. Default: ``loss`` (the step's loss over the
  evaluation set) and, with the default loss, ``accuracy``.
"""

from __future__ import annotations

import functools
import math
import warnings
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

from .data import DATASETS, DataError, load_dataset
from .data.dataset import ArraySplit
from .spec import accepted_kwargs, one_line, resolve
from .user_code import USER_CODE


class StepError(ValueError):
    """The user's loss, metrics or collate returned something equipoise cannot use; the
    one-line message names the spec and what is wrong."""


class SampleError(RuntimeError):
    """Reading a sample failed mid-run; the message names the dataset, the index and the
    exception (the worker adds its rank)."""


class EvalAborted(Exception):
    """An evaluation stopped by its caller between batches (superseded)."""


@dataclass(frozen=True)
class StepLoss:
    """One batch's loss: `objective` is what is back-propagated (the mean over the batch's
    units), `value` its float, `count` the units it averages over (the servers' weight)."""

    objective: torch.Tensor
    value: float
    count: float


def cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    """The default step: mean cross-entropy of ``model(x)`` against ``y``."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def classification_metrics(model: nn.Module, batch) -> dict:
    """The default metrics of the default step: summed cross-entropy and correct count."""
    x, y = batch
    out = model(x)
    n = len(y)
    return {"loss": (F.cross_entropy(out, y, reduction="sum"), n),
            "accuracy": (int((out.argmax(1) == y).sum()), n)}


def inference_module(model: nn.Module, example: Any) -> Any:
    """`model` traced on `example` and frozen for evaluation (TorchScript: a layer and its
    activation fused, weights packed once), or None. Only for an `nn.Sequential` of torch's
    own layers on a CPU tensor: a trace records the one path its example took, and such a
    stack has no other; a user's module, or anything the trace refuses, is run as it is.
    The default job's evaluation (the CNN, 10,000 images, two threads) took 1.33 s frozen
    against 2.3-2.5 s as it is."""
    layers = list(model.modules())[1:] if isinstance(model, nn.Sequential) else None
    if (not layers or not all(type(m).__module__.startswith("torch.nn.modules.") for m in layers)
            or not isinstance(example, torch.Tensor) or example.device.type != "cpu"
            or not example.dtype.is_floating_point):
        return None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on what it records
            return torch.jit.freeze(torch.jit.trace(model.eval(), example, check_trace=False))
    except Exception:  # not traceable after all: evaluated as it is
        return None


def _number(value: Any) -> float | None:
    """A python float from a number or a one-element tensor; None for anything else."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().item()) if value.numel() == 1 else None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


class Workload:
    """The datasets and the step of a job, built in the process that uses them."""

    def __init__(self, train, eval=None, *, loss: Callable | None = None, metrics: Callable | None = None,
                 collate: Callable | None = None, sparse_ids: Callable | None = None,
                 names: dict[str, str] | None = None):
        self.train, self.eval = train, eval
        self.sparse_ids_fn = sparse_ids  # batch -> {table module: ids}: a step's table rows, fetched at once
        self.loss_fn = loss or cross_entropy
        self.metrics_fn = metrics
        self.collate = collate or default_collate
        self.names = {"dataset": "dataset", "loss": "loss", "metrics": "metrics", "collate": "collate",
                      "sparse_ids": "sparse_ids", **(names or {})}
        self.input_shape = getattr(train, "input_shape", None)
        self.num_classes = getattr(train, "num_classes", None)

    def __len__(self) -> int:
        return len(self.train)

    @property
    def num_eval(self) -> int:
        return 0 if self.eval is None else len(self.eval)

    # -- batches --------------------------------------------------------------------------
    def fetch(self, dataset, idx: torch.Tensor, split: str = "train"):
        """The collated batch at indices `idx` of `dataset`."""
        get_batch = getattr(dataset, "get_batch", None)
        if get_batch is not None:
            try:
                with USER_CODE.call("the dataset's get_batch", int(idx[0]) if len(idx) else -1):
                    return get_batch(idx)
            except Exception as exc:
                lo, hi = (int(idx.min()), int(idx.max())) if len(idx) else (0, 0)
                raise SampleError(f"{self.names['dataset']} ({split}): get_batch of {len(idx)} indices in "
                                  f"[{lo}, {hi}] raised {type(exc).__name__}: {one_line(exc)}") from exc
        return self.collate_items(self.items(dataset, idx, split))

    def items(self, dataset, idx, split: str = "train") -> list:
        out = []
        for i in idx.tolist():
            try:
                with USER_CODE.call("the dataset's __getitem__", i):
                    out.append(dataset[i])
            except Exception as exc:
                raise SampleError(f"{self.names['dataset']} ({split}): item {i} raised "
                                  f"{type(exc).__name__}: {one_line(exc)}") from exc
        return out

    def collate_items(self, items: list):
        try:
            with USER_CODE.call("the collate function"):
                return self.collate(items)
        except Exception as exc:
            raise StepError(f"collate {self.names['collate']!r} failed on {len(items)} items: "
                            f"{type(exc).__name__}: {one_line(exc)}") from exc

    def sparse_ids(self, batch) -> dict[str, torch.Tensor] | None:
        """The user's `sparse_ids(batch)`: the ids each sparse table (by module name) will
        look up in this batch; None without one. StepError naming the spec if it raises or
        returns something else than a dict of names to integer tensors."""
        if self.sparse_ids_fn is None:
            return None
        name = self.names["sparse_ids"]
        with USER_CODE.call("sparse_ids"):
            try:
                out = self.sparse_ids_fn(batch)
            except Exception as exc:
                raise StepError(f"sparse_ids {name!r} raised {type(exc).__name__}: {str(exc)[:200]}") from exc
        if not (isinstance(out, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              and not v.is_floating_point() for k, v in out.items())):
            raise StepError(f"sparse_ids {name!r} returned {type(out).__name__}; expected a dict of table "
                            "module names to integer tensors of ids")
        return out

    # -- the step -------------------------------------------------------------------------
    def loss_of(self, model: nn.Module, batch, n: int) -> StepLoss:
        """The step's loss on a batch of `n` samples; StepError if the user's loss returns
        neither a scalar tensor nor ``(scalar tensor, count)`` with a finite count ≥ 0."""
        with USER_CODE.call("the loss"):
            out = self.loss_fn(model, batch)
        name = self.names["loss"]
        if isinstance(out, (tuple, list)):
            if len(out) != 2:
                raise StepError(f"loss {name!r} returned a {type(out).__name__} of {len(out)} items; "
                                "expected a scalar tensor or (loss_sum, count)")
            total, count = out
            self._check_scalar(total, "loss_sum of ")
            c = _number(count)
            if c is None or not math.isfinite(c) or c < 0:
                raise StepError(f"loss {name!r} returned count = {count!r}; expected a finite number ≥ 0 "
                                "(an int, a float or a one-element tensor)")
            objective = total / c if c > 0 else total * 0.0  # no units: no gradient
            return StepLoss(objective, float(objective.item()), c)
        self._check_scalar(out, "")
        return StepLoss(out, float(out.item()), float(n))

    def _check_scalar(self, t: Any, what: str) -> None:
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or not t.dtype.is_floating_point:
            got = (f"a tensor of shape {tuple(t.shape)} and dtype {t.dtype}" if isinstance(t, torch.Tensor)
                   else f"a {type(t).__name__}")
            raise StepError(f"{what}loss {self.names['loss']!r} is {got}; expected a floating-point "
                            "scalar tensor (reduce over the batch: a mean, or (sum, count))")

    # -- evaluation -----------------------------------------------------------------------
    def eval_batches(self, batch_size: int = 128, limit: int = 0) -> Iterator[tuple[Any, int]]:
        """The evaluation set in order (its first `limit` samples if limit > 0), as
        (batch, number of samples)."""
        n = self.num_eval if not limit else min(limit, self.num_eval)
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(n, start + batch_size), dtype=torch.int64)
            yield self.fetch(self.eval, idx, "eval"), len(idx)

    def batch_metrics(self, model: nn.Module, batch, n: int) -> dict[str, tuple[float, float]]:
        """One batch's metrics as name -> (sum, count)."""
        if self.metrics_fn is None:
            if self.loss_fn is cross_entropy:
                raw = classification_metrics(model, batch)
            else:
                step = self.loss_of(model, batch, n)
                raw = {"loss": (step.value * step.count, step.count)}
        else:
            raw = self.metrics_fn(model, batch)
        name = self.names["metrics"]
        if not isinstance(raw, dict) or not raw:
            raise StepError(f"metrics {name!r} returned {type(raw).__name__}; expected a non-empty dict "
                            "of name -> number or (sum, count)")
        out = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise StepError(f"metrics {name!r}: name {key!r} is not an identifier")
            if isinstance(value, (tuple, list)) and len(value) == 2:
                s, c = _number(value[0]), _number(value[1])
            else:
                s, c = _number(value), float(n)
                s = None if s is None else s * n
            if s is None or c is None or not math.isfinite(c) or c < 0:
                raise StepError(f"metrics {name!r}: {key} = {value!r} is not a number or (sum, count) "
                                "of numbers")
            out[key] = (s, c)
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch_size: int = 128, limit: int = 0,
                 device: torch.device | None = None, abort: Callable[[], bool] | None = None) -> dict[str, float]:
        """The metrics of `model` over the evaluation set (its first `limit` samples), its
        batches moved to `device` (where the model is) if given. `abort` is asked before
        each batch: true, the evaluation stops with `EvalAborted`."""
        from .device import to_device

        model.eval()
        sums: dict[str, list[float]] = {}
        # the default metrics call model(x) alone: a plain stack of torch's layers may run frozen
        plain = self.metrics_fn is None and self.loss_fn is cross_entropy
        run = None
        for batch, n in self.eval_batches(batch_size, limit):
            if abort is not None and abort():
                raise EvalAborted("evaluation aborted")
            if device is not None:
                batch = to_device(batch, device)
            if run is None:
                frozen = inference_module(model, batch[0]) if plain and isinstance(batch, (tuple, list)) else None
                run = model if frozen is None else frozen
            for key, (s, c) in self.batch_metrics(run, batch, n).items():
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += s
                acc[1] += c
        return {k: (s / c if c > 0 else float("nan")) for k, (s, c) in sums.items()}


# -- building one ---------------------------------------------------------------------------
def _spec(cfg, key: str) -> str:
    return str(getattr(cfg, key, "") or "")


def provide(cfg) -> tuple[Any, Any]:
    """(train, eval) datasets of the job's `dataset` (a built-in name or a provider spec)."""
    name = cfg.dataset
    if name in DATASETS:
        data = load_dataset(name, cfg.data_dir or None, seed=cfg.seed)
        return data.split("train"), data.split("test")
    fn = resolve(name, "dataset", DataError)
    try:
        with torch.random.fork_rng(devices=[]):  # the same dataset in every process, whatever ran before
            torch.manual_seed(cfg.seed)
            out = fn(**accepted_kwargs(fn, {"seed": cfg.seed, "data_dir": cfg.data_dir or None}),
                     **(getattr(cfg, "data_args", None) or {}))
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"dataset {name!r}: call raised {type(exc).__name__}: {one_line(exc)}") from exc
    if isinstance(out, dict):
        unknown = set(out) - {"train", "eval"}
        if "train" not in out or unknown:
            raise DataError(f"dataset {name!r} returned a dict with keys {sorted(out)}; expected 'train' "
                            "and optionally 'eval'")
        train, evl = out["train"], out.get("eval")
    elif isinstance(out, (tuple, list)):
        if len(out) != 2:
            raise DataError(f"dataset {name!r} returned {len(out)} items; expected a Dataset or (train, eval)")
        train, evl = out
    else:
        train, evl = out, None
    for what, ds in (("train", train), ("eval", evl)):
        if ds is None and what == "eval":
            continue
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
            raise DataError(f"dataset {name!r}: its {what} set is a {type(ds).__name__}, not a map-style "
                            "Dataset (with __getitem__ and __len__)")
        if len(ds) <= 0:
            raise DataError(f"dataset {name!r}: its {what} set is empty")
    return train, evl


def load_workload(cfg, shared=None) -> Workload:
    """The job's workload, built in this process. `shared`: a built-in `Dataset` a
    launcher already holds (Ray's object store), used instead of loading it again."""
    if shared is not None:
        train, evl = shared.split("train"), shared.split("test")
    else:
        train, evl = provide(cfg)
    fns = {}
    for key in ("loss", "metrics", "collate", "sparse_ids"):
        spec = _spec(cfg, key)
        fns[key] = resolve(spec, key, StepError) if spec else None
    loss_args = getattr(cfg, "loss_args", None) or {}
    if loss_args and fns["loss"] is not None:  # the recipe's settings, after (model, batch)
        fns["loss"] = functools.partial(fns["loss"], **loss_args)
    names = {"dataset": cfg.dataset, **{k: _spec(cfg, k) or f"(default {k})" for k in fns}}
    return Workload(train, evl, **fns, names=names)


def as_workload(cfg, data=None) -> Workload:
    """`data` as the job's Workload: itself, a built-in `Dataset` already in memory
    wrapped with the job's step, or (None) built from `cfg`."""
    if isinstance(data, Workload):
        return data
    return load_workload(cfg, shared=data)


__all__ = ["as_workload", "EvalAborted", "SampleError", "StepError", "StepLoss", "Workload", "classification_metrics", "cross_entropy",
           "load_workload", "provide"]
