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
from typing import Callable
from abc import ABC, abstractmethod

from .message import DEFAULT_MAX_BYTES, Message, WireError, frames_nbytes

log = logging.getLogger("equipoise.wire")


class PeerTimeout(TimeoutError):
    """No (valid) message arrived from a peer in time; the text names peer and timeout."""


def log_dropped(address: str, peer: bytes, reason: object) -> None:
    """Log a dropped malformed message (one warning line)."""
    log.warning("%s dropped message from peer %s: %s", address, peer.hex(), reason)


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
        """Return ``(peer identity, message)``, or None if nothing valid arrived in time."""

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
    def close(self) -> None:
        """Release the socket; idempotent and never blocks."""

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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

