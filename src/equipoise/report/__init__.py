"""Plots of a finished (or running) job from its run directory.

    from equipoise.report import report
    report("runs/20250101-120000-lbbsp")   # writes runs/.../report/*.png

Importing this package does not import matplotlib; the plotting functions do, and draw on
their own `matplotlib.figure.Figure` objects (the Agg renderer, no pyplot, no global state).
"""

from .plots import (Run, ReportError, load_run, plot_accuracy, plot_batch_sizes, plot_time_split,
                    plot_timeline, report)

__all__ = ["Run", "ReportError", "load_run", "plot_accuracy", "plot_batch_sizes", "plot_time_split",
           "plot_timeline", "report"]
