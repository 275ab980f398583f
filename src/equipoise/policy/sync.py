"""Synchronisation protocols as small, pure policies, and the per-server state machine
that drives them.

The protocols are those Rudra compares (Gupta, Zhang and Wang, "Model Accuracy and
Runtime Tradeoff in Distributed Deep Learning: A Systematic Study", ICDM 2016) plus
stale synchronous parallel. Following ps-lite (Li et al., "Scaling Distributed Machine
Learning with the Parameter Server", OSDI 2014), every protocol is one version/staleness
mechanism with different knobs. A policy answers plain numbers with plain numbers:

* `group_size(active)` — how many pushed gradients are combined into one update
  (Rudra's c: λ for hardsync/BSP, ⌊λ/n⌋ for n-softsync, 1 for async and SSP);
* `clocked` — whether the version a server publishes counts *worker clocks* (the
  number of iterations every worker has finished: SSP) instead of updates applied;
* `barrier()` — whether every worker runs iteration t on the weights of version t;
* `pull_version(pushes, iteration)` — the version a worker's pull asks for after it
  has pushed `pushes` gradients, the last of them for global iteration `iteration`;
* `pull_ready(min_version, version)` — whether such a pull may be answered while the
  server publishes `version`;
* `staleness(version_now, version_read)` — σ of a gradient applied now that was
  computed on weights of `version_read`;
* `modulate(weights, staleness)` — Rudra's staleness-dependent learning rate: the
  aggregation weights of a group and a factor for the learning rate of its update;
* `weights(samples)` — the aggregation weight of each gradient in a group: sample-count
  weighted, so any split of the global batch is exactly SGD on the global batch
  (LB-BSP: Chen et al., "Semi-Dynamic Load Balancing: Efficient Distributed Learning
  in Non-Dedicated Environments", SoCC 2020).

`ServerSync` is one server's protocol state — the pushes it holds (as plain data), the
version it has applied, worker clocks, retired workers — and every synchronisation
decision a server makes. A server (or a discrete-event simulator) drives it:

    token = sync.accept(worker, version, samples)   # SyncFault if the protocol refuses
    while (update := sync.next_update()) is not None:
        ...apply the pushes of update.tokens with σ update.sigmas...
        sync.on_applied(update)
    ack with sync.published() and sync.take_staleness(worker)

Nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..config_checks import BARRIER_PROTOCOLS
from .staleness import ASYNC_SCALINGS, DELAY_COMPENSATIONS

LR_MODULATIONS = ("none", "per_gradient", "mean")


@dataclass(frozen=True)
class SyncPolicy:
    """Base protocol (async): apply each gradient on arrival, answer pulls at once."""

    name: str = "asp"
    lr_modulation: str = "none"
    async_scaling: str = "none"      # "bsp": BSP's lr and momentum carried over (policy/staleness.py)
    delay_compensation: str = "none"  # "dc" | "dc_adaptive": DC-ASGD (policy/staleness.py)
    dc_lambda: float = 0.0

    def group_size(self, active: int) -> int:
        return 1

    @property
    def clocked(self) -> bool:
        return False

    def pull_version(self, pushes: int, iteration: int) -> int:
        return 0

    def pull_ready(self, min_version: int, version: int) -> bool:
        return True

    def barrier(self) -> bool:
        """True when every worker runs iteration t on the weights of version t."""
        return False

    def pull_first(self) -> bool:
        """Whether a worker sends its pull before its push. Under a barrier the pull must
        be registered before the push can complete the update, so that when every ack
        is in every pull is answered and nothing is in flight; without one the push
        goes first, so the weights the pull brings include the worker's own gradient."""
        return self.barrier()

    @staticmethod
    def staleness(version_now: int, version_read: int) -> int:
        """σ: versions published between the read and the apply (never negative)."""
        return max(0, version_now - version_read)

    def modulate(self, weights: Sequence[float], staleness: Sequence[int]) -> tuple[list[float], float]:
        """Rudra's learning-rate modulation. `per_gradient` scales each gradient by
        1/σ (1 when σ = 0), i.e. α = α0/σ per gradient; `mean` scales the update's
        learning rate by 1/⟨σ⟩ (1 while ⟨σ⟩ < 1); `none` leaves both alone."""
        if self.lr_modulation == "per_gradient":
            return [w / max(1, s) for w, s in zip(weights, staleness)], 1.0
        if self.lr_modulation == "mean" and staleness:
            return list(weights), 1.0 / max(1.0, sum(staleness) / len(staleness))
        return list(weights), 1.0

    @staticmethod
    def weights(samples: Sequence[float]) -> list[float]:
        """Each gradient's share of its group: its units (samples, or the (sum, count)
        loss's count) over the group's. A group with no units at all (every loss
        averaged over nothing) contributes no gradient."""
        total = sum(samples)
        if total < 0 or any(s < 0 for s in samples):
            raise ValueError(f"samples = {list(samples)}: weights must be ≥ 0")
        if total == 0:
            return [0.0 for _ in samples]
        return [s / total for s in samples]


