"""What the coordinator needs to lose a worker in the middle of a barrier iteration and
end it as if the worker had not been lost.

Under BSP and LB-BSP every split of an iteration's global batch is the same SGD step:
the servers combine the pushes of an update weighted by their sample counts, so the
update is the mean gradient over the global batch however it was cut. When a worker dies
with iteration t in flight, its slices (its own and any shares of earlier losses it was
computing) are cut again among the survivors in proportion to their planned sizes
(LB-BSP's predicted speeds); each survivor computes its share on the weights of version
t and pushes it to the servers that had not applied t. A server's update t then waits
for exactly the pushes of the slices still owed to it.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Slice:
    """Samples [start, start + size) of the global order, computed by `worker` for the
    iteration in flight and pushed to `servers` (None: every server). `part` 0 is the
    worker's own plan; parts ≥ 1 are shares of a lost worker's slices."""

    worker: int
    part: int
    start: int
    size: int
    servers: tuple[int, ...] | None = None

    def reaches(self, server: int) -> bool:
        return self.servers is None or server in self.servers


class Assignments:
    """The slices of the iteration in flight, and the shares of lost ones not yet handed
    out (a survivor computes one share per plan request)."""

    def __init__(self) -> None:
        self.iteration: int | None = None
        self.slices: list[Slice] = []
        self.queue: dict[int, deque[Slice]] = {}
        self._parts = itertools.count(1)

    def begin(self, iteration: int, plans: dict[int, tuple[int, int]]) -> None:
        """Iteration `iteration` was handed out: worker → (start, size). A slice of no
        samples (LB-BSP's `min_batch` 0) is kept: its worker still pushes (zeros), and
        the servers' count of pushes after a loss includes it."""
        self.iteration = iteration
        self.slices = [Slice(w, 0, start, size) for w, (start, size) in sorted(plans.items())]
        self.queue = {}

    def lose(self, worker: int, shares: dict[int, float], behind: list[int],
             caps: dict[int, int] | None = None) -> list[Slice]:
        """`worker` died before delivering its slices; the servers in `behind` have not
        applied the iteration. Its slices are cut among the survivors by `shares`
        (worker → weight > 0), each cut again into pieces of at most its worker's cap
        (`caps`: device memory, max_batch), each going to the servers of `behind` it was
        owed to. Returns the new slices, also queued for their workers."""
        mine = [s for s in self.slices if s.worker == worker]
        self.slices = [s for s in self.slices if s.worker != worker]
        self.queue.pop(worker, None)
        new: list[Slice] = []
        for lost in mine:
            servers = tuple(r for r in behind if lost.reaches(r))
            if not servers:
                continue  # every server it was owed to applied the iteration already
            new += self._pieces(lost.start, lost.size, shares, caps or {}, servers)
        for s in new:
            self.slices.append(s)
            self.queue.setdefault(s.worker, deque()).append(s)
        return new

    def _pieces(self, start: int, size: int, shares: dict[int, float], caps: dict[int, int],
                servers: tuple[int, ...] | None) -> list[Slice]:
        """[start, start + size) cut by `shares`, each cut into pieces of at most its
        worker's cap, as new slices (parts) for `servers`."""
        out: list[Slice] = []
        for w, (at, n) in _cut(start, size, shares).items():
            cap = max(1, caps.get(w, n))
            for piece in range(0, n, cap):
                out.append(Slice(w, next(self._parts), at + piece, min(cap, n - piece), servers))
        return out

    def resplit(self, worker: int, start: int, shares: dict[int, float], caps: dict[int, int],
                servers: tuple[int, ...]) -> list[Slice]:
        """The slice of `worker` starting at `start` ran out of memory: it is cut among
        the workers of `shares` (worker → weight > 0), each cut again into pieces of at
        most its worker's cap (`caps`), for the servers it was owed to (`servers`, those
        holding blocks, if it was owed to all; none applied the iteration: the push
        never left). Returns the new slices, also queued."""
        old = next((s for s in self.slices if s.worker == worker and s.start == start), None)
        if old is None:
            raise ValueError(f"worker {worker} has no slice at {start} in iteration {self.iteration}")
        self.slices.remove(old)
        new = self._pieces(old.start, old.size, shares, caps, servers if old.servers is None else old.servers)
        for s in new:
            self.slices.append(s)
            self.queue.setdefault(s.worker, deque()).append(s)
        return new

    def expected(self, server: int) -> int:
        """Pushes server `server`'s update for the iteration in flight waits for."""
        return sum(1 for s in self.slices if s.reaches(server))

    def next_share(self, worker: int) -> Slice | None:
        q = self.queue.get(worker)
        return q.popleft() if q else None

    def owed(self) -> bool:
        """Whether shares remain to be handed out."""
        return any(self.queue.values())


def _cut(start: int, size: int, shares: dict[int, float]) -> dict[int, tuple[int, int]]:
    """[start, start + size) cut into contiguous pieces, worker → (start, size), in
    proportion to `shares` (largest remainder; empty pieces are left out)."""
    workers = sorted(w for w, x in shares.items() if x > 0)
    if not workers:
        raise ValueError("no survivor to take a lost slice")
    total = sum(shares[w] for w in workers)
    exact = {w: size * shares[w] / total for w in workers}
    sizes = {w: int(exact[w]) for w in workers}
    for w in sorted(workers, key=lambda w: exact[w] - sizes[w], reverse=True)[:size - sum(sizes.values())]:
        sizes[w] += 1
    out, at = {}, start
    for w in workers:
        if sizes[w]:
            out[w] = (at, sizes[w])
            at += sizes[w]
    return out


__all__ = ["Assignments", "Slice"]
