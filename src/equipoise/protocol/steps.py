"""How the servers stepped under async_scaling = "bsp" (policy/staleness.py): the
totals a server keeps and the coordinator sums over servers. On the wire (a server's
stop acknowledgement, `steps`) they are the list [updates, Σ delay, Σ momentum, Σ lr
factor]."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepTotals:
    updates: int = 0
    delay: float = 0.0       # Σ of each update's mean delay τ̄
    momentum: float = 0.0    # Σ of the momentum each update used
    lr_factor: float = 0.0   # Σ of each update's learning-rate factor

    def add(self, step) -> None:
        """One update stepped as `step` (a policy.staleness.Step)."""
        self.updates += 1
        self.delay += step.delay
        self.momentum += step.momentum
        self.lr_factor += step.lr_factor

    def to_wire(self) -> list:
        return [self.updates, self.delay, self.momentum, self.lr_factor]

    @classmethod
    def from_wire(cls, got: object) -> "StepTotals | None":
        """The totals a server sent, or None if `got` is not four numbers."""
        if isinstance(got, list) and len(got) == 4 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in got):
            return cls(int(got[0]), float(got[1]), float(got[2]), float(got[3]))
        return None

    def __iadd__(self, other: "StepTotals") -> "StepTotals":
        self.updates += other.updates
        self.delay += other.delay
        self.momentum += other.momentum
        self.lr_factor += other.lr_factor
        return self

    def means(self) -> dict[str, float] | None:
        """summary.json's `async_steps`: the means over updates (None before any)."""
        if not self.updates:
            return None
        return {"updates": self.updates, "delay_mean": self.delay / self.updates,
                "momentum_mean": self.momentum / self.updates, "lr_factor_mean": self.lr_factor / self.updates}
