"""bench_fuzz's messages: what its fuzz peers send (`Generator`), the header and tensor
entry it builds them from, and the constants both the generator and the run use."""

from __future__ import annotations

import math
import random
from typing import Any

import msgpack
import numpy as np

NUMEL = 64                   # one block of 64 float32
MAX_BYTES = 1 << 20          # the server's max message size (MAXMSGSIZE): oversized frames are cheap
CATEGORIES = {  # relative weights
    "garbage": 12, "truncated": 10, "oversized": 2, "fields": 20, "tensors": 15, "versions": 15,
    "replay": 8, "unknown": 10, "control": 6, "impostor": 6, "stranger": 2,
}
# Coordinator-only types (not in server.SENDERS) an impostor sends, well-formed.
IMPOSTOR_TYPES = ("stop", "init", "members", "straggle", "migrate", "lose", "expect", "replicate",
                  "replica_req", "flush", "state_req", "stats_req")
NOWHERE = "tcp://127.0.0.1:9"  # an address nobody answers (discard port)
NAN, INF = float("nan"), float("inf")
BAD = [None, True, False, "x", "", [], {}, [1, 2], {"a": 1}, 1.5, NAN, INF, -INF, 2**63 - 1, 2**64 - 1,
       -2**63, -1, 0, b"\x00\xff"]
HUGE_INTS = [2**63 - 1, 2**64 - 1, -2**63, -1, 10**12]


def header(mtype: Any, fields: Any, table: Any = (), **extra: Any) -> bytes:
    return msgpack.packb({"v": 1, "t": mtype, "f": fields, "x": list(table), **extra}, use_bin_type=True)


def entry(name: str = "g0", dtype: str = "float32", shape: Any = (NUMEL,)) -> list:
    return [name, dtype, list(shape)]


