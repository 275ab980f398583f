"""Codec tests for equipoise.wire.message: round trips, rejections, fuzzing."""

from __future__ import annotations

import gc

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equipoise.wire import (
    DTYPES,
    MAX_HEADER_BYTES,
    SCHEMA,
    WIRE_VERSION,
    MIN_HEADER_BYTES,
    Message,
    WireError,
    decode,
    encode,
    register,
)

pytestmark = pytest.mark.timeout(60)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
plain = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)

FIELD_STRATEGIES = {
    str: st.text(max_size=10),
    int: st.integers(-(2**63), 2**63 - 1),
    float: st.floats(allow_nan=False) | st.integers(-(2**31), 2**31),
    bool: st.booleans(),
    list: st.lists(plain, max_size=3),
    dict: st.dictionaries(st.text(max_size=5), plain, max_size=3),
}


def field_strategy(ftype):
    types = ftype if isinstance(ftype, tuple) else (ftype,)
    return st.one_of([FIELD_STRATEGIES[t] for t in types])


@st.composite
def fields_for(draw, type_name):
    spec = SCHEMA[type_name]
    fields = {name: draw(field_strategy(ftype)) for name, ftype in spec.items()}
    extra = draw(st.dictionaries(st.text(max_size=6).filter(lambda k: k not in spec), plain, max_size=3))
    return {**extra, **fields}


