"""worker/rows.py RowsAhead with a scripted client: which requests it waits on, and when.
A request asked ahead is for a version the servers may reach only through this worker's
next push (a lost worker's share is computed first): it must never be waited on before
this worker's weights are of that version."""

from types import SimpleNamespace

import pytest
import torch

from equipoise.policy.placement import Block
from equipoise.wire import Message
from equipoise.wire.names import pack_parts
from equipoise.worker.rows import AheadMissed, RowsAhead, fetch_rows, slice_seed

BLOCK = Block(0, "t", 0, 40, "rows", 4, 4)  # 10 rows of 4


class ClientError(Exception):
    pass


class Client:
    """Answers every rows request with rows of the version asked, unless `missing`;
    records which tickets were waited on."""

    def __init__(self):
        self.epoch, self.worker, self.who = 0, 0, "worker 0"
        self.by_server, self.conns = {0: [BLOCK]}, {}
        self.sent, self.waited, self.missing = [], [], False

    def _send(self, kind, make, only):
        msg = make(0, [BLOCK])
        ticket = SimpleNamespace(id=len(self.sent), msg=msg)
        self.sent.append(ticket)
        return ticket

    def wait(self, ticket):
        self.waited.append(ticket.id)
        version = ticket.msg.fields["min_version"]
        if self.missing and ticket.msg.fields.get("ahead"):
            return {0: Message("rows", {"version": version, "missing": [0]})}
        rows = ticket.msg.tensors
        n = sum(int(c[1]) for c in rows["I0#"].tolist()) if "I0#" in rows else rows["I0"].numel()
        return {0: Message("rows", {"version": version}, pack_parts("R", {0: torch.full((n * 4,), float(version))}))}

    def rows(self, version, wanted):
        return fetch_rows(self, version, wanted, ClientError)


class Tables:
    def __init__(self):
        self.version, self.ready, self.fetched = 1, None, []

    def wanted(self, ids):
        uniq = torch.unique(ids["t"])
        return {"t": uniq}, {0: uniq}

    def put_ready(self, asked, got):
        self.ready = got[0]

    def prefetch(self, ids, fetch):
        self.fetched.append(fetch(self.version, self.wanted(ids)[1])[0])


class Loader:
    data_s = 0.0

    def get(self, start, size):
        return torch.arange(start, start + size) % 10 + torch.randint(0, 1, (size,))  # draws from the generator

    def prefetch(self, start, size):
        pass


def rows_ahead():
    client, tables = Client(), Tables()
    data = SimpleNamespace(sparse_ids=lambda batch: {"t": batch})
    cfg = SimpleNamespace(global_batch=8, seed=3)
    return RowsAhead(tables, client, ClientError, data, Loader(), cfg, end=1000, early=True), client, tables


def test_the_next_steps_rows_are_asked_for_at_the_pulls_version_and_taken_by_it():
    ahead, client, tables = rows_ahead()
    ahead.ask_next({"start": 0, "size": 4, "iteration": 0}, version=2)
    assert [t.msg.fields for t in client.sent] == [{"worker": 0, "min_version": 2, "epoch": 0, "ahead": True}]
    assert client.waited == []  # not waited on when asked
    torch.manual_seed(0)
    batch, state = ahead.get(8, 4), torch.default_generator.get_state()  # the slice read ahead
    torch.manual_seed(slice_seed(3, 8))  # as the step seeds and reads it without: the same batch and generator
    assert torch.equal(batch, Loader().get(8, 4)) and torch.equal(state, torch.default_generator.get_state())
    tables.version = 2
    ahead.rows(batch, {"start": 8, "size": 4})
    assert client.waited == [0] and tables.fetched == [] and bool((tables.ready == 2.0).all())


def test_a_lost_workers_share_is_fetched_at_once_and_the_rows_asked_ahead_wait_for_the_step_after():
    """The recovery of a share (plan `recover`) computes on the weights of version 1
    while the request asked ahead waits for version 2, which the servers reach only once
    this share is pushed: it is neither waited on nor dropped, and the next step takes it."""
    ahead, client, tables = rows_ahead()
    ahead.ask_next({"start": 0, "size": 4}, version=2)
    share = {"start": 20, "size": 2, "recover": True}
    ahead.rows(ahead.get(20, 2), share)
    assert client.waited == [1] and len(tables.fetched) == 1  # its own request, of version 1, only
    tables.version = 2
    ahead.rows(ahead.get(8, 4), {"start": 8, "size": 4})
    assert client.waited == [1, 0] and tables.ready is not None


@pytest.mark.parametrize("plan", [{"start": 8, "size": 6}, {"start": 16, "size": 4}])
def test_rows_asked_for_another_slice_are_dropped_and_collected_once_their_version_is_reached(plan):
    ahead, client, tables = rows_ahead()
    ahead.ask_next({"start": 0, "size": 4}, version=2)
    tables.version = 1  # weights still of version 1 (a share recomputed, a rollback's replay)
    ahead.rows(ahead.get(plan["start"], plan["size"]), plan)
    assert client.waited == [1] and tables.ready is None  # fetched now; the dropped request not waited on
    tables.version = 2
    ahead.rows(ahead.get(24, 4), {"start": 24, "size": 4})
    assert sorted(client.waited) == [0, 1, 2]  # collected now, then the step's own


def test_rows_asked_ahead_of_a_block_moved_since_are_asked_again():
    """A server that no longer holds a block asked for ahead (moved at the barrier since)
    answers it as missing: the step asks again, by its table, at once."""
    ahead, client, tables = rows_ahead()
    ahead.ask_next({"start": 0, "size": 4}, version=2)
    client.missing = True  # to requests asked ahead only
    tables.version = 2
    ahead.rows(ahead.get(8, 4), {"start": 8, "size": 4})
    assert client.waited == [0, 1] and tables.ready is None and bool((tables.fetched[0] == 2.0).all())
