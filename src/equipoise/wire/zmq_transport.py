"""ZeroMQ transport: ROUTER listeners, DEALER connections, per-job authentication.

With ``keys`` (one process's :class:`~equipoise.wire.auth.JobKeys`), every listener, tcp
or ipc, is a CURVE (or PLAIN) server whose ZAP handler admits only the job's own
processes, and every received message carries its sender's role in ``Message.origin``
("coordinator", "server" or "worker") and its rank in ``Message.origin_rank``; a peer without the job's credentials fails the handshake and no
message of it is ever delivered. Without keys there is no authentication and ``origin``
and ``origin_rank`` are None. See wire/auth.py for the modes.

Each :class:`ZmqTransport` owns its own ``zmq.Context`` (never the global
instance); create transports in the process that uses them, i.e. after any
fork or spawn. Sockets close with LINGER 0, so ``close()`` never hangs and
unsent messages are discarded.

Frames of at least ``copy_threshold`` bytes are sent zero-copy: ZeroMQ reads
the tensor memory after ``send()`` returns, so a sent tensor must not be
modified in place. Pass ``copy_threshold=float("inf")`` to copy every frame
at send time instead (one memcpy per frame; then mutation is safe).

Received frames are not copied: decoded tensors share memory with them.

``MAXMSGSIZE`` is set to ``max_bytes`` on every socket: a peer sending a
single frame larger than that is disconnected by ZeroMQ itself (not logged).
Multi-frame messages whose total exceeds ``max_bytes`` are logged and dropped.
"""

from __future__ import annotations

import math
import os
import socket as _socket
import tempfile
import time
from typing import Any, Callable

import zmq

from .auth import JobKeys, ZapHandler, parse_identity, secure_connection, secure_listener
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

COPY_THRESHOLD = 64 * 1024
_WILDCARDS = ("*", "0.0.0.0", "")
_INT_MAX = 2**31 - 1


