"""Wire protocol: pickle-free messages (msgpack header + raw tensor frames) and transports.

Typical use::

    from equipoise.wire import Message, make_transport

    transport = make_transport("zmq")            # or "memory" in tests
    listener = transport.listen()                # server side (ROUTER)
    conn = transport.connect(listener.address)   # client side (DEALER), one per thread
    conn.send(Message("ping"))
    peer, msg = listener.recv(timeout=1.0)
    listener.send(peer, Message("pong"))
    reply = conn.recv(timeout=1.0)
"""

from .message import (
    DEFAULT_MAX_BYTES,
    DTYPES,
    MAX_HEADER_BYTES,
    MIN_HEADER_BYTES,
    WIRE_VERSION,
    Message,
    WireError,
    decode,
    encode,
)
from .schema import SCHEMA, check_fields, register
from .transport import Connection, Listener, PeerTimeout, Transport, wait_readable
from .memory import InMemoryTransport
from .auth import JobKeys, generate_keys
from .zmq_transport import ZmqTransport

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DTYPES",
    "MAX_HEADER_BYTES",
    "MIN_HEADER_BYTES",
    "WIRE_VERSION",
    "Connection",
    "InMemoryTransport",
    "JobKeys",
    "Listener",
    "Message",
    "PeerTimeout",
    "SCHEMA",
    "Transport",
    "WireError",
    "ZmqTransport",
    "check_fields",
    "decode",
    "encode",
    "generate_keys",
    "make_transport",
    "register",
    "wait_readable",
]


def make_transport(kind: str = "zmq", **kw: object) -> Transport:
    """Create a transport: ``"zmq"`` (ZmqTransport) or ``"memory"`` (InMemoryTransport).
    It lives here, beside both transports, because transport.py (which they import)
    must not import them back."""
    if kind == "zmq":
        return ZmqTransport(**kw)  # type: ignore[arg-type]
    if kind in ("memory", "mem"):
        return InMemoryTransport(**kw)  # type: ignore[arg-type]
    raise ValueError(f"unknown transport kind {kind!r} (expected 'zmq' or 'memory')")
