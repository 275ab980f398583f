"""Which pushes each block has taken: a gradient is applied at most once, by its id.

Every push of a worker carries an id: the rollback epoch it was computed in, the worker's
step and the part of that step (a share of a lost worker's slice computed in recovery is
a part > 0). One push may reach a block twice: a worker's own push to the block's new
owner and the old owner's forward of the same step after a hand-over, a push sent again
after its acknowledgement was lost, or a peer that replays a message. The ledger records,
per worker, the ids it has taken and for each the blocks it took (a bitmask of block
keys); a block's gradient whose id it already took is dropped and counted as a duplicate.

Bounded: the last ``WINDOW`` ids of each worker (by arrival). An id older than every id
kept of a full window can no longer be told apart from a duplicate: it is dropped too,
counted as ``too_old`` (a loss, logged by the server). A worker's pushes arrive in order
and a forward within one move, so a correct job never meets one.

The rows of the blocks a server hands over go with them (`rows`, `adopt`): the new owner
then refuses an id the old one applied. Under a barrier the version does the same job
(one push per worker and part per version, ``PushedTwice``), and a fail-over restores a
version whose pushes are not in it: replicas carry no ledger. A rollback (a new epoch)
starts an empty ledger; the ids of the old epoch can no longer arrive (stale, dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..wire.transport import QuietLog

__all__ = ["PushLedger", "WINDOW"]

WINDOW = 256  # ids kept per worker: more than a worker's pushes in flight while a block moves

PushId = tuple[int, int, int]  # (epoch, step, part)

_quiet = QuietLog(logging.getLogger(__name__))


def _mask(keys: Iterable[int]) -> int:
    m = 0
    for k in keys:
        m |= 1 << int(k)
    return m


def _bits(mask: int) -> list[int]:
    """The keys of a mask's set bits, ascending (one step per set bit)."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class PushLedger:
    def __init__(self, window: int = WINDOW):
        self.window = window
        self.taken: dict[int, dict[PushId, int]] = {}  # worker -> id -> mask of blocks taken
        self.floor: dict[int, PushId] = {}  # worker -> newest id evicted from a full window
        self.duplicates = 0  # block gradients dropped because their id was taken already
        self.too_old = 0     # dropped because their id fell below the window

    def clear(self) -> None:
        self.taken, self.floor = {}, {}

    def screen(self, worker: int, pid: PushId | None, keys: Iterable[int]) -> tuple[set[int], set[int]]:
        """The blocks of ``keys`` to drop from push ``pid`` of ``worker``, as
        (duplicates: their id was taken already, too old: below the window); counted,
        nothing recorded (``record`` once the rest is taken). ``pid`` None (a push
        without a step): nothing dropped."""
        keys = {int(k) for k in keys}
        if pid is None or not keys:
            return set(), set()
        floor = self.floor.get(worker)
        if floor is not None and pid <= floor:
            self.too_old += len(keys)
            return set(), keys
        seen = self.taken.get(worker, {}).get(pid, 0)
        dup = {k for k in keys if seen >> k & 1}
        self.duplicates += len(dup)
        return dup, set()

    def record(self, worker: int, pid: PushId | None, keys: Iterable[int]) -> None:
        """Push ``pid`` of ``worker`` was taken for blocks ``keys``."""
        if pid is not None:
            self._add(worker, pid, _mask(keys))

    def _add(self, worker: int, pid: PushId, mask: int) -> None:
        if not mask:
            return
        mine = self.taken.setdefault(worker, {})
        mine[pid] = mine.get(pid, 0) | mask
        while len(mine) > self.window:
            oldest = next(iter(mine))
            del mine[oldest]
            self.floor[worker] = max(self.floor.get(worker, oldest), oldest)

    def rows(self, keys: Iterable[int]) -> list[list]:
        """The ids that took any of ``keys`` (blocks leaving), as wire rows
        [worker, epoch, step, part, [blocks]]."""
        m = _mask(keys)
        return [[w, *pid, _bits(mask & m)] for w, mine in self.taken.items() for pid, mask in mine.items() if mask & m]

    def adopt(self, rows: Iterable, keys: Iterable[int]) -> None:
        """Take the rows of blocks ``keys`` handed over to this server (``rows`` of the
        old owner's ledger; bits of other blocks are ignored); a malformed row raises
        ValueError and changes nothing."""
        self.take(self.parse(rows, keys))

    @staticmethod
    def parse(rows: Iterable, keys: Iterable[int]) -> list[tuple[int, PushId, int]]:
        """``adopt``'s rows checked and read, nothing taken yet: (worker, id, mask) each;
        ValueError for a malformed row."""
        allowed, parsed = _mask(keys), []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 5 and isinstance(row[4], list)
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in [*row[:4], *row[4]])):
                raise ValueError(f"malformed ledger row {str(row)[:80]}")
            mask = 0
            for k in row[4]:
                if allowed >> k & 1:
                    mask |= 1 << k
            parsed.append((row[0], (row[1], row[2], row[3]), mask))
        return parsed

    def take(self, parsed: list[tuple[int, PushId, int]]) -> None:
        """Record rows `parse` read."""
        for worker, pid, mask in parsed:
            self._add(worker, pid, mask)

    def drop(self, keys: Iterable[int]) -> None:
        """Blocks that left: their bits go (the rows went with them)."""
        m = ~_mask(keys)
        for mine in self.taken.values():
            for pid in list(mine):
                mine[pid] &= m


def drop_taken(ledger: PushLedger, worker: int, pid: PushId | None, tensors: dict, what: str) -> bool:
    """Remove from ``tensors`` (block key -> gradient, changed in place) the blocks
    ``ledger`` says push ``pid`` of ``worker`` gave already, or too long ago to tell;
    logged, rate-limited. Whether it dropped every block (nothing is left to take)."""
    dup, old = ledger.screen(worker, pid, tensors)
    for k in dup | old:
        del tensors[k]
    if dup or old:
        _quiet(worker, what, "%s of worker %d, id %s: blocks %s %s, dropped", what, worker, pid,
               sorted(dup | old)[:8], "taken already" if dup else "older than the window")
    return bool(dup or old) and not tensors
