"""A worker's requests for rows of sparse tables (PSClient.rows): one request per server
holding rows asked for, many blocks in one tensor (wire/names.py ``pack_parts``), and
again of a block's new owner where the block was handed over without a barrier since
the worker's table (the old owner answers with its address).

`RowsAhead`: under a barrier, the next step's rows are asked for as soon as this step's
exchange is sent, beside its pull (the user's ``sparse_ids`` of the slice the worker
expects next; a server holds the request, like the pull, until it is at the version
asked), so they come back while the barrier is waited for instead of after it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..wire import Message
from ..wire.names import pack_parts, unpack_parts

__all__ = ["fetch_rows", "ask_rows", "RowsAhead", "AheadMissed", "MAX_ROW_HOPS", "slice_seed"]

MAX_ROW_HOPS = 4  # a rows request follows a block handed over without a barrier this many times


def slice_seed(seed: int, start: int) -> int:
    """The CPU generator's seed for the step on the slice at `start` (worker/loop.py)."""
    return seed * 1_000_003 + start


class AheadMissed(Exception):
    """Rows asked for ahead from a server that no longer holds their block (moved at
    the barrier since): the step asks again by its table."""


def ask_rows(client, version: int | None, wanted: dict[int, torch.Tensor], route: dict[int, int] | None = None,
             ahead: bool = False):
    """Send the requests for `wanted` (by key, rows within the block) to the servers
    `route` (default: the client's table) names; the ticket `fetch_rows` collects.
    `ahead`: a block no longer held there is answered as missing, not refused."""
    if route is None:
        route = {b.key: r for r, blocks in client.by_server.items() for b in blocks}
    return client._send("rows", lambda r, blocks: Message(
        "rows_req", {"worker": client.worker, "min_version": int(version or 0), "epoch": client.epoch,
                     **({"ahead": True} if ahead else {})},
        pack_parts("I", {k: ids for k, ids in wanted.items() if route.get(k) == r})),
        only=sorted({route[k] for k in wanted if k in route}))


def fetch_rows(client, version: int | None, wanted: dict[int, torch.Tensor], error: type[Exception],
               ticket=None) -> dict[int, torch.Tensor]:
    """PSClient.rows: by key, rows × width; `error` (the client's) names what went wrong.
    `ticket`: the requests for `wanted` were sent already (`ask_rows`); AheadMissed if
    they were asked ahead and a server no longer holds a block (all replies collected)."""
    owner = {b.key: r for r, blocks in client.by_server.items() for b in blocks}
    width = {b.key: b.width for blocks in client.by_server.values() for b in blocks}
    route, pending = dict(owner), dict(wanted)
    out: dict[int, torch.Tensor] = {}
    for _ in range(MAX_ROW_HOPS):
        if ticket is None:
            ticket = ask_rows(client, version, pending, route)
        moved: dict[int, str] = {}
        replies = client.wait(ticket)
        if any(reply.fields.get("missing") for reply in replies.values()):
            raise AheadMissed(f"{client.who}: rows asked ahead of blocks moved since")
        for r, reply in replies.items():
            got = reply.fields.get("version")
            if version is not None and got != version:  # e.g. a lost worker's share recomputed after the update
                raise error(f"{client.who}: server {r} has table rows of version {got}, not {version}; "
                            "recomputing a lost worker's share with sparse tables is not supported yet")
            try:
                values = unpack_parts(reply.tensors, "R")
                moved.update({int(k): str(a) for k, a in reply.fields.get("moved", [])})
            except (ValueError, TypeError) as exc:
                raise error(f"{client.who}: server {r}'s rows reply: {exc}") from None
            for k, v in values.items():
                if k not in pending or k not in width or v.numel() != pending[k].numel() * width[k]:
                    raise error(f"{client.who}: server {r}'s rows reply has {v.numel()} values for "
                                f"block {k}, not the rows asked for")
                out[k] = v.view(-1, width[k])
        ticket = None
        # blocks handed over since this worker's table (no barrier): asked of their new owner
        pending = {k: pending[k] for k in moved if k in pending and k not in out}
        if not pending:
            return out
        ranks = {conn.address: r for r, conn in client.conns.items()}
        for k in pending:
            if moved[k] not in ranks:
                raise error(f"{client.who}: block {k} moved to {moved[k]}, a server this worker "
                            "is not connected to")
            route[k] = ranks[moved[k]]
    raise error(f"{client.who}: rows of blocks {sorted(pending)[:5]} moved {MAX_ROW_HOPS} times "
                "while being asked for")


@dataclass
class Ahead:
    """The next step's rows, asked for: the slice they are of, the version asked, the
    request, the ids by table and rows by block, the batch read for them and the CPU
    generator's state after its reading and the user's `sparse_ids` (as the step's
    forward would find it without asking ahead)."""

    start: int
    size: int
    version: int
    ticket: object
    asked: dict[str, torch.Tensor]
    wanted: dict[int, torch.Tensor]
    batch: object
    rng: torch.Tensor
    epoch: int  # the client's: a reset since abandoned the request


