"""replication = 1, a server's side (server/replica.py): what may be published."""

from __future__ import annotations

from equipoise.server.replica import Replication
from equipoise.wire import InMemoryTransport, Message


def test_a_version_waits_for_the_backup_and_a_server_alone_waits_for_nothing():
    transport = InMemoryTransport()
    backup = transport.listen()
    try:
        rep = Replication(transport, 0, "self")
        rep.reset(3)
        rep.set_backup(backup.address)
        rep.record(4, 10, {}, {})
        assert rep.published(3) and not rep.published(4)  # forwarded, not yet acknowledged
        rep.on_ack(4)
        assert rep.published(4)
        # The last server left (its backup was lost and no other remains) has no backup:
        # were it to wait for an acknowledgement, every pull would be held forever.
        rep.set_backup("")
        assert rep.published(5)
        rep.close()
    finally:
        backup.close()
        transport.close()


def test_a_replica_ack_of_an_epoch_before_the_last_rollback_is_dropped():
    """After a rollback (epoch 2) a late ack of epoch 1 says nothing of what the backup
    holds now: `confirmed` does not move; the same ack of epoch 2 moves it."""
    from equipoise.server.core import Server
    from equipoise.wire import InMemoryTransport

    t = InMemoryTransport()
    server = Server(0, t, "nowhere")
    server.epoch = 2
    server.replication = Replication(t, 0, server.listener.address)
    server.backup.on_replica_ack(b"p", Message("replica_ack", {"version": 5, "backup": 1, "epoch": 1}))
    assert server.replication.confirmed == 0
    server.backup.on_replica_ack(b"p", Message("replica_ack", {"version": 5, "backup": 1, "epoch": 2}))
    assert server.replication.confirmed == 5
    server.listener.close()
    t.close()
