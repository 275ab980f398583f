"""Starting the forward before all of the weights have arrived (`forward_pull`): the
pull's reply comes in parts, the first layers' blocks first (priority-based parameter
propagation: Jayarajan et al., "Priority-based Parameter Propagation for Distributed DNN
Training", MLSys 2019), and the forward waits per module, not for the whole pull.

A forward pre-hook on each module that registers parameters or buffers of its own waits
until their blocks have arrived, writing every block that has come meanwhile into the
model — never into a module whose forward has begun (autograd saved its tensors, and
batch norm updates its running statistics in place); the servers send their blocks in key order, which is the model's own order
(its parameters as it created them), so the first modules find theirs in the first part
while the later parts are still on the wire. After the step, `finish` waits for the rest
and writes it. A block its server did not send (handed to another server since: no
barrier) keeps its value, as in a pull taken whole.

The contract (as for any per-module prefetch): a parameter is used by the forward of a
module that registers it — its owner, or any module it is registered in (a tied weight) —
as torch's layers do. A model that reads another module's parameter directly (`x @
other.weight` in a parent's forward) would read it before it is written: such a model
must leave `forward_pull` off. The time the forward waits is reported as communication,
not compute (LB-BSP's speeds do not see it).
"""

from __future__ import annotations

import time

from torch import nn

from ..policy.placement import Block
from .client import Pulled, PSClient, Ticket
from .device import DeviceLink


class ForwardPull:
    """Forward pre-hooks on `model` that, while a pull is armed, write each module's
    blocks as they arrive and wait for the ones its forward needs."""

    def __init__(self, model: nn.Module, blocks: list[Block], link: DeviceLink, client: PSClient,
                 timeout: float):
        self.link, self.client, self.timeout = link, client, timeout
        by_name: dict[str, set[int]] = {}
        for b in blocks:
            by_name.setdefault(b.name, set()).add(b.key)
        # a tensor's first name (a tied weight has several): parameters, and buffers (batch
        # norm's running statistics, which its forward updates in place and autograd saves)
        names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        self._hooks = []
        for module in model.modules():
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            keys = set().union(*[by_name.get(names.get(id(t), ""), set()) for t in own])
            if keys:
                self._hooks.append(module.register_forward_pre_hook(self._hook(frozenset(keys))))
        self.ticket: Ticket | None = None
        self.written: set[int] = set()
        self.ran: set[int] = set()  # the blocks of the modules whose forward has begun
        self.wait_s = 0.0  # seconds the forward waited for weights since the last `take_wait`
        self._complete = False

    def arm(self, ticket: Ticket) -> None:
        """The next forward takes `ticket`'s weights as they come."""
        self.ticket, self.written, self.ran, self._complete = ticket, set(), set(), False

    @property
    def armed(self) -> bool:
        return self.ticket is not None

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

    def take_wait(self) -> float:
        got, self.wait_s = self.wait_s, 0.0
        return got

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _hook(self, keys: frozenset[int]):
        def pre(module: nn.Module, args) -> None:
            if self.ticket is None:
                return
            if not keys <= self.written:
                self._need(keys)
            self.ran |= keys
        return pre

    def _need(self, keys: frozenset[int]) -> None:
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        while True:
            # Not into a module whose forward has begun (autograd saved its tensors): such a
            # block (one its server did not send in time, e.g. moved) waits for `finish`.
            fresh = {k: v for k, v in self.client.arrived(self.ticket).items() if k not in self.ran}
            if fresh:
                self.link.write(fresh)
                self.written.update(fresh)
            if keys <= self.written or self._complete:
                break  # (complete: a block not sent keeps its value)
            self._complete = self.client.progress(self.ticket, deadline, self.timeout)
        self.wait_s += time.perf_counter() - t0


__all__ = ["ForwardPull"]
