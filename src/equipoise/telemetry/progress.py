"""The progress bar with the live view of the cluster below it, and the final summary
table (rich); plain lines when stderr is not a terminal; nothing when disabled."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .live import ClusterState, plain_line, render

PLAIN_EVERY_S = 10.0  # seconds between plain lines when stderr is not a terminal


class _BarAndView(Progress):
    """The bar, then the cluster view (workers, servers, events), redrawn together."""

    def __init__(self, *columns, state: ClusterState, **kwargs):
        self.state = state
        super().__init__(*columns, **kwargs)

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        yield render(self.state)


class ProgressDisplay:
    """Fed every metrics record (`record`, as the metrics writer writes it): on a terminal
    a progress bar with the live view below, redrawn once a second; otherwise a plain
    line every `PLAIN_EVERY_S` seconds and at the end."""

    def __init__(self, total: int, enabled: bool, start: int = 0):
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.state = ClusterState(total)
        self.stats = {"sps": 0.0, "loss": float("nan"), "acc": float("nan")}
        self._progress = None
        self._plain = enabled and not self.console.is_terminal
        self._last_line = time.monotonic()
        if enabled and not self._plain:
            self._progress = _BarAndView(
                TextColumn("[bold]iter"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[sps]:>7.0f} samples/s  loss {task.fields[loss]:.3f}  "
                           "acc {task.fields[acc]:.2%}"),
                TimeElapsedColumn(), console=self.console, transient=False, refresh_per_second=1,
                state=self.state)
            self._task = self._progress.add_task("train", total=total, completed=start, **self.stats)
            self._progress.start()

    def record(self, rec: dict) -> None:
        """A record just written to metrics.jsonl."""
        if not self.enabled:
            return
        self.state.feed(rec)
        kind = rec.get("type")
        if kind == "iteration":
            self.update(int(rec["iteration"]) + 1, sps=rec.get("samples_per_s"), loss=rec.get("loss"))
            if self._plain and time.monotonic() - self._last_line >= PLAIN_EVERY_S:
                self._line()
        elif kind == "eval":
            self.update(None, acc=rec.get("test_accuracy"))

    def update(self, iteration: int | None, **stats: float | None) -> None:
        """Move the bar to `iteration` done (None: leave it) and update its figures."""
        self.stats.update({k: v for k, v in stats.items() if v is not None})
        if self._progress is not None:
            self._progress.update(self._task, completed=iteration, **self.stats)

    def note(self, text: str) -> None:
        """A line above the bar (a failure, a recovery); on stderr when the bar is off."""
        self.console.print(text, markup=False, highlight=False)

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self.console.print(plain_line(self.state), markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self._plain and self.state.iteration:
            self._plain = False
            self._line()


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
