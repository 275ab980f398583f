"""A worker's side of the parameter servers, in the spirit of ps-lite's KVWorker (Li et
al., "Scaling Distributed Machine Learning with the Parameter Server", OSDI 2014).

`PSClient` owns the connections to the servers and the block table that slices a
worker's keys among them. `push` and `pull` send one request to every server that holds
blocks and return a `Ticket` at once; `wait(ticket)` collects the replies. Several
exchanges may be in flight: a server may answer a connection's requests out of order (a
pull held for a newer version is overtaken by the ack of a later push), so every reply
is matched to the oldest request of its type on its connection, and replies for other
tickets are kept until those are waited.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..policy.placement import Block
from ..wire import Connection, Message, PeerTimeout, Transport, wait_readable
from ..wire.names import blocks_named, grad_name, pack_parts, values_of
from .rows import fetch_rows
from ..protocol.fields import read_field

_REPLY = {"push": "ack", "pull": "params", "rows": "rows"}


def _nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class ClientError(RuntimeError):
    """A server refused a request, answered out of protocol or not in time; names it."""


@dataclass(eq=False)
class Ticket:
    """An exchange in flight: the request `kind` ("push" or "pull") sent to each server
    of `parts` (server rank, its connection, the keys of the blocks it holds)."""
    kind: str
    id: int
    parts: list[tuple[int, Connection, list[int]]]
    sent: float = 0.0  # time.perf_counter() when the first request was sent
    sent_to: dict[int, float] = field(default_factory=dict)  # server rank → when its request was sent
    carried: dict[int, list[int]] = field(default_factory=dict)  # server rank → the block keys its message carried


@dataclass
class Pulled:
    """What a pull brought: every block's value, each server's version, and the longest
    time a server held the pull back (waiting for a version, not moving bytes)."""
    values: dict[int, torch.Tensor]
    versions: dict[int, int]
    held_s: float
    reads: dict[int, int] = field(default_factory=dict)  # each server's stamp of these weights


def receive(conn: Connection, expect: str, timeout: float, who: str) -> Message:
    """The next message on `conn`, which must be an `expect` reply within `timeout` s;
    ClientError (prefixed by `who`, naming the peer) on an error reply, another type or
    silence."""
    try:
        reply = conn.recv(timeout=max(0.001, timeout))
    except PeerTimeout:
        raise ClientError(f"{who}: no {expect!r} from {conn.address} within {timeout:g}s") from None
    if reply.type == "error":
        raise ClientError(f"{who}: {conn.address} refused: {reply.fields.get('message')}")
    if reply.type != expect:
        raise ClientError(f"{who}: expected {expect!r} from {conn.address}, got {reply.type!r}")
    return reply


class PSClient:
    """Worker `worker`'s connections to the servers holding `blocks`. Call `set_table`
    before the first request; every `wait` gives up after `timeout` seconds."""

    def __init__(self, transport: Transport, worker: int, blocks: list[Block], timeout: float,
                 interrupt: Callable[[], None] = lambda: None):
        """`interrupt()` is called about every 0.2 s while a wait goes on; it may raise
        to abandon the wait (the coordinator resets the job)."""
        self.transport, self.worker, self.blocks, self.timeout = transport, int(worker), list(blocks), timeout
        self.interrupt = interrupt
        self.epoch = 0  # rollbacks seen: servers ignore requests of an earlier epoch
        self.table_keys = {b.key for b in self.blocks if b.kind == "rows"}  # sparse tables: not pulled whole
        self.wire_bytes = [0, 0]  # tensor bytes sent, received since `take_wire`
        self.who = f"worker {self.worker}"
        self.conns: dict[int, Connection] = {}  # server rank → connection
        self.by_server: dict[int, list[Block]] = {}  # server rank → its blocks (only servers holding any)
        self._ids = itertools.count()
        self._owed: dict[int, dict[str, deque[int]]] = {}  # id(conn) → reply type → ticket ids, oldest first
        self._got: dict[int, dict[int, Message]] = {}  # ticket id → id(conn) → reply
        self._leaving: dict[int, Connection] = {}  # servers removed with replies still owed
        self._arrived: dict[int, dict[int, float]] = {}  # ticket id → id(conn) → when its reply was read
        self._parts: dict[tuple[int, int], dict] = {}  # (ticket id, id(conn)) → the tensors of a reply's parts so far
        self._fresh: dict[int, dict[int, torch.Tensor]] = {}  # pulls in parts: ticket id → values not yet handed out
        self._early: dict[tuple[int, int], dict] = {}  # (ticket id, id(conn)) → blocks sent ahead, not yet confirmed
        self._sent_at: dict[int, float] = {}  # pulls: ticket id → when sent
        # Seconds of each exchange with each server since `take_server_s` (push: sent to
        # acked; pull: sent to arrived, less the time the server held it for a version):
        # what a slow link or a loaded host costs, which the server itself does not see.
        self.server_s: dict[int, float] = {}
        # What happened on the wire since `take_timeline`: (kind, server, sent, arrived, keys),
        # kind "fragment" (no reply: arrived None), "push" (arrived: its ack), "pull" (its
        # weights) or "early" (a pull's blocks the server computed ahead of the version, and
        # sent before it: eager_update) or "plan" (the worker's report and the coordinator's
        # plan, server -1: `note`); keys: the blocks the message (a pull: its reply) carried.
        self.timeline: list[tuple[str, int, float, float | None, list[int]]] = []

    @property
    def active(self) -> list[int]:
        """The ranks of the servers that hold blocks, ascending."""
        return sorted(self.by_server)

    def set_table(self, table: list[int], addresses: list[str]) -> None:
        """Route by a (new) block → server table; `addresses[r]` is server r's address,
        "" for a server that was removed. Requests already sent are still collected,
        unless their server's connection had to be closed (ClientError)."""
        for b in self.blocks:
            r = table[b.key] if b.key < len(table) else -1
            if not (0 <= r < len(addresses) and addresses[r]):
                raise ClientError(f"{self.who}: the block table puts block {b.key} on server {r}, "
                                  f"which has no address")
        for r, conn in list(self.conns.items()):
            if r >= len(addresses) or conn.address != addresses[r]:
                if any(self._owed.get(id(conn), {}).values()):
                    # A server being removed while requests to it are in flight (no barrier):
                    # it serves them still; its connection closes with a later table.
                    self._leaving[r] = conn
                    del self.conns[r]
                    continue
                self._owed.pop(id(conn), None)
                conn.close()
                del self.conns[r]
        for r, conn in list(self._leaving.items()):
            if not any(self._owed.get(id(conn), {}).values()):
                self._owed.pop(id(conn), None)
                conn.close()
                del self._leaving[r]
        for r, address in enumerate(addresses):
            if address and r not in self.conns:
                self.conns[r] = self.transport.connect(address)
        self.by_server = {}
        for b in self.blocks:
            self.by_server.setdefault(table[b.key], []).append(b)

    def push(self, grads: dict[int, torch.Tensor], version_by_server: dict[int, int], samples: int, *,
             part: int = 0, only: list[int] | None = None, start: int | None = None,
             count: float | None = None, reads: dict[int, int] | None = None, step: int | None = None,
             sent: dict[int, tuple[int, int]] | None = None, rows: dict[int, torch.Tensor] | None = None) -> Ticket:
        """Send each server (of `only`, if given) the gradients (or buffer values) of
        its blocks, tagged with the version of that server they were computed on (a
        sparse table's block: the gradient of the rows `rows[key]` only); `part`
        > 0 marks a share of a lost worker's slice, `start` the slice's first position
        (servers combine a barrier update's pushes in that order), `count` the units the
        loss averaged over, when not the samples (the servers' weight), `reads` each server's
        stamp of the weights they were computed on (it measures their delay), `step` the
        number of this push among the worker's (SSP counts each step once), `sent`
        (server → (seq, n)) the fragments of this push already sent to a server
        (`push_fragment`): `grads` then holds only the rest. A server
        not read from yet (a block's new owner) is told the oldest version read. The
        tensors are sent without copying: do not change them before the ticket is waited
        (or copy them)."""
        extra = {"part": int(part)} if part else {}
        extra["epoch"] = self.epoch
        if start is not None:
            extra["start"] = int(start)
        if count is not None and count != samples:
            extra["count"] = float(count)
        if step is not None:
            extra["step"] = int(step)
        reads = reads or {}
        oldest = min(version_by_server.values(), default=0)
        borrowed = {"borrowed": True, **({"read": min(reads.values())} if reads else {})}

        def tags(r: int) -> dict:
            if r not in version_by_server:  # weights read from a block's old owner: its tags
                return {"version": int(oldest), **borrowed}
            return {"version": int(version_by_server[r]), **({"read": reads[r]} if r in reads else {})}

        sent = sent or {}

        def fragments(r: int) -> dict:
            return {"seq": sent[r][0], "fragments": sent[r][1]} if r in sent else {}

        rows = rows or {}
        return self._send("push", lambda r, blocks: Message(
            "push", {"worker": self.worker, "samples": int(samples), **extra, **tags(r), **fragments(r)},
            {**{grad_name(b.key): grads[b.key] for b in blocks  # a table's blocks: packed, those touched
                if (r not in sent or b.key in grads) and b.kind != "rows"},
             **pack_parts("G", {b.key: grads[b.key] for b in blocks if b.key in rows}),
             **pack_parts("I", {b.key: rows[b.key] for b in blocks if b.key in rows})}), only)

    def rows(self, version: int | None, wanted: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Rows of sparse tables' blocks (`wanted[key]`: rows within block `key`, int64)
        from the servers holding them, of `version` exactly (the barrier protocols: the
        version of the worker's dense weights; None: any, before the first pull and
        without a barrier), asked again of a block's new owner where it was handed over
        since (worker/rows.py); by key, rows × width. ClientError if a server is at
        another version."""
        return fetch_rows(self, version, wanted, ClientError)

    def push_fragment(self, server: int, grads: dict[int, torch.Tensor], seq: int, tags: dict | None = None) -> None:
        """Send `server` some of its blocks' gradients ahead of the push they belong to
        (`seq`: the push's number among this worker's streamed pushes). No reply: the
        push that ends the sequence names how many fragments went before it
        (`push(..., sent=...)`), and the server takes it and them as one push. `tags`:
        the push's samples, start and count, where known. Sent without copying, like a
        push."""
        self.conns[server].send(Message("fragment", {"worker": self.worker, "epoch": self.epoch, "seq": int(seq),
                                                     **(tags or {})},
                                        {grad_name(k): t for k, t in grads.items()}))
        self.wire_bytes[0] += _nbytes(grads)
        self.timeline.append(("fragment", server, time.perf_counter(), None, sorted(grads)))

    def pull(self, min_version: int, part_kb: int = 0, early: bool = False) -> Ticket:
        """Ask every server for its blocks once it is at `min_version` (as its sync
        policy reads that number); `part_kb` > 0: in parts of at least that many KiB,
        the first blocks first (`arrived` hands them out as they come); `early` (with
        `part_kb`, eager_update): a server may send blocks it computed ahead before it
        publishes the version; they are held back until its reply's final parts say
        they stand (`kept`), and dropped otherwise (the final parts then bring them)."""
        parts = {"part_kb": int(part_kb), **({"early": True} if early else {})} if part_kb else {}
        msg = Message("pull", {"worker": self.worker, "min_version": int(min_version), "epoch": self.epoch, **parts})
        ticket = self._send("pull", lambda r, blocks: msg)
        self._sent_at[ticket.id] = ticket.sent
        if part_kb:
            self._fresh[ticket.id] = {}  # its values are handed out as they come (`arrived`)
        return ticket

    def wait(self, ticket: Ticket, timeout: float | None = None) -> Pulled | list[int]:
        """The replies to `ticket`, each within `timeout` (default: the client's) seconds
        of this call: for a pull a `Pulled`; for a push σ of each of our gradients the
        servers applied since their last ack (under softsync a push may wait in a group
        and be applied when another worker's push completes it: its σ comes later)."""
        if ticket.id not in self._got:
            raise ValueError(f"{self.who}: ticket {ticket.id} was already waited")
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self.progress(ticket, deadline, limit):
            pass
        got = self._got.pop(ticket.id)
        self._fresh.pop(ticket.id, None)
        self._sent_at.pop(ticket.id, None)
        arrived = self._arrived.pop(ticket.id, {})
        if ticket.kind == "push":
            sigmas = [s for _, conn, _ in ticket.parts for s in self._sigmas(conn, got[id(conn)])]
            self._time(ticket, arrived, {})
            return sigmas
        if ticket.kind == "rows":  # a sparse table's rows: the replies themselves, by server
            self._time(ticket, arrived, {})
            return {r: got[id(conn)] for r, conn, _ in ticket.parts}
        pulled = Pulled({}, {}, 0.0)
        held: dict[int, float] = {}
        for r, conn, keys in ticket.parts:
            reply = got[id(conn)]
            values = values_of(reply.tensors)
            try:
                moved = reply.fields.get("moved", [])  # handed over since we routed by the table
                pulled.values.update({k: values[k] for k in keys if k in values
                                      or (k not in moved and k not in self.table_keys)})  # tables: by rows
                pulled.versions[r] = int(reply.fields["version"])
                held[id(conn)] = float(reply.fields["held_s"])
                pulled.held_s = max(pulled.held_s, held[id(conn)])
                read = read_field(reply.fields, "read", int, who="", least=0)
                if read is not None:
                    pulled.reads[r] = read
            except (KeyError, TypeError, ValueError) as exc:
                raise ClientError(f"{self.who}: {conn.address} sent malformed params "
                                  f"({type(exc).__name__}: {exc})") from None
        self._time(ticket, arrived, held)
        return pulled

    def progress(self, ticket: Ticket, deadline: float, limit: float) -> bool:
        """Read what has come for `ticket` (waiting at most 0.2 s for something, and
        ClientError past `deadline`, a time.monotonic(); `limit` names the wait's length in
        the message); True once every reply to it is in."""
        got = self._got[ticket.id]
        pending = [conn for _, conn, _ in ticket.parts if id(conn) not in got]
        if not pending:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientError(f"{self.who}: no reply from {pending[0].address} within {limit:g}s")
        # Every connection that owes a reply is watched, not only this ticket's: a reply
        # left unread while we wait on another server would be timed when that server
        # answered, charging its exchange time to a server that answered long before
        # (this ticket's first, so a transport without polling blocks on one of them).
        owing = [c for c in self._owing() if c not in pending]
        ready = wait_readable(pending + owing, min(left, 0.2))
        if not ready:
            self.interrupt()
        for conn in ready:  # each read as it is ready, so that its reply is timed as it came
            self._receive(conn, deadline, limit)
        return all(id(conn) in got for _, conn, _ in ticket.parts)

    def arrived(self, ticket: Ticket) -> dict[int, torch.Tensor]:
        """The block values of a pull's replies read since the last call (a pull in
        parts: as each part came), by key."""
        fresh = self._fresh.get(ticket.id, {})
        if fresh:
            self._fresh[ticket.id] = {}
        return fresh

    def _time(self, ticket: Ticket, arrived: dict[int, float], held: dict[int, float]) -> None:
        """Add each server's part of `ticket` to `server_s`: from sending its request (not
        the ticket's first, which another server's larger message may have delayed) to its
        reply's arrival, less the time the server held it (`held`, by id of the connection)."""
        for r, conn, _ in ticket.parts:
            sent = ticket.sent_to.get(r, ticket.sent)
            seconds = arrived.get(id(conn), sent) - sent - held.get(id(conn), 0.0)
            self.server_s[r] = self.server_s.get(r, 0.0) + max(0.0, seconds)
            self.timeline.append((ticket.kind, r, ticket.sent, arrived.get(id(conn)), ticket.carried.get(r, [])))

    def note(self, kind: str, sent: float, arrived: float) -> None:
        """Add an exchange with the coordinator (server -1) to the timeline: "plan", the
        report sent and the next plan arrived (perf_counter times)."""
        self.timeline.append((kind, -1, sent, arrived, []))

    def take_timeline(self, origin: float) -> list[list]:
        """The wire's events since the last call, oldest first, each [kind, server, sent,
        arrived, blocks] in seconds from `origin` (a perf_counter time; arrived: null for
        a fragment, which gets no reply, and for "applied"): a push's fragments, the push
        (or the push that ends them) and its ack, a pull and its weights (its last part),
        each part of a pull answered in parts ("part") and blocks sent ahead ("early") as
        they came, when the server computed the blocks of each reply ("applied",
        `_note_applied`); blocks: the keys the message (a pull: its reply) carried."""
        got, self.timeline = self.timeline, []
        return [[kind, r, round(sent - origin, 6), None if at is None else round(at - origin, 6), keys]
                for kind, r, sent, at, keys in sorted(got, key=lambda e: e[2])]

    def take_wire(self) -> list[int]:
        """[sent, received]: the tensor bytes of this worker's requests and of the replies
        it read since the last call."""
        got, self.wire_bytes = self.wire_bytes, [0, 0]
        return got

    def take_server_s(self) -> dict[int, float]:
        """The seconds spent in exchanges with each server since the last call."""
        got, self.server_s = self.server_s, {}
        return got

    def close(self) -> None:
        for conn in [*self.conns.values(), *self._leaving.values()]:
            conn.close()
        self.conns, self._leaving = {}, {}

    def reset(self, table: list[int], addresses: list[str], epoch: int) -> None:
        """Abandon every request in flight (new connections: late replies to the old
        ones are never read), route by `table`, and tag requests with `epoch`."""
        self.close()
        self._owed, self._got, self._arrived, self._parts, self._fresh, self._early = {}, {}, {}, {}, {}, {}
        self._sent_at = {}
        self.epoch = int(epoch)
        self.set_table(table, addresses)

    # -- internals ----------------------------------------------------------------------
    def _send(self, kind: str, make, only: list[int] | None = None) -> Ticket:
        ticket = Ticket(kind, next(self._ids), [], time.perf_counter())
        self._got[ticket.id] = {}
        targets = self.active if only is None else [r for r in self.active if r in set(only)]
        if kind == "rows":  # may go to a server this worker's table routes nothing to: a block's new owner
            targets = [r for r in sorted(set(only or ())) if r in self.conns]
        for r in targets:
            conn = self.conns[r]
            msg = make(r, self.by_server.get(r, []))
            conn.send(msg)
            self.wire_bytes[0] += _nbytes(msg.tensors)
            ticket.sent_to[r] = time.perf_counter()
            ticket.carried[r] = ([b.key for b in self.by_server.get(r, [])] if kind == "pull" else
                                 blocks_named(msg.tensors))
            self._owed.setdefault(id(conn), {}).setdefault(_REPLY[kind], deque()).append(ticket.id)
            ticket.parts.append((r, conn, [b.key for b in self.by_server.get(r, [])]))
        return ticket

    def _receive(self, conn: Connection, deadline: float, limit: float) -> None:
        """Take one reply off `conn` and file it under the oldest ticket owed one of
        its type."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientError(f"{self.who}: no reply from {conn.address} within {limit:g}s")
            try:
                reply = conn.recv(timeout=min(left, 0.2))
                break
            except PeerTimeout:
                self.interrupt()
        if reply.type == "error":
            raise ClientError(f"{self.who}: {conn.address} refused: {reply.fields.get('message')}")
        self.wire_bytes[1] += _nbytes(reply.tensors)
        owed = self._owed.get(id(conn), {}).get(reply.type)
        if not owed:
            raise ClientError(f"{self.who}: unexpected {reply.type!r} from {conn.address}")
        ticket = owed[0]
        if reply.type == "params":
            self._note_applied(conn, ticket, reply)
        if reply.type == "params" and ticket in self._fresh:  # a pull in parts
            part = (ticket, id(conn))
            try:
                values = values_of(reply.tensors)
            except (KeyError, TypeError, ValueError) as exc:
                raise ClientError(f"{self.who}: {conn.address} sent malformed params ({exc})") from None
            early = reply.fields.get("early") is True
            self.timeline.append(("early" if early else "part", self._rank_of(conn), self._sent_at.get(ticket, 0.0),
                                  time.perf_counter(), sorted(values)))
            if early:  # computed ahead: not used before the version is published
                self._early.setdefault(part, {}).update(reply.tensors)
                return
            earlier = self._parts.pop(part, {})
            ahead = self._early.pop(part, None)
            if ahead is not None and reply.fields.get("kept") is True:  # they stand: the first of the final parts
                self._fresh[ticket].update(values_of(ahead))
                earlier = {**ahead, **earlier}
            self._fresh[ticket].update(values)
            if reply.fields.get("last", True) is False:  # a part of the reply: the rest is to come
                self._parts[part] = {**earlier, **reply.tensors}
                return
            reply.tensors.update(earlier)
        owed.popleft()
        self._got[ticket][id(conn)] = reply
        self._arrived.setdefault(ticket, {})[id(conn)] = time.perf_counter()

    def wait_beside(self, other: Connection, timeout: float) -> bool:
        """Wait at most `timeout` s for `other` (a connection not to a server: the
        coordinator's) to have a message, reading meanwhile each server reply owed as it
        comes, so that it is timed when it came and not when the wait for `other` ended
        (a worker blocked on the barrier would charge the barrier's time to every server
        whose reply came during it). True if `other` may be read: it has a message, or the
        transport cannot poll (then `other.recv` blocks as before)."""
        owing = self._owing()
        ready = wait_readable([other, *owing], timeout)
        for conn in ready:
            if conn is not other:
                self._receive(conn, time.monotonic() + self.timeout, self.timeout)
        return any(conn is other for conn in ready)

    def _owing(self) -> list[Connection]:
        """The connections (live or leaving) that owe a reply to some ticket."""
        return [c for c in (*self.conns.values(), *self._leaving.values())
                if any(self._owed.get(id(c), {}).values())]

    def _rank_of(self, conn: Connection) -> int:
        """The server at the other end of `conn` (also one removed with replies owed)."""
        return next((r for r, c in (*self.conns.items(), *self._leaving.items()) if c is conn), -1)

    def _note_applied(self, conn: Connection, ticket: int, reply: Message) -> None:
        """An "applied" event for the blocks of a pull's reply (or part of it) whose server
        said when it last computed them (`applied_s`, seconds after the pull reached it,
        for the latest of them): placed that long after the pull was sent, which is early
        by the pull's own trip to the server, so never after the weights' arrival (and
        never after now, should the two machines' clocks run at different rates)."""
        try:
            applied = read_field(reply.fields, "applied_s", float, who="")
        except ValueError as exc:
            raise ClientError(f"{self.who}: {conn.address} sent malformed params ({exc})") from None
        if applied is None or ticket not in self._sent_at:
            return
        try:
            keys = sorted(values_of(reply.tensors))
        except (KeyError, TypeError, ValueError) as exc:
            raise ClientError(f"{self.who}: {conn.address} sent malformed params ({exc})") from None
        at = min(self._sent_at[ticket] + applied, time.perf_counter())
        self.timeline.append(("applied", self._rank_of(conn), at, None, keys))

    def _sigmas(self, conn: Connection, ack: Message) -> list[int]:
        sigmas = ack.fields.get("staleness", [])
        if not isinstance(sigmas, list) or not all(isinstance(x, int) for x in sigmas):
            raise ClientError(f"{self.who}: {conn.address} sent a malformed ack")
        return sigmas


__all__ = ["ClientError", "PSClient", "Pulled", "Ticket", "receive"]
