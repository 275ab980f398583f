"""The processes and clients the wire benchmark drives: a raw pyzmq ROUTER echo server
and a real equipoise server, each in a spawned child process, and the clients that talk
to them (`RawEcho`, `EquipoiseClient`). Shared by `bench_wire` (the measurement) and
`wire_profile` (where the time goes), which import this module and not each other."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

import torch
import zmq

from benchmarks.common import scoped_env

SERVER_IDLE_TIMEOUT = 300.0
REPLY_TIMEOUT = 120.0
_STOP = b"stop"


# -- the servers (child processes) -------------------------------------------------------

def _raw_echo_server(pipe: Pipe) -> None:
    """ROUTER echo: send every message back to its sender until a 4-byte b'stop'."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    pipe.send(port)
    pipe.close()
    try:
        while sock.poll(int(SERVER_IDLE_TIMEOUT * 1000), zmq.POLLIN):
            frames = sock.recv_multipart(copy=False)
            if len(frames) == 2 and len(frames[1]) == len(_STOP) and frames[1].bytes == _STOP:
                sock.send_multipart([frames[0], _STOP])
                break
            sock.send_multipart(frames, copy=False)
    finally:
        sock.close(linger=0)
        ctx.term()


def _equipoise_server(coordinator: str, timings: Pipe | None = None, keys: dict | None = None) -> None:
    """A real equipoise server, as the local launcher runs it (one torch thread), with the
    server's `JobKeys.to_dict()` if any. With a `timings` pipe, its steps are timed (by
    wrapping methods in this process only) and the list of milliseconds of each step is
    sent through the pipe when it stops."""
    from equipoise.server.core import Server
    from equipoise.wire import JobKeys, ZmqTransport

    torch.set_num_threads(1)
    record = _instrument_server() if timings is not None else None
    transport = ZmqTransport(keys=JobKeys.from_dict(keys) if keys else None)
    try:
        Server(0, transport, coordinator, timeout=SERVER_IDLE_TIMEOUT).serve()
    finally:
        transport.close()
        if timings is not None and record is not None:
            timings.send(dict(record))
            timings.close()


def _instrument_server() -> dict[str, list[float]]:
    """Wrap the server's steps with timers (in the calling process only); returns the
    dict the wrappers append milliseconds to, keyed by step (and message type)."""
    from equipoise.server import core as server_mod
    from equipoise.server.store import ParameterStore
    from equipoise.wire import zmq_transport

    record: dict[str, list[float]] = {}

    def timer(fn: Callable[..., Any], label: Callable[[tuple, Any], str]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            record.setdefault(label(args, out), []).append((time.perf_counter() - t0) * 1e3)
            return out
        return wrapper

    S = server_mod.Server
    S._on_push = timer(S._on_push, lambda a, o: "server: _on_push total (check+apply+ack)")
    S._on_pull = timer(S._on_pull, lambda a, o: "server: _on_pull total (encode+send)")
    S._reply = timer(S._reply, lambda a, o: "server: _reply (encode+send, values lent: no copy)")
    ParameterStore.check = timer(ParameterStore.check, lambda a, o: "server: store.check (finite check)")
    ParameterStore.apply = timer(ParameterStore.apply,
                                 lambda a, o: "server: store.apply (weighted sum + SGD step)")
    ParameterStore._copy_on_write = timer(ParameterStore._copy_on_write,
                                          lambda a, o: "server: part of apply: copy-on-write of lent values")
    zmq_transport.decode = timer(zmq_transport.decode, lambda a, o: f"server: decode {o.type}")
    L = zmq_transport._ZmqListener
    L.send = timer(L.send, lambda a, o: f"server: encode+send {a[2].type}")
    # a streamed exchange (EquipoiseClient(parts > 1)): per fragment
    from equipoise.server.ahead import AheadUpdates
    from equipoise.server.fragments import FragmentPart

    FragmentPart.on_fragment = timer(FragmentPart.on_fragment,
                                     lambda a, o: "server: _on_fragment total (check+keep+ahead+early)")
    AheadUpdates.speculate = timer(AheadUpdates.speculate, lambda a, o: "server: a block updated ahead (speculate)"
                                   if o else "server: _speculate with nothing ready")
    return record


def _spawn(target: Callable[..., None], *args: Any) -> mp.Process:
    ctx = mp.get_context("spawn")
    with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"):
        proc = ctx.Process(target=target, args=args, daemon=True)
        proc.start()
    return proc


def _join(proc: mp.Process, timeout: float = 10.0) -> None:
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)


