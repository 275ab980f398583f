"""The coordinator's servers and the versioned block → server table (PSLD).

`ServerPool` owns one connection per server rank (None once a server is removed), the
table, and its version. Every change happens at a BSP barrier, when every server is at
the same version with nothing pending: blocks migrate server to server with their
optimizer state (the source sends them straight to the destination, the coordinator
only orders it), servers are initialised empty, or emptied and stopped. Workers learn
the new table with their next plan, before they push again.

Without a barrier (asp, softsync, ssp) the same changes happen while workers run: a
block's old owner fences it (applies what it holds for it, hands it over, forwards the
gradients that still reach it), and a server emptied for removal keeps forwarding until
no worker routes by a table that has it (`drain`, then `retire`).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..policy.measure import PROBE_TRAIN, ProbeTrain, probe_bytes, probed_rates
from ..policy.placement import Block, rehome
from ..wire import Connection, Message, wait_readable


class ServerPool:
    def __init__(self, connect: Callable[[str], Connection], expect: Callable[[Connection, str, str], Message],
                 addresses: list[str], table: list[int], blocks: list[Block],
                 on_removed: Callable[[int], None] = lambda rank: None):
        """`connect(address)` opens a connection, `expect(conn, kind, who)` awaits a
        reply, `on_removed(rank)` hears that a server was stopped on purpose."""
        self._connect, self._expect, self._on_removed = connect, expect, on_removed
        self.addresses = list(addresses)
        self.conns: list[Connection | None] = [connect(a) for a in addresses]
        self.table = list(table)
        self.blocks = blocks
        self.version = 0
        self.round_trip_s = float("inf")  # the least seen by `broadcast`
        self.leaving: dict[int, int] = {}  # emptied, still forwarding: rank -> table version it left at

    # -- plumbing ---------------------------------------------------------------------
    def live(self) -> list[int]:
        return [r for r, c in enumerate(self.conns) if c is not None]

    def serving(self) -> list[int]:
        """The live servers that may hold blocks (not those emptied for removal)."""
        return [r for r in self.live() if r not in self.leaving]

    def next_rank(self) -> int:
        return len(self.conns)

    def request(self, rank: int, msg: Message, kind: str) -> Message:
        self.conns[rank].send(msg)
        return self._expect(self.conns[rank], kind, f"server {rank}")

    def broadcast(self, msg: Message, kind: str) -> dict[int, Message]:
        """Send `msg` to every live server and take each one's `kind` reply. The least
        time from the sending to a reply's reading is kept (`round_trip_s`): what a
        message that carries no bytes costs, every exchange's fixed cost."""
        replies, took = self.timed(self.live(), msg, kind)
        self.round_trip_s = min([self.round_trip_s, *took.values()])
        return replies

    def timed(self, ranks: list[int], msg: Message, kind: str) -> tuple[dict[int, Message], dict[int, float]]:
        """Send `msg` to servers `ranks` at once; each one's `kind` reply, and the seconds from
        the sending to its reading (replies read in the order they come)."""
        sent = time.perf_counter()
        for r in ranks:
            self.conns[r].send(msg)
        replies: dict[int, Message] = {}
        took: dict[int, float] = {}
        while len(replies) < len(ranks):
            pending = [r for r in ranks if r not in replies]
            ready = wait_readable([self.conns[r] for r in pending], 1.0)
            r = next((r for r in pending if any(c is self.conns[r] for c in ready)), pending[0])
            replies[r] = self._expect(self.conns[r], kind, f"server {r}")
            took[r] = time.perf_counter() - sent
        return {r: replies[r] for r in ranks}, took

    def probe(self, ranks: list[int], measured: dict[int, float], train: int = PROBE_TRAIN[0],
              timed: int = PROBE_TRAIN[1], window: int = PROBE_TRAIN[2]) -> dict[int, float]:
        """The rates of servers `ranks` by a probe (PSLD's ``probe_targets``, the slowest server
        first): a tensor of as many bytes as the first's largest block, at most what its
        `measured` rate handles in PROBE_S (``probe_bytes``), sent `train` times to each,
        `window` at most in flight, none more to the others once the first's are in
        (``ProbeTrain``: a server still answering is slower than the first); a server's
        rate is those bytes over the median of its last `timed` replies' spacings
        (``train_spacing``, ``probed_rates``, scaled by the first's rate).

        A spacing is what a server takes per probe; the probes before the timed ones cross
        whatever burst an idle link lets through (the emulated link's bucket holds 5 ms of
        its rate: one probe at the slowest server's rate, three at a light server 3x as
        fast; a light server faster still is then overrated, but faster than the slowest
        all the same). Timing each probe from its sending counted the burst and the round
        trip: a server behind 55 MB/s was probed at 83-216 MB/s beside another as fast,
        and PSLD swapped the layer between the two up to 10 times in 60 iterations. The
        median drops a spacing that the host's scheduler stretched."""
        largest = max((b.nbytes for b in self.blocks if self.table[b.key] == ranks[0]), default=0)
        size = probe_bytes(largest, measured.get(ranks[0], 0.0))
        msg = Message("probe", {}, {"p": torch.zeros(size // 4, dtype=torch.float32)})
        plan = ProbeTrain(ranks, train, window)
        start = time.perf_counter()
        for r in plan.start():
            self.conns[r].send(msg)
        while pending := plan.pending():
            ready = wait_readable([self.conns[r] for r in pending], 1.0)
            for r in [r for r in pending if any(c is self.conns[r] for c in ready)] or pending[:1]:
                self._expect(self.conns[r], "pong", f"server {r}")
                for again in plan.replied(r, time.perf_counter()):
                    self.conns[again].send(msg)
        return probed_rates(plan.seconds(start, timed), size // 4 * 4, 0.0, measured, ranks[0])

    def close(self) -> None:
        for c in self.conns:
            if c is not None:
                c.close()

    def loads(self) -> dict[int, int]:
        out = {r: 0 for r in self.live()}
        for b in self.blocks:
            out[self.table[b.key]] += b.nbytes
        return out

    # -- changes (at a barrier only) ------------------------------------------------------
    def refusal(self, keys: list[int], dst: int) -> str | None:
        """Why `move(keys, dst)` would be refused (None: it would not)."""
        if dst not in self.serving():
            return f"server {dst} is not running (running: {self.serving()})"
        bad = [k for k in keys if not 0 <= k < len(self.table)]
        return f"blocks {bad} do not exist (0..{len(self.table) - 1})" if bad else None

    def move(self, keys: list[int], dst: int) -> dict:
        """Migrate blocks `keys` to server `dst`; returns bytes moved and seconds."""
        refused = self.refusal(keys, dst)
        if refused:
            raise ValueError(refused)
        t0, nbytes = time.perf_counter(), 0
        by_src: dict[int, list[int]] = {}
        for k in keys:
            if self.table[k] != dst:
                by_src.setdefault(self.table[k], []).append(k)
        for src, ks in sorted(by_src.items()):  # one at a time: a server blocks while it hands over
            ack = self.request(src, Message("migrate", {"keys": ks, "to": self.addresses[dst]}), "ack")
            nbytes += int(ack.fields.get("bytes", 0))
            for k in ks:
                self.table[k] = dst
        if by_src:
            self.version += 1
        return {"blocks": sorted(k for ks in by_src.values() for k in ks), "to": dst,
                "from": sorted(by_src), "bytes": nbytes, "pause_s": time.perf_counter() - t0}

    def add(self, rank: int, address: str, init: Message) -> dict:
        """Take server `rank` (started earlier, registered at `address`) into the job,
        initialised with no blocks."""
        t0 = time.perf_counter()
        while len(self.conns) <= rank:
            self.conns.append(None)
            self.addresses.append("")
        self.addresses[rank] = address
        self.conns[rank] = self._connect(address)
        self.request(rank, init, "ready")
        self.version += 1
        return {"server": rank, "pause_s": time.perf_counter() - t0}

    def remove(self, rank: int, rates: dict[int, float] | None = None) -> dict:
        """Move every block off server `rank` to the homes the placement policy picks
        (`rehome`: each to the server that would finish it soonest), stop it, forget it."""
        done = self.drain(rank, rates)
        self.retire(rank)
        return done

    def drain(self, rank: int, rates: dict[int, float] | None = None) -> dict:
        """Move every block off server `rank` (see `remove`); it stays up, holding
        nothing, until `retire`."""
        live = self.serving()
        if rank not in live:
            raise ValueError(f"server {rank} is not running (running: {live})")
        if len(live) == 1:
            raise ValueError(f"server {rank} is the last one running")
        t0 = time.perf_counter()
        homes = rehome([b.nbytes for b in self.blocks], self.table, rank, live, rates or {})
        plan: dict[int, list[int]] = {}
        for key, dst in homes.items():
            plan.setdefault(dst, []).append(key)
        moved = 0
        for dst, keys in sorted(plan.items()):
            moved += self.move(keys, dst)["bytes"]
        self.addresses[rank] = ""  # tables from now on do not name it
        self.version += 1
        self.leaving[rank] = self.version
        return {"server": rank, "bytes": moved, "pause_s": time.perf_counter() - t0}

    def retire(self, rank: int) -> None:
        """Stop server `rank`, emptied by `drain`, and forget it."""
        self.request(rank, Message("stop", {"reason": "server removed"}), "ack")
        self.conns[rank].close()
        self.conns[rank] = None
        self.addresses[rank] = ""  # also if a replacement took its rank while it drained
        self.leaving.pop(rank, None)
        self._on_removed(rank)


__all__ = ["ServerPool"]
