"""What every plot shares: a figure of its own, rendered by Agg (no pyplot, no global
state), saved as PNG, and the text drawn where there is nothing to plot."""

from __future__ import annotations

from pathlib import Path

DPI = 100
WIDTH, HEIGHT = 8.0, 4.5  # inches: 800 x 450 pixels at DPI


def _figure(width: float = WIDTH, height: float = HEIGHT):
    from matplotlib.figure import Figure  # Agg-rendered, no pyplot, no global backend switch
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format=None if path.suffix else "png")
    return path


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=12, color="0.4")
