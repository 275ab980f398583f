"""A server's part in `replication = 1` (barrier protocols): every version it applies is
forwarded, values and optimizer state, to a backup server, and published — pulls and
state requests for it answered — only once the backup has acknowledged it. Primary and
backup each keep the last two versions, so that after a loss every block's state at the
start of the iteration in flight can be read back: from its primary if that survived,
else from the backup (Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014, replicate a server's key range on its neighbour in the same way).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from ..wire import Connection, Message, Transport
from ..wire.names import pack
from .parts import Core


MAX_PRIMARIES = 64  # primaries one backup acknowledges: a bound on the connections a message can open


@dataclass(frozen=True)
class Version:
    """One server's blocks at `version`: values and optimizer state as wire tensors
    (copies: never changed after they are taken)."""

    version: int
    samples: int
    tensors: dict[str, torch.Tensor]


class Replication:
    def __init__(self, transport: Transport, rank: int, address: str):
        self.transport, self.rank, self.address = transport, rank, address
        self.backup: Connection | None = None
        self.confirmed = 0  # the newest version the backup acknowledged
        self.own: deque[Version] = deque(maxlen=2)
        self.replicas: dict[int, deque[Version]] = {}  # primary rank -> its last two versions
        self._acks: dict[str, Connection] = {}  # primary address -> connection for acks

    def reset(self, version: int) -> None:
        """A new start (an init): nothing replicated yet; `version` counts as confirmed
        (the coordinator holds it)."""
        self.own.clear()
        self.replicas.clear()
        self.confirmed = version

    def set_backup(self, address: str) -> None:
        if self.backup is not None:
            self.backup.close()
        self.backup = self.transport.connect(address) if address else None

    def record(self, version: int, samples: int, values: dict, state: dict, epoch: int = 0) -> None:
        """Keep a copy of this server's state at `version` and forward it to the backup,
        tagged with the job's rollback `epoch` (its ack echoes it: a late one is stale)."""
        own = Version(version, samples, {k: t.clone() for k, t in pack(values=values, states=state).items()})
        self.own.append(own)
        if self.backup is None:
            self.confirmed = version
            return
        self.backup.send(Message("replica", {"primary": self.rank, "version": version, "samples": samples,
                                             "reply_to": self.address, "epoch": epoch}, own.tensors))

    def on_replica(self, msg: Message) -> None:
        """Keep a primary's forwarded version and acknowledge it to the primary."""
        f = msg.fields
        primary, version = int(f["primary"]), int(f["version"])
        self.replicas.setdefault(primary, deque(maxlen=2)).append(
            Version(version, int(f["samples"]), dict(msg.tensors)))
        address = str(f["reply_to"])
        if address not in self._acks and len(self._acks) >= MAX_PRIMARIES:
            raise ValueError(f"server {self.rank} already acknowledges {MAX_PRIMARIES} primaries")
        if address not in self._acks:
            self._acks[address] = self.transport.connect(address)
        self._acks[address].send(Message("replica_ack", {"version": version, "backup": self.rank,
                                                         "epoch": int(f.get("epoch", 0))}))

    def on_ack(self, version: int) -> None:
        self.confirmed = max(self.confirmed, int(version))

    def published(self, version: int) -> bool:
        """Whether `version` may be published: the backup has it, or there is no backup
        (the last server left: versions are not even recorded then)."""
        return self.backup is None or version <= self.confirmed

    def find(self, primary: int, version: int) -> Version | None:
        """This server's own state (primary = its rank) or a primary's replica at `version`."""
        kept = self.own if primary == self.rank else self.replicas.get(primary, ())
        return next((v for v in kept if v.version == version), None)

    def close(self) -> None:
        for conn in [self.backup, *self._acks.values()]:
            if conn is not None:
                conn.close()
        self.backup, self._acks = None, {}


class BackupPart:
    """The server's handlers of replication: a part built around its core (the core
    holds the `Replication`, made on the first replication message)."""

    def __init__(self, core: Core):
        self.core = core

    def replication(self) -> Replication:
        core = self.core
        if core.replication is None:
            core.replication = Replication(core.transport, core.rank, core.listener.address)
            core.replication.reset(core.store.version if core.store else 0)
        return core.replication

    def record(self) -> None:
        """Forward the store's current version to the backup."""
        store = self.core.store
        self.core.replication.record(store.version, store.samples, store.values, store.optim_state(),
                                     self.core.epoch)

    def on_replicate(self, peer: bytes, msg: Message) -> None:
        """The coordinator names this server's backup ("": none); the current version
        is forwarded at once."""
        self.replication().set_backup(str(msg.fields["backup"]))
        self.record()
        self.core.listener.send(peer, Message("ack", {"version": self.core.sync.published()}))

    def on_replica(self, peer: bytes, msg: Message) -> None:
        """A primary forwards a version it applied (this server is its backup); one of
        an epoch before the last rollback is dropped."""
        if not self.core.is_stale(msg):
            self.replication().on_replica(msg)

    def on_replica_ack(self, peer: bytes, msg: Message) -> None:
        """The backup has a version: it may be published (unless the ack is of an epoch
        before the last rollback: then it says nothing of what the backup holds now)."""
        if self.core.is_stale(msg):
            return
        self.replication().on_ack(int(msg.fields["version"]))
        self.core.release()

    def on_replica_req(self, peer: bytes, msg: Message) -> None:
        """The coordinator reads back a state at `version`: this server's own, or a
        primary's it backs."""
        primary, version = int(msg.fields["primary"]), int(msg.fields["version"])
        kept = self.replication().find(primary, version)
        if kept is None:
            raise KeyError(f"server {self.core.rank} holds no state of server {primary} at version {version}")
        self.core.listener.send(peer, Message("state", {"version": kept.version, "samples": kept.samples,
                                                        "blocks": 1}, kept.tensors))

__all__ = ["BackupPart", "Replication", "Version"]
