"""Starting the forward before all of the weights have arrived (`forward_pull`): the
pull's reply comes in parts, the first layers' blocks first (priority-based parameter
propagation: Jayarajan et al., "Priority-based Parameter Propagation for Distributed DNN
Training", MLSys 2019), and the forward waits per tensor, not for the whole pull.

While the step's forward runs under `guard()`, a torch function mode sees every torch
operation before it runs: one that takes a parameter or buffer of the model whose blocks
have not all arrived first writes every block that has come meanwhile into the model,
and waits for the rest of that tensor's. The servers send their blocks in key order,
the model's own order (its tensors as it created them), so the first layers find theirs
in the first part while the later parts are still on the wire. Watching operations, not
modules, is what makes this safe for any model: torch's own `nn.MultiheadAttention`
hands its child's `out_proj.weight` to an operation without calling the child, and a
module-level hook would have let it read the weight before it was written.

A block is never written into a tensor an operation has already used in this step
(autograd may have saved it; batch norm updates its running statistics in place): such
a block — one its server did not send before it was needed, i.e. handed to another
server since — keeps its value until `finish`, as in a pull taken whole. After the step,
`finish` waits for the rest and writes it. The time the forward waits is reported as
communication, not compute (LB-BSP's speeds do not see it).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..policy.placement import Block
from .client import Pulled, PSClient, Ticket
from ..device import DeviceLink


# Attributes whose reading does not read a tensor's values (`model.zero_grad` reads every
# parameter's `.grad`: a wait on it would wait for the whole pull before the forward).
# Not `.data`: it hands out the values under another tensor's identity.
_METADATA = frozenset({"grad", "grad_fn", "requires_grad", "is_leaf", "shape", "dtype", "device", "layout",
                       "ndim", "is_cuda", "names"})


def _metadata(func) -> bool:
    return getattr(func, "__name__", "") == "__get__" and getattr(getattr(func, "__self__", None), "__name__",
                                                                   None) in _METADATA


class _Watch(TorchFunctionMode):
    """Calls `seen(tensor)` for each tensor argument of every torch operation (one level
    into lists and tuples), before the operation runs; reads of a tensor's metadata
    (`_METADATA`) are not operations on its values."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _metadata(func):
            return func(*args, **kwargs)
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                self.seen(a)
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, torch.Tensor):
                        self.seen(b)
        return func(*args, **kwargs)


class ForwardPull:
    """Takes a pull's weights as they arrive while the step's forward runs."""

    def __init__(self, model: nn.Module, blocks: list[Block], link: DeviceLink, client: PSClient,
                 timeout: float):
        self.link, self.client, self.timeout = link, client, timeout
        by_name: dict[str, set[int]] = {}
        for b in blocks:
            by_name.setdefault(b.name, set()).add(b.key)
        # each parameter's and buffer's blocks, by the tensor's identity (a tied weight: one entry)
        self._keys: dict[int, frozenset[int]] = {}
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in by_name:
                self._keys[id(t)] = frozenset(by_name[name])
        self.ticket: Ticket | None = None
        self.written: set[int] = set()
        self.used: set[int] = set()  # blocks of the tensors an operation has used in this step
        self.wait_s = 0.0  # seconds the forward waited for weights since the last `take_wait`
        self._complete = False

    def arm(self, ticket: Ticket) -> None:
        """The next forward takes `ticket`'s weights as they come."""
        self.ticket, self.written, self.used, self._complete = ticket, set(), set(), False

    @property
    def armed(self) -> bool:
        return self.ticket is not None

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run the step's forward (and backward) under this: operations wait for the
        weights they read."""
        with _Watch(self._seen):
            yield

    def finish(self) -> Pulled:
        """Wait for the rest of the pull, write it, disarm; returns the pull."""
        ticket, self.ticket = self.ticket, None
        t0 = time.perf_counter()
        pulled: Pulled = self.client.wait(ticket)
        rest = {k: v for k, v in pulled.values.items() if k not in self.written}
        if rest:
            self.link.write(rest)
        self.wait_s += time.perf_counter() - t0
        return pulled

    def disarm(self) -> None:
        """Forget an armed pull without reading it (the job was rolled back)."""
        self.ticket = None

    def rest(self) -> tuple[dict[int, int], dict[int, int], float]:
        """`finish`: the versions, reads and held seconds of the pull the forward began on."""
        pulled = self.finish()
        return pulled.versions, pulled.reads, pulled.held_s

    def take_wait(self) -> float:
        got, self.wait_s = self.wait_s, 0.0
        return got

    def _seen(self, tensor: torch.Tensor) -> None:
        keys = self._keys.get(id(tensor))
        if keys is None or self.ticket is None:
            return
        if not keys <= self.written:
            self._need(keys)
        self.used |= keys

    def _need(self, keys: frozenset[int]) -> None:
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        while True:
            fresh = {k: v for k, v in self.client.arrived(self.ticket).items() if k not in self.used}
            if fresh:
                self.link.write(fresh)
                self.written.update(fresh)
            if keys <= self.written or self._complete:
                break  # (complete: a block not sent keeps its value)
            self._complete = self.client.progress(self.ticket, deadline, self.timeout)
        self.wait_s += time.perf_counter() - t0


__all__ = ["ForwardPull"]
