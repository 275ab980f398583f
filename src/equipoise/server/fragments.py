"""A server's side of pushes sent in parts while the worker's backward runs
(`backward_push`): the fragments of each worker's push in progress, kept until the push
that ends it arrives and names how many went before it.

A fragment carries some of a push's gradients and the push's number (`seq`) among its
worker's streamed pushes; it gets no reply. The push that ends the sequence carries the
rest, the tags (version, samples, start, ...) and `fragments` = how many were sent; the
server then takes the fragments and that push as one push, through the same checks and
the same update as a push sent whole. A worker has one push in progress per server
(messages on a connection arrive in order, and a worker streams one push at a time), so
a fragment of a new `seq` abandons what an older one left (a step that ran out of
memory, or a push the worker never ended). At most `limit` workers' fragments are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..policy.sync import SyncFault
from ..protocol.fields import read_field
from ..wire import Message
from ..wire.names import grads_of
from .parts import Core, per_block
from .store import Push, PushError


@dataclass
class _Parts:
    seq: int
    count: int = 0
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    checked: set[int] = field(default_factory=set)
    version: int = -1  # the server's version when the first came (a barrier's update in progress)
    tags: dict | None = None  # the push's samples, start and count, where the worker sent them


class Fragments:
    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._by_worker: dict[int, _Parts] = {}

    def add(self, worker: int, seq: int, tensors: dict[int, torch.Tensor], checked: set[int], *,
            version: int = -1, tags: dict | None = None) -> None:
        """Keep a fragment of `worker`'s push `seq`, of which the blocks `checked` were
        checked on arrival (the others, handed over to another server, were not);
        `version`: the server's when it came, `tags`: the push's samples, start and
        count (`eager_update` combines the gradients before the push ends). PushError,
        and nothing kept, for a block already sent in this push."""
        parts = self._by_worker.get(worker)
        if parts is None and len(self._by_worker) >= self.limit:
            raise PushError(f"fragment of worker {worker}: fragments of {self.limit} workers' pushes "
                            "are held already")
        if parts is None or parts.seq != seq:
            parts = self._by_worker[worker] = _Parts(seq, version=version, tags=tags)
        again = sorted(set(tensors) & set(parts.tensors))
        if again:
            raise PushError(f"fragment of worker {worker}'s push {seq} repeats blocks {again[:5]}")
        parts.tensors.update(tensors)
        parts.checked |= set(tensors) & checked
        parts.count += 1

    def take(self, worker: int, seq: int | None, count: int) -> tuple[dict[int, torch.Tensor], set[int]]:
        """The gradients the `count` fragments of `worker`'s push `seq` brought, taken
        out, and which of their blocks were checked on arrival (none when `count` is 0:
        whatever an abandoned push left is dropped); PushError unless exactly that many
        arrived."""
        parts = self._by_worker.pop(worker, None)
        if count == 0:
            return {}, set()
        if parts is None or parts.seq != seq or parts.count != count:
            held = "none" if parts is None else f"{parts.count} of push {parts.seq}"
            raise PushError(f"push from worker {worker} ends {count} fragments of push {seq}, "
                            f"but this server holds {held}")
        return parts.tensors, parts.checked

    def items(self):
        """(worker, its push in progress) of each worker: the parts' seq, tensors,
        version and tags."""
        return self._by_worker.items()

    def drop(self, worker: int) -> None:
        self._by_worker.pop(worker, None)

    def clear(self) -> None:
        self._by_worker = {}

    def __len__(self) -> int:
        return len(self._by_worker)


class FragmentPart:
    """The server's handler of fragments: a part built around the server's core, with
    `ahead` (eager_update) to compute blocks ahead as their gradients come in."""

    def __init__(self, core: Core, ahead):
        self.core, self.ahead = core, ahead

    def on_fragment(self, peer: bytes, msg: Message) -> None:
        """Part of a push sent while the worker's backward runs (kept in `Fragments`):
        its blocks are checked now (size, dtype, finite: while the worker still
        computes) and kept until the push that ends it. A block handed over since is
        kept unchecked: the push's forwarding checks it. No reply, unless refused."""
        if self.core.is_stale(msg):
            return
        t0, f = self.core.clock.now(), msg.fields
        worker, seq = int(f["worker"]), count_field(f, "seq", None)
        if worker in self.core.sync.lost:
            raise SyncFault(f"fragment of worker {worker}, which was declared lost")
        tensors = grads_of(msg.tensors)
        mine = {k: t for k, t in tensors.items() if k in self.core.store.blocks}
        stray = sorted(k for k in tensors if k not in mine and k not in self.core.handover.moved)
        if stray or not tensors:
            raise PushError(f"fragment of worker {worker} has wrong blocks (unexpected {stray[:5]})")
        if mine:
            self.core.store.check(Push(worker, 0, 1, mine), partial=True)
        self.core.fragments.add(worker, seq, tensors, checked=set(mine), version=self.core.sync.version,
                           tags=_fragment_tags(f))
        self.core.charge(per_block(tensors), t0)
        if self.core.eager and mine and self.ahead.speculate(mine):
            self.core.release()


def _fragment_tags(f: dict) -> dict | None:
    """A fragment's tags of the push it belongs to (samples, start, count), checked;
    None if it has none."""
    if "samples" not in f:
        return None
    who = f"fragment of worker {f.get('worker')}"
    count = read_field(f, "count", float, who=who, least=0)
    return {"samples": read_field(f, "samples", int, who=who, least=1, required=True),
            "start": read_field(f, "start", int, who=who, least=-1, default=-1), **({} if count is None else {"count": count})}


def count_field(f: dict, name: str, default):
    """Field `name` of a request, an int ≥ 0 (`default` if absent); FieldError otherwise."""
    return read_field(f, name, int, who=f"request of worker {f.get('worker')}", least=0, default=default)


__all__ = ["FragmentPart", "Fragments", "count_field"]
