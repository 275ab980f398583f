"""Fuzz a live parameter server: generated bad messages, valid traffic in between.

A real `equipoise.server.core.Server` runs in its own (spawned) process, logging to a
file, authenticated as in a real job (`--auth`, default "plain", the default of real
jobs; "curve"; or "off", no authentication, for comparison): one `generate_keys(auth)`
per run, the server listening with the job's "server" keys. This process plays its
coordinator with the "coordinator" keys (hello, then init: one block of NUMEL float32,
BSP with one worker, SGD lr 1 without momentum) and then three kinds of peers:

* fuzz peers: raw ZeroMQ DEALER sockets holding the job's "worker" keys, sending
  generated messages of the CATEGORIES of fuzz_messages.py (garbage bytes, truncated and oversized
  frames, valid headers with wrong fields, wrong dtypes, shapes (element counts that
  overflow among them: a zero beside huge dimensions) and names, stale and
  future versions, replays of valid pushes, unknown types); "control" messages
  (coordinator messages with bad contents) come from a raw DEALER with the
  "coordinator" keys, a buggy coordinator, since the server reads them from no other role;
  "impostor" peers, also worker-keyed, send well-formed coordinator-only messages (stop,
  init with other values, members, straggle, migrate, lose, expect, replicate,
  replica_req, flush, state_req, stats_req): each must be answered with an error, and
  none may take effect (any would stop the server, hang it or change the values);
* strangers: fresh identities that connect without keys or with another job's keys (of
  any role). They send fuzz messages and, with authentication, dangerous well-formed ones
  (coordinator-only messages, pushes for the version the server is at); they must get
  no reply and no handshake of theirs may succeed (socket monitor events);
* a well-behaved worker with the "worker" keys: every `valid_every` messages it pushes an
  integer-valued gradient for the version the server is at, pulls the next version and
  pings. The ack must carry version v + 1 and the parameters must equal, bit for bit,
  the initial values minus the sum of its gradients (small integers: exact in float32).

No fuzz push carries the version the server is at, so BSP refuses every one of them:
only the worker's pushes may change the values, and the check catches anything else.
With `--auth off` there is no role to refuse, so impostors are not sent (a `stop` would
end the run) and strangers send fuzz messages only: the old unauthenticated run.
Measured: replies by kind, server RSS (start, max, end), requests held (from the pong),
log lines the server wrote, and that the server stops cleanly when told to.

    python -m benchmarks.bench_fuzz --messages 100000 [--seed S] [--auth plain|curve|off]
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import zmq

from benchmarks.common import git_state, load_average, scoped_env, write_results
from benchmarks.fuzz_messages import CATEGORIES, MAX_BYTES, NUMEL, Generator

NAME = "bench_fuzz"
REPLY_TIMEOUT = 60.0         # a valid request unanswered this long is a hang
SEND_TIMEOUT = 60.0          # a fuzz socket that cannot queue this long: the server stopped reading
FUZZ_PEERS = 8
AUTH_MODES = ("plain", "curve", "off")
HANDSHAKE_EVENTS = {zmq.EVENT_HANDSHAKE_SUCCEEDED: "succeeded", zmq.EVENT_HANDSHAKE_FAILED_AUTH: "failed_auth",
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed_protocol",
                    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed_no_detail"}


# -- the server (child process) --------------------------------------------------------------

def _server_main(coordinator: str, log_path: str, keys: dict | None) -> None:
    """The server, with the job's "server" `JobKeys.to_dict()` (None: auth off)."""
    import torch

    from equipoise.server.core import Server
    from equipoise.wire import JobKeys, ZmqTransport

    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    transport = ZmqTransport(max_bytes=MAX_BYTES, keys=JobKeys.from_dict(keys) if keys else None)
    try:
        Server(0, transport, coordinator, timeout=300.0).serve()
    finally:
        transport.close()


# -- the run ----------------------------------------------------------------------------------

