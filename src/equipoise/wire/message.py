"""Wire messages and their pickle-free codec.

A message travels as a list of frames: frame 0 is a msgpack header
``{"v": WIRE_VERSION, "t": type, "f": fields, "x": [[name, dtype, shape], ...]}``
and frames 1..k hold the raw bytes of each tensor listed in ``"x"`` (in order,
C-contiguous, native little-endian byte order). A header with tensor frames behind it
is padded to ``MIN_HEADER_BYTES`` with a ``"p"`` entry of zero bytes, which decoding
ignores: in raw pyzmq on loopback, a frame of a few dozen bytes (a push's or a params
reply's header) ahead of a multi-megabyte frame slows the big frame's transfer, and a
frame of a few hundred bytes does not.

Contracts:

* :func:`encode` returns frames whose tensor parts are zero-copy views of the
  (contiguous) tensors: do not modify those tensors in place until the frames
  have been sent and released.
* :func:`decode` raises :class:`WireError` (and nothing else) for any frames it
  does not accept. Decoded tensors are writable. When the frames are writable
  (``zmq.Frame`` from ``recv_multipart(copy=False)``, ``bytearray``) the tensors
  share memory with them, without a copy; read-only (``bytes``) or misaligned
  frames are copied once.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np
import torch

from .schema import SCHEMA, check_fields

WIRE_VERSION = 1
MIN_HEADER_BYTES = 256  # a header with tensors behind it is padded to this ("p": zeros)
DEFAULT_MAX_BYTES = 1 << 30
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS = 64
MAX_DIM = 1 << 62

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
    raise ImportError("equipoise.wire supports little-endian hosts only")


class WireError(ValueError):
    """A message could not be encoded or decoded; the text says why (one line)."""


@dataclass(eq=False)
class Message:
    """One protocol message.

    ``fields`` holds plain msgpack data (None, bool, int, float, str, bytes,
    list, dict with str keys; tuples arrive as lists). ``tensors`` maps names
    to CPU tensors of a dtype in :data:`DTYPES`. Equality compares type,
    fields and tensors exactly (dtype, shape, ``torch.equal``).

    ``origin`` is not sent: a listener that authenticates its peers sets it on a
    received message to the sender's job role ("coordinator", "server", "worker"),
    and ``origin_rank`` to its rank (None for the coordinator); both are None when the
    transport does not authenticate (wire/auth.py).
    """

    type: str
    fields: dict = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    origin: str | None = None
    origin_rank: int | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self.type != other.type or self.fields != other.fields:
            return False
        if self.tensors.keys() != other.tensors.keys():
            return False
        return all(_same_tensor(t, other.tensors[k]) for k, t in self.tensors.items())


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


def _check_plain(obj: Any) -> str | None:
    """Return None if ``obj`` is plain wire data, else the reason (iterative walk; a
    list or dict of scalars alone, the usual case, is passed by its set of types)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, (bool, int, float, str, bytes)):
            continue
        if type(item) in (list, tuple):  # exact: msgpack.ExtType is a tuple subclass
            if not _SCALARS.issuperset(map(type, item)):
                stack.extend(item)
        elif type(item) is dict:
            if not all(isinstance(k, str) for k in item):
                return "field dicts must have str keys"
            if not _SCALARS.issuperset(map(type, item.values())):
                stack.extend(item.values())
        else:
            return f"field value of type {type(item).__name__} is not plain wire data"
    return None


def _tensor_frame(name: str, t: Any) -> tuple[list, memoryview]:
    """Return the header entry and a zero-copy byte view for tensor ``name``."""
    if not isinstance(name, str):
        raise WireError(f"tensor name {name!r} is not a str")
    if not isinstance(t, torch.Tensor):
        raise WireError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
    if t.device.type != "cpu" or t.layout != torch.strided:
        raise WireError(f"tensor {name!r} must be a dense CPU tensor")
    dtype_name = _DTYPE_NAMES.get(t.dtype)
    if dtype_name is None:
        raise WireError(f"tensor {name!r} has unsupported dtype {t.dtype}")
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return [name, dtype_name, list(t.shape)], memoryview(flat.numpy())