class RowsAhead:
    """A worker's rows of sparse tables, asked for one step ahead under a barrier (see
    the module docstring). `ask` reads the slice expected next (seeded as its step seeds
    it, the user's `sparse_ids` run on it: a dataset's own randomness is the same), asks
    for its rows, and leaves the generator as it found it; the step then takes the batch
    (`get`) and the rows (`rows`) if its plan names that slice and its weights are of
    that version. Otherwise they are dropped: the step reads and fetches as without, and
    the replies are collected once this worker's weights are of the version they wait
    for (never before: the servers may reach it only through this worker's next push).
    A lost worker's share (a `recover` plan) is fetched as without, the rows asked ahead
    kept for the step after it."""

    def __init__(self, tables, client, error: type[Exception], data, loader, cfg, end: int, early: bool):
        """`early`: ask ahead (a barrier, no exchange in flight, weights not taken as
        they come); otherwise each step asks for its rows itself."""
        self.tables, self.client, self.error, self.data, self.loader = tables, client, error, data, loader
        self.global_batch, self.seed, self.end, self.early = int(cfg.global_batch), int(cfg.seed), int(end), early
        self.ahead: Ahead | None = None
        self.dropped: list[Ahead] = []  # requests whose replies are still to collect

    def rows(self, batch, f: dict) -> None:
        """The rows of every table the step on plan `f` touches (the user's `sparse_ids`
        of its `batch`), in one request per server: those asked for ahead if they are of
        this slice and of the version of the weights pulled, else asked for now."""
        self._collect(self.tables.version)
        if f.get("recover") or not self.take(int(f["start"]), int(f["size"]), self.tables.version):
            self.tables.prefetch(self.data.sparse_ids(batch), self.client.rows)

    def ask_next(self, f: dict, version: int) -> None:
        """After the exchange of the step on plan `f`: ask for the rows of the slice its
        worker most likely has next (the same offset in the next iteration), of `version`
        (the pull's)."""
        start, size = int(f["start"]) + self.global_batch, int(f["size"])
        if self.early and size and not f.get("recover") and start + size <= self.end:
            self.ask(start, size, version)
        else:
            self.drop()

    def ask(self, start: int, size: int, version: int) -> None:
        self.drop()
        before = torch.default_generator.get_state()
        try:
            torch.default_generator.manual_seed(slice_seed(self.seed, start))
            batch = self.loader.get(start, size)
            asked, wanted = self.tables.wanted(self.data.sparse_ids(batch))
            rng = torch.default_generator.get_state()  # as the step's forward would find it
        except Exception:  # noqa: BLE001 - read again by the step itself, which reports what failed
            return
        finally:
            torch.default_generator.set_state(before)
        ticket = ask_rows(self.client, version, wanted, ahead=True) if wanted else None
        self.ahead = Ahead(start, size, version, ticket, asked, wanted, batch, rng, self.client.epoch)

    def get(self, start: int, size: int):
        """The batch of [start, start+size): the one read ahead (the generator set as
        after its reading) if it is that slice, else the loader's."""
        if not self._holds(start, size):
            return self.loader.get(start, size)
        torch.default_generator.set_state(self.ahead.rng)
        self.loader.data_s = 0.0  # read while the exchange was waited for
        return self.ahead.batch

    def prefetch(self, start: int, size: int) -> None:
        """The loader's prefetch of a plan's slice, unless it was read ahead."""
        if not self._holds(start, size):
            self.loader.prefetch(start, size)

    def take(self, start: int, size: int, version: int | None) -> bool:
        """Install the rows asked for ahead if they are of this step's slice and
        `version`; False (and nothing installed) otherwise."""
        a, self.ahead = self.ahead, None
        if a is None:
            return False
        if (a.start, a.size, a.version, a.epoch) != (start, size, version, self.client.epoch):
            self._drop(a)
            return False
        try:
            got = fetch_rows(self.client, a.version, a.wanted, self.error, a.ticket) if a.ticket is not None else {}
        except AheadMissed:  # a block moved at the barrier since: asked again by the new table
            return False
        self.tables.put_ready(a.asked, got)
        return True

    def drop(self) -> None:
        a, self.ahead = self.ahead, None
        if a is not None:
            self._drop(a)

    def _holds(self, start: int, size: int) -> bool:
        a = self.ahead
        return a is not None and (a.start, a.size, a.epoch) == (start, size, self.client.epoch)

    def _drop(self, a: Ahead) -> None:
        if a.ticket is not None and a.epoch == self.client.epoch:  # else abandoned with the rest by a reset
            self.dropped.append(a)

    def _collect(self, version: int | None) -> None:
        """The replies to dropped requests whose version this worker's weights are of (or
        past): they are in or on their way. Requests a reset abandoned are forgotten."""
        keep = []
        for a in self.dropped:
            if a.epoch != self.client.epoch:
                continue
            if version is None or a.version > version:
                keep.append(a)
                continue
            try:
                self.client.wait(a.ticket)
            except self.error:  # a server that left or answered at another version: unused anyway
                pass
        self.dropped = keep