@dataclass(frozen=True)
class BSP(SyncPolicy):
    """Hardsync: one gradient from every active worker per update; σ = 0 always."""

    name: str = "bsp"

    def group_size(self, active: int) -> int:
        return max(1, active)

    def pull_version(self, pushes: int, iteration: int) -> int:
        return iteration + 1

    def pull_ready(self, min_version: int, version: int) -> bool:
        return version >= min_version

    def barrier(self) -> bool:
        return True


@dataclass(frozen=True)
class ASP(SyncPolicy):
    """Async (Downpour, Rudra's λ-softsync): every gradient is applied on arrival."""

    name: str = "asp"


@dataclass(frozen=True)
class SoftSync(SyncPolicy):
    """n-softsync: update as soon as c = ⌊λ/n⌋ gradients from *any* workers are held.
    n = 1 waits for λ gradients but, unlike hardsync, a fast worker may supply two of
    them; n = λ is async. Rudra measured ⟨σ⟩ ≈ n."""

    name: str = "softsync"
    n: int = 1

    def group_size(self, active: int) -> int:
        return max(1, active // max(1, self.n))


@dataclass(frozen=True)
class SSP(SyncPolicy):
    """Stale synchronous parallel with bound s (Ho et al., "More Effective Distributed ML
    via a Stale Synchronous Parallel Parameter Server", NIPS 2013; ps-lite's τ): gradients
    are applied on arrival, and the published version is the *clock* — iterations
    finished by every worker. A worker that has pushed p gradients may read only once
    the clock is ≥ p − s, i.e. it runs at most s iterations ahead of the slowest. The
    server measures a gradient's σ against the pushing worker's own clock (p − the clock
    it read), so σ ≤ s; s = 0 runs in lock step like BSP, but applies the λ gradients of
    a clock one by one."""

    name: str = "ssp"
    bound: int = 0

    @property
    def clocked(self) -> bool:
        return True

    def pull_version(self, pushes: int, iteration: int) -> int:
        return max(0, pushes - self.bound)

    def pull_ready(self, min_version: int, version: int) -> bool:
        return version >= min_version


def make_sync_policy(protocol: str, *, softsync_n: int = 1, staleness_bound: int = 0,
                     lr_modulation: str = "none", async_scaling: str = "none",
                     delay_compensation: str = "none", dc_lambda: float = 0.0) -> SyncPolicy:
    """The policy of a protocol name; LB-BSP synchronises exactly like BSP. Under a
    barrier σ = 0 and every update is the global batch: `async_scaling` and
    `delay_compensation` change nothing there and are dropped."""
    if lr_modulation not in LR_MODULATIONS:
        raise ValueError(f"lr_modulation = {lr_modulation!r} is not one of {', '.join(LR_MODULATIONS)}")
    if async_scaling not in ASYNC_SCALINGS:
        raise ValueError(f"async_scaling = {async_scaling!r} is not one of {', '.join(ASYNC_SCALINGS)}")
    if delay_compensation not in DELAY_COMPENSATIONS:
        raise ValueError(f"delay_compensation = {delay_compensation!r} is not one of "
                         f"{', '.join(DELAY_COMPENSATIONS)}")
    if not (isinstance(dc_lambda, (int, float)) and math.isfinite(dc_lambda) and dc_lambda >= 0):
        raise ValueError(f"dc_lambda = {dc_lambda!r} must be a finite number ≥ 0")
    stale = dict(lr_modulation=lr_modulation, async_scaling=async_scaling,
                 delay_compensation=delay_compensation, dc_lambda=float(dc_lambda))
    if protocol in BARRIER_PROTOCOLS:
        return BSP(name=protocol, lr_modulation=lr_modulation)
    if protocol == "asp":
        return ASP(**stale)
    if protocol == "softsync":
        if softsync_n < 1:
            raise ValueError(f"softsync_n = {softsync_n} must be ≥ 1")
        return SoftSync(n=softsync_n, **stale)
    if protocol == "ssp":
        if staleness_bound < 0:
            raise ValueError(f"staleness_bound = {staleness_bound} must be ≥ 0")
        return SSP(bound=staleness_bound, **stale)
    raise ValueError(f"protocol = {protocol!r} has no sync policy")


# -- one server's protocol state ---------------------------------------------------------

class SyncFault(ValueError):
    """A push or request the protocol refuses; the message names the worker and the fault."""


class WrongVersion(SyncFault):
    """Under a barrier, a push computed on another version than the server's."""


class PushedTwice(SyncFault):
    """Under a barrier, a second push from one worker for the same version."""


class UnknownWorker(SyncFault):
    """Under SSP, a push from a worker that is neither active nor retired."""


class AheadOfPublished(SyncFault):
    """A push claiming to be computed on a version the server has not published."""


class LostWorker(SyncFault):
    """A push from a worker the coordinator declared lost (its slices were given to others)."""


class NotIdle(SyncFault):
    """A change that needs no push pending (membership under a barrier, a new base version)."""


@dataclass(frozen=True)
class Pending:
    """A push held until its group is complete. `token` is the caller's handle for its
    tensors; `clock` is, under SSP, the gradients its worker pushed before it."""

    token: int
    worker: int
    version: int
    samples: int
    clock: int = 0
    part: int = 0
    counted: bool = True  # SSP: the first push of its step to arrive (it advances the clock)


@dataclass(frozen=True)
class Update:
    """Pushes to combine into one update, in arrival order, and σ of each."""

    pushes: tuple[Pending, ...]
    sigmas: tuple[int, ...]

    @property
    def tokens(self) -> list[int]:
        return [p.token for p in self.pushes]


class ServerSync:
    """The synchronisation state of one server under `policy` with `workers` active
    workers, starting at `version` (updates applied).

    Under SSP the server publishes the clock — min over active workers of the gradients
    each has had applied — and a worker that stopped (`retired`) no longer holds it back;
    otherwise it publishes the updates applied. Call `next_update` until it returns None
    after every `accept` (and once after `flush`), and `on_applied` after applying each
    update, before asking for the next: σ of an update is measured when it is taken.
    """

    def __init__(self, policy: SyncPolicy, workers: int, *, version: int = 0, ranks: Iterable[int] | None = None):
        """`ranks`: the active workers' ranks (default 0 … workers − 1), whose clocks SSP keeps."""
        self.policy, self.workers, self.version = policy, int(workers), int(version)
        self.pending: list[Pending] = []
        ranks = range(self.workers) if ranks is None else sorted(int(r) for r in ranks)
        self.clocks: dict[int, int] = {w: 0 for w in ranks} if policy.clocked else {}
        self.pushed: dict[int, int] = dict(self.clocks)  # SSP: gradients accepted per active worker
        self.retired: dict[int, int] = {}  # SSP: stopped workers' pushes (a last push may follow)
        self.histogram: Counter[int] = Counter()  # σ of every gradient applied
        self.applied: Counter[int] = Counter()  # gradients applied, per worker
        self.expected: int | None = None  # barrier: pushes the current update waits for, if not λ
        self.lost: set[int] = set()  # workers declared lost: their late pushes are refused
        self.seen: dict[int, set[int]] = {}  # SSP: per worker, the steps (push numbers) counted
        self._unacked: dict[int, list[int]] = {}  # σ of each worker's applied gradients, not yet acked
        self._tokens = 0

    # -- pushes -------------------------------------------------------------------------
    def accept(self, worker: int, version: int, samples: int = 1, part: int = 0, step: int | None = None) -> int:
        """Hold a push of `worker` computed on `version`; its token. `part` > 0 marks a
        share of a lost worker's slice that `worker` computed in recovery (a barrier
        update may then hold several pushes of one worker). `step` numbers the worker's
        pushes (0, 1, …): under SSP a step is counted on the clock once however many of
        its pushes arrive — a block's new owner gets one step's gradient twice over, the
        worker's own push for its other blocks and the old owner's forward of the block
        (`counts`). The forward of a later step can be counted before this step's own push
        arrives: σ is then taken against this step's number, not the count (σ ≤ s holds
        either way). Raises a SyncFault subclass if the protocol refuses it (then nothing
        changes)."""
        policy = self.policy
        if worker in self.lost:
            raise LostWorker(f"push from worker {worker}, which was declared lost")
        if policy.barrier():
            if version != self.version:
                raise WrongVersion(f"push from worker {worker} computed on version {version}, but the "
                                   f"server is at version {self.version} under {policy.name}")
            if any(p.worker == worker and p.part == part for p in self.pending):
                raise PushedTwice(f"worker {worker} pushed twice for version {self.version}"
                                  + (f" (recovery part {part})" if part else ""))
        if policy.clocked and worker not in self.clocks and worker not in self.retired:
            raise UnknownWorker(f"push from worker {worker}, which is not a worker of this server "
                                f"(active: {sorted(self.clocks)})")
        if version > self.published():
            raise AheadOfPublished(f"push from worker {worker} claims version {version}, but the server "
                                   f"has only published {self.published()}")
        clock, counted = 0, True
        if worker in self.pushed:
            clock = self.pushed[worker]
            counted = self.counts(worker, step)
            if counted:
                self.pushed[worker] += 1
                if step is not None:  # a later step's forward may have been counted first
                    clock = min(clock, int(step))
            else:  # σ against the clock its step was counted at
                clock = max(0, min(int(step), clock - 1))
        elif worker in self.retired:  # a retired worker's last push no longer counts
            clock = self.retired[worker]
        token, self._tokens = self._tokens, self._tokens + 1
        self.pending.append(Pending(token, worker, version, samples, clock, part, counted))
        return token

    def counts(self, worker: int, step: int | None) -> bool:
        """Whether a push of `worker`'s `step` advances its clock (SSP): the first of
        that step to arrive does; without a step number every push does."""
        if step is None or not self.policy.clocked:
            return True
        seen = self.seen.setdefault(worker, set())
        if step in seen:
            return False
        seen.add(step)
        while len(seen) > 64:  # only recent steps can arrive twice (a hand-over's forwards)
            seen.discard(min(seen))
        return True

    def next_update(self) -> Update | None:
        """The oldest complete group of pending pushes, removed from `pending`, or None."""
        size = self.policy.group_size(self.workers) if self.expected is None else self.expected
        return self._take(size) if len(self.pending) >= size else None

    def flush(self) -> Update | None:
        """The end of a run: every pending push as one update (a half-filled softsync
        group), so no gradient is lost; None under a barrier or with nothing pending."""
        if self.policy.barrier() or not self.pending:
            return None
        return self._take(len(self.pending))

    def _take(self, n: int) -> Update:
        """σ of each gradient is the version now minus the one it was computed on. Under
        SSP "now" is the pushing worker's own clock (the gradients it pushed before): σ is
        how far ahead of the slowest worker it read, ≤ s by construction — also at the
        end of a run, when stopped workers leave the published clock free to jump."""
        group, self.pending = tuple(self.pending[:n]), self.pending[n:]
        clocked = self.policy.clocked
        return Update(group, tuple(self.policy.staleness(p.clock if clocked else self.version, p.version)
                                   for p in group))

    def on_applied(self, update: Update) -> None:
        """`update` was applied: one version more, its workers' clocks advance, and σ of
        each gradient is recorded for its worker's next ack and in the histogram."""
        self.version += 1
        self.expected = None
        for p, sigma in zip(update.pushes, update.sigmas):
            self.applied[p.worker] += 1
            if p.worker in self.clocks and p.counted:
                self.clocks[p.worker] += 1
            self._unacked.setdefault(p.worker, []).append(sigma)
            self.histogram[sigma] += 1

    def forwarded(self, worker: int, step: int | None) -> None:
        """A gradient of `worker`'s `step` came from a block's old owner and was applied
        on its own: under SSP it advances the worker's clock if its step was not counted
        yet (a server that held nothing before the hand-over gets the worker's steps this
        way until the worker routes by the new table)."""
        if self.policy.clocked and worker in self.pushed and step is not None and self.counts(worker, step):
            self.pushed[worker] += 1
            self.clocks[worker] += 1

    def take_staleness(self, worker: int) -> list[int]:
        """σ of `worker`'s gradients applied since it was last told (for its ack)."""
        return self._unacked.pop(worker, [])

    # -- what the server publishes ------------------------------------------------------
    def published(self) -> int:
        """Updates applied, or under SSP the clock (iterations every active worker has
        had applied; updates applied once no worker is active)."""
        if self.policy.clocked and self.clocks:
            return min(self.clocks.values())
        return self.version

    def pull_ready(self, min_version: int) -> bool:
        """Whether a pull asking for `min_version` may be answered now."""
        return self.policy.pull_ready(min_version, self.published())

    # -- membership and moves -----------------------------------------------------------
    def members(self, workers: int, retired: Iterable[int] = ()) -> None:
        """`workers` are active from the next update on; under SSP the `retired` ones no
        longer hold the clock back. Under a barrier only with no group half-filled."""
        if self.pending and self.policy.barrier():
            raise NotIdle(f"membership change with {len(self.pending)} pushes pending")
        for w in retired:
            if w in self.clocks:
                del self.clocks[w]
                self.retired[w] = self.pushed.pop(w)
        self.workers = int(workers)

    def lose(self, worker: int, workers: int, *, drop: bool) -> list[int]:
        """`worker` died; `workers` remain active. Under SSP it no longer holds the clock
        back; its pending pushes are dropped if `drop` (their tokens are returned), so a
        gradient it had not delivered everywhere is applied nowhere. Under a barrier the
        current update is held (`expected` = ∞) until `expect` says how many pushes —
        the survivors' and their shares of the lost slice — complete it."""
        self.lost.add(worker)
        dropped = [p.token for p in self.pending if p.worker == worker] if drop else []
        self.pending = [p for p in self.pending if p.token not in dropped]
        if worker in self.clocks:
            del self.clocks[worker]
            self.retired[worker] = self.pushed.pop(worker)
        self.workers = max(1, int(workers))
        if self.policy.barrier():
            self.expected = 1 << 62
        return dropped

    def expect(self, version: int, pushes: int | None) -> None:
        """Under a barrier, the update that produces `version` + 1 waits for `pushes`
        pushes (None: one per active worker). Only for the update in progress."""
        if version == self.version:
            self.expected = None if pushes is None else max(1, int(pushes))
        elif version < self.version:
            self.expected = None  # that update was applied already: the next one is normal
        else:
            raise AheadOfPublished(f"expect for version {version}, but the server is at {self.version}")

    def can_migrate(self) -> bool:
        """Blocks may move only with nothing pending, so no update is lost or applied twice."""
        return not self.pending

    def clock_state(self) -> dict:
        """SSP's clocks, for a server that holds no blocks and adopts some of ours while
        workers run: it must count their steps from where we do."""
        return {"clocks": [[w, c] for w, c in sorted(self.clocks.items())],
                "pushed": [[w, c] for w, c in sorted(self.pushed.items())],
                "retired": [[w, c] for w, c in sorted(self.retired.items())],
                "seen": [[w, sorted(s)] for w, s in sorted(self.seen.items())]}

    def join(self, version: int, clocks: dict | None = None) -> None:
        """Start counting updates from `version` (a server that held no blocks adopting
        some), and under SSP the clocks of the server the blocks come from
        (`clock_state`); only with nothing pending."""
        if self.pending:
            raise NotIdle(f"cannot move to version {version} with {len(self.pending)} pushes pending")
        if clocks and self.policy.clocked:  # parsed whole before anything changes
            got = {name: {int(w): int(c) for w, c in clocks.get(name, [])} for name in ("clocks", "pushed", "retired")}
            seen = {int(w): {int(x) for x in steps} for w, steps in clocks.get("seen", [])}
            if set(got["clocks"]) != set(got["pushed"]):
                raise ValueError(f"clocks of workers {sorted(got['clocks'])} but pushes of {sorted(got['pushed'])}")
            self.clocks, self.pushed, self.retired, self.seen = got["clocks"], got["pushed"], got["retired"], seen
        self.version = int(version)

    @property
    def unapplied(self) -> int:
        return len(self.pending)
