"""A worker's connection to the coordinator: requests, the replies it waits for (with a
deadline, reading server replies meanwhile), the messages kept while it waits for
servers, and a rollback's reset, which ends any wait."""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from ..wire import Connection, Message, PeerTimeout
from .client import ClientError


class WorkerError(ClientError):
    """A fault of this worker's step (non-finite loss, a bad plan); names the worker."""

    @classmethod
    def unsplittable(cls, oom: Exception) -> "WorkerError":
        """A slice out of memory where it cannot be cut again (no barrier)."""
        return cls(f"{oom}; without a barrier its slice cannot be split again: lower max_batch")


class Reset(Exception):
    """The coordinator rolled the job back (a server was lost): start again from the
    plan it will send, on the block table `msg` carries."""

    def __init__(self, msg: Message):
        super().__init__("reset")
        self.msg = msg


class CoordinatorLink:
    """Worker `rank`'s connection `conn` to the coordinator; every wait ends within `timeout`."""

    def __init__(self, conn: Connection, rank: int, timeout: float):
        self.conn, self.rank, self.timeout = conn, rank, timeout
        self.inbox: deque[Message] = deque()  # coordinator messages read while waiting for servers

    def send(self, msg: Message) -> None:
        self.conn.send(msg)

    def recv(self, expect: str, epoch: int, beside: Callable[[Connection, float], bool] | None = None) -> Message:
        """The coordinator's next message of epoch `epoch` or later (replies of an earlier
        one, sent before a rollback, are skipped), which must be an `expect`; Reset if the
        coordinator rolled the job back. `beside(conn, seconds)` waits for this
        connection while reading the servers' replies as they come (False: not ready)."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self.inbox:
                msg = self.inbox.popleft()
            else:
                try:
                    left = deadline - time.monotonic()
                    if left > 0 and beside is not None and not beside(self.conn, min(left, 0.2)):
                        continue
                    msg = self.conn.recv(timeout=max(0.001, deadline - time.monotonic()))
                except PeerTimeout:
                    raise WorkerError(f"worker {self.rank}: no {expect!r} from the coordinator within "
                                      f"{self.timeout:g}s") from None
            if msg.fields.get("reset"):
                raise Reset(msg)
            if int(msg.fields.get("epoch", epoch)) >= epoch:
                break
        if msg.type != expect:
            raise WorkerError(f"worker {self.rank}: expected {expect!r} from the coordinator, got {msg.type!r}"
                              + (f": {msg.fields.get('message')}" if msg.type == "error" else ""))
        return msg

    def look(self) -> None:
        """While waiting for servers: keep what the coordinator sent; a reset ends the wait."""
        while True:
            try:
                msg = self.conn.recv(timeout=0)
            except PeerTimeout:
                return
            if msg.fields.get("reset"):
                raise Reset(msg)
            self.inbox.append(msg)

    def close(self) -> None:
        self.conn.close()


def oom_report(f: dict, oom: Exception, versions: dict[int, int]) -> dict:
    """The report of a slice (plan fields `f`) that ran out of memory: nothing computed."""
    return {"iteration": f["iteration"], "start": f["start"], "samples": f["size"], "oom": True,
            "part": int(f.get("part", 0)), "message": str(oom), "loss": 0.0, "count": 0.0,
            "compute_s": 0.0, "wait_s": 0.0, "comm_s": 0.0, "staleness": [],
            "version": min(versions.values(), default=0)}


def plan_table(client, barrier: bool, rank: int, plan: Message, versions: dict[int, int],
               in_flight: int) -> dict[int, int]:
    """Route a worker's `client` (worker/client.py) by the block table that came with a
    plan; the versions its weights are of. Under a barrier every server is at the plan's
    version, so the weights just pulled are current on the new owners too. Without one
    the blocks were handed over while the worker ran: the next exchange routes by the new
    table (a gradient that reached an old owner is forwarded by it), and the versions read
    so far stand."""
    if "table" not in plan.fields:
        return versions
    if not barrier:
        client.set_table(plan.fields["table"], plan.fields["servers"])
        return versions
    if in_flight:
        raise WorkerError(f"worker {rank}: the block table changed with {in_flight} "
                          f"exchanges in flight (tables change only at a barrier)")
    client.set_table(plan.fields["table"], plan.fields["servers"])
    return {r: int(plan.fields["version"]) for r in client.active}


def exchange_times(since: float, pull_held: float, plan: Message) -> dict:
    """Split an exchange begun at `since` into waiting (a server or the coordinator held
    the request for the barrier) and communication (the rest)."""
    total = time.perf_counter() - since
    wait = min(total, max(pull_held, float(plan.fields.get("held_s", 0.0))))
    return {"wait_s": wait, "comm_s": total - wait}


__all__ = ["CoordinatorLink", "Reset", "WorkerError", "exchange_times", "oom_report", "plan_table"]
