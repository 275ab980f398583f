"""A server's update of each block as soon as all of its gradients are in
(`eager_update`, barrier protocols, with `backward_push` and `forward_pull`).

Backward makes the last layers' gradients first, and `backward_push` sends them while
the earlier layers' are still being computed. Under a barrier the server cannot publish
the next version before every worker's whole push is in, but a block's own update needs
only that block's gradients: once every worker of the update in progress has sent its
gradient of a block (in a fragment or its push), the server computes that block's update
on side buffers (`ParameterStore.speculate`), and sends it to each pull already waiting
for the next version as an *early* part of the reply. The block travels down while the
earlier layers' gradients still travel up — both directions of the links at once, which
is what a ring all-reduce gets and a push-then-pull exchange does not.

Nothing is published early. The update takes each speculated block's result only if its
group turned out the same (the same gradients, weights, learning rate and momentum, on
the same values: a worker lost or a slice cut again meanwhile changes them), else it
computes the block again; the store is bit-equal to one that updated whole. The reply's
final parts, sent once the version is published, say whether the early parts stand
(`kept`) or are sent again; the worker's client holds early parts back from the forward
until then (worker/client.py), so no step ever computes on weights of an unpublished
version.

Off (each block updated with the rest) when the update in progress waits for a lost
worker's shares, while blocks are handed over, and under replication (a version is
published when the backup has it).
"""

from __future__ import annotations

from ..wire import Message
from ..wire.names import pack
from .parts import Core, nbytes as _nbytes, per_block
from .store import Push


class AheadUpdates:
    """The server's side of `eager_update`: a part built around the server's core."""

    def __init__(self, core: Core):
        self.core = core

    def members(self) -> list[Push] | None:
        """The pushes the update in progress will be made of, as far as they have come
        (a worker's fragments so far stand for its push), if every worker's has begun
        to come and nothing makes the group uncertain; None otherwise."""
        sync = self.core.sync
        if not self.core.eager or not sync.policy.barrier() or sync.expected is not None or self.core.handover.moved \
                or self.core.replication is not None:
            return None
        group: list[Push] = []
        for p in sync.pending:
            if p.part:  # a lost worker's share: the group is being cut again
                return None
            group.append(self.core.pushes[p.token])
        pushed = {p.worker for p in sync.pending}
        for worker, parts in self.core.fragments.items():
            if worker in pushed or worker in sync.lost or parts.tags is None or parts.version != sync.version:
                continue
            t = parts.tags
            group.append(Push(worker, sync.version, t["samples"], parts.tensors, t["start"], t.get("count")))
        return group if len(group) == sync.policy.group_size(sync.workers) else None

    def speculate(self, keys) -> bool:
        """Compute ahead the update of each block of `keys` whose gradients are all in;
        True if any was."""
        group = self.members()
        if group is None:
            return False
        store = self.core.store
        ready = sorted(k for k in keys if k in store.blocks and k not in store.early
                       and all(k in p.tensors for p in group))
        if ready:
            store.speculate(group, ready)
            self.core.early_at.update(dict.fromkeys(ready, self.core.clock.now()))
        return bool(ready)

    def send_early(self, h) -> None:
        """Send a pull held for the next version the blocks computed ahead that it has
        not got yet, in parts, marked `early`."""
        store = self.core.store
        if h.early is None or h.min_version != self.core.sync.version + 1 or not store.early:
            return
        new = {k: e.value for k, e in sorted(store.early.items()) if k not in h.early}
        if not new:
            return
        t0 = self.core.clock.now()
        for part in split(new, h.part_bytes):
            self.core.charge(per_block(part), t0)
            msg = Message("params", {"version": h.min_version, "held_s": 0.0, "early": True, "last": False,
                                     **self.core.applied_s(h, part, self.core.early_at)}, pack(part))
            store.lend(list(part.values()), self.core.listener.send(h.peer, msg))
            h.early.update(part)
            t0 = self.core.clock.now()

    def kept(self, h) -> bool:
        """Whether every block sent to `h` early is the published value (its update took
        the speculation's result)."""
        return all(self.core.store.values.get(k) is t for k, t in h.early.items())


def split(values: dict, part_bytes: int) -> list[dict]:
    """`values` in key order, cut into parts of at least `part_bytes` (the last may be
    smaller; one empty part if there is nothing)."""
    parts: list[dict] = [{}]
    size = 0
    for key in sorted(values):
        if size >= part_bytes:
            parts.append({})
            size = 0
        parts[-1][key] = values[key]
        size += _nbytes([values[key]])
    return parts


__all__ = ["AheadUpdates", "split"]