def encode(msg: Message) -> list:
    """Encode ``msg`` into frames ``[header bytes, tensor views...]``.

    Validates the message like :func:`decode` would (type, required fields,
    plain field data, tensor dtypes); raises :class:`WireError` if invalid.
    """
    if not isinstance(msg.fields, dict) or not isinstance(msg.tensors, dict):
        raise WireError("message fields and tensors must be dicts")
    reason = check_fields(msg.type, msg.fields) or _check_plain(msg.fields)
    if reason:
        raise WireError(reason)
    entries, frames = [], []
    for name, t in msg.tensors.items():
        entry, view = _tensor_frame(name, t)
        entries.append(entry)
        frames.append(view)
    header = {"v": WIRE_VERSION, "t": msg.type, "f": msg.fields, "x": entries}
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"fields cannot be packed: {exc}") from None
    if frames and len(packed) <= MIN_HEADER_BYTES - 4:  # see the module's docstring
        header["p"] = bytes(MIN_HEADER_BYTES - len(packed) - 4)  # "p" and a bin8 length: 4 bytes
        packed = msgpack.packb(header, use_bin_type=True)
    if len(packed) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(packed)} bytes exceeds {MAX_HEADER_BYTES}")
    return [packed, *frames]


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total byte length of ``frames`` (as produced by :func:`encode`)."""
    return sum(memoryview(f).nbytes for f in frames)


def _as_bytes_view(frame: Any, index: int) -> memoryview:
    """A flat unsigned-byte memoryview of one frame (zmq.Frame, bytes, ...)."""
    buf = getattr(frame, "buffer", frame)
    try:
        view = memoryview(buf)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    except (TypeError, ValueError) as exc:
        raise WireError(f"frame {index} is not a contiguous byte buffer: {exc}") from None
    return view


def _unpack_header(view: memoryview) -> dict:
    if view.nbytes > MAX_HEADER_BYTES:
        raise WireError(f"header of {view.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(view, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for bad input
        raise WireError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise WireError("header is not a msgpack map")
    return header


def _check_header(header: dict) -> None:
    """Validate version, type, fields and the shape of the tensor table."""
    version = header.get("v")
    if type(version) is not int or version != WIRE_VERSION:
        raise WireError(f"wire version {version!r} != {WIRE_VERSION}")
    mtype, fields, table = header.get("t"), header.get("f"), header.get("x")
    if not isinstance(mtype, str):
        raise WireError("header type 't' is missing or not a str")
    if not isinstance(fields, dict) or not isinstance(table, list):
        raise WireError("header lacks a fields map 'f' or tensor list 'x'")
    reason = check_fields(mtype, fields) or _check_plain(fields)
    if reason:
        raise WireError(reason)


def _parse_entry(entry: Any) -> tuple[str, torch.dtype, tuple[int, ...]]:
    if not (isinstance(entry, list) and len(entry) == 3):
        raise WireError("tensor entry is not [name, dtype, shape]")
    name, dtype_name, shape = entry
    if not isinstance(name, str):
        raise WireError("tensor name is not a str")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireError(f"tensor {name!r} has unknown dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise WireError(f"tensor {name!r} shape is not a list of non-negative ints")
    if len(shape) > MAX_DIMS or any(d > MAX_DIM for d in shape):
        raise WireError(f"tensor {name!r} has more than {MAX_DIMS} dims or a huge dim")
    # Storage is sized by multiplying every dimension, zeros included in any order: a
    # zero beside huge ones overflows it before the zero is reached. The product of the
    # non-zero dimensions, in bytes, must fit in MAX_DIM.
    if math.prod(d for d in shape if d) * DTYPES[dtype_name].itemsize > MAX_DIM:
        raise WireError(f"tensor {name!r} of shape {shape[:8]} overflows an element count")
    return name, DTYPES[dtype_name], tuple(shape)


def _make_tensor(view: memoryview, name: str, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """Build the tensor over ``view`` (length already checked), copying only if needed."""
    if view.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    itemsize = dtype.itemsize
    raw = np.frombuffer(view, dtype=np.uint8)
    if dtype == torch.bool and int(raw.max()) > 1:
        raise WireError(f"bool tensor {name!r} holds bytes other than 0/1")
    if view.readonly or raw.ctypes.data % itemsize:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=dtype).reshape(shape)


def decode(frames: Sequence[Any], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Decode frames produced by :func:`encode`; raise :class:`WireError` if invalid.

    Accepts ``bytes``, ``bytearray``, ``memoryview`` or ``zmq.Frame`` items.
    Rejects: no frames, header > 1 MiB, bad msgpack, wrong version, unknown
    type, missing or mistyped required fields, non-plain field data, malformed
    tensor table, duplicate tensor names, frame count != tensor count, frame
    length != prod(shape) * itemsize, and total size > ``max_bytes``.
    """
    try:
        if isinstance(frames, (bytes, bytearray, memoryview, str)):
            raise TypeError
        frames = list(frames)
    except TypeError:
        raise WireError("expected a sequence of frames") from None
    if not frames:
        raise WireError("expected a non-empty sequence of frames")
    views = [_as_bytes_view(f, i) for i, f in enumerate(frames)]
    total = sum(v.nbytes for v in views)
    if total > max_bytes:
        raise WireError(f"message of {total} bytes exceeds max_bytes {max_bytes}")
    header = _unpack_header(views[0])
    _check_header(header)
    entries = [_parse_entry(e) for e in header["x"]]
    if len(views) - 1 != len(entries):
        raise WireError(f"header lists {len(entries)} tensors but {len(views) - 1} frames follow")
    tensors: dict[str, torch.Tensor] = {}
    for view, (name, dtype, shape) in zip(views[1:], entries):
        if name in tensors:
            raise WireError(f"duplicate tensor name {name!r}")
        expected = math.prod(shape) * dtype.itemsize
        if view.nbytes != expected:
            raise WireError(f"tensor {name!r} frame has {view.nbytes} bytes, expected {expected}")
        try:
            tensors[name] = _make_tensor(view, name, dtype, shape)
        except WireError:
            raise
        except Exception as exc:  # torch's own refusal of what passed the checks: still the message's fault
            raise WireError(f"tensor {name!r} cannot be built ({type(exc).__name__}: {str(exc)[:120]})") from None
    return Message(header["t"], header["f"], tensors)


__all__ = [
    "DEFAULT_MAX_BYTES",
    "DTYPES",
    "MAX_HEADER_BYTES",
    "MIN_HEADER_BYTES",
    "Message",
    "SCHEMA",
    "WIRE_VERSION",
    "WireError",
    "decode",
    "encode",
    "frames_nbytes",
]
