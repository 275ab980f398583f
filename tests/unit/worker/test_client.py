"""The worker's client of the parameter servers (worker/client.py), against scripted
servers on the in-memory transport: the test plays each server by hand (its listener's
queue holds the requests), so the order in which replies arrive is chosen exactly."""

import time

import pytest
import torch

from equipoise.policy.placement import Block
from equipoise.worker.client import ClientError, PSClient, Pulled
from equipoise.wire import InMemoryTransport, Message
from equipoise.wire.names import grads_of, pack

BLOCKS = [Block(k, "w", 3 * k, 3 * k + 3) for k in range(4)]


@pytest.fixture
def net():
    transport = InMemoryTransport()
    servers = [transport.listen(), transport.listen()]
    client = PSClient(transport, worker=7, blocks=BLOCKS, timeout=5.0)
    client.set_table([0, 1, 0, 1], [s.address for s in servers])
    yield transport, servers, client
    client.close()
    transport.close()


def take(server, kind):
    """The next request a server received; it must be of `kind`."""
    peer, msg = server.recv(timeout=1.0)
    assert msg.type == kind, msg
    return peer, msg


def params(keys, version, held=0.0):
    return Message("params", {"version": version, "held_s": held},
                   pack(values={k: torch.full((3,), float(10 * version + k)) for k in keys}))


def test_a_pull_brings_every_block_each_servers_version_and_the_longest_hold(net):
    _, servers, client = net
    assert client.active == [0, 1]
    ticket = client.pull(5)
    for r, server in enumerate(servers):
        peer, msg = take(server, "pull")
        assert msg.fields == {"worker": 7, "min_version": 5, "epoch": 0}
        server.send(peer, params([r, r + 2], version=5 + r, held=0.25 * (r + 1)))
    pulled = client.wait(ticket)
    assert isinstance(pulled, Pulled)
    assert pulled.versions == {0: 5, 1: 6} and pulled.held_s == 0.5
    assert {k: v[0].item() for k, v in pulled.values.items()} == {0: 50.0, 1: 61.0, 2: 52.0, 3: 63.0}


def test_a_push_sends_each_server_its_blocks_tagged_with_its_version(net):
    _, servers, client = net
    grads = {k: torch.full((3,), float(k)) for k in range(4)}
    ticket = client.push(grads, {0: 3, 1: 4}, samples=16)
    for r, server in enumerate(servers):
        peer, msg = take(server, "push")
        assert msg.fields == {"worker": 7, "version": 3 + r, "samples": 16, "epoch": 0}
        assert sorted(grads_of(msg.tensors)) == [r, r + 2] and len(msg.tensors) == 2
        assert all(torch.equal(t, grads[k]) for k, t in grads_of(msg.tensors).items())
        server.send(peer, Message("ack", {"version": 5, "staleness": [r, r + 10]}))
    assert client.wait(ticket) == [0, 10, 1, 11]


def test_replies_out_of_request_order_reach_their_own_tickets(net):
    """A pull held for a newer version is overtaken by the ack of a later push, and two
    pulls in flight on a connection are answered in order but may be waited in any."""
    _, servers, client = net
    first = client.pull(1)
    push = client.push({k: torch.zeros(3) for k in range(4)}, {0: 0, 1: 0}, samples=4)
    second = client.pull(2)
    for r, server in enumerate(servers):
        peer, _ = take(server, "pull")
        take(server, "push")
        take(server, "pull")
        server.send(peer, Message("ack", {"version": 1, "staleness": [r]}))
        server.send(peer, params([r, r + 2], version=1))
        server.send(peer, params([r, r + 2], version=2))
    assert client.wait(second).versions == {0: 2, 1: 2}
    assert client.wait(first).versions == {0: 1, 1: 1}
    assert client.wait(push) == [0, 1]
    with pytest.raises(ValueError, match="already waited"):
        client.wait(push)


def test_an_error_reply_names_the_server(net):
    _, servers, client = net
    ticket = client.push({k: torch.zeros(3) for k in range(4)}, {0: 0, 1: 0}, samples=4)
    peer, _ = take(servers[0], "push")
    servers[0].send(peer, Message("ack", {"version": 1, "staleness": []}))
    peer, _ = take(servers[1], "push")
    servers[1].send(peer, Message("error", {"message": "version 9 is ahead"}))
    with pytest.raises(ClientError, match=f"worker 7: {servers[1].address} refused: version 9 is ahead"):
        client.wait(ticket)