def random_tensor(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


tensor_st = st.builds(
    random_tensor,
    st.sampled_from(list(DTYPES.values())),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
    st.integers(0, 2**31),
)


@st.composite
def messages(draw):
    type_name = draw(st.sampled_from(sorted(SCHEMA)))
    tensors = draw(st.dictionaries(st.text(max_size=6), tensor_st, max_size=4))
    return Message(type_name, draw(fields_for(type_name)), tensors)


def assert_same(got: Message, want: Message) -> None:
    assert got.type == want.type
    assert got.fields == want.fields
    assert list(got.tensors) == list(want.tensors)
    for name, t in want.tensors.items():
        assert got.tensors[name].dtype == t.dtype
        assert got.tensors[name].shape == t.shape
        assert torch.equal(got.tensors[name], t)
    assert got == want


@FAST
@given(messages())
def test_every_type_round_trips(msg):
    assert_same(decode(encode(msg)), msg)
    # read-only frames (bytes) take the copying path
    assert_same(decode([bytes(f) for f in encode(msg)]), msg)


@pytest.mark.parametrize("type_name", sorted(SCHEMA))
def test_each_schema_type_round_trips(type_name):
    fields_ok = {n: {str: "s", int: 7, float: 1.5, bool: True, list: [1], dict: {"a": 1}}[
        (t if isinstance(t, type) else t[0])] for n, t in SCHEMA[type_name].items()}
    msg = Message(type_name, fields_ok, {"b0": torch.ones(2, 3)})
    assert_same(decode(encode(msg)), msg)


def test_non_contiguous_bfloat16_and_zero_dim():
    base = torch.randn(4, 6)
    msg = Message("state", {"version": 1, "samples": 2}, {
        "t": base.t(), "s": base[:, ::2], "bf": base.to(torch.bfloat16),
        "z": torch.tensor(3.5, dtype=torch.float64), "e": torch.empty(0, 5, dtype=torch.int16),
        "g": torch.ones(3, requires_grad=True) * 2,
    })
    out = decode(encode(msg))
    for name, t in msg.tensors.items():
        assert torch.equal(out.tensors[name], t.detach()) and out.tensors[name].shape == t.shape


def test_a_header_with_tensors_behind_it_is_padded_and_padding_is_optional():
    # padded to MIN_HEADER_BYTES exactly when tensor frames follow (a frame of a few dozen
    # bytes ahead of a big one slows ZeroMQ on loopback), never when none do; a header
    # without the padding decodes the same
    msg = Message("push", {"worker": 1, "version": 2, "samples": 3}, {"g": torch.arange(8.0)})
    frames = encode(msg)
    assert len(frames[0]) == MIN_HEADER_BYTES
    assert len(encode(Message("ack", {"version": 3}))[0]) < MIN_HEADER_BYTES
    bare = msgpack.unpackb(frames[0], raw=False)
    del bare["p"]
    assert_same(decode([msgpack.packb(bare, use_bin_type=True), *frames[1:]]), msg)
    # headers of every size near the bound: padded to it exactly, or left as they are
    # when the padding's own 4 bytes would not fit (never an error)
    for k in range(150, 270):
        pad = Message("push", {"worker": 1, "version": 2, "samples": 3, "note": "n" * k}, {"g": torch.arange(8.0)})
        head = encode(pad)[0]
        assert len(head) == MIN_HEADER_BYTES or len(head) > MIN_HEADER_BYTES - 4
        assert_same(decode(encode(pad)), pad)


def test_decoded_tensors_are_writable_and_zero_copy_on_writable_frames():
    msg = Message("push", {"worker": 1, "version": 2, "samples": 3}, {"g": torch.arange(8.0)})
    frames = [bytearray(f) for f in encode(msg)]
    out = decode(frames)
    out.tensors["g"][0] = 42.0  # shares memory with the bytearray frame
    assert frames[1][:4] == torch.tensor([42.0]).numpy().tobytes()
    ro = decode([bytes(f) for f in encode(msg)])
    ro.tensors["g"].add_(1)  # a private copy: no warning, no error
    del frames
    gc.collect()
    assert out.tensors["g"][0].item() == 42.0


def test_decode_40mb_is_a_view_of_the_frame():
    """Decoding a writable frame copies nothing (what makes decoding 40 MB cheap): the
    tensor is the frame's memory."""
    msg = Message("params", {"version": 1, "held_s": 0.0}, {"b0": torch.randn(10_000_000)})
    frames = [bytearray(f) if i else f for i, f in enumerate(encode(msg))]
    out = decode(frames)
    assert out.tensors["b0"].numel() == 10_000_000
    frames[1][-4:] = torch.tensor([42.0]).numpy().tobytes()
    assert out.tensors["b0"][-1].item() == 42.0


# ---------------------------------------------------------------- rejections

GOOD = Message("ack", {"version": 3}, {"x": torch.arange(6, dtype=torch.int32).reshape(2, 3)})


def raw_header(**over):
    header = {"v": WIRE_VERSION, "t": "ack", "f": {"version": 3}, "x": [["x", "int32", [2, 3]]]}
    header.update(over)
    return msgpack.packb(header, use_bin_type=True)


def with_header(**over):
    return [raw_header(**over), *encode(GOOD)[1:]]


def test_raw_header_helper_is_valid():
    assert decode(with_header()) == GOOD


@pytest.mark.parametrize(
    "frames, needle",
    [
        ([], "non-empty"),
        (b"abc", "sequence of frames"),
        (None, "sequence of frames"),
        ([b"\xc1"], "msgpack"),
        ([b"\x85\xa1v"], "msgpack"),
        ([msgpack.packb([1, 2])], "map"),
        (with_header(v=2), "version"),
        (with_header(v=True), "version"),
        (with_header(v=1.0), "version"),
        ([msgpack.packb({"t": "ack"})], "version"),
        (with_header(t="nope"), "unknown message type"),
        (with_header(t=5), "type"),
        (with_header(f={}), "lacks field 'version'"),
        (with_header(f={"version": "3"}), "'version' should be int"),
        (with_header(f={"version": True}), "'version' should be int"),
        (with_header(f=[1]), "fields map"),
        (with_header(x=[["x", "complex64", [2, 3]]]), "dtype"),
        (with_header(x=[["x", "int32", [-2, -3]]]), "non-negative"),
        (with_header(x=[["x", "int32", [True, 6]]]), "non-negative"),
        (with_header(x=[["x", "int32"]]), "[name, dtype, shape]"),
        (with_header(x=[[1, "int32", [2, 3]]]), "name"),
        (with_header(x=[["x", "int32", [0] * 65]]), "dims"),
        # a zero beside huge dimensions: storage sized by multiplying them all overflows
        ([raw_header(x=[["x", "float32", [2**62, 2**62, 0]]]), b""], "overflows"),
        ([raw_header(x=[["x", "uint8", [2**31, 2**31, 2**31, 0]]]), b""], "overflows"),
        ([raw_header(x=[["x", "float32", [2**62]]]), b"\0" * 8], "overflows"),
        (with_header(x="x"), "tensor list"),
        ([raw_header(), *encode(GOOD)[1:], b""], "1 tensors but 2 frames"),
        ([raw_header()], "1 tensors but 0 frames"),
        ([raw_header(), bytes(encode(GOOD)[1])[:-1]], "expected 24"),
        ([raw_header(), bytes(encode(GOOD)[1]) + b"\x00"], "expected 24"),
        ([raw_header(), 12345], "not a contiguous byte buffer"),
        ([raw_header(x=[["x", "int32", [1]], ["x", "int32", [1]]]), b"\0" * 4, b"\0" * 4], "duplicate"),
        ([raw_header(x=[["b", "bool", [2]]]), b"\x01\x02"], "0/1"),
        (with_header(f={"version": 3, "when": msgpack.ExtType(5, b"x")}), "not plain"),
        (with_header(f={"version": 3, "when": msgpack.Timestamp(5)}), "not plain"),
        ([msgpack.packb({"v": 1, "t": "ack", "f": {"version": 3, "k": {1: 2}}, "x": []})], "msgpack"),
        ([b"\x81" + msgpack.packb("pad") + msgpack.packb(b"\0" * MAX_HEADER_BYTES)], "exceeds"),
    ],
)
def test_decode_rejects(frames, needle):
    with pytest.raises(WireError) as info:
        decode(frames)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_float_field_accepts_int_but_not_bool():
    assert decode(encode(Message("params", {"version": 1, "held_s": 2}))).fields["held_s"] == 2
    with pytest.raises(WireError, match="held_s"):
        decode([msgpack.packb({"v": 1, "t": "params", "f": {"version": 1, "held_s": False}, "x": []})])


def test_oversized_is_rejected():
    frames = encode(GOOD)
    decode(frames, max_bytes=sum(len(memoryview(f)) for f in frames))
    with pytest.raises(WireError, match="exceeds max_bytes"):
        decode(frames, max_bytes=20)


@pytest.mark.parametrize(
    "msg, needle",
    [
        (Message("nope"), "unknown"),
        (Message("ack", {}), "lacks"),
        (Message("ack", {"version": 1.0}), "should be int"),
        (Message("ack", {"version": 1, "s": {1, 2}}), "plain"),
        (Message("ack", {"version": 1, "d": {1: 2}}), "str keys"),
        (Message("ack", {"version": 1, "big": 2**70}), "packed"),
        (Message("ack", {"version": 1}, {"c": torch.zeros(2, dtype=torch.complex64)}), "dtype"),
        (Message("ack", {"version": 1}, {"u": torch.zeros(2, dtype=torch.uint16)}), "dtype"),
        (Message("ack", {"version": 1}, {"s": torch.eye(2).to_sparse()}), "dense CPU"),
        (Message("ack", {"version": 1}, {"n": [1.0]}), "not a torch.Tensor"),
        (Message("ack", {"version": 1}, {3: torch.zeros(1)}), "name"),
        (Message("ack", None), "dicts"),
        (Message("ack", {"version": 1, "blob": b"\0" * (MAX_HEADER_BYTES + 1)}), "header"),
    ],
)
def test_encode_rejects(msg, needle):
    with pytest.raises(WireError, match=needle):
        encode(msg)


def test_register_extends_schema():
    try:
        register("heartbeat", rank=int, load=(float, type(None)))
        msg = Message("heartbeat", {"rank": 1, "load": None})
        assert decode(encode(msg)) == msg
        with pytest.raises(WireError, match="load"):
            encode(Message("heartbeat", {"rank": 1, "load": "x"}))
        with pytest.raises(ValueError):
            register("bad", x="int")
    finally:
        SCHEMA.pop("heartbeat", None)


# ------------------------------------------------------------------ fuzzing

FUZZ = settings(max_examples=150, deadline=None)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_only_raise_wire_error(frames):
    try:
        decode(frames)
    except WireError:
        pass


@FUZZ
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "v": st.sampled_from([1, 1, 2, True, "1"]),
            "t": st.sampled_from(sorted(SCHEMA)) | plain,
            "f": plain,
            "x": st.lists(
                st.lists(plain, max_size=3)
                | st.tuples(st.text(max_size=2), st.sampled_from(sorted(DTYPES)),
                            # small, zero, and huge dimensions whose products overflow
                            st.lists(st.integers(-2, 3) | st.sampled_from([0, 2**31, 2**32 + 1, 2**61, 2**62,
                                                                            2**62 + 1, 2**63]), max_size=4)),
                max_size=3,
            ),
        },
    ),
    st.lists(st.binary(max_size=16) | st.just(b""), max_size=3),
)
def test_structured_fuzz_only_raises_wire_error(header, tail):
    try:
        decode([msgpack.packb(header, use_bin_type=True), *tail])
    except WireError:
        pass
