"""Where a worker computes: its device and precision, and the copies between the wire's
host tensors and the device.

Servers always run on CPU (as BytePS's summation servers do): the wire carries host
tensors. A worker on a GPU keeps its model there and moves bytes through pinned host
buffers allocated once (`DeviceLink`): the weights a pull brought are copied into
pinned buffers and on to the device without blocking (the forward queues behind the
copies on the same stream); the gradients are copied once from the device into pinned
buffers that are themselves the frames of the push. With overlap a push may still be in
flight while the next backward runs, so there are two sets of gradient buffers, used in
turn. Nothing is allocated per iteration. On CPU the same calls do no copies at all
(views of the model, as before), unless `staged` asks for the staging path (tests run
every device code path that way on a machine without a GPU).

`h2d_s` and `d2h_s` (seconds copying in and out, per step) go into each iteration's
report, metrics.jsonl and the live view.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .config_checks import DEVICE_RE, PRECISIONS
from .policy.placement import Block
from .protocol.blocks import _flat, read_pushes, write_values


class DeviceError(ValueError):
    """A device or precision this machine cannot give; one line naming what and who."""


def worker_device(cfg, rank: int) -> str:
    """The device string worker `rank` is configured for (`devices` by rank, else `device`)."""
    return cfg.devices[rank] if cfg.devices and rank < len(cfg.devices) else cfg.device


def worker_precision(cfg, rank: int) -> str:
    return cfg.precisions[rank] if cfg.precisions and rank < len(cfg.precisions) else cfg.precision


def worker_setup(cfg, rank: int) -> tuple[torch.device, str]:
    """Worker `rank`'s device (made current, if a GPU) and precision; DeviceError naming
    what it cannot have."""
    who = f"worker {rank}"
    device, precision = resolve(worker_device(cfg, rank), who), worker_precision(cfg, rank)
    check_precision(precision, device, who)
    if device.type == "cuda":  # streams, events and pinned memory of this GPU, not cuda:0
        torch.cuda.set_device(device)
    return device, precision


def resolve(spec: str, who: str, *, cuda=torch.cuda) -> torch.device:
    """The torch device for `spec` ("cpu", "cuda", "cuda:N", "auto": a GPU if there is
    one) on this machine; DeviceError naming `who` if it has no such device. Under Ray
    the GPUs an actor sees are the ones Ray assigned it (CUDA_VISIBLE_DEVICES), so
    "cuda" is the first of those."""
    if not DEVICE_RE.match(spec):
        raise DeviceError(f"{who}: device = {spec!r} is not cpu, cuda, cuda:N or auto")
    if spec == "cpu" or (spec == "auto" and not cuda.is_available()):
        return torch.device("cpu")
    if spec == "auto":
        return torch.device("cuda", 0)
    if not cuda.is_available():
        raise DeviceError(f"{who}: device = {spec!r}, but this machine has no CUDA device "
                          f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    count = cuda.device_count()
    if index >= count:
        raise DeviceError(f"{who}: device = {spec!r}, but this machine has {count} CUDA device(s) "
                          f"(cuda:0 … cuda:{count - 1})")
    return torch.device("cuda", index)


def check_precision(precision: str, device: torch.device, who: str, *, cuda=torch.cuda) -> None:
    """bf16-mixed needs bfloat16 arithmetic: on a GPU, compute capability ≥ 8.0 (Ampere);
    refused, naming the worker and its device, on an older one."""
    if precision not in PRECISIONS:
        raise DeviceError(f"{who}: precision = {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "bf16-mixed" and device.type == "cuda":
        major, minor = cuda.get_device_capability(device)
        if major < 8:
            raise DeviceError(f"{who}: precision = \"bf16-mixed\" on {device} ({cuda.get_device_name(device)}, "
                              f"compute capability {major}.{minor}): bfloat16 needs 8.0 (Ampere) or newer; "
                              f"give this worker precision \"32\" in `precisions`")


def check_local(cfg, *, cuda=torch.cuda) -> None:
    """Every worker's device and precision on this machine (the local launcher's
    workers all run here): DeviceError, one line, for the first that it cannot give."""
    for rank in range(cfg.workers):
        who = f"worker {rank}"
        device = resolve(worker_device(cfg, rank), who, cuda=cuda)
        check_precision(worker_precision(cfg, rank), device, who, cuda=cuda)
    resolve(cfg.eval_device, "evaluation (eval_device)", cuda=cuda)


def set_deterministic(on: bool) -> None:
    """torch's deterministic algorithms (and cuBLAS's fixed workspace they need), so a
    GPU run can be compared with the reference; before the first CUDA call."""
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def autocast(device: torch.device, precision: str):
    """The step's forward under `precision`: bf16-mixed is torch.autocast to bfloat16
    (the weights, gradients and the wire stay float32)."""
    if precision == "bf16-mixed":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """A batch (tensors, or tuples, lists and dicts of them) on `device`."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device, non_blocking) for b in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


