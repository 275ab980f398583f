"""Pushing gradients while backward still runs (`backward_push`): wait-free
backpropagation (Zhang et al., "Poseidon: An Efficient Communication Architecture for
Distributed Deep Learning on GPU Clusters", USENIX ATC 2017), on a parameter server.

A parameter's gradient is final once autograd has accumulated all of it
(`Tensor.register_post_accumulate_grad_hook`: once per backward, also for a parameter
used twice, such as tied embeddings). Backward produces them from the last layer to the
first, so the blocks of the last layers — often the largest, a classifier's or a language
model's head — are final while the earlier layers' backward is still to run. Each server's
final blocks are gathered until they reach `fragment_bytes`, then sent as a fragment
(`PSClient.push_fragment`); the push that ends a step carries the rest (blocks still
gathering, buffers, parameters that got no gradient) and names how many fragments went
before it, so that the server takes them all as one push (server/fragments.py): the
same update, bit for bit, as a push sent whole. A fragment's bytes travel, and are
checked by the server, while the worker computes the earlier layers' gradients.

Why a least size and not a fragment per block: each part costs the server a fixed
quarter of a millisecond or so (decoding, keeping, the dispatch; the streamed profile
in benchmarks/results/bench_wire.json) whatever it carries, so a fragment must carry
enough for that to be small beside its transfer: 256 KiB take about 2 ms at 1 Gbit/s
and 21 ms at 100 Mbit/s.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from ..policy.placement import Block
from ..device import DeviceLink


class BackwardPush:
    """Hooks on `model`'s parameters that, while armed, send each server its blocks'
    gradients in fragments of at least `fragment_bytes` as backward makes them final."""

    def __init__(self, model: nn.Module, blocks: list[Block], link: DeviceLink, fragment_bytes: int):
        self.link, self.fragment_bytes = link, max(1, int(fragment_bytes))
        params = dict(model.named_parameters())
        self._of: dict[str, list[Block]] = {}
        for b in blocks:
            if b.kind == "param":
                self._of.setdefault(b.name, []).append(b)
        # a frozen parameter (requires_grad False) gets no gradient and no hook: its blocks
        # go with the push that ends the step, as any parameter's that got no gradient
        self._hooks = [params[n].register_post_accumulate_grad_hook(self._hook(n)) for n in self._of
                       if params[n].requires_grad]
        self._send: Callable[[int, dict[int, torch.Tensor], int], None] | None = None
        self.seq = 0
        self._server_of: dict[int, int] = {}
        self._copy = False
        self._gathered: dict[int, list[Block]] = {}
        self._bytes: dict[int, int] = {}
        self.sent: dict[int, int] = {}  # server → fragments sent of the push in progress
        self.keys: set[int] = set()  # the blocks they carried
        self.first_s: float | None = None  # when the first gradient was final (perf_counter)

    def arm(self, server_of: dict[int, int], send: Callable[[int, dict[int, torch.Tensor], int], None],
            copy: bool) -> None:
        """Stream the next backward's gradients: `server_of` maps a block to its server,
        `send(server, tensors, seq)` sends a fragment; `copy`: send copies (a push left
        in flight while the next backward overwrites .grad)."""
        self.link.next_turn()
        self.seq += 1
        self._server_of, self._send, self._copy = server_of, send, copy
        self._gathered, self._bytes, self.sent, self.keys, self.first_s = {}, {}, {}, set(), None

    @property
    def armed(self) -> bool:
        return self._send is not None

    def finish(self) -> tuple[dict[int, tuple[int, int]], set[int]]:
        """Stop streaming: each server's (seq, fragments sent), and the blocks they
        carried; what was still gathering goes with the push that ends this one."""
        self._send = None
        return {r: (self.seq, n) for r, n in self.sent.items()}, self.keys

    def _hook(self, name: str):
        def ready(param: torch.Tensor) -> None:
            if self._send is None:
                return
            if self.first_s is None:
                self.first_s = time.perf_counter()
            for b in self._of[name]:
                r = self._server_of[b.key]
                self._gathered.setdefault(r, []).append(b)
                self._bytes[r] = self._bytes.get(r, 0) + b.numel * b.itemsize
                if self._bytes[r] >= self.fragment_bytes:
                    self._flush(r)
        return ready

    def _flush(self, r: int) -> None:
        blocks = self._gathered.pop(r)
        self._bytes[r] = 0
        self._send(r, self.link.read_part(blocks, self._copy), self.seq)
        self.sent[r] = self.sent.get(r, 0) + 1
        self.keys.update(b.key for b in blocks)


__all__ = ["BackwardPush"]
