"""The progress bar and the final summary table (rich), or nothing when disabled."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class ProgressDisplay:
    def __init__(self, total: int, enabled: bool, start: int = 0):
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.stats = {"sps": 0.0, "loss": float("nan"), "acc": float("nan")}
        self._progress = None
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]iter"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[sps]:>7.0f} samples/s  loss {task.fields[loss]:.3f}  "
                           "acc {task.fields[acc]:.2%}"),
                TimeElapsedColumn(), console=self.console, transient=False)
            self._task = self._progress.add_task("train", total=total, completed=start, **self.stats)
            self._progress.start()

    def update(self, iteration: int, **stats: float) -> None:
        self.stats.update({k: v for k, v in stats.items() if v is not None})
        if self._progress is not None:
            self._progress.update(self._task, completed=iteration, **self.stats)

    def note(self, text: str) -> None:
        """A line above the bar (a failure, a recovery); on stderr when the bar is off."""
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def print_summary(summary: dict[str, Any]) -> None:
    """The final summary as a table on stderr."""
    table = Table(title="equipoise run summary", show_header=False)
    for key in ("protocol", "workers", "servers", "iterations", "final_accuracy",
                "samples_per_s", "wall_s", "barrier_wait_fraction", "lost_updates", "run_dir"):
        value = summary.get(key)
        if isinstance(value, float):
            value = f"{value:.4g}"
        table.add_row(key, str(value))
    for r in summary.get("recovered", []):
        table.add_row("recovered", f"{r['role']}{r['rank']} at iteration {r['iteration']}: {r['action']}")
    Console(stderr=True).print(table)
