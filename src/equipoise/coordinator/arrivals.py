"""Servers started while training runs (the coordinator's server manager's part): a
scenario's additions, started with the job so that their join costs an initialisation,
not a process start, and PSLD's or a user's, started at a barrier and joined once they
have registered."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..wire import Message
from .rpc import JobError, Peers


@dataclass(frozen=True)
class JoinServer:
    """A server started earlier has registered at `address`: initialise it empty."""

    server: int
    address: str


class Arrivals:
    """The servers started and not yet joined; `await_hello(what, wanted)` waits for a
    hello `wanted` accepts; a server that never registers fails the job after `timeout`."""

    def __init__(self, peers: Peers, await_hello: Callable[[str, Callable[[Message], bool]], bytes],
                 timeout: float):
        self.peers, self._await_hello, self.timeout = peers, await_hello, timeout
        self.spawning: dict[int, float] = {}  # started, not yet joined: rank -> start time
        self.hellos: dict[int, str] = {}  # of those, registered: rank -> address
        self.planned: dict[int, int] = {}  # scenario additions started early: rank -> join iteration

    def start(self, rank: int, joins_at: int | None = None) -> int:
        """Start the process of server `rank`; it registers with a hello later (and joins
        at iteration `joins_at`, waited for then, if given)."""
        self.spawning[rank] = time.monotonic()
        self.peers.spawn("server", rank)
        if joins_at is not None:
            self.planned[rank] = joins_at
        return rank

    def start_next(self, free: int) -> int:
        """Start the next server: rank `free` (the pool's next), or one above every server
        started earlier and not yet joined. Its rank."""
        return self.start(max([free - 1, *self.spawning]) + 1)

    def note_hello(self, msg: Message) -> bool:
        """Record the hello of a server started while training runs (it joins later)."""
        if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self.spawning:
            self.hellos[int(msg.fields["rank"])] = str(msg.fields["address"])
            return True
        return False

    def joining(self, t: int) -> list[JoinServer]:
        """The scenario's additions that join at iteration t, waited for if need be."""
        out = []
        for rank, at in sorted(self.planned.items()):
            if at <= t:
                del self.planned[rank]
                out.append(JoinServer(rank, self._hello(rank)))
        return out

    def arrived(self) -> list[JoinServer]:
        """The other servers that have registered since (PSLD's then get blocks by its
        next decision)."""
        out = []
        for rank, started in sorted(self.spawning.items()):
            if rank in self.planned:
                continue
            if rank in self.hellos:
                out.append(JoinServer(rank, self.hellos.pop(rank)))
                del self.spawning[rank]
            elif time.monotonic() - started > self.timeout:
                raise JobError(f"new server {rank} did not register within {self.timeout:.0f} s")
        return out

    def _hello(self, rank: int) -> str:
        if rank not in self.hellos:
            self._await_hello(f"new server {rank} to register", lambda m: m.fields.get("role") == "server"
                              and m.fields.get("rank") == rank)
        del self.spawning[rank]
        return self.hellos.pop(rank)


__all__ = ["Arrivals", "JoinServer"]
