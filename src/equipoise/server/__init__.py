"""A parameter server: `core` (the message handling of one server process), `store` (its
blocks, their optimizer and versions), `parts` (what its parts use of the core), `moves` (blocks migrated in and out), `handover`
(without a barrier, gradients that reached a block's old owner sent on), `fragments`
(pushes streamed in parts by backward_push), `ahead` (eager_update: a block's update
computed as soon as its gradients are in), `replica` (replication = 1) and `origin` (who
may send it what). It imports no
other role package.

Public: `Server`, `ParameterStore`."""

from .core import Server
from .store import ParameterStore

__all__ = ["ParameterStore", "Server"]
