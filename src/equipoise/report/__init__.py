"""Plots and report.html of a finished (or running) job from its run directory.

    from equipoise.report import report, html_report
    report("runs/20250101-120000-lbbsp")   # writes runs/.../report/*.png
    html_report(["runs/a", "runs/b"])      # writes runs/report/report.html: both runs, compared

Importing this package does not import matplotlib; the plotting functions do, and draw on
their own `matplotlib.figure.Figure` objects (the Agg renderer, no pyplot, no global state).
"""

from .html import html_report
from .plots import (Run, ReportError, load_run, plot_accuracy, plot_batch_sizes, plot_throughput,
                    plot_time_split, plot_timeline, report)
from .wire import plot_wire

__all__ = ["Run", "ReportError", "html_report", "load_run", "plot_accuracy", "plot_batch_sizes",
           "plot_throughput", "plot_time_split", "plot_timeline", "plot_wire", "report"]