class Fuzz:
    """One fuzzing run against a fresh server process; `run()` returns the results dict.
    `auth` ("plain", "curve" or "off") is the job's config key: with keys, the server
    listens with the "server" keys, this process's coordinator uses the "coordinator"
    keys, the valid worker, the fuzz peers and the impostors the "worker" keys, and the
    strangers none or another job's."""

    def __init__(self, messages: int, seed: int = 0, *, valid_every: int = 50, auth: str = "plain") -> None:
        from equipoise.wire import JobKeys, ZmqTransport, generate_keys

        if auth not in AUTH_MODES:
            raise ValueError(f"auth {auth!r}: expected one of {AUTH_MODES}")
        self.messages, self.seed, self.valid_every, self.auth = messages, seed, valid_every, auth
        self.keys = generate_keys(auth) if auth != "off" else None
        # Strangers' credentials: every role of two other jobs (a bounded number of refused
        # credentials, which the server's ZAP handler logs once each); under CURVE also this
        # job's listening key with a client key of no role.
        self.foreign = [k for _ in range(2) for k in generate_keys(auth).values()] if self.keys else []
        if auth == "curve":
            self.foreign.append(JobKeys(auth, "coordinator", self.foreign[0].client, self.keys["worker0"].listener, {}))
        self.categories = {c: w for c, w in CATEGORIES.items() if self.keys or c != "impostor"}
        self.gen = Generator(seed, horizon=messages // valid_every + 2, authenticated=self.keys is not None)
        self.sent: Counter[str] = Counter()
        self.replies: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.failures: list[str] = []
        self.checks = 0
        self.rss: list[int] = []
        self.held: list[int] = []
        self.exchange_ms: list[float] = []
        self.impostor_sent: Counter[str] = Counter()
        self.impostor_refused: Counter[str] = Counter()
        self.impostor_wrong: list[str] = []   # impostor messages answered other than refused
        self.stranger_replies = 0
        self.stranger_sockets = 0
        self.stranger_unsent = 0
        self.handshakes: Counter[str] = Counter()  # strangers' handshake events
        self.log_path = Path(tempfile.mkdtemp(prefix="equipoise-fuzz-")) / "server.log"
        self.transport = ZmqTransport(max_bytes=MAX_BYTES, keys=self._keys("coordinator"))
        self.worker_transport = ZmqTransport(max_bytes=MAX_BYTES, keys=self._keys("worker"))
        self.ctx = zmq.Context()
        self.peers: list[zmq.Socket] = []
        self.buggy_coordinator: list[zmq.Socket] = []  # coordinator-keyed: sends "control"
        self.impostors: list[tuple[zmq.Socket, list[str]]] = []  # socket, types awaiting a reply
        self.strangers: list[tuple[zmq.Socket, zmq.Socket]] = []  # socket, its monitor

    def _keys(self, role: str) -> Any:
        return self.keys[{"worker": "worker0", "server": "server0"}.get(role, role)] if self.keys else None

    # sockets
    def _dealer(self, keys: Any) -> zmq.Socket:
        from equipoise.wire.auth import secure_connection

        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        if keys is not None:
            secure_connection(sock, keys)
        sock.connect(self.address)
        return sock

    def _stranger(self) -> tuple[zmq.Socket, zmq.Socket]:
        """A fresh identity without keys or with another job's (of any role), watched by a
        monitor socket that reports its handshakes."""
        rng = self.gen.rng
        keys = rng.choice(self.foreign) if self.foreign and rng.random() < 0.5 else None
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        monitor = sock.get_monitor_socket(sum(HANDSHAKE_EVENTS))
        if keys is not None:
            from equipoise.wire.auth import secure_connection
            secure_connection(sock, keys)
        sock.connect(self.address)
        self.stranger_sockets += 1
        return sock, monitor

    def _close_stranger(self, pair: tuple[zmq.Socket, zmq.Socket]) -> None:
        sock, monitor = pair
        self._watch(monitor)
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)

    def _watch(self, monitor: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(monitor)["event"]
            self.handshakes[HANDSHAKE_EVENTS.get(event, str(event))] += 1

    def _send(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        deadline = time.monotonic() + SEND_TIMEOUT
        while True:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not queue a message for {SEND_TIMEOUT:g} s: the server "
                                       f"stopped reading") from None
                self._drain()
                time.sleep(0.001)

    def _drain(self) -> None:
        from equipoise.wire.transport import kind_of

        for sock in self.peers + self.buggy_coordinator:
            while sock.poll(0, zmq.POLLIN):
                frames = sock.recv_multipart()
                try:
                    h = msgpack.unpackb(frames[0], raw=False)
                    self.replies[h["t"]] += 1
                    if h["t"] == "error":
                        self.errors[kind_of(h["f"]["message"])] += 1
                except Exception:  # the server sent something undecodable: a finding
                    self.replies["<undecodable>"] += 1
        for sock, waiting in self.impostors:
            while sock.poll(0, zmq.POLLIN):
                frames = sock.recv_multipart()
                mtype = waiting.pop(0) if waiting else "<none sent>"
                try:
                    h = msgpack.unpackb(frames[0], raw=False)
                    text = h["f"]["message"] if h["t"] == "error" else f"a {h['t']!r} reply"
                except Exception:
                    text = "an undecodable reply"
                if f"{mtype!r} from a worker" in text:
                    self.impostor_refused[mtype] += 1
                else:
                    self.impostor_wrong.append(f"{mtype}: {text[:200]}")
        for sock, monitor in self.strangers:
            while sock.poll(0, zmq.POLLIN):
                sock.recv_multipart()
                self.stranger_replies += 1
            self._watch(monitor)

    # the server process
    def _start(self) -> None:
        from equipoise.wire import Message

        self.listener = self.transport.listen()
        server_keys = self.keys["server0"].to_dict() if self.keys else None
        with scoped_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"):
            self.proc = mp.get_context("spawn").Process(
                target=_server_main, args=(self.listener.address, str(self.log_path), server_keys), daemon=True)
            self.proc.start()
        deadline = time.monotonic() + REPLY_TIMEOUT
        while (got := self.listener.recv(timeout=0.5)) is None or got[1].type != "hello":
            if time.monotonic() > deadline or not self.proc.is_alive():
                raise RuntimeError("the server did not say hello")
        self.address = got[1].fields["address"]
        self.ps = psutil.Process(self.proc.pid)
        self.admin = self.transport.connect(self.address)
        self.worker = self.worker_transport.connect(self.address)
        spec = {"name": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": 0.0, "schedule": "constant",
                "total": 10**9, "step_size": 10, "gamma": 0.1, "global_batch": 1}
        self.values = np.arange(NUMEL, dtype=np.float32)
        self.admin.send(Message("init", {"blocks": [[0, "w", 0, NUMEL, "param", 4]], "optimizer": spec,
                                         "version": 0, "samples": 0, "protocol": "bsp", "workers": 1},
                                {"b0": _tensor(self.values)}))
        self._expect(self.admin, "ready")

    def _expect(self, conn: Any, kind: str) -> Any:
        from equipoise.wire import PeerTimeout

        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:  # in short waits, to notice at once a server that died
            try:
                reply = conn.recv(timeout=0.5)
                break
            except PeerTimeout:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the server died (exit code {self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise
        if reply.type != kind:
            raise AssertionError(f"expected {kind!r}, got {reply.type!r} {reply.fields}")
        return reply

    def _valid_exchange(self) -> None:
        """Push for the current version, pull the next, ping: every answer exactly right."""
        from equipoise.wire import Message
        from equipoise.wire.message import encode

        v, t0 = self.gen.version, time.perf_counter()
        grad = np.array([self.gen.rng.randint(-3, 3) for _ in range(NUMEL)], dtype=np.float32)
        push = Message("push", {"worker": 0, "version": v, "samples": 1}, {"g0": _tensor(grad)})
        self.worker.send(push)
        ack = self._expect(self.worker, "ack")
        self.worker.send(Message("pull", {"worker": 0, "min_version": v + 1}))
        params = self._expect(self.worker, "params")
        self.worker.send(Message("ping", {}))
        pong = self._expect(self.worker, "pong")
        self.exchange_ms.append((time.perf_counter() - t0) * 1e3)
        self.values = self.values - grad  # SGD, lr 1: w − g, exact for these small integers
        got = params.tensors["b0"].numpy()
        problems = []
        if ack.fields["version"] != v + 1 or params.fields["version"] != v + 1 or pong.fields["version"] != v + 1:
            problems.append(f"versions {ack.fields['version']}, {params.fields['version']}, "
                            f"{pong.fields['version']} after a push for {v}")
        if got.shape != (NUMEL,) or not np.all(np.isfinite(got)) or not np.array_equal(got, self.values):
            problems.append(f"values differ from the valid pushes' (max |diff| "
                            f"{float(np.max(np.abs(got - self.values))) if got.shape == (NUMEL,) else 'shape'})")
        if problems:
            self.failures.append(f"check {self.checks}: " + "; ".join(problems))
            self.values = got.copy()
        self.checks += 1
        self.held.append(int(pong.fields.get("held", -1)))
        self.gen.version = v + 1
        self.gen.recent = (self.gen.recent + [[bytes(memoryview(f)) for f in encode(push)]])[-16:]

    def _sample(self) -> None:
        if not self.proc.is_alive():
            raise RuntimeError(f"the server died (exit code {self.proc.exitcode})")
        self.rss.append(self.ps.memory_info().rss)
        self.cpu_s = sum(self.ps.cpu_times()[:2])

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        crashed = hung = None
        stopped = False
        try:
            self._start()
            self.peers = [self._dealer(self._keys("worker")) for _ in range(FUZZ_PEERS)]
            if self.keys:
                self.impostors = [(self._dealer(self._keys("worker")), []) for _ in range(2)]
                self.buggy_coordinator = [self._dealer(self._keys("coordinator"))]
            self.strangers = [self._stranger() for _ in range(4)]
            self._valid_exchange()
            self._sample()
            names, weights = list(self.categories), list(self.categories.values())
            rng = self.gen.rng
            for i in range(1, self.messages + 1):
                category = rng.choices(names, weights)[0]
                if category == "impostor":
                    mtype, frames = self.gen.impostor()
                    sock, waiting = rng.choice(self.impostors)
                    self._send(sock, frames)
                    waiting.append(mtype)
                    self.impostor_sent[mtype] += 1
                elif category == "stranger":
                    frames = self.gen.make(category)
                    j = rng.randrange(len(self.strangers))
                    try:  # never blocks: a stranger that cannot queue is just dropped
                        self.strangers[j][0].send_multipart(frames, flags=zmq.NOBLOCK)
                    except zmq.Again:
                        self.stranger_unsent += 1
                    if rng.random() < 0.5:  # a fresh identity next time
                        self._close_stranger(self.strangers[j])
                        self.strangers[j] = self._stranger()
                elif category == "control" and self.buggy_coordinator:  # only its control messages are read
                    self._send(self.buggy_coordinator[0], self.gen.make(category))
                else:
                    self._send(rng.choice(self.peers), self.gen.make(category))
                self.sent[category] += 1
                if i % self.valid_every == 0:
                    self._valid_exchange()
                if i % 200 == 0:
                    self._drain()
                if i % 1000 == 0:
                    self._sample()
            self._valid_exchange()
            self._sample()
            self._await_impostor_replies()
            self.admin.send(_message("stop", {"reason": "fuzz finished"}))
            self._expect(self.admin, "ack")
            self.proc.join(REPLY_TIMEOUT)
            stopped = self.proc.exitcode == 0
        except AssertionError as exc:  # a valid request got the wrong kind of answer
            self.failures.append(str(exc))
        except (TimeoutError, RuntimeError) as exc:
            if getattr(self, "proc", None) is not None and self.proc.is_alive():
                hung = f"{type(exc).__name__}: {exc}"
            else:
                crashed = f"exit code {getattr(getattr(self, 'proc', None), 'exitcode', None)}: {exc}"
        finally:
            self._drain()
            for pair in self.strangers:
                self._close_stranger(pair)
            self.ctx.destroy(linger=0)
            self.transport.close()
            self.worker_transport.close()
            if getattr(self, "proc", None) is not None and self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(5)
        return self._results(time.perf_counter() - t0, crashed, hung, stopped)

    def _await_impostor_replies(self) -> None:
        """Drain until every impostor message has its answer (REPLY_TIMEOUT at most);
        those still unanswered are reported."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            self._drain()
            if not any(waiting for _, waiting in self.impostors) or time.monotonic() > deadline:
                return
            if not self.proc.is_alive():
                raise RuntimeError(f"the server died (exit code {self.proc.exitcode})")
            time.sleep(0.01)

    def _results(self, seconds: float, crashed: str | None, hung: str | None, stopped: bool) -> dict[str, Any]:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        tracebacks = sum("Traceback" in line for line in lines)
        mb = [round(r / 2**20, 1) for r in self.rss] or [math.nan]
        results = {
            "auth": self.auth, "seed": self.seed, "messages": sum(self.sent.values()), "valid_every": self.valid_every,
            "sent_by_category": dict(sorted(self.sent.items())),
            "replies_by_kind": dict(sorted(self.replies.items())),
            "top_errors": dict(self.errors.most_common(20)),
            "valid_checks": self.checks, "valid_checks_failed": len(self.failures),
            "failures": self.failures[:10],
            "impostor": {"sent": sum(self.impostor_sent.values()), "refused": sum(self.impostor_refused.values()),
                         "unanswered": sum(len(w) for _, w in self.impostors),
                         "answered_otherwise": len(self.impostor_wrong), "examples": self.impostor_wrong[:10],
                         "sent_by_type": dict(sorted(self.impostor_sent.items()))},
            "strangers": {"sockets": self.stranger_sockets, "replies": self.stranger_replies,
                          "unsent": self.stranger_unsent, "handshakes": dict(sorted(self.handshakes.items()))},
            "valid_exchange_ms_median": float(np.median(self.exchange_ms)) if self.exchange_ms else math.nan,
            "valid_exchange_ms_max": max(self.exchange_ms, default=math.nan),
            "server_rss_mb": {"start": mb[0], "max": max(mb), "end": mb[-1]},
            "held": {"max": max(self.held, default=-1), "end": self.held[-1] if self.held else -1},
            "log_lines": len(lines), "log_warnings": sum(" WARNING " in line for line in lines),
            "log_tracebacks": tracebacks,
            "crashed": crashed, "hung": hung, "stopped_cleanly": stopped,
            "server_cpu_s": round(getattr(self, "cpu_s", math.nan), 2), "seconds": round(seconds, 2),
            "messages_per_s": round(sum(self.sent.values()) / seconds, 1),
        }
        results["problems"] = problems(results)
        if results["problems"]:  # the server's log stays for a look
            results["server_log"] = str(self.log_path)
        else:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)
        return results


def problems(r: dict[str, Any]) -> list[str]:
    """What went wrong in a run's results (empty: the server passed)."""
    found = []
    if r["crashed"] or r["hung"]:
        found.append(f"crashed: {r['crashed']}" if r["crashed"] else f"hung: {r['hung']}")
    if not r["stopped_cleanly"]:
        found.append("did not stop cleanly")
    if r["valid_checks_failed"]:
        found.append(f"{r['valid_checks_failed']} valid exchanges wrong")
    imp = r["impostor"]
    if imp["refused"] != imp["sent"] or imp["answered_otherwise"] or imp["unanswered"]:
        found.append(f"impostors: {imp['refused']} of {imp['sent']} refused, {imp['answered_otherwise']} "
                     f"answered otherwise, {imp['unanswered']} unanswered")
    if r["auth"] != "off" and (r["strangers"]["replies"] or r["strangers"]["handshakes"].get("succeeded")):
        found.append(f"strangers: {r['strangers']['replies']} replies, "
                     f"{r['strangers']['handshakes'].get('succeeded', 0)} handshakes succeeded")
    return found


def _tensor(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a.copy())


def _message(mtype: str, fields: dict) -> Any:
    from equipoise.wire import Message

    return Message(mtype, fields)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--valid-every", type=int, default=50, help="a valid exchange every N messages")
    parser.add_argument("--auth", choices=AUTH_MODES, default="plain",
                        help="the job's auth mode (default plain, as real jobs; off: no authentication)")
    parser.add_argument("--results", default=None, help=f"JSON path (default benchmarks/results/{NAME}.json)")
    args = parser.parse_args(argv)
    load_at_start, git_at_start = load_average(), git_state()
    results = Fuzz(args.messages, args.seed, valid_every=args.valid_every, auth=args.auth).run()
    payload = {"command": ["python", "-m", "benchmarks.bench_fuzz", *(sys.argv[1:] if argv is None else argv)],
               "loadavg_at_start": load_at_start, "git_at_start": git_at_start, **results}
    path = write_results(NAME, payload, args.results)
    for key, value in results.items():
        print(f"{key}: {value}")
    print(f"wrote {path}")
    return 0 if not results["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