def test_silence_raises_after_the_timeout_naming_the_server(net):
    _, servers, client = net
    ticket = client.pull(0)
    peer, _ = take(servers[0], "pull")
    servers[0].send(peer, params([0, 2], version=0))
    with pytest.raises(ClientError, match=f"no reply from {servers[1].address} within 0.05s"):
        client.wait(ticket, timeout=0.05)


@pytest.mark.parametrize("reply, match", [
    (Message("params", {"version": 0, "held_s": 0.0}), "unexpected 'params'"),  # no pull owed
    (Message("ack", {"version": 0, "staleness": ["x"]}), "malformed ack"),
])
def test_replies_out_of_protocol_are_refused(net, reply, match):
    _, servers, client = net
    ticket = client.push({k: torch.zeros(3) for k in range(4)}, {0: 0, 1: 0}, samples=4)
    for server in servers:
        peer, _ = take(server, "push")
        server.send(peer, reply)
    with pytest.raises(ClientError, match=match):
        client.wait(ticket)


@pytest.mark.parametrize("applied", [-0.001, 0.0, 5.0, float("nan"), "soon", True])
def test_a_reply_saying_when_its_blocks_were_computed_is_placed_after_the_pull_or_refused(net, applied):
    """`applied_s` (seconds from the pull's arrival to the blocks' update, by the server's
    clock) becomes an "applied" event at the pull's sending plus that much, with the
    reply's blocks, but never later than the reply was read (5 s ahead: a server whose
    clock runs fast); anything but a finite number is a malformed reply, named."""
    _, servers, client = net
    ticket = client.pull(3)
    for r, server in enumerate(servers):
        peer, _ = take(server, "pull")
        reply = params([r, r + 2], version=3)
        reply.fields["applied_s"] = applied
        server.send(peer, reply)
    if not isinstance(applied, float) or applied != applied:
        with pytest.raises(ClientError, match=f"sent malformed params \\(applied_s = {applied!r} is not a finite number\\)"):
            client.wait(ticket)
        return
    client.wait(ticket)
    read = time.perf_counter() - ticket.sent
    events = sorted((e[1], e[2], e[3], e[4]) for e in client.take_timeline(origin=ticket.sent) if e[0] == "applied")
    assert [(r, at, keys) for r, _, at, keys in events] == [(0, None, [0, 2]), (1, None, [1, 3])]
    for _, t, _, _ in events:
        assert t == round(applied, 6) if applied < 1 else 0 < t <= read


def test_params_missing_a_block_are_refused(net):
    _, servers, client = net
    ticket = client.pull(0)
    for r, server in enumerate(servers):
        peer, _ = take(server, "pull")
        server.send(peer, params([r], version=0))  # block r + 2 is missing
    with pytest.raises(ClientError, match=f"{servers[0].address} sent malformed params"):
        client.wait(ticket)


def test_a_new_table_reroutes_and_drops_a_removed_server(net):
    transport, servers, client = net
    old = client.conns[1]
    client.set_table([0, 0, 0, 0], [servers[0].address, ""])
    assert client.active == [0] and 1 not in client.conns and old.closed
    ticket = client.pull(0)
    peer, _ = take(servers[0], "pull")
    assert servers[1].recv(timeout=0.01) is None
    servers[0].send(peer, params(range(4), version=0))
    assert sorted(client.wait(ticket).values) == [0, 1, 2, 3]
    with pytest.raises(ClientError, match="block 3 on server 1, which has no address"):
        client.set_table([0, 0, 0, 1], [servers[0].address, ""])


def test_a_server_removed_with_replies_owed_is_still_waited_then_closed(net):
    """Without a barrier a server may be removed while a pull to it is in flight: the
    new table routes nothing to it, its reply is still collected (a handed-over block
    keeps the worker's own value), and the next table closes the connection."""
    _, servers, client = net
    ticket = client.pull(0)
    leaving = client.conns[1]
    client.set_table([0, 0, 0, 0], [servers[0].address, ""])
    assert client.active == [0] and not leaving.closed
    for s, keys, moved in ((0, [0, 2], []), (1, [], [1, 3])):
        peer, _ = take(servers[s], "pull")
        reply = params(keys, version=0)
        reply.fields["moved"] = moved
        servers[s].send(peer, reply)
    assert sorted(client.wait(ticket).values) == [0, 2]
    client.set_table([0, 0, 0, 0], [servers[0].address, ""])
    assert leaving.closed


