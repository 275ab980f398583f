"""Push+pull through a real equipoise server vs a raw pyzmq echo, side by side.

For each payload (float32 tensors of 1M and 10M elements, i.e. 4 MB and 40 MB):

* raw: a ZeroMQ ROUTER echo server in its own process; a DEALER client sends the bytes
  (zero-copy) and receives the echo. One round trip moves the payload there and back.
* equipoise: a real `equipoise.runtime.server.Server` in its own process, initialised by
  this process (playing the coordinator) with one block of that size under ASP; the
  client does what a worker does each iteration: push a gradient and wait for the ack,
  then pull and receive the parameters. That also moves the payload there and back.

Repetitions are interleaved (raw, equipoise, raw, equipoise, ...) after a warm-up; the
report is the median of each and the ratio equipoise/raw (target ≤ 1.3).
When equipoise is over target (or with --profile), the report shows where the time
goes: the steps of a real server process, timed by wrapping its methods inside that
process (no file is changed), and the same steps in this process next to baselines (a
copy into fresh vs reused memory) and cheaper alternatives.

Run from the repository root::

    python -m benchmarks.bench_wire --preset ci
    python -m benchmarks.bench_wire --preset full
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import torch
import zmq

from benchmarks.common import (
    git_state,
    interleave,
    load_average,
    markdown_table,
    median,
    ratio,
    scoped_env,
    write_results,
)

NAME = "bench_wire"
TARGET_RATIO = 1.3
MB = 1_000_000
DEFAULT_NUMELS = (1_000_000, 10_000_000)  # float32: 4 MB and 40 MB
SERVER_IDLE_TIMEOUT = 300.0
REPLY_TIMEOUT = 120.0
_STOP = b"stop"


@dataclass(frozen=True)
class WirePreset:
    numels: tuple[int, ...]
    reps: int
    warmup: int
    profile_reps: int


PRESETS: dict[str, WirePreset] = {
    "ci": WirePreset(DEFAULT_NUMELS, reps=5, warmup=2, profile_reps=5),
    "full": WirePreset(DEFAULT_NUMELS, reps=30, warmup=3, profile_reps=20),
}


@dataclass
class WireResult:
    """The timings of one payload size, in milliseconds per push+pull (or round trip)."""

    numel: int
    nbytes: int
    raw_ms: list[float] = field(default_factory=list)
    equipoise_ms: list[float] = field(default_factory=list)
    push_ms: list[float] = field(default_factory=list)   # push + ack
    pull_ms: list[float] = field(default_factory=list)   # pull + params

    @property
    def raw_median(self) -> float:
        return median(self.raw_ms)

    @property
    def equipoise_median(self) -> float:
        return median(self.equipoise_ms)

    @property
    def ratio(self) -> float:
        return ratio(self.equipoise_median, self.raw_median)

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "raw_median_ms": self.raw_median,
                "equipoise_median_ms": self.equipoise_median,
                "push_median_ms": median(self.push_ms), "pull_median_ms": median(self.pull_ms),
                "ratio": self.ratio, "target": TARGET_RATIO,
                "meets_target": bool(self.ratio <= TARGET_RATIO)}


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


def _equipoise_server(coordinator: str, timings: Pipe | None = None) -> None:
    """A real equipoise server, as the local launcher runs it (one torch thread). With a
    `timings` pipe, its steps are timed (by wrapping methods in this process only) and
    the list of milliseconds of each step is sent through the pipe when it stops."""
    from equipoise.runtime.server import Server
    from equipoise.wire import ZmqTransport

    torch.set_num_threads(1)
    record = _instrument_server() if timings is not None else None
    transport = ZmqTransport()
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
    from equipoise.runtime import server as server_mod
    from equipoise.runtime.store import ParameterStore
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
    S._on_pull = timer(S._on_pull, lambda a, o: "server: _on_pull total (clone+encode+send)")
    S._reply = timer(S._reply, lambda a, o: "server: _reply (clone of the values)")
    ParameterStore.check = timer(ParameterStore.check, lambda a, o: "server: store.check (finite check)")
    ParameterStore.apply = timer(ParameterStore.apply,
                                 lambda a, o: "server: store.apply (weighted sum + SGD step)")
    zmq_transport.decode = timer(zmq_transport.decode, lambda a, o: f"server: decode {o.type}")
    L = zmq_transport._ZmqListener
    L.send = timer(L.send, lambda a, o: f"server: encode+send {a[2].type}")
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
    float32 parameters (SGD, constant lr 1e-6, ASP, one worker), then acts as its worker."""

    def __init__(self, numel: int, *, instrument: bool = False) -> None:
        from equipoise.policy.placement import make_blocks
        from equipoise.runtime.store import OptimizerSpec
        from equipoise.wire import Message, ZmqTransport

        self.Message = Message
        self.transport = ZmqTransport()
        self.listener = self.transport.listen()
        self.timings: Pipe | None = None
        self.server_ms: dict[str, list[float]] = {}
        if instrument:
            self.timings, child = mp.get_context("spawn").Pipe(duplex=False)
            self.proc = _spawn(_equipoise_server, self.listener.address, child)
            child.close()
        else:
            self.proc = _spawn(_equipoise_server, self.listener.address)
        hello = self._hello()
        self.conn = self.transport.connect(hello.fields["address"])
        blocks = make_blocks([("w", numel, "param", 4)], block_size=numel)
        spec = OptimizerSpec("sgd", lr=1e-6, momentum=0.0, weight_decay=0.0, schedule="constant",
                             total=1, step_size=100, gamma=0.1, global_batch=1)
        self.conn.send(Message("init", {
            "blocks": [b.to_list() for b in blocks], "optimizer": spec.to_dict(), "version": 0,
            "samples": 0, "protocol": "asp", "workers": 1}, {"b0": torch.zeros(numel)}))
        self._expect("ready")
        self.version = 0

    def _hello(self) -> Any:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while time.monotonic() < deadline:
            got = self.listener.recv(timeout=0.5)
            if got is not None and got[1].type == "hello":
                return got[1]
            if not self.proc.is_alive():
                raise RuntimeError(f"equipoise server exited with code {self.proc.exitcode}")
        raise TimeoutError("equipoise server did not say hello")

    def _expect(self, kind: str) -> Any:
        reply = self.conn.recv(timeout=REPLY_TIMEOUT)
        if reply.type != kind:
            raise RuntimeError(f"equipoise server sent {reply.type!r} ({reply.fields}), expected {kind!r}")
        return reply

    def push_pull(self, grad: torch.Tensor) -> tuple[float, float]:
        """One worker iteration's traffic, sent as runtime/worker.py sends it: the push and
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

    def close(self) -> None:
        try:
            self.conn.send(self.Message("stop", {"reason": "benchmark finished"}))
            self._expect("ack")
            if self.timings is not None and self.timings.poll(REPLY_TIMEOUT):
                self.server_ms = self.timings.recv()
        finally:
            self.transport.close()
            _join(self.proc)


# -- the measurement -------------------------------------------------------------------------

def measure_wire(numels: Sequence[int] = DEFAULT_NUMELS, reps: int = 5, warmup: int = 2) -> list[WireResult]:
    """Interleaved raw / equipoise repetitions for each payload size (float32 elements)."""
    results = []
    for numel in numels:
        grad = torch.randn(numel) * 1e-3
        payload = memoryview(grad.numpy()).cast("B")
        result = WireResult(numel, payload.nbytes)
        raw = RawEcho()
        try:
            eq = EquipoiseClient(numel)
            try:
                def run_raw() -> float:
                    return raw.round_trip(payload) * 1e3

                def run_eq() -> tuple[float, float]:
                    push, pull = eq.push_pull(grad)
                    return push * 1e3, pull * 1e3

                runs: dict[str, list[Any]] = interleave({"raw": run_raw, "equipoise": run_eq},
                                                        reps, warmup=warmup)
            finally:
                eq.close()
        finally:
            raw.close()
        result.raw_ms = runs["raw"]
        result.push_ms = [push for push, _ in runs["equipoise"]]
        result.pull_ms = [pull for _, pull in runs["equipoise"]]
        result.equipoise_ms = [push + pull for push, pull in runs["equipoise"]]
        results.append(result)
    return results


# -- report ----------------------------------------------------------------------------------

def results_table(results: Sequence[WireResult]) -> str:
    rows = [[f"{r.nbytes / MB:g} MB", len(r.raw_ms), r.raw_median, r.equipoise_median,
             median(r.push_ms), median(r.pull_ms), r.ratio,
             "yes" if r.ratio <= TARGET_RATIO else "NO"] for r in results]
    return markdown_table(["payload", "reps", "raw ms", "equipoise ms", "eq to ack ms",
                           "eq then to params ms", "ratio eq/raw", f"≤ {TARGET_RATIO}?"], rows)


def profile_table(profiles: dict[int, dict[str, float]]) -> str:
    numels = sorted(profiles)
    names = list(dict.fromkeys(k for n in numels for k in profiles[n]))
    rows = [[name, *(profiles[n].get(name) for n in numels)] for name in names]
    return markdown_table(["step (median ms)", *(f"{n * 4 / MB:g} MB" for n in numels)], rows)


def run(preset: str, *, profile: bool | None = None, results_path: str | Path | None = None,
        numels: Sequence[int] | None = None) -> dict[str, Any]:
    """Run the benchmark with a preset, print the Markdown tables, write the JSON."""
    p = PRESETS[preset]
    sizes = tuple(numels) if numels else p.numels
    load_at_start, git_at_start = load_average(), git_state()
    results = measure_wire(sizes, reps=p.reps, warmup=p.warmup)
    print(f"## push+pull: equipoise server vs raw pyzmq echo (preset {preset}, "
          f"medians of {p.reps} interleaved reps)\n")
    print(results_table(results))
    over = any(not r.ratio <= TARGET_RATIO for r in results)
    payload: dict[str, Any] = {"preset": preset, "target_ratio": TARGET_RATIO,
                               "loadavg_at_start": load_at_start, "git_at_start": git_at_start,
                               "results": [r.summary() for r in results]}
    if profile or (profile is None and over):
        from benchmarks.wire_profile import profile_server, profile_server_process, small_round_trip_ms

        real = {n: profile_server_process(n, p.profile_reps) for n in sizes}
        local = {n: profile_server(n, p.profile_reps) for n in sizes}
        small = small_round_trip_ms()
        print(f"\n## where equipoise spends the time: a real server process, instrumented "
              f"(medians of {p.profile_reps} push+pulls)\n")
        print(profile_table(real))
        print(f"\n## the same steps in this process, with baselines and alternatives "
              f"(1 torch thread, medians of {p.profile_reps})\n")
        print(profile_table(local))
        print(f"\nraw 8-byte ZeroMQ round trip (floor of one extra request/reply): {small:.3f} ms")
        payload["profile_server_process_ms"] = {str(n): v for n, v in real.items()}
        payload["profile_in_process_ms"] = {str(n): v for n, v in local.items()}
        payload["small_round_trip_ms"] = small
    path = write_results(NAME, payload, results_path)
    print(f"\nwrote {path}")
    return payload


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--profile", action="store_true", default=None,
                        help="always profile the server side (default: only when over target)")
    parser.add_argument("--results", default=None, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args()
    run(args.preset, profile=args.profile, results_path=args.results)
