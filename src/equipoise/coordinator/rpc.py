"""What the coordinator's parts share to talk to their peers: the job's error, the
launcher's view of the processes, and awaiting a peer's reply with a deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from ..interrupt import check as interrupted
from ..wire import Connection, Message, PeerTimeout
from ..wire.auth import impersonated
from ..wire.transport import QuietLog, kind_of


_SENT_BY = {"plan_req": "worker", "table_req": "worker"}  # requests only workers send


class OriginCheck:
    """The coordinator's check of a message against its sender's authenticated identity
    (`Message.origin`, `Message.origin_rank`): a hello's claimed role, or a worker's
    request from another role, is refused, each (role, type) logged once; so is a hello
    or a worker's request that claims another rank than its credentials' (logged
    bounded, by QuietLog)."""

    def __init__(self, log):
        self.log = log
        self._refused: set[tuple[str, str]] = set()
        self._quiet = QuietLog(log)  # other refusals: bounded, whoever sends them

    def refuse(self, listener, peer: bytes, reason: str) -> None:
        """Answer `peer` with an error naming `reason`; log it (the first of its kind
        from that peer, then counts)."""
        self._quiet(peer, kind_of(reason), "refused a message from %s: %s", peer.hex(), reason)
        listener.send(peer, Message("error", {"message": reason[:500]}))

    def refusal(self, msg: Message) -> Message | None:
        """The error to answer `msg` with if its origin contradicts what it claims, else None."""
        if msg.origin is None:
            return None
        claimed = msg.fields.get("role") if msg.type == "hello" else _SENT_BY.get(msg.type, msg.origin)
        if claimed == msg.origin:
            return self._rank_refusal(msg)
        if (msg.origin, msg.type) not in self._refused:
            self._refused.add((msg.origin, msg.type))
            self.log.warning("refused a %r from a %s claiming to be a %s", msg.type, msg.origin, claimed)
        return Message("error", {"message": f"a {msg.origin} may not send {msg.type!r} as a {claimed}"})

    def _rank_refusal(self, msg: Message) -> Message | None:
        """The error for a message whose claimed rank (a hello's `rank`, a worker's
        `worker` field) is not the one its credentials vouch for (`Message.origin_rank`)."""
        rank = impersonated(msg)
        if rank is None:
            return None
        who = f"{msg.origin} {msg.origin_rank}"
        self._quiet(who, f"rank {msg.type}", "refused a %r claiming %s %s from the credentials of %s",
                    msg.type, msg.origin, str(rank)[:20], who)
        return Message("error", {"message": f"{who}'s credentials may not send {msg.type!r} as "
                                            f"{msg.origin} {str(rank)[:20]}"})


class JobError(RuntimeError):
    """The job cannot go on (a peer died, timed out or refused); the message names it."""


@dataclass(frozen=True)
class Failure:
    """A process lost: killed, or silent for several heartbeats (then killed, so that it
    cannot come back). `seen_s` is the launcher's monotonic clock when it was noticed."""

    role: str
    rank: int
    reason: str
    seen_s: float


class PeerLost(JobError):
    """A server of the job was lost and the coordinator can recover it: whatever was
    waiting for it is abandoned (the recovery resets every server and worker)."""

    def __init__(self, failure: Failure):
        super().__init__(f"{failure.role}{failure.rank} {failure.reason}")
        self.failure = failure


class Peers(Protocol):
    """What a launcher offers the coordinator: start a role, say if one died, and hear
    that one stopped on purpose."""

    def check(self) -> None:
        """Raise JobError naming a process that failed in a way no recovery covers (it
        exited with an error of its own, or a role not tolerated died)."""

    def lost(self) -> list[Failure]:
        """Processes of tolerated roles lost since the last call, each reported once
        (`check` raises PeerLost on noticing a lost server, to interrupt a wait for it)."""

    def tolerate(self, role: str) -> None:
        """From now on a lost process of `role` is reported by `lost`, not `check`."""

    def spawn(self, role: str, rank: int) -> None:
        """Start the process of `role` ("server" or "worker") with `rank`."""

    def retired(self, role: str, rank: int) -> None:
        """The process of `role` `rank` was told to stop: its exit is no failure."""

    def started(self) -> None:
        """Every process registered and was initialised: what the launcher keeps for later
        (the Ray launcher's warm standbys) may start now without slowing the job's start."""


class LaunchedPeers:
    """What both launchers' `Peers` share: `check` records each process lost of a
    tolerated role with `_report` (raising PeerLost for a server, to interrupt a wait for
    it); `lost` hands them over once."""

    def __init__(self) -> None:
        self.failed: list[Failure] = []
        self.reported: set[str] = set()  # names of processes reported lost

    def check(self) -> None:
        raise NotImplementedError

    def started(self) -> None:
        pass

    def _report(self, role: str, rank: int, reason: str, now: float) -> None:
        self.reported.add(f"{role}{rank}")
        failure = Failure(role, rank, reason, now)
        self.failed.append(failure)
        if role == "server":
            raise PeerLost(failure)

    def lost(self) -> list[Failure]:
        try:
            self.check()
        except PeerLost:
            pass  # it is in `failed`
        out, self.failed = self.failed, []
        return out


class Rpc:
    """Deadlines for everything the coordinator waits for; every wait checks the peers."""

    def __init__(self, timeout: float, peers: Peers):
        self.timeout, self.peers = timeout, peers

    def deadline(self) -> float:
        return time.monotonic() + self.timeout

    def tick(self, deadline: float | None, what: str) -> None:
        """Raise if a peer died or `deadline` passed while doing `what` (or Ctrl-C was
        pressed: `interrupt`)."""
        interrupted()
        self.peers.check()
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(f"timed out after {self.timeout:.0f} s {what}")

    def expect(self, conn: Connection, kind: str, who: str) -> Message:
        """The next message on `conn`, which must be a `kind`; JobError otherwise."""
        deadline = self.deadline()
        while True:
            interrupted()
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


__all__ = ["Failure", "JobError", "LaunchedPeers", "PeerLost", "Peers", "Rpc"]