class ZmqTransport(Transport):
    """TCP transport over ZeroMQ; see the module docstring for copy semantics.

    ``max_bytes`` bounds every message both ways; ``keys`` (None: no authentication)
    secures every socket, see the module docstring;
    ``send_timeout`` bounds how long a connection's ``send`` may block when it
    cannot queue (no handshaken peer, or high-water mark) before PeerTimeout;
    ``copy_threshold``: frames at least this large are sent zero-copy.
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keys: JobKeys | None = None,
        *,
        send_timeout: float = 30.0,
        copy_threshold: float = COPY_THRESHOLD,
    ) -> None:
        self.max_bytes = int(max_bytes)
        self.keys = keys
        self.send_timeout = check_timeout(send_timeout)
        self.copy_threshold = copy_threshold
        self._zero_copy = copy_threshold < _INT_MAX
        self._ctx = zmq.Context()
        self._open: set[_ZmqEndpoint] = set()  # keeps sockets alive until closed
        self._zap: ZapHandler | None = None  # started by the first listener

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.linger = 0
        sock.sndtimeo = -1 if math.isinf(self.send_timeout) else int(self.send_timeout * 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_bytes)
        sock.copy_threshold = int(min(self.copy_threshold, _INT_MAX))
        return sock

    def listen(self, host: str = "127.0.0.1") -> Listener:
        """Bind a ROUTER on ``tcp://host:<free port>``, or on a fresh Unix socket
        under the temp dir when ``host == "ipc"`` (same machine only, about 1.6× the
        throughput of TCP loopback here).

        ``address`` is ``tcp://host:port``; for a wildcard host it advertises
        this machine's hostname instead.
        """
        if host == "ipc":
            return self._listen_ipc()
        sock = self._router()
        try:
            port = sock.bind_to_random_port(f"tcp://{host or '*'}")
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise OSError(f"cannot listen on {host!r}: {exc}") from None
        shown = _socket.gethostname() if host in _WILDCARDS else host
        return self._track(_ZmqListener(sock, f"tcp://{shown}:{port}", self))

    def _router(self) -> zmq.Socket:
        sock = self._socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self.keys is not None:
            try:
                secure_listener(sock, self.keys)
            except ValueError:
                sock.close(linger=0)
                raise
            if self._zap is None:  # before the bind: no handshake may find no handler
                self._zap = ZapHandler(self._ctx, self.keys)
        return sock

    def _listen_ipc(self) -> Listener:
        sock = self._router()
        path = tempfile.mktemp(prefix=f"equipoise-{os.getpid()}-", suffix=".sock")  # launch/warm.py: IPC_NAME_LEN
        try:
            sock.bind(f"ipc://{path}")
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise OSError(f"cannot listen on ipc://{path}: {exc}") from None
        return self._track(_ZmqListener(sock, f"ipc://{path}", self))

    def connect(self, address: str) -> Connection:
        """Connect a DEALER to ``address`` (e.g. ``tcp://127.0.0.1:5555``)."""
        sock = self._socket(zmq.DEALER)
        if self.keys is not None:
            secure_connection(sock, self.keys)
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ValueError(f"cannot connect to {address!r}: {exc}") from None
        return self._track(_ZmqConnection(sock, address, self))

    def _track(self, endpoint: "_ZmqEndpoint") -> Any:
        self._open.add(endpoint)
        return endpoint

    def close(self) -> None:
        """Close all sockets of this transport (LINGER 0) and terminate the context."""
        for endpoint in list(self._open):
            endpoint.close()
        if self._zap is not None:
            self._zap.close()
        if not self._ctx.closed:
            self._ctx.destroy(linger=0)


def _DONE() -> bool:
    return True


def _poll(sock: zmq.Socket, deadline: float) -> bool:
    """Wait until ``sock`` is readable or ``deadline`` (monotonic) passes."""
    while True:
        remaining = deadline - time.monotonic()
        if sock.poll(max(0, math.ceil(remaining * 1000)), zmq.POLLIN):
            return True
        if remaining <= 0 or time.monotonic() >= deadline:
            return False


class _ZmqEndpoint:
    """Socket ownership shared by listeners and connections."""

    def __init__(self, sock: zmq.Socket, address: str, transport: ZmqTransport) -> None:
        self._sock = sock
        self._transport = transport
        self.address = address
        self.max_bytes = transport.max_bytes
        self._auth = transport.keys is not None
        self._zero_copy = transport._zero_copy
        self._copy_threshold = transport.copy_threshold

    def _send(self, frames: list, track: bool = False) -> Callable[[], bool]:
        """Send a multipart message; with `track`, the returned function tells whether
        ZeroMQ has finished reading every frame sent zero-copy (send_multipart would
        track only the last frame, which may have been copied while others are read)."""
        if not self._zero_copy:
            self._sock.send_multipart(frames, copy=True)
            return _DONE
        trackers = []
        last, threshold = len(frames) - 1, self._copy_threshold
        for i, frame in enumerate(frames):
            tracked = track and memoryview(frame).nbytes >= threshold
            tracker = self._sock.send(frame, zmq.SNDMORE if i < last else 0, copy=False, track=tracked)
            if tracked:
                trackers.append(tracker)
        return (lambda: all(t.done for t in trackers)) if trackers else _DONE

    def close(self) -> None:
        self._sock.close(linger=0)
        self._transport._open.discard(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.address}>"


class _ZmqListener(_ZmqEndpoint, Listener):
    """ROUTER socket; see :class:`Listener` for the contract."""

    def close(self) -> None:
        super().close()
        if self.address.startswith("ipc://"):  # ZeroMQ leaves the socket's file behind
            try:
                os.unlink(self.address[len("ipc://"):])
            except OSError:
                pass

    def recv(self, timeout: float) -> tuple[bytes, Message] | None:
        deadline = time.monotonic() + check_timeout(timeout)
        while _poll(self._sock, deadline):
            frames = self._sock.recv_multipart(copy=False)
            peer = frames[0].bytes
            try:
                msg = decode(frames[1:], max_bytes=self.max_bytes)
                if self._auth:  # the identity ZAP gave this connection; never absent when authenticated
                    who = parse_identity(frames[-1].get("User-Id"))
                    if who is None:
                        raise WireError(f"no job identity for this connection ({frames[-1].get('User-Id')!r})")
                    msg.origin, msg.origin_rank = who
                return peer, msg
            except WireError as exc:
                log_dropped(self.address, peer, exc)
            if time.monotonic() >= deadline:
                break
        return None

    def send(self, peer: bytes, msg: Message) -> Callable[[], bool]:
        frames = encode(msg)
        check_size(frames, self.max_bytes)
        return self._send([peer, *frames], track=True)


class _ZmqConnection(_ZmqEndpoint, Connection):
    """DEALER socket; see :class:`Connection` for the contract."""

    def send(self, msg: Message) -> None:
        frames = encode(msg)
        check_size(frames, self.max_bytes)
        try:
            self._send(frames)
        except zmq.Again:
            timeout = self._sock.sndtimeo / 1000
            raise PeerTimeout(f"cannot queue message for {self.address} within {timeout}s") from None

    def pending(self) -> bool:
        return bool(self._sock.poll(0, zmq.POLLIN))

    def recv(self, timeout: float) -> Message:
        seconds = check_timeout(timeout)
        if not _poll(self._sock, time.monotonic() + seconds):
            raise PeerTimeout(f"no message from {self.address} within {seconds:g}s")
        frames = self._sock.recv_multipart(copy=False)
        try:
            return decode(frames, max_bytes=self.max_bytes)
        except WireError as exc:
            raise WireError(f"from {self.address}: {exc}") from None