class Generator:
    """Fuzz messages as lists of frames; `version` is the version the server is at (only
    the valid worker advances it, to `horizon` at most), `recent` the frames of the
    worker's last pushes. A fuzz message may reach the server after the worker's next
    push (they travel on different sockets), so "future" versions lie beyond `horizon`."""

    def __init__(self, seed: int, horizon: int, *, authenticated: bool = True) -> None:
        self.rng = random.Random(seed)
        self.version, self.horizon = 0, horizon
        self.authenticated = authenticated  # else no impostors, and strangers send fuzz only
        self.recent: list[list[bytes]] = []

    def tensor(self, dtype: str = "float32", n: int = NUMEL) -> bytes:
        return np.array([self.rng.randint(-3, 3) for _ in range(n)]).astype(dtype).tobytes()

    def other_version(self) -> int:
        """Any version but the one the server is at: future, stale, huge or negative."""
        v, h = self.version, self.horizon
        choices = [h + 1, h + 2, h + 1000, *HUGE_INTS] + ([v - 1, 0] if v > 0 else [])
        return self.rng.choice(choices)

    def push(self, **fields: Any) -> list[bytes]:
        f = {"worker": 0, "version": self.other_version(), "samples": 1, **fields}
        return [header("push", f, [entry()]), self.tensor()]

    def make(self, category: str) -> list[bytes]:
        return getattr(self, f"_{category}")()

    def _garbage(self) -> list[bytes]:
        r = self.rng
        kind = r.randrange(4)
        if kind == 0:  # random bytes
            return [r.randbytes(r.randrange(0, 300)) for _ in range(r.randint(1, 3))]
        if kind == 1:  # valid msgpack, not a header
            return [msgpack.packb(r.choice([[1, 2], 5, "ping", None, {"t": "ping"}, {1: 2}, b"x" * 9]))]
        if kind == 2:  # a header map with a bad envelope
            h = {"v": 1, "t": "ping", "f": {}, "x": []}
            key = r.choice(list(h))
            if r.random() < 0.5:
                del h[key]
            else:
                h[key] = r.choice(BAD)
            return [msgpack.packb(h, use_bin_type=True)]
        return [b"\x00" * r.randrange(0, 64)]

    def _truncated(self) -> list[bytes]:
        r = self.rng
        frames = self.push()
        kind = r.randrange(4)
        if kind == 0:
            frames[0] = frames[0][:r.randrange(len(frames[0]))]
        elif kind == 1:
            frames[1] = frames[1][:r.randrange(len(frames[1]))]
        elif kind == 2:
            frames = frames[:1]
        else:
            frames.append(frames[1])  # one frame more than listed
        return frames

    def _oversized(self) -> list[bytes]:
        r = self.rng
        kind = r.randrange(4)
        if kind == 0:  # a tensor frame longer than declared
            return [header("push", {"worker": 0, "version": self.other_version(), "samples": 1}, [entry()]),
                    self.tensor(n=NUMEL + r.randint(1, 4096))]
        if kind == 1:  # a header over 1 MiB
            return [header("ping", {"pad": "x" * ((1 << 20) + 10)})]
        if kind == 2:  # frames of up to 16 times max_bytes in total (each frame under it)
            half, n = b"\x00" * (MAX_BYTES // 2 + 8), r.choice((2, 8, 32))
            return [header("push", {"worker": 0, "version": self.other_version(), "samples": 1},
                           [entry(f"g{i}", "uint8", [len(half)]) for i in range(n)]), *[half] * n]
        return [header("ping", {}), b"\x00" * (MAX_BYTES + 1)]  # a single frame over MAXMSGSIZE

    def base_fields(self, mtype: str) -> dict:
        v, r = self.version, self.rng
        return {
            "pull": {"worker": 0, "min_version": v + r.randint(0, 2)},
            "push": {"worker": 0, "version": self.other_version(), "samples": 1},
            "state_req": {"version": v},
            "members": {"workers": 1},
            "migrate": {"keys": [7], "to": "nowhere"},
            "adopt": {"blocks": [[5, "w", 0, 4, "param", 4]], "version": self.other_version(), "samples": 0},
            "init": {"blocks": [[0, "w", 0, NUMEL, "param", 4]], "optimizer": {"name": "sgd"},
                     "version": 0, "samples": 0, "protocol": "bsp", "workers": 1},
            "stop": {"reason": "fuzz"},
            "plan_req": {"worker": 0, "step": 0, "report": {}},
            "table_req": {"worker": 0},
        }.get(mtype, {})

    def _fields(self) -> list[bytes]:
        """A known type with one required field missing or of the wrong type (or, for
        requests that cannot change state, an int out of range)."""
        r = self.rng
        mtype = r.choice(["pull", "push", "state_req", "members", "migrate", "adopt", "init", "stop",
                          "plan_req", "table_req", "ping", "flush", "stats_req", "straggle"])
        f = self.base_fields(mtype)
        table, frames = ([entry()], [self.tensor()]) if mtype == "push" else ([], [])
        if not f:  # no required fields: junk extras, or a fields map that is no map
            if r.random() < 0.5:
                return [header(mtype, r.choice(BAD[2:9] + [5, 1.5]))]
            # no huge finite numbers: a well-formed straggle may slow a server at will (only
            # authentication keeps strangers from sending one)
            return [header(mtype, {r.choice(["factor", "x", ""]): r.choice(BAD[:13] + [-1, 0])})]
        name = r.choice(list(f))
        if r.random() < 0.3:
            del f[name]
        elif mtype in ("pull", "push", "state_req") and isinstance(f[name], int) and r.random() < 0.5:
            f[name] = r.choice(HUGE_INTS)
        else:
            f[name] = r.choice([b for b in BAD if type(b) is not type(f[name]) and not
                                (type(f[name]) is float and type(b) is int)])
        return [header(mtype, f, table), *frames]

    def _tensors(self) -> list[bytes]:
        r = self.rng
        f = {"worker": r.choice([0, 0, 1, -1, 2**63 - 1]), "version": self.other_version(),
             "samples": r.choice([1, 1, 0, -5, 2**63 - 1])}
        kind = r.randrange(10)
        if kind == 9:  # element counts that overflow: zeros beside huge dimensions, empty or short frames
            shape = r.choice([[2**62, 2**62, 0], [0, 2**62, 2**62], [2**31, 2**31, 2**31, 0], [2**62],
                              [2**40, 2**40], [2**61, 3]])
            return [header("push", f, [entry(shape=shape)]), r.choice([b"", b"\0" * 8, self.tensor()])]
        if kind == 0:  # wrong dtype
            dtype = r.choice(["float64", "int32", "float16", "int64", "uint8", "int8"])
            return [header("push", f, [entry(dtype=dtype)]), self.tensor(dtype)]
        if kind == 1:  # wrong shape
            shape = r.choice([[NUMEL + 1], [NUMEL // 2, 2], [], [0], [1, NUMEL]])
            return [header("push", f, [entry(shape=shape)]), self.tensor(n=math.prod(shape))]
        if kind == 2:  # wrong names
            names = r.choice([["g1"], ["gx"], ["b0"], ["s0.m"], ["g0", "g1"], [], ["g-1"], ["g" + "9" * 30]])
            return [header("push", f, [entry(n) for n in names]), *(self.tensor() for _ in names)]
        if kind == 3:  # non-finite values
            t = np.zeros(NUMEL, dtype="float32")
            t[r.randrange(NUMEL)] = r.choice([NAN, INF, -INF])
            return [header("push", f, [entry()]), t.tobytes()]
        if kind == 4:  # declared length differs from the frame
            return [header("push", f, [entry(shape=[r.choice([NUMEL * 2, 2**62, 1])])]), self.tensor()]
        if kind == 5:  # bool bytes other than 0/1
            return [header("push", f, [entry(dtype="bool")]), bytes([2]) * NUMEL]
        if kind == 6:  # a malformed table entry
            bad = r.choice([["g0"], ["g0", "float32"], [0, "float32", [NUMEL]], ["g0", "complex64", [NUMEL]],
                            ["g0", "float32", [-1]], ["g0", "float32", [1.5]], ["g0", "float32", [1] * 65],
                            ["g0", "float32", "64"], "g0"])
            return [header("push", f, [bad]), self.tensor()]
        if kind == 7:  # duplicate names
            return [header("push", f, [entry(), entry()]), self.tensor(), self.tensor()]
        return [header("push", f, [entry()]), self.tensor()]  # fine tensors, wrong version or samples

    def _versions(self) -> list[bytes]:
        r, v = self.rng, self.version
        far = [v + 1, v + 2, v + 5, v + 1000, v + (1 << 20) + 1, *HUGE_INTS, 0, v]
        kind = r.randrange(3)
        if kind == 0:
            return [header("pull", {"worker": r.choice([0, 3]), "min_version": r.choice(far)})]
        if kind == 1:
            return [header("state_req", {"version": r.choice(far)})]
        return self.push()

    def _replay(self) -> list[bytes]:
        if not self.recent:
            return self.push()
        return list(self.rng.choice(self.recent))

    def _unknown(self) -> list[bytes]:
        r = self.rng
        if r.random() < 0.5:
            mtype = r.choice(["", "PUSH", "push ", "pul", "\u2603", "x" * 200, "_on_push", "__init__",
                              r.randbytes(8).hex()])
            return [header(mtype, {})]
        mtype, f = r.choice([
            ("hello", {"role": "server", "rank": 0, "address": "tcp://x:1", "pid": 1}),
            ("welcome", {"rank": 0, "servers": [], "table": []}), ("ready", {"rank": 0}),
            ("plan", {"step": 0, "iteration": 0, "start": 0, "size": 1, "stop": False, "version": 0}),
            ("params", {"version": 0, "held_s": 0.0}), ("ack", {"version": 0}), ("pong", {}),
            ("state", {"version": 0, "samples": 0}), ("error", {"message": "x"}),
            ("stats", {"busy_s": 0.0, "bytes": 0, "load_bytes": 0, "blocks": 1}),
            ("table", {"table": [], "servers": [], "version": 0}), ("table_req", {"worker": 0}),
            ("plan_req", {"worker": 0, "step": 0, "report": {}})])
        return [header(mtype, f)]

    def _control(self) -> list[bytes]:
        """Coordinator messages with bad contents (right field types, wrong values)."""
        r = self.rng
        kind = r.randrange(5)
        if kind == 0:
            key = r.choice(["factor", "rate_mbps", "bandwidth_mbps"])
            return [header("straggle", {key: r.choice([NAN, INF, -INF, -1.0, 0.0 if key != "bandwidth_mbps" else -2.0,
                                                       "x", None, [1], {}])})]
        if kind == 1:
            return [header("migrate", {"keys": [r.choice([NAN, INF, -INF, "a", None, -1, 7, 2**64 - 1, [0], {}])],
                                       "to": r.choice(["", "nowhere", "tcp://", "\x00"])})]
        if kind == 2:
            row = r.choice([[], [1], ["a", "w", 0, 1, "param", 4], [INF, "w", 0, 1, "param", 4], "row", None])
            return [header("adopt", {"blocks": [row], "version": self.other_version(), "samples": 0})]
        if kind == 3:
            return [header("members", {"workers": 1, "retired": r.choice([[INF], [NAN], ["a"], 5, [None], [[1]]])})]
        return self._bad_init()

    def _bad_init(self) -> list[bytes]:
        r = self.rng
        spec = {"name": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": 0.0, "schedule": "constant",
                "total": 100, "step_size": 10, "gamma": 0.1, "global_batch": 1}
        f = {"blocks": [[0, "w", 0, NUMEL, "param", 4]], "optimizer": spec, "version": 0, "samples": 0,
             "protocol": "bsp", "workers": 1}
        kind = r.randrange(5)
        if kind == 0:
            f["straggler"] = r.choice([{"factor": NAN}, {"rate_mbps": 0.0}, {"factor": -1.0}, "slow", [1],
                                       {"bandwidth_mbps": INF}, {"factor": "x"}])
        elif kind == 1:
            f["optimizer"] = r.choice([{}, {**spec, "name": "lbfgs"}, {**spec, "lr": "x"}])
        elif kind == 2:
            f["protocol"] = r.choice(["nope", "", "BSP"])
        elif kind == 3:
            f["workers"] = r.choice(["x", None, [1], INF])
        else:
            f["blocks"] = r.choice([[[0, "w"]], [None], ["x"], [[INF, "w", 0, NUMEL, "param", 4]]])
        return [header("init", f, [entry("b0")]), self.tensor()]

    def impostor(self, mtype: str | None = None) -> tuple[str, list[bytes]]:
        """A well-formed coordinator-only message (its type, its frames) that would take
        effect if accepted: stop the server, replace its values, make BSP wait for a
        second worker or for an `expect`, slow it a millionfold, send it to an address
        nobody answers (migrate, replicate), or read its state."""
        r, v = self.rng, self.version
        mtype = mtype or r.choice(IMPOSTOR_TYPES)
        if mtype == "init":
            spec = {"name": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": 0.0, "schedule": "constant",
                    "total": 100, "step_size": 10, "gamma": 0.1, "global_batch": 1}
            f = {"blocks": [[0, "w", 0, NUMEL, "param", 4]], "optimizer": spec, "version": v, "samples": 0,
                 "protocol": "bsp", "workers": 1}
            return mtype, [header("init", f, [entry("b0")]), np.full(NUMEL, 1000.0, np.float32).tobytes()]
        f = {"stop": {"reason": "impostor"}, "members": {"workers": 2},
             "straggle": {"factor": 1e6, "rate_mbps": 1e-3}, "migrate": {"keys": [0], "to": NOWHERE},
             "lose": {"worker": 0, "workers": 1, "drop": True}, "expect": {"version": v, "pushes": 2},
             "replicate": {"backup": NOWHERE}, "replica_req": {"primary": 0, "version": v}, "flush": {},
             "state_req": {"version": v}, "stats_req": {}}[mtype]
        return mtype, [header(mtype, f)]

    def _stranger(self) -> list[bytes]:
        r = self.rng
        if self.authenticated and r.random() < 0.5:  # what would do harm if it got through
            kind = r.randrange(3)
            if kind == 0:
                return self.impostor()[1]
            if kind == 1:  # a push for the version the server is at: BSP would apply it
                return [header("push", {"worker": 0, "version": self.version, "samples": 1}, [entry()]),
                        self.tensor()]
            return [header("pull", {"worker": 0, "min_version": self.version})]
        return self.make(r.choice([c for c in CATEGORIES if c not in ("stranger", "impostor")]))
