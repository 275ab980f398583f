"""What a server's parts may use of its core: the `Core` protocol.

A server (server/core.py) is a core — its listener, store, synchronisation state and
held replies — and parts built around it, each owning one responsibility: block moves
(`moves.BlockMoves`), streamed pushes (`fragments.FragmentPart`) and updates computed
ahead (`ahead.AheadUpdates`). A part is given the core at construction and reads only
what `Core` names; the core calls a part's methods, and its handler table points at a
part's `on_*` handlers directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import torch

if TYPE_CHECKING:
    from ..clock import Clock
    from ..policy.sync import ServerSync, Update
    from ..wire import Listener, Message, Transport
    from .handover import Forwarding
    from .store import ParameterStore, Prepared, Push


@dataclass
class Held:
    """A deferred reply: a pull, rows or state request waiting for `min_version`."""

    peer: bytes
    kind: str          # "pull", "rows" or "state"
    min_version: int
    since: float
    worker: int = -1   # the pulling worker
    part_bytes: int = 0  # forward_pull: the reply in parts of at least this many bytes, in key order
    early: dict | None = field(default=None)  # eager_update: the blocks sent ahead of the reply (None: not asked)
    wanted: dict | None = field(default=None)  # "rows": the rows of each table block asked for
    moved: dict | None = field(default=None)  # "rows": blocks asked for that were handed over: key -> address
    missing: list | None = field(default=None)  # "rows" asked ahead: blocks not held here (a list: asked ahead)


class Core(Protocol):
    """The state and the services of one server that its parts share."""

    rank: int
    timeout: float
    clock: Clock
    transport: Transport
    listener: Listener
    store: ParameterStore            # replaced whole when blocks move in or out
    sync: ServerSync
    pushes: dict[int, Push]          # the tensors of the pushes `sync` holds, by token
    held: list[Held]                 # deferred replies
    epoch: int
    eager: bool                      # eager_update is on
    block_grads: dict[int, int]      # gradients applied to each block held (they move with it)
    applied_at: dict[int, float]     # when each block's value was last computed
    early_at: dict[int, float]       # eager_update: when each block computed ahead was
    handover: Forwarding
    fragments: Any                   # fragments.Fragments (typed loosely: that module imports this one)
    ledger: Any                      # ledger.PushLedger: the push ids each block took
    replication: Any                 # replica.Replication, or None without replication
    busy_s: float                    # PSLD's measurements since the coordinator last asked
    bytes: int
    block_bytes: dict[int, int]      # of those bytes, each block's (migrations not counted)
    rows_served: int                 # tables' rows sent in rows replies, and the seconds their
    gather_s: float                  # gather (index_select) alone took

    def apply(self, update: Update, group: list[Push] | None = None, prepared: Prepared | None = None,
              norm: float | None = None) -> None: ...

    def charge(self, nbytes: int | Mapping[int, int], since: float) -> None: ...

    def release(self) -> None: ...

    def is_stale(self, msg: Message) -> bool: ...

    def hold(self, held: Held) -> None: ...

    def applied_s(self, h: Held, keys, at: dict[int, float] | None = None) -> dict: ...


def nbytes(tensors) -> int:
    """The bytes of `tensors` (an iterable of tensors)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def per_block(*maps: Mapping[int, torch.Tensor]) -> dict[int, int]:
    """The bytes of block-keyed tensors, by block (a push's gradients and its rows)."""
    out: dict[int, int] = {}
    for m in maps:
        for k, t in m.items():
            out[k] = out.get(k, 0) + t.numel() * t.element_size()
    return out


def remember_read(reads: dict, worker: int, stamp: int, values: dict, blocks: dict, kept: int) -> None:
    """Delay compensation needs w_then: the weights each worker read, kept for its last
    `kept` reads (a worker computes on its last pull's weights, or with overlap on the
    one before); `reads`: worker -> stamp -> {key: weights} (changed in place)."""
    mine = reads.setdefault(worker, {})
    if stamp not in mine:
        mine[stamp] = {k: v.detach().clone() for k, v in values.items() if k in blocks
                       and blocks[k].kind == "param"}
    while len(mine) > kept:
        del mine[min(mine)]


__all__ = ["Core", "Held", "nbytes", "per_block", "remember_read"]
