"""Synchronisation protocols as small, pure policies.

Following ps-lite, every protocol is one version/staleness mechanism with different
knobs. A server calls a policy with plain numbers and gets plain answers back:

* `group_size(active)` — how many pushed gradients are combined into one update
  (Rudra's c: λ for hardsync/BSP, 1 for async);
* `pull_ready(min_version, version)` — whether a pull that asked for `min_version` may be
  answered while the server holds `version`;
* `weights(samples)` — the aggregation weight of each gradient in a group: sample-count
  weighted, so any split of the global batch is exactly SGD on the global batch
  (LB-BSP, PAPERS.md §2).

Nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class SyncPolicy:
    """Base protocol: combine `group_size` gradients, answer pulls at once."""

    name: str = "asp"

    def group_size(self, active: int) -> int:
        return 1

    def pull_ready(self, min_version: int, version: int) -> bool:
        return True

    def barrier(self) -> bool:
        """True when every worker runs iteration t on the weights of version t."""
        return False

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

    def pull_ready(self, min_version: int, version: int) -> bool:
        return version >= min_version

    def barrier(self) -> bool:
        return True


@dataclass(frozen=True)
class ASP(SyncPolicy):
    """Async (Downpour, Rudra's λ-softsync): every gradient is applied on arrival."""

    name: str = "asp"


def make_sync_policy(protocol: str) -> SyncPolicy:
    """The policy of a protocol name; LB-BSP synchronises exactly like BSP."""
    if protocol in ("bsp", "lbbsp"):
        return BSP(name=protocol)
    if protocol == "asp":
        return ASP()
    raise ValueError(f"protocol = {protocol!r} has no sync policy")
