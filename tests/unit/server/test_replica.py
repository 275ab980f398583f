"""replication = 1, a server's side (server/replica.py): what may be published."""

from __future__ import annotations

from equipoise.server.replica import Replication
from equipoise.wire import InMemoryTransport


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
