"""In-process transport with the same semantics as ZeroMQ, for tests.

Messages still go through :func:`encode`/:func:`decode`, so tests exercise
the codec. Each send copies the frames once into fresh writable buffers, so
like a real network the receiver never shares memory with the sender (the
sender may modify its tensors right after ``send``).

Addresses are ``mem://N`` and are only reachable through the transport object
that issued them; share that object between threads. Sending to a listener
that does not exist (yet, or any more) silently drops the message, like a
ZeroMQ DEALER whose peer never answers. :meth:`InMemoryTransport.inject`
delivers raw frames to a listener to test malformed-input handling.

There is no authentication: every peer lives in the process, so every received message
is trusted and has ``origin`` None (no role check applies; see wire/auth.py).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Sequence

from .message import DEFAULT_MAX_BYTES, Message, WireError, decode, encode
from .transport import (
    Connection,
    Listener,
    PeerTimeout,
    Transport,
    check_size,
    check_timeout,
    log_dropped,
)

_ids = itertools.count(1)


def _copy_frames(frames: Sequence[Any]) -> list[bytearray]:
    return [bytearray(f) for f in frames]


_CLOSED = object()  # put in an inbox by close(): a recv waiting on it raises at once


class InMemoryTransport(Transport):
    """Thread-safe queues standing in for sockets; see the module docstring."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._listeners: dict[str, _MemListener] = {}
        self._peers: dict[bytes, _MemConnection] = {}

    def listen(self, host: str = "127.0.0.1") -> Listener:
        """Create a listener at a fresh ``mem://N`` address (``host`` is ignored)."""
        listener = _MemListener(self, f"mem://{next(_ids)}")
        with self._lock:
            self._listeners[listener.address] = listener
        return listener

    def connect(self, address: str) -> Connection:
        """Connect to ``mem://N``; ValueError if the address is not of that form."""
        if not (isinstance(address, str) and address.startswith("mem://")):
            raise ValueError(f"cannot connect to {address!r}: not a mem:// address")
        identity = b"\x00" + next(_ids).to_bytes(4, "big")
        conn = _MemConnection(self, address, identity)
        with self._lock:
            self._peers[identity] = conn
        return conn

    def inject(self, address: str, frames: Sequence[Any], peer: bytes = b"\x00inject") -> bool:
        """Deliver raw ``frames`` (as given, not encoded) to the listener at ``address``.

        Returns False if no listener is there. Replies to ``peer`` are dropped
        unless ``peer`` is the identity of an open connection.
        """
        return self._to_listener(address, peer, list(frames))

    def _to_listener(self, address: str, peer: bytes, frames: list) -> bool:
        with self._lock:
            listener = self._listeners.get(address)
        if listener is None:
            return False
        listener._inbox.put((peer, frames))
        return True

    def _to_peer(self, peer: bytes, frames: list) -> None:
        with self._lock:
            conn = self._peers.get(peer)
        if conn is not None:
            conn._inbox.put(frames)

    def _forget(self, key: str | bytes) -> None:
        with self._lock:
            if isinstance(key, str):
                self._listeners.pop(key, None)
            else:
                self._peers.pop(key, None)

    def close(self) -> None:
        """Close every listener and connection of this transport."""
        with self._lock:
            items = [*self._listeners.values(), *self._peers.values()]
        for item in items:
            item.close()


class _MemListener(Listener):
    def __init__(self, transport: InMemoryTransport, address: str) -> None:
        self._transport = transport
        self._inbox: queue.Queue = queue.Queue()
        self.address = address
        self.closed = False

    def recv(self, timeout: float) -> tuple[bytes, Message] | None:
        self._check_open()
        deadline = time.monotonic() + check_timeout(timeout)
        while True:
            try:
                peer, frames = self._inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if frames is _CLOSED:
                raise RuntimeError(f"listener {self.address} is closed")
            try:
                return peer, decode(frames, max_bytes=self._transport.max_bytes)
            except WireError as exc:
                log_dropped(self.address, peer, exc)
            if time.monotonic() >= deadline:
                return None

    def send(self, peer: bytes, msg: Message):
        self._check_open()
        frames = encode(msg)
        check_size(frames, self._transport.max_bytes)
        self._transport._to_peer(peer, _copy_frames(frames))
        return lambda: True  # copied: the tensors may change at once

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"listener {self.address} is closed")

    def close(self) -> None:
        self.closed = True
        self._transport._forget(self.address)
        self._inbox.put((b"", _CLOSED))  # a recv waiting on it ends now

    def __repr__(self) -> str:
        return f"<MemListener {self.address}>"


class _MemConnection(Connection):
    def __init__(self, transport: InMemoryTransport, address: str, identity: bytes) -> None:
        self._transport = transport
        self._inbox: queue.Queue = queue.Queue()
        self.address = address
        self.identity = identity
        self.closed = False

    def send(self, msg: Message) -> None:
        self._check_open()
        frames = encode(msg)
        check_size(frames, self._transport.max_bytes)
        self._transport._to_listener(self.address, self.identity, _copy_frames(frames))

    def pending(self) -> bool:
        return not self._inbox.empty()

    def recv(self, timeout: float) -> Message:
        self._check_open()
        seconds = check_timeout(timeout)
        try:
            frames = self._inbox.get(timeout=seconds)
        except queue.Empty:
            raise PeerTimeout(f"no message from {self.address} within {seconds:g}s") from None
        if frames is _CLOSED:  # closed while this waited (by its owner or the transport's close)
            raise RuntimeError(f"connection to {self.address} is closed")
        try:
            return decode(frames, max_bytes=self._transport.max_bytes)
        except WireError as exc:
            raise WireError(f"from {self.address}: {exc}") from None

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"connection to {self.address} is closed")

    def close(self) -> None:
        self.closed = True
        self._transport._forget(self.identity)
        self._inbox.put(_CLOSED)  # a recv waiting on it ends now, not at its timeout

    def __repr__(self) -> str:
        return f"<MemConnection {self.address}>"