# -- the clients ---------------------------------------------------------------------------

class RawEcho:
    """A DEALER talking to a raw ROUTER echo server in a child process."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        self.proc = _spawn(_raw_echo_server, child)
        child.close()
        if not parent.poll(REPLY_TIMEOUT):
            _join(self.proc, 0)
            raise RuntimeError("raw echo server did not start")
        port = parent.recv()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def _recv(self) -> list[zmq.Frame]:
        if not self.sock.poll(int(REPLY_TIMEOUT * 1000), zmq.POLLIN):
            raise TimeoutError("raw echo server did not answer")
        return self.sock.recv_multipart(copy=False)

    def round_trip(self, payload: memoryview) -> float:
        """Seconds to send `payload` (zero-copy) and receive its echo."""
        t0 = time.perf_counter()
        self.sock.send(payload, copy=False)
        frames = self._recv()
        dt = time.perf_counter() - t0
        if len(frames) != 1 or len(frames[0]) != payload.nbytes:
            raise RuntimeError("raw echo returned the wrong bytes")
        return dt

    def round_trip_parts(self, payload: memoryview, parts: int) -> float:
        """Seconds to send `payload` as `parts` messages back to back (zero-copy) and
        receive every echo: the echo of the first travels back while the rest still
        go out, as a streamed exchange's parts do."""
        size = -(-payload.nbytes // parts)
        pieces = [payload[i:i + size] for i in range(0, payload.nbytes, size)]
        t0 = time.perf_counter()
        for piece in pieces:
            self.sock.send(piece, copy=False)
        got = sum(len(self._recv()[0]) for _ in pieces)
        dt = time.perf_counter() - t0
        if got != payload.nbytes:
            raise RuntimeError("raw echo returned the wrong bytes")
        return dt

    def close(self) -> None:
        try:
            self.sock.send(_STOP)
            self._recv()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()
            _join(self.proc)


class EquipoiseClient:
    """Plays the coordinator of one real equipoise server holding one block of `numel`
    float32 parameters (SGD, constant lr 1e-6, ASP, one worker), then acts as its worker.
    `auth` is the job's config key: "off", or "curve"/"plain" with fresh keys, the server
    holding the server's, this process the coordinator's (init, stop) and the worker's
    (push, pull)."""

    def __init__(self, numel: int, *, instrument: bool = False, auth: str = "off", parts: int = 1) -> None:
        from equipoise.policy.placement import make_blocks
        from equipoise.server.store import OptimizerSpec
        from equipoise.wire import Message, ZmqTransport, generate_keys

        self.Message = Message
        keys = generate_keys(auth) if auth != "off" else None
        self.transport = ZmqTransport(keys=keys["coordinator"] if keys else None)
        self.worker = ZmqTransport(keys=keys["worker0"] if keys else None)
        server_keys = keys["server0"].to_dict() if keys else None
        self.listener = self.transport.listen()
        self.timings: Pipe | None = None
        self.server_ms: dict[str, list[float]] = {}
        if instrument:
            self.timings, child = mp.get_context("spawn").Pipe(duplex=False)
            self.proc = _spawn(_equipoise_server, self.listener.address, child, server_keys)
            child.close()
        else:
            self.proc = _spawn(_equipoise_server, self.listener.address, None, server_keys)
        hello = self._hello()
        self.control = self.transport.connect(hello.fields["address"])
        self.conn = self.worker.connect(hello.fields["address"])
        blocks = make_blocks([("w", numel, "param", 4)], block_size=-(-numel // parts))
        self.sizes = [b.numel for b in blocks]
        spec = OptimizerSpec("sgd", lr=1e-6, momentum=0.0, weight_decay=0.0, schedule="constant",
                             total=1, step_size=100, gamma=0.1, global_batch=1)
        streamed = {"protocol": "bsp", "eager_update": True} if parts > 1 else {"protocol": "asp"}
        self.control.send(Message("init", {
            "blocks": [b.to_list() for b in blocks], "optimizer": spec.to_dict(), "version": 0,
            "samples": 0, "workers": 1, **streamed},
            {f"b{b.key}": torch.zeros(b.numel) for b in blocks}))
        self._expect("ready", self.control)
        self.version = 0
        self.seq = 0

    def _hello(self) -> Any:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while time.monotonic() < deadline:
            got = self.listener.recv(timeout=0.5)
            if got is not None and got[1].type == "hello":
                return got[1]
            if not self.proc.is_alive():
                raise RuntimeError(f"equipoise server exited with code {self.proc.exitcode}")
        raise TimeoutError("equipoise server did not say hello")

    def _expect(self, kind: str, conn: Any = None) -> Any:
        reply = (conn or self.conn).recv(timeout=REPLY_TIMEOUT)
        if reply.type != kind:
            raise RuntimeError(f"equipoise server sent {reply.type!r} ({reply.fields}), expected {kind!r}")
        return reply

    def push_pull(self, grad: torch.Tensor) -> tuple[float, float]:
        """One worker iteration's traffic, sent as worker/loop.py sends it: the push and
        the pull go out back to back on the same (ordered) connection, then the ack and
        the parameters come back. Returns (seconds to the ack, then seconds to the params)."""
        Message = self.Message
        t0 = time.perf_counter()
        self.conn.send(Message("push", {"worker": 0, "version": self.version, "samples": 1},
                               {"g0": grad}))
        self.conn.send(Message("pull", {"worker": 0, "min_version": 0}))
        ack = self._expect("ack")
        t1 = time.perf_counter()
        params = self._expect("params")
        t2 = time.perf_counter()
        self.version = int(ack.fields["version"])
        if params.tensors["b0"].numel() != grad.numel():
            raise RuntimeError("equipoise server returned the wrong parameters")
        return t1 - t0, t2 - t1

    def push_pull_streamed(self, grad: torch.Tensor) -> tuple[float, float]:
        """The same traffic as a worker with backward_push, forward_pull and eager_update
        sends it (BSP, one worker, the block cut in `parts` blocks): the next version's pull
        first (parts of one block, early parts taken), then each block's gradient as a
        fragment but the last, which the push carries. The server updates each block as
        its fragment comes and sends it down at once (early), and with the version
        published says they stand (`kept`). Returns (seconds to the ack, then seconds to
        the last part of the weights)."""
        Message = self.Message
        grads = list(torch.split(grad, self.sizes))
        part_kb = -(-max(self.sizes) * 4 // 1024)
        t0 = time.perf_counter()
        self.conn.send(Message("pull", {"worker": 0, "min_version": self.version + 1, "part_kb": part_kb,
                                        "early": True}))
        for k, g in enumerate(grads[:-1]):
            self.conn.send(Message("fragment", {"worker": 0, "seq": self.seq, "samples": 1, "start": 0},
                                   {f"g{k}": g}))
        self.conn.send(Message("push", {"worker": 0, "version": self.version, "samples": 1, "start": 0,
                                        "seq": self.seq, "fragments": len(grads) - 1},
                               {f"g{len(grads) - 1}": grads[-1]}))
        self.seq += 1
        got, t1, last, kept = 0, None, False, False
        while t1 is None or not last:
            reply = self.conn.recv(timeout=REPLY_TIMEOUT)
            if reply.type == "ack":
                t1 = time.perf_counter()
                self.version = int(reply.fields["version"])
            elif reply.type == "params":
                got += sum(t.numel() for t in reply.tensors.values())
                last = reply.fields.get("last") is True
                kept = kept or reply.fields.get("kept") is True
            else:
                raise RuntimeError(f"equipoise server sent {reply.type!r} ({reply.fields})")
        t2 = time.perf_counter()
        if got != grad.numel() or not kept:
            raise RuntimeError(f"equipoise server returned {got} of {grad.numel()} parameters (kept: {kept})")
        return t1 - t0, t2 - t1

    def close(self) -> None:
        try:
            self.control.send(self.Message("stop", {"reason": "benchmark finished"}))
            self._expect("ack", self.control)
            if self.timings is not None and self.timings.poll(REPLY_TIMEOUT):
                self.server_ms = self.timings.recv()
        finally:
            self.worker.close()
            self.transport.close()
            _join(self.proc)
