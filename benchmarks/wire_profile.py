"""Where an equipoise server spends a push+pull: each step timed inside this process
(`profile_server`) and inside a real, instrumented server process
(`profile_server_process`), next to baselines and cheaper alternatives. Used by
`bench_wire --profile`; the servers and clients come from `benchmarks.harness`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import median
from benchmarks.harness import EquipoiseClient, RawEcho

# -- server-side profile -----------------------------------------------------------------------

class _StubListener:
    """Stands in for the server's ROUTER: encodes what the server sends (as the real
    listener does before its zero-copy send) and keeps the last message."""

    address = "stub://0"

    def __init__(self) -> None:
        self.last: Any = None
        self.encode_s = 0.0

    def send(self, peer: bytes, msg: Any) -> Callable[[], bool]:
        from equipoise.wire import encode

        t0 = time.perf_counter()
        encode(msg)
        self.encode_s += time.perf_counter() - t0
        self.last = msg
        return lambda: True  # sent at once: the store may update the lent tensors in place

    def recv(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        pass


class _StubTransport:
    def __init__(self) -> None:
        self.listener = _StubListener()

    def listen(self, host: str = "127.0.0.1") -> _StubListener:
        return self.listener


def profile_server(numel: int, reps: int = 5) -> dict[str, float]:
    """Median milliseconds of each piece of the server's work for one push and one pull
    of `numel` float32 elements, measured in this process (one torch thread), next to
    baselines (a copy into fresh vs reused memory) and cheaper alternatives of the
    costliest steps, for scale."""
    import numpy as np

    from equipoise.policy.placement import make_blocks
    from equipoise.server.core import Server
    from equipoise.server.store import OptimizerSpec, Push
    from equipoise.wire import Message, decode, encode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        transport = _StubTransport()
        server = Server(0, transport, "stub://coordinator")  # type: ignore[arg-type]
        blocks = make_blocks([("w", numel, "param", 4)], block_size=numel)
        spec = OptimizerSpec("sgd", 1e-6, 0.0, 0.0, "constant", 1, 100, 0.1, 1)
        server.handle(b"c", Message("init", {
            "blocks": [b.to_list() for b in blocks], "optimizer": spec.to_dict(), "version": 0,
            "samples": 0, "protocol": "asp", "workers": 1}, {"b0": torch.zeros(numel)}))
        store = server.store
        assert store is not None
        grad = torch.randn(numel) * 1e-3
        reused = torch.empty_like(grad)
        reused.copy_(grad)  # touched once: no page faults later
        push_msg = Message("push", {"worker": 0, "version": 0, "samples": 1}, {"g0": grad})
        pull_msg = Message("pull", {"worker": 0, "min_version": 0})
        samples: dict[str, list[float]] = {}

        def clock(name: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            out = fn()
            samples.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
            return out

        for _ in range(reps):
            frames = [bytearray(f) for f in encode(push_msg)]  # writable, like zmq.Frame
            clock("client: encode push", lambda: encode(push_msg))
            got = clock("server: decode push", lambda: decode(frames))
            push = Push(0, store.version, 1, {0: got.tensors["g0"]})
            clock("server: store.check (finite check)", lambda: store.check(push))
            clock("server: store.apply (weighted sum + SGD step)", lambda: store.apply([push]))
            reply = Message("params", {"version": store.version, "held_s": 0.0}, {"b0": store.values[0]})
            clock("server: encode params", lambda: encode(reply))
            clock("server: handle(push) total", lambda: server.handle(b"w", push_msg))
            clock("server: handle(pull) total", lambda: server.handle(b"w", pull_msg))
            clock("baseline: copy into fresh memory (clone)", lambda: grad.clone())
            clock("baseline: copy into reused memory", lambda: reused.copy_(grad))
            clock("part of apply: grad * 1.0 (fresh tensor)", lambda: grad * 1.0)
            clock("part of apply: optimizer.step", lambda: store.optimizer.step())
            clock("alternative: np.isfinite(a).all()", lambda: bool(np.isfinite(grad.numpy()).all()))
            clock("alternative: torch.aminmax both finite",
                  lambda: all(bool(torch.isfinite(v)) for v in torch.aminmax(grad)))
        return {name: median(values) for name, values in samples.items()}
    finally:
        torch.set_num_threads(threads)


def profile_server_process(numel: int, reps: int = 5, parts: int = 1) -> dict[str, float]:
    """Median milliseconds of each step inside a real (instrumented) server process over
    `reps` push+pulls, plus what the client saw, for one payload size; with `parts` > 1
    the exchange is streamed in that many blocks (`EquipoiseClient.push_pull_streamed`),
    and a step done per part (a fragment's) is the median over every part."""
    client = EquipoiseClient(numel, instrument=True, parts=parts)
    grad = torch.randn(numel) * 1e-3
    seen: dict[str, list[float]] = {"client: push+pull sent, to ack": [], "client: then to params": []}
    exchange = client.push_pull_streamed if parts > 1 else client.push_pull
    try:
        for _ in range(reps):
            push, pull = exchange(grad)
            seen["client: push+pull sent, to ack"].append(push * 1e3)
            seen["client: then to params"].append(pull * 1e3)
    finally:
        client.close()
    skip = ("server: decode init", "server: encode+send ready", "server: decode stop",
            "server: _speculate with nothing ready")
    # Every list starts with the reps' entries; the stop's ack comes last, after them.
    steps = {k: median(v[:reps] if k == "server: encode+send ack" else v)
             for k, v in sorted(client.server_ms.items()) if k not in skip}
    return {**{k: median(v) for k, v in seen.items()}, **steps}


def small_round_trip_ms(reps: int = 20) -> float:
    """Median ms of a raw 8-byte ZeroMQ round trip (the latency floor of one extra
    request/reply such as equipoise's separate ack)."""
    raw = RawEcho()
    try:
        payload = memoryview(b"12345678")
        for _ in range(3):
            raw.round_trip(payload)
        return median([raw.round_trip(payload) * 1e3 for _ in range(reps)])
    finally:
        raw.close()


