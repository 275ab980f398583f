"""Transport interfaces: one listening socket serving many peers, and connections.

Semantics shared by every transport:

* Messages are encoded with :func:`~equipoise.wire.message.encode` and decoded
  with :func:`~equipoise.wire.message.decode`; no pickle anywhere.
* Every receive takes a timeout in seconds (``0`` polls once).
* A :class:`Listener` logs (``equipoise.wire`` logger, warning level, naming
  the peer identity in hex and the reason) and drops any malformed message,
  then keeps waiting until its deadline.
* A :class:`Listener` may hold a request and answer it later (deferred reply);
  replies to peers that have gone away are silently dropped.
* Messages larger than the transport's ``max_bytes`` are refused at send time
  with :class:`WireError`.
* Listeners and connections are not thread-safe: each thread makes its own
  :class:`Connection`, and a :class:`Listener` is used by one thread.
* Sending may be zero-copy: do not modify a sent message's tensors in place
  afterwards (send clones, or see the transport's ``copy_threshold``).
* After a :class:`PeerTimeout`, a late reply may still arrive and be returned
  by the next ``recv``; callers that retry should check the reply's fields
  (e.g. ``version``/``step``) or open a fresh connection.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Callable, Hashable
from abc import ABC, abstractmethod

from .message import DEFAULT_MAX_BYTES, Message, WireError, frames_nbytes

log = logging.getLogger("equipoise.wire")


class PeerTimeout(TimeoutError):
    """No (valid) message arrived from a peer in time; the text names peer and timeout."""


class QuietLog:
    """Bounded logging of refusals: the first refusal of each kind from each peer is
    logged (one warning line); the rest are counted, and the count is logged in one line
    once per `every` seconds (at the next refusal), so a flood of bad messages writes a
    few lines, not one per message. At most `max_keys` (peer, kind) pairs are told apart
    per period (then one line per kind for all other peers), so memory stays bounded."""

    def __init__(self, logger: logging.Logger, every: float = 60.0, max_keys: int = 64) -> None:
        self.logger, self.every, self.max_keys = logger, every, max_keys
        self.seen: dict[tuple, int] = {}
        self.since, self.quiet, self.logged = time.monotonic(), 0, 0
        self._lock = threading.Lock()

    def __call__(self, peer: Hashable, kind: str, fmt: str, *args: object) -> bool:
        """Log `fmt % args` if it is the first of `kind` from `peer` this period;
        True if a line was written."""
        with self._lock:
            now = time.monotonic()
            if now - self.since >= self.every:
                if self.quiet:
                    self.logger.warning("%d more refusals like the above in the last %.0f s, not logged "
                                        "one by one", self.quiet, now - self.since)
                self.seen, self.quiet, self.since = {}, 0, now
            key = (peer, kind)
            if key not in self.seen and len(self.seen) >= self.max_keys:
                key = ("*", kind if len(self.seen) < 2 * self.max_keys else "*")
            n = self.seen[key] = self.seen.get(key, 0) + 1
            if n > 1:
                self.quiet += 1
                return False
            self.logged += 1
        self.logger.warning(fmt, *args)
        return True


_VARIABLE = re.compile(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\(.*\)|[-+]?\d[\w.+-]*")


def kind_of(reason: object) -> str:
    """The kind of a refusal: its text with numbers, quoted names and lists blanked."""
    return _VARIABLE.sub("#", str(reason))[:100]


_dropped = QuietLog(log)


def log_dropped(address: str, peer: bytes, reason: object) -> None:
    """Log a dropped malformed message (one warning line; the first of each kind per
    listener and peer, then counted: see QuietLog)."""
    _dropped((address, peer), kind_of(reason), "%s dropped message from peer %s: %s", address, peer.hex(),
             reason)


def check_size(frames: list, max_bytes: int) -> None:
    """Raise WireError if encoded ``frames`` exceed ``max_bytes`` in total."""
    total = frames_nbytes(frames)
    if total > max_bytes:
        raise WireError(f"message of {total} bytes exceeds max_bytes {max_bytes}")


def check_timeout(timeout: float) -> float:
    """Return ``timeout`` as a float >= 0; None or NaN is refused (no unbounded waits)."""
    value = float(timeout)  # TypeError for None
    if value != value:
        raise ValueError("timeout must be a number of seconds, not NaN")
    return max(value, 0.0)


class Listener(ABC):
    """The bound side: one socket serving many peers (ZeroMQ ROUTER)."""

    address: str

    @abstractmethod
    def recv(self, timeout: float) -> tuple[bytes, Message] | None:
        """Return ``(peer identity, message)``, or None if nothing valid arrived in time.
        The message's tensors are the receiver's own: no sender shares their memory."""

    @abstractmethod
    def send(self, peer: bytes, msg: Message) -> Callable[[], bool]:
        """Send ``msg`` to ``peer`` (now or later); dropped silently if the peer is gone.
        Returns a function telling whether the transport has finished reading the
        message's tensors (zero-copy sends read them after ``send`` returns): until it
        answers True, the tensors must not be modified."""

    @abstractmethod
    def close(self) -> None:
        """Release the socket; idempotent and never blocks."""

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Connection(ABC):
    """The connecting side (ZeroMQ DEALER), talking to one Listener."""

    address: str

    @abstractmethod
    def send(self, msg: Message) -> None:
        """Queue ``msg`` for the listener (raises PeerTimeout if it cannot be queued in time)."""

    @abstractmethod
    def recv(self, timeout: float) -> Message:
        """Return the next message; PeerTimeout if none in time, WireError if malformed."""

    def request(self, msg: Message, timeout: float) -> Message:
        """Send ``msg`` then wait up to ``timeout`` seconds for the next message."""
        self.send(msg)
        return self.recv(timeout)

    @abstractmethod
    def pending(self) -> bool:
        """Whether a message waits to be read now (a transport that cannot tell says
        True: the next `recv` then blocks as it would have)."""
        return True

    def close(self) -> None:
        """Release the socket; idempotent and never blocks."""

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_readable(conns: list["Connection"], timeout: float) -> list["Connection"]:
    """Those of `conns` with a message waiting, once one has or `timeout` s passed (then
    none). ZeroMQ connections are polled together; others are taken one at a time, in
    order (the first is returned, and its `recv` blocks as before)."""
    socks = [getattr(c, "_sock", None) for c in conns]
    if conns and all(sock is not None for sock in socks):
        import zmq

        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        ready = {sock for sock, _ in poller.poll(max(0, int(timeout * 1000)))}
        return [c for c, sock in zip(conns, socks) if sock in ready]
    return [next((c for c in conns if c.pending()), conns[0])] if conns else []


class Transport(ABC):
    """Factory for listeners and connections sharing one context."""

    max_bytes: int = DEFAULT_MAX_BYTES

    @abstractmethod
    def listen(self, host: str = "127.0.0.1") -> Listener:
        """Bind a new listener on ``host`` (a free port is chosen)."""

    @abstractmethod
    def connect(self, address: str) -> Connection:
        """Connect to a listener's ``address``; the listener need not exist yet."""

    @abstractmethod
    def close(self) -> None:
        """Close every listener/connection still open; call once their threads are done."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

