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
    WIRE_VERSION,
    Message,
    WireError,
    decode,
    encode,
)
from .schema import SCHEMA, check_fields, register
from .transport import Connection, Listener, PeerTimeout, Transport, make_transport
from .memory import InMemoryTransport
from .zmq_transport import CurveKeys, ZmqTransport

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DTYPES",
    "MAX_HEADER_BYTES",
    "WIRE_VERSION",
    "Connection",
    "CurveKeys",
    "InMemoryTransport",
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
    "make_transport",
    "register",
]
