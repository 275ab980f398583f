"""The coordinator: one per job, in the calling process. It owns the plan (who computes
which slice of which iteration: `pacings` for barrier and stream protocols, `planner` for
LB-BSP's batch sizes, `assignments` for re-cutting a lost worker's slices), the servers
(`server_manager` and its `pool`: the block table, PSLD's decisions, migrations, elastic
servers, clipping's global norm, the user's requests in `control`), recovery from lost processes (`recovery`), snapshots,
evaluations and checkpoints (`snapshots`), and the run's records (`stats`). `rpc` holds
what its parts share to talk to peers. It imports no other role package.

Public: `make_coordinator`, `Coordinator`, `JobError`."""

from .base import Coordinator
from .pacings import make_coordinator
from .rpc import JobError

__all__ = ["Coordinator", "JobError", "make_coordinator"]