def test_the_worker_keeps_at_most_one_exchange_in_flight():
    from dataclasses import replace

    from equipoise.config import Config
    from equipoise.worker.loop import Worker, WorkerError

    cfg = replace(Config.from_dict({"protocol": "asp", "overlap": True}), overlap=2)
    with pytest.raises(WorkerError, match="overlap = 2"):
        Worker(cfg, 0, InMemoryTransport(), "mem://1")


def test_an_overlapped_job_on_threads_applies_every_gradient_once(tmp_path):
    from equipoise.config import Config
    from equipoise.data import load_dataset
    from equipoise.launch.threads import run_threads

    cfg = Config.from_dict(dict(dataset="digits", model="mlp", protocol="asp", overlap=True, global_batch=48,
                                workers=3, servers=2, iterations=8, eval_every=0, checkpoint_every=0,
                                progress=False, timeout=30.0, block_size=2000))
    summary = run_threads(cfg, tmp_path, load_dataset("digits"))
    assert summary["samples"] == 8 * 48
    # one gradient per μ = 16 samples, applied once on each server, none lost at the stop
    assert sum(summary["staleness_histogram"].values()) == 8 * 3 * cfg.servers


def test_each_servers_exchange_time_is_measured_as_its_reply_comes_less_a_pulls_hold(net):
    """What PSLD weighs a server by besides its own busy time: server 1 answers a push
    0.2 s after server 0, so its exchange took at least 0.2 s (a lower bound: a loaded
    machine can only make it longer). A pull's time is less the time the server held
    it for a version (here more than the whole wait: none of it is counted)."""
    import threading
    import time

    _, servers, client = net
    ticket = client.push({k: torch.zeros(3) for k in range(4)}, {0: 0, 1: 0}, 8)
    peer0, _ = take(servers[0], "push")
    peer1, _ = take(servers[1], "push")
    servers[0].send(peer0, Message("ack", {"version": 0, "staleness": []}))
    late = threading.Timer(0.2, lambda: servers[1].send(peer1, Message("ack", {"version": 0, "staleness": []})))
    start = time.perf_counter()
    late.start()
    client.wait(ticket)
    waited = time.perf_counter() - start
    got = client.take_server_s()
    assert set(got) == {0, 1} and got[1] >= 0.2 and got[0] <= waited
    assert client.take_server_s() == {}  # taken once
    ticket = client.pull(0)
    for r, server in enumerate(servers):
        peer, _ = take(server, "pull")
        server.send(peer, params([r, r + 2], version=0, held=10.0))
    client.wait(ticket)
    assert client.take_server_s() == {0: 0.0, 1: 0.0}


@pytest.mark.parametrize("kept", [True, False])
def test_blocks_sent_ahead_are_held_back_until_the_final_parts_say_they_stand(net, kept):
    """eager_update: a server's early parts (blocks computed before it published the
    version) are not handed out while the forward runs; the first final part says whether
    they stand (kept: then they are handed out and belong to the pull) or not (dropped:
    the final parts bring every block again)."""
    _, servers, client = net
    ticket = client.pull(5, part_kb=1, early=True)
    peers = []
    for server in servers:
        peer, msg = take(server, "pull")
        assert msg.fields["early"] is True and msg.fields["part_kb"] == 1
        peers.append(peer)
    servers[0].send(peers[0], params([0, 2], version=5))
    # server 1 (blocks 1 and 3) sends block 3 ahead: 63 is its published value
    servers[1].send(peers[1], Message("params", {"version": 5, "held_s": 0.0, "early": True, "last": False},
                                      pack(values={3: torch.full((3,), 63.0 if kept else -1.0)})))
    got, deadline = {}, time.monotonic() + 5
    while not (0 in got and client._early):  # both read: server 0's reply, server 1's early part
        assert not client.progress(ticket, deadline, 5)
        got.update(client.arrived(ticket))
    assert sorted(got) == [0, 2]  # the early block is held back
    final = params([1] if kept else [1, 3], version=5)
    final.fields.update(kept=kept, last=True)
    servers[1].send(peers[1], final)
    pulled = client.wait(ticket)
    assert {k: v[0].item() for k, v in pulled.values.items()} == {0: 50.0, 1: 51.0, 2: 52.0, 3: 53.0 if not kept
                                                                    else 63.0}


