"""clip_grad_norm under a barrier, a server's part: a complete update is combined but not
stepped until the coordinator has the norm of every block on every server.

`NormWait` holds the update waiting (its pushes, the combined gradients, its blocks'
norms) and the coordinator's request for those norms, answered once the update is
complete. It is given what it uses — the store, the server's sync state, the pushes by
token, and how to reply — and nothing else of the server's. A change of the group (a
worker lost, a new count of pushes) puts the update back to pending (`release_group`),
for the sync state to judge again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..policy.sync import ServerSync, Update
from ..wire import Message
from .store import ParameterStore, Prepared, Push


@dataclass
class Waiting:
    update: Update
    group: list[Push]
    prepared: Prepared
    norms: dict[int, float]  # block key -> the L2 norm of its combined gradient


class NormWait:
    def __init__(self, store: Callable[[], ParameterStore], sync: ServerSync, pushes: dict[int, Push],
                 send: Callable[[bytes, Message], None]):
        """`store()` is the server's store now (a block move replaces it)."""
        self._store, self.sync, self.pushes, self.send = store, sync, pushes, send
        self.waiting: Waiting | None = None
        self.request: tuple[bytes, int] | None = None  # (coordinator's peer, version) not yet answered

    @property
    def store(self) -> ParameterStore:
        return self._store()

    def active(self) -> bool:
        """Whether complete updates wait for the norm (clipping under a barrier)."""
        return self.store.spec.clip > 0 and self.sync.policy.barrier()

    def hold(self, update: Update) -> None:
        """Combine `update` and wait for the global norm."""
        group = [self.pushes.pop(t) for t in update.tokens]
        prepared = self.store.prepare(group, list(update.sigmas))
        self.waiting = Waiting(update, group, prepared, self.store.grad_norms(prepared, self.store.blocks))
        self.answer()

    def release_group(self) -> None:
        """The group changes: the update waiting goes back to pending, as if never taken."""
        if self.waiting is not None:
            w, self.waiting = self.waiting, None
            self.pushes.update(zip(w.update.tokens, w.group))
            self.sync.pending[:0] = list(w.update.pushes)

    def ask(self, peer: bytes, version: int) -> None:
        """The coordinator asks for the norms of the update from `version`."""
        self.request = (peer, version)
        self.answer()

    def answer(self) -> None:
        if self.request is None:
            return
        peer, version = self.request
        if not any(b.kind == "param" for b in self.store.blocks.values()):
            norms: dict[int, float] = {}  # nothing to clip: no update waits here
        elif self.waiting is not None and self.sync.published() == version:
            norms = self.waiting.norms
        else:
            return  # the update is not complete yet
        self.request = None
        self.send(peer, Message("norm", {"version": version, "norms": sorted(norms.items())}))

    def take(self) -> Waiting | None:
        """The update waiting, to be clipped and stepped now (None if none)."""
        w, self.waiting = self.waiting, None
        return w
