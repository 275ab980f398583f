"""Per-job credentials and the ZAP handler that checks them on every listener.

A job's launcher calls :func:`generate_keys` once and hands each child process the
:class:`JobKeys` of its own identity out of band (the local launcher writes them to the
child's stdin, never to a command line, a log or the run directory). Every process has
credentials of its own: the coordinator, each server rank and each worker rank
(``identity``: "coordinator", "server1", "worker3"), for every rank the job may ever
start (replacement workers, servers added while it runs). A listener accepts a
connection only if its ZAP handler (ZeroMQ RFC 27, run in a thread of the listening
transport) finds the peer's credential in the job's allow-list; the identity it maps to
becomes the connection's ZAP User-Id, which the transport sets on every message received
over it as ``Message.origin`` (the role) and ``Message.origin_rank`` (the rank). So a
worker's credentials vouch for one rank: the servers and the coordinator refuse a
message whose ``worker`` field names another.

Modes (config key ``auth``):

* ``curve``: CurveZMQ (Hintjens, "CurveZMQ", RFC 26, 2013), every connection encrypted
  and authenticated. One listening key pair, held by the coordinator and the servers, is
  the CURVE server key of every listener; each process has its own client key pair. A
  worker holds neither the listening secret nor another process's client secret, so it
  cannot pass for a listener, the coordinator, a server or another worker.
* ``plain``: ZeroMQ PLAIN: user name = identity, a random per-job password per identity,
  checked by ZAP against SHA-256 digests (a listener knows the digests, not the
  passwords). Authenticated but NOT encrypted: the password travels in clear, so anyone
  able to read the traffic (root on this machine for loopback or ipc; anyone on the path
  for other hosts) can replay it. Acceptable on loopback/ipc only.
* ``off``: no authentication, for debugging; ``Message.origin`` is then None.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from dataclasses import dataclass, field

import zmq
from zmq.utils import z85

from .transport import QuietLog

ROLES = ("coordinator", "server", "worker")
MAX_IDENTITIES = 1 << 16  # credentials one job may generate (ranks of all roles)
ZAP_DOMAIN = b"equipoise"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"

log = logging.getLogger("equipoise.wire")


@dataclass(frozen=True)
class JobKeys:
    """The credentials of one role of one job (from :func:`generate_keys`).

    ``mode``: "curve" or "plain". ``role`` and ``rank`` (None for the coordinator): whose
    keys. ``client``: its (public, secret) CURVE key pair in Z85, or (identity, password)
    under PLAIN. ``listener``: the listening (public, secret) CURVE pair; the secret is ""
    for workers, which never listen; unused under PLAIN. ``allowed``: the ZAP allow-list,
    CURVE client public key -> identity, or under PLAIN identity -> SHA-256 hex digest of
    its password.
    """

    mode: str
    role: str
    client: tuple[str, str] = field(repr=False)
    listener: tuple[str, str] = field(repr=False)
    allowed: dict[str, str] = field(repr=False)
    rank: int | None = None

    def to_dict(self) -> dict:
        """Plain JSON-able data; :meth:`from_dict` reads it back."""
        return {"mode": self.mode, "role": self.role, "rank": self.rank, "client": list(self.client),
                "listener": list(self.listener), "allowed": dict(self.allowed)}

    @classmethod
    def from_dict(cls, d: dict) -> "JobKeys":
        """ValueError naming the problem if `d` is not what :meth:`to_dict` writes."""
        try:
            rank = d.get("rank")
            keys = cls(str(d["mode"]), str(d["role"]), _pair(d["client"]), _pair(d["listener"]),
                       {str(k): str(v) for k, v in d["allowed"].items()}, None if rank is None else int(rank))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"malformed job keys ({type(exc).__name__}: {exc})") from None
        if keys.mode not in ("curve", "plain") or keys.role not in ROLES:
            raise ValueError(f"job keys of unknown mode {keys.mode!r} or role {keys.role!r}")
        return keys

    def secrets(self) -> list[str]:
        """Every secret these keys hold (for tests that check none leaks)."""
        return [s for s in (self.client[1], self.listener[1]) if s]


def _pair(v) -> tuple[str, str]:
    a, b = v
    return str(a), str(b)


def identity(role: str, rank: int | None) -> str:
    """The name one process's credentials carry: "coordinator", "server1", "worker3"."""
    return role if rank is None else f"{role}{int(rank)}"


def parse_identity(name: object) -> tuple[str, int | None] | None:
    """(role, rank) of an identity name (rank None for the coordinator), or None if it
    is not one."""
    if not isinstance(name, str):
        return None
    role = name.rstrip("0123456789")
    digits = name[len(role):]
    if role == "coordinator" and not digits:
        return role, None
    if role in ("server", "worker") and digits and (digits == "0" or not digits.startswith("0")) and len(digits) < 8:
        return role, int(digits)
    return None


def impersonated(msg) -> object | None:
    """The rank a received message claims for its sender (a hello's `rank`, a worker's
    `worker` field) if it is not the rank its credentials vouch for
    (`Message.origin_rank`), else None; None without authentication."""
    if msg.origin_rank is None:
        return None
    rank = msg.fields.get("rank") if msg.type == "hello" else (
        msg.fields.get("worker") if msg.origin == "worker" else None)
    return None if rank is None or rank == msg.origin_rank else rank