class DeviceLink:
    """Worker-side copies between the wire's host tensors and a model on `device`."""

    def __init__(self, model: nn.Module, blocks: list[Block], device: torch.device, depth: int = 0,
                 staged: bool | None = None):
        """`depth`: exchanges kept in flight while a step computes (overlap); `staged`:
        copy through host buffers (default: off the CPU only)."""
        self.model, self.blocks, self.device, self.depth = model, blocks, device, depth
        self.staged = device.type != "cpu" if staged is None else staged
        self.h2d_s = self.d2h_s = 0.0
        self._cuda = device.type == "cuda"
        self._pending: list[tuple[Any, Any]] = []  # CUDA events around copies in, read at `take_times`
        if not self.staged:
            return
        pin = self._cuda
        flat = _flat(model)
        self._flat = flat
        shape = {b.key: flat[b.name][b.start:b.stop] for b in blocks}

        def host(key):
            t = shape[key]
            return torch.empty(t.numel(), dtype=t.dtype, pin_memory=pin)

        self.inbound = {b.key: host(b.key) for b in blocks}
        self.outbound = [{b.key: host(b.key) for b in blocks} for _ in range(depth + 1)]
        self._turn = 0

    def write(self, values: dict[int, torch.Tensor]) -> None:
        """The pulled weights into the model (blocks without a value keep theirs)."""
        if not self.staged:
            return write_values(self.model, self.blocks, values, partial=True)
        t0 = time.perf_counter()
        mine = [b for b in self.blocks if b.key in values]
        for b in mine:  # host to pinned host, on the CPU
            self.inbound[b.key].copy_(values[b.key])
        self.h2d_s += time.perf_counter() - t0
        start = torch.cuda.Event(enable_timing=True) if self._cuda else None
        if start is not None:
            start.record()
        with torch.no_grad():
            for b in mine:  # pinned host to the device: queued, timed by the events
                self._flat[b.name][b.start:b.stop].copy_(self.inbound[b.key], non_blocking=self._cuda)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((start, end))

    def read(self, copy: bool = False) -> dict[int, torch.Tensor]:
        """What to push for each block: host tensors, ready to send. Unstaged: views of
        the model (`copy`: copies, for a push left in flight while the next backward
        overwrites .grad); staged: this turn's pinned buffers, filled once."""
        self.next_turn()
        return self.read_part(self.blocks, copy)

    def next_turn(self) -> None:
        """Start a push: the staged buffers it is read into are the next set's."""
        if self.staged:
            self._out = self.outbound[self._turn]
            self._turn = (self._turn + 1) % len(self.outbound)

    def read_part(self, blocks: list[Block], copy: bool = False) -> dict[int, torch.Tensor]:
        """`read` for some of the blocks, into the buffers of the push `next_turn` began
        (a push read in parts while backward runs)."""
        pushes = read_pushes(self.model, blocks)
        if not self.staged:
            return {k: t.clone() for k, t in pushes.items()} if copy else pushes
        t0 = time.perf_counter()
        out = self._out
        for k, t in pushes.items():
            out[k].copy_(t, non_blocking=self._cuda)
        if self._cuda:
            torch.cuda.current_stream(self.device).synchronize()  # the frames must be whole before they are sent
        self.d2h_s += time.perf_counter() - t0
        return {k: out[k] for k in pushes}

    def take_times(self) -> dict[str, float]:
        """h2d_s and d2h_s since the last call (a CUDA copy in is timed by its events,
        read once the step has synchronised)."""
        for start, end in self._pending:
            end.synchronize()
            self.h2d_s += start.elapsed_time(end) / 1e3
        self._pending = []
        out = {"h2d_s": self.h2d_s, "d2h_s": self.d2h_s}
        self.h2d_s = self.d2h_s = 0.0
        return out




class OutOfMemory(RuntimeError):
    """A step ran out of device memory with `size` samples (the worker's own catch of
    torch.OutOfMemoryError, after freeing what the step held)."""

    def __init__(self, size: int, message: str):
        super().__init__(message)
        self.size = size


@dataclass(frozen=True)
class MemoryProbe:
    """Peak memory of a step as base + per_sample · batch, against what the worker may
    use (`budget`), in bytes."""

    base: float
    per_sample: float
    budget: float

    def cap(self) -> int:
        """The largest batch whose predicted peak fits the budget (≥ 1)."""
        return max(1, int((self.budget - self.base) // max(self.per_sample, 1.0)))


def probe_memory(step: Callable[[int], None], device: torch.device, *, share: int = 1,
                 limit_gib: float = 0.0, sizes: tuple[int, int] = (2, 8),
                 fraction: float = 0.9) -> MemoryProbe | None:
    """Measure a step's peak memory at two batch sizes (`step(b)` runs a forward and
    backward on b samples) and fit base + per-sample bytes; the budget is `fraction` of
    what the device holds, shared by the `share` workers on it, or `limit_gib` (which
    torch then enforces for this process: above it a step runs out of memory). None off
    a GPU (host memory is not capped)."""
    if device.type != "cuda":
        return None
    _, total = torch.cuda.mem_get_info(device)
    if limit_gib:
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_gib * 2**30 / total), device)
    budget = fraction * (limit_gib * 2**30 if limit_gib else total / max(1, share))
    peaks = []
    for b in sizes:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            step(b)
        except torch.OutOfMemoryError:
            peaks.append(None)
            break
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device))
    if peaks[-1] is None:  # the probe itself did not fit: a cap of what did (at least 1)
        torch.cuda.empty_cache()
        fit = sizes[0] if len(peaks) == 2 else 1
        return MemoryProbe(0.0, budget / (fit + 0.5), budget)
    per = max(1.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
    return MemoryProbe(peaks[0] - per * sizes[0], per, budget)


__all__ = ["DeviceError", "DeviceLink", "MemoryProbe", "OutOfMemory", "PRECISIONS", "autocast", "check_local",
           "check_precision", "probe_memory", "resolve", "set_deterministic", "to_device", "worker_device",
           "worker_precision"]
