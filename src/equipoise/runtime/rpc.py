"""What the coordinator's parts share to talk to their peers: the job's error, the
launcher's view of the processes, and awaiting a peer's reply with a deadline."""

from __future__ import annotations

import time
from typing import Protocol

from ..wire import Connection, Message, PeerTimeout


class JobError(RuntimeError):
    """The job cannot go on (a peer died, timed out or refused); the message names it."""


class Peers(Protocol):
    """What a launcher offers the coordinator: start a role, say if one died, and hear
    that one stopped on purpose."""

    def check(self) -> None:
        """Raise JobError naming a process that died."""

    def spawn(self, role: str, rank: int) -> None:
        """Start the process of `role` ("server" or "worker") with `rank`."""

    def retired(self, role: str, rank: int) -> None:
        """The process of `role` `rank` was told to stop: its exit is no failure."""


class Rpc:
    """Deadlines for everything the coordinator waits for; every wait checks the peers."""

    def __init__(self, timeout: float, peers: Peers):
        self.timeout, self.peers = timeout, peers

    def deadline(self) -> float:
        return time.monotonic() + self.timeout

    def tick(self, deadline: float | None, what: str) -> None:
        """Raise if a peer died or `deadline` passed while doing `what`."""
        self.peers.check()
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(f"timed out after {self.timeout:.0f} s {what}")

    def expect(self, conn: Connection, kind: str, who: str) -> Message:
        """The next message on `conn`, which must be a `kind`; JobError otherwise."""
        deadline = self.deadline()
        while True:
            self.peers.check()
            try:
                reply = conn.recv(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                break
            except PeerTimeout:
                if time.monotonic() > deadline:
                    raise JobError(f"{who} did not answer within {self.timeout:.0f} s") from None
        if reply.type == "error":
            raise JobError(f"{who} refused: {reply.fields['message']}")
        if reply.type != kind:
            raise JobError(f"{who} sent {reply.type!r}, expected {kind!r}")
        return reply

    def request(self, conn: Connection, msg: Message, kind: str, who: str) -> Message:
        conn.send(msg)
        return self.expect(conn, kind, who)


__all__ = ["JobError", "Peers", "Rpc"]