def generate_keys(mode: str, workers: int = 1, servers: int = 1) -> dict[str, JobKeys]:
    """Fresh credentials for one job, one per process it may ever run: identity ->
    JobKeys, for the coordinator, server ranks 0..servers-1 and worker ranks
    0..workers-1. RuntimeError if `mode` is "curve" and this libzmq has no CURVE support;
    ValueError for a mode other than curve/plain, or counts out of range."""
    if not (1 <= workers and 1 <= servers and workers + servers < MAX_IDENTITIES):
        raise ValueError(f"credentials for {workers} workers and {servers} servers: each ≥ 1, "
                         f"together under {MAX_IDENTITIES}")
    who = [("coordinator", None)] + [("server", r) for r in range(servers)] + [("worker", r) for r in range(workers)]
    names = {identity(role, rank): (role, rank) for role, rank in who}
    if mode == "curve":
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq build has no CURVE support (use auth = \"plain\")")
        pairs = {name: tuple(k.decode() for k in zmq.curve_keypair()) for name in names}
        listen = tuple(k.decode() for k in zmq.curve_keypair())
        allowed = {pairs[name][0]: name for name in names}
        return {name: JobKeys(mode, role, pairs[name], (listen[0], "" if role == "worker" else listen[1]),
                              allowed, rank) for name, (role, rank) in names.items()}
    if mode == "plain":
        words = {name: secrets.token_urlsafe(32) for name in names}
        allowed = {name: _digest(w) for name, w in words.items()}
        return {name: JobKeys(mode, role, (name, words[name]), ("", ""), allowed, rank)
                for name, (role, rank) in names.items()}
    raise ValueError(f"auth mode {mode!r} has no keys (expected 'curve' or 'plain')")


def _digest(password: str | bytes) -> str:
    data = password.encode() if isinstance(password, str) else password
    return hashlib.sha256(data).hexdigest()


def secure_listener(sock: zmq.Socket, keys: JobKeys) -> None:
    """Make `sock` (not yet bound) a CURVE or PLAIN server that refuses any peer the
    job's ZAP handler does not accept, and fails closed if no handler answers."""
    if keys.mode == "curve":
        if not keys.listener[1]:
            raise ValueError(f"the {keys.role} keys cannot listen (no listening secret)")
        sock.curve_secretkey = keys.listener[1].encode()
        sock.curve_publickey = keys.listener[0].encode()
        sock.curve_server = True
    else:
        sock.plain_server = True
    sock.zap_domain = ZAP_DOMAIN
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def secure_connection(sock: zmq.Socket, keys: JobKeys) -> None:
    """Make `sock` (not yet connected) present this role's credentials."""
    if keys.mode == "curve":
        sock.curve_serverkey = keys.listener[0].encode()
        sock.curve_publickey = keys.client[0].encode()
        sock.curve_secretkey = keys.client[1].encode()
    else:
        sock.plain_username = keys.client[0].encode()
        sock.plain_password = keys.client[1].encode()


MAX_REFUSED = 256  # refused credentials remembered and named one by one


class ZapHandler:
    """Answers the ZAP requests of one ZeroMQ context in a daemon thread.

    It binds the context's ZAP endpoint at construction (before any listener binds, so no
    handshake ever finds it missing), accepts a peer whose credential is in
    ``keys.allowed`` with its identity ("worker3") as User-Id, and refuses any other with status 400,
    logging one warning per refused credential (not per attempt: a refused DEALER keeps
    reconnecting). Bounded: at most MAX_REFUSED credentials are remembered (then each
    refusal is counted in QuietLog's lines), so rotating credentials fills neither the
    log nor the memory.
    """

    def __init__(self, ctx: zmq.Context, keys: JobKeys) -> None:
        self.keys = keys
        self.refused: set[bytes] = set()
        self._quiet = QuietLog(log)  # refusals past MAX_REFUSED: a few lines a minute, counts
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(_ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._run, name="equipoise-zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._sock.poll(100, zmq.POLLIN):
                    request = self._sock.recv_multipart()
                    self._sock.send_multipart(self.answer(request))
        except zmq.ZMQError:  # the context was terminated under us: nothing left to guard
            pass
        finally:
            self._sock.close(linger=0)

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request (RFC 27 frames)."""
        if len(request) < 6 or request[0] != b"1.0":
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"bad ZAP request", b"", b""]
        request_id, domain, address, mechanism, creds = request[1], request[2], request[3], request[5], request[6:]
        name, why = self._identity(mechanism, creds)
        if name is not None and domain == ZAP_DOMAIN:
            return [b"1.0", request_id, b"200", b"OK", name.encode(), b""]
        seen = mechanism[:16] + b"\0" + (creds[0][:64] if creds else b"")
        who = address.decode(errors="replace")[:64] or "?"
        if seen in self.refused:
            pass
        elif len(self.refused) < MAX_REFUSED:
            self.refused.add(seen)
            log.warning("refused a connection from %s: %s", who, why or f"ZAP domain {domain[:40]!r}")
        else:
            self._quiet("*", "refused", "refused connections with more than %d distinct credentials; "
                        "further ones are counted, not named (the last from %s)", MAX_REFUSED, who)
        return [b"1.0", request_id, b"400", b"not a peer of this job", b"", b""]

    def _identity(self, mechanism: bytes, creds: list[bytes]) -> tuple[str | None, str]:
        if self.keys.mode == "curve" and mechanism == b"CURVE" and len(creds) == 1:
            public = z85.encode(creds[0]).decode()
            name = self.keys.allowed.get(public)
            return name, "" if name else f"unknown CURVE key {public[:8]}…"
        if self.keys.mode == "plain" and mechanism == b"PLAIN" and len(creds) == 2:
            user = creds[0].decode(errors="replace")
            expected = self.keys.allowed.get(user)
            if expected is not None and hmac.compare_digest(expected, _digest(creds[1])):
                return user, ""
            return None, f"wrong PLAIN user or password (user {user[:20]!r})"
        return None, f"mechanism {mechanism.decode(errors='replace')!r} is not this job's"

    def close(self) -> None:
        """Stop the thread (it closes its socket); call before terminating the context."""
        self._stop.set()
        self._thread.join(timeout=5)