def test_a_pull_sent_ahead_takes_its_early_parts_after_the_older_pull_s_reply(net):
    """eager_update: the next version's pull is sent while the current one is still
    arriving in parts; each server's replies come in order on its connection (the
    current pull's parts, then the next one's early and final parts), and each lands in
    its own ticket."""
    _, servers, client = net
    now, ahead = client.pull(5, part_kb=1), client.pull(6, part_kb=1, early=True)
    for r, server in enumerate(servers):
        (peer, _), _ = take(server, "pull"), take(server, "pull")
        first = params([r], version=5)
        first.fields["last"] = False
        server.send(peer, first)
        server.send(peer, params([r + 2], version=5))  # its last part
        server.send(peer, Message("params", {"version": 6, "held_s": 0.0, "early": True, "last": False},
                                  pack(values={r + 2: torch.full((3,), float(62 + r))})))
        final = params([r], version=6)
        final.fields.update(kept=True, last=True)
        server.send(peer, final)
    assert {k: v[0].item() for k, v in client.wait(now).values.items()} == {0: 50.0, 1: 51.0, 2: 52.0, 3: 53.0}
    assert {k: v[0].item() for k, v in client.wait(ahead).values.items()} == {0: 60.0, 1: 61.0, 2: 62.0, 3: 63.0}


@pytest.fixture
def zmq_net():
    """Two servers, a coordinator and a client over ZeroMQ (connections polled together)."""
    from equipoise.wire import ZmqTransport

    with ZmqTransport() as transport:
        servers = [transport.listen(), transport.listen()]
        coordinator = transport.listen()
        client = PSClient(transport, worker=7, blocks=BLOCKS, timeout=5.0)
        client.set_table([0, 1, 0, 1], [s.address for s in servers])
        coord = transport.connect(coordinator.address)
        try:
            yield servers, coordinator, coord, client
        finally:
            coord.close()
            client.close()


def _once_read(client, ticket, then, seen):
    """A thread that calls `then()` as soon as the client has read a reply to `ticket`
    (`seen` set), or after 5 s without (`seen` left clear)."""
    import threading

    def run():
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not client._arrived.get(ticket.id):
            time.sleep(0.005)
        if client._arrived.get(ticket.id):
            seen.set()
        then()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_reply_is_read_when_it_comes_while_the_worker_waits_for_another_server(zmq_net):
    """A server's exchange time must not hold the time the worker spent waiting for
    another server: server 0 answers a pull at once, and server 1 acks a push only once
    the client has read that reply, which it must do while it waits for the ack. Read
    only when the worker came to the pull, server 0's reply would be charged the wait
    for server 1 (one cause of PSLD keeping the CNN's first layer on a 4x-slower server:
    every light server looked as slow as the slow one)."""
    import threading

    servers, _, _, client = zmq_net
    pull = client.pull(0)
    push = client.push({k: torch.zeros(3) for k in (1, 3)}, {1: 0}, 8, only=[1])
    peer0, _ = take(servers[0], "pull")
    peer1, _ = take(servers[1], "pull")
    take(servers[1], "push")
    seen = threading.Event()
    ack = _once_read(client, pull, lambda: servers[1].send(peer1, Message("ack", {"version": 0, "staleness": []})),
                     seen)
    servers[0].send(peer0, params([0, 2], version=0))
    client.wait(push)
    ack.join()
    assert seen.is_set()  # read during the wait for the ack, which came after it
    servers[1].send(peer1, params([1, 3], version=0))
    client.wait(pull)
    got = client.take_server_s()
    assert got[0] <= got[1], got  # server 1's reply came after server 0's, to a pull sent after


def test_a_reply_is_read_when_it_comes_while_the_worker_waits_for_the_coordinator(zmq_net):
    """The same while the worker waits for its next plan (under a barrier: for the
    slowest worker): the coordinator answers only once server 0's reply has been read."""
    import threading

    servers, coordinator, coord, client = zmq_net
    coord.send(Message("ping", {}))  # stands for the plan request
    coord_peer, _ = coordinator.recv(timeout=2.0)
    pull = client.pull(0)
    peers = [take(server, "pull")[0] for server in servers]
    seen = threading.Event()
    plan = _once_read(client, pull, lambda: coordinator.send(coord_peer, Message("pong", {})), seen)
    servers[0].send(peers[0], params([0, 2], version=0))
    while not client.wait_beside(coord, 2.0):
        pass
    assert coord.recv(timeout=1.0).type == "pong"
    plan.join()
    assert seen.is_set()
    servers[1].send(peers[1], params([1, 3], version=0))
    assert isinstance(client.wait(pull), Pulled)
