"""Synchronisation protocols as small, pure policies (PAPERS.md §1).

Following ps-lite, every protocol is one version/staleness mechanism with different
knobs. A server calls a policy with plain numbers and gets plain answers back:

* `group_size(active)` — how many pushed gradients are combined into one update
  (Rudra's c: λ for hardsync/BSP, ⌊λ/n⌋ for n-softsync, 1 for async and SSP);
* `clocked` — whether the version a server publishes counts *worker clocks* (the
  number of iterations every worker has finished: SSP) instead of updates applied;
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
  (LB-BSP, PAPERS.md §2).

Nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

LR_MODULATIONS = ("none", "per_gradient", "mean")


@dataclass(frozen=True)
class SyncPolicy:
    """Base protocol (async): apply each gradient on arrival, answer pulls at once."""

    name: str = "asp"
    lr_modulation: str = "none"

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
    def weights(samples: Sequence[int]) -> list[float]:
        total = sum(samples)
        if total <= 0:
            raise ValueError(f"samples = {list(samples)}: a group needs at least one sample")
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
    """Stale synchronous parallel with bound s (Ho et al. 2013; ps-lite's τ): gradients
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
                     lr_modulation: str = "none") -> SyncPolicy:
    """The policy of a protocol name; LB-BSP synchronises exactly like BSP."""
    if lr_modulation not in LR_MODULATIONS:
        raise ValueError(f"lr_modulation = {lr_modulation!r} is not one of {', '.join(LR_MODULATIONS)}")
    if protocol in ("bsp", "lbbsp"):
        return BSP(name=protocol, lr_modulation=lr_modulation)
    if protocol == "asp":
        return ASP(lr_modulation=lr_modulation)
    if protocol == "softsync":
        if softsync_n < 1:
            raise ValueError(f"softsync_n = {softsync_n} must be ≥ 1")
        return SoftSync(n=softsync_n, lr_modulation=lr_modulation)
    if protocol == "ssp":
        if staleness_bound < 0:
            raise ValueError(f"staleness_bound = {staleness_bound} must be ≥ 0")
        return SSP(bound=staleness_bound, lr_modulation=lr_modulation)
    raise ValueError(f"protocol = {protocol!r} has no sync policy")
