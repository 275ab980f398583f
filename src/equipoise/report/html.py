"""report.html: one self-contained page for one run or a comparison of several.

    from equipoise.report import html_report
    html_report(["runs/bsp", "runs/lbbsp"])   # writes runs/report/report.html and its PNGs

The page holds each run's plots (the PNGs `report` draws, embedded as base64 data, so
the page needs no other file and no network) and its summary; for several runs first a
comparison: a table (samples/s, time to a common accuracy, final accuracy, barrier wait,
staleness) and test accuracy and throughput against training time, overlaid.
"""

from __future__ import annotations

import base64
import html
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from .plots import Run, ReportError, _number, load_run, plot_accuracy, plot_throughput, report

SUMMARY_KEYS = ("status", "protocol", "workers", "servers", "iterations", "global_batch", "samples",
                "final_accuracy", "final_test_loss", "final_train_loss", "samples_per_s", "startup_s", "train_s", "eval_s",
                "shutdown_s", "total_s", "wall_s",
                "barrier_wait_fraction", "staleness_mean", "staleness_max", "lost_updates", "predictor",
                "resumed_from", "error")
CONFIG_KEYS = ("dataset", "model", "loss", "metrics", "collate", "loader_workers", "target", "optimizer", "lr", "placement", "slowdown", "trace", "server_slowdown",
               "membership", "server_events")
STYLE = """body{font-family:sans-serif;margin:2em auto;padding:0 1.5em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:1em 0}
h2{border-bottom:2px solid #ddd;margin-top:2em}.note{color:#666}"""


def figures(run: Run, target: float | None = None) -> dict[str, Any]:
    """A run's comparison row: from summary.json where it has the figure, else from
    the records (a run still going). `target`: the accuracy to time (a fraction)."""
    s, iters = run.summary, run.iterations
    last = next((r["elapsed"] for r in reversed(iters) if _number(r.get("elapsed"))), None)
    samples = sum(_number(b) or 0 for r in iters for b in r.get("batch") or ())
    parts = {k: sum(v for pts in run.per_worker(k).values() for _, v in pts) for k in ("compute_s", "wait_s", "comm_s")}
    busy = sum(parts.values())
    stale = [r["staleness_mean"] for r in iters if _number(r.get("staleness_mean")) is not None]
    reached = [e for e in run.evals if target is not None and (_number(e.get("test_accuracy")) or 0) >= target]
    evals = [e for e in run.evals if _number(e.get("test_accuracy")) is not None]
    return {
        "samples_per_s": s.get("samples_per_s", samples / last if last else None),
        "time_to_target_s": reached[0].get("elapsed") if reached else None,
        "final_accuracy": s.get("final_accuracy", evals[-1]["test_accuracy"] if evals else None),
        "barrier_wait_fraction": s.get("barrier_wait_fraction", parts["wait_s"] / busy if busy else None),
        "staleness_mean": s.get("staleness_mean", sum(stale) / len(stale) if stale else None),
        "iterations": len(iters), "status": s.get("status", "running (no summary.json)"),
        "job_target_s": (s.get("time_to_target") or {}).get("elapsed"),
    }


def html_report(run_dirs: str | Path | Iterable[str | Path], out_dir: str | Path | None = None, *,
                target: float | None = None) -> list[Path]:
    """Draw every run's plots and write report.html into `out_dir` (default: RUN_DIR/report
    for one run; for several, report/ in the folder that holds them all, with each run's
    plots in a subfolder `<n>-<name>`). `target`: the accuracy the comparison times
    (default: the highest accuracy every run reached). Returns the PNGs, then the page."""
    dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not dirs:
        raise ReportError("no run directory given")
    runs = [load_run(d) for d in dirs]
    several = len(runs) > 1
    if out_dir is not None:
        out = Path(out_dir)
    elif several:
        out = Path(os.path.commonpath([r.path.resolve() for r in runs])) / "report"
    else:
        out = runs[0].path / "report"
    labels = [f"{i + 1}: {r.label}" if several else r.label for i, r in enumerate(runs)]
    paths: list[Path] = []
    body = [f"<h1>equipoise report</h1><p class=note>{len(runs)} run{'s' if several else ''}, "
            f"written {html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"]
    if several:
        if target is None:
            best = [max((_number(e.get("test_accuracy")) or 0.0 for e in r.evals), default=None) for r in runs]
            target = min(best) if all(b is not None for b in best) else None
        by_label = dict(zip(labels, runs))
        comparison = [plot_accuracy(by_label, out / "accuracy.png"), plot_throughput(by_label, out / "throughput.png")]
        paths += comparison
        body += ["<h2>Comparison</h2>", _comparison_table(labels, runs, target)]
        body += [_img(p, "comparison") for p in comparison]
    for i, (label, run) in enumerate(zip(labels, runs)):
        folder = out / f"{i + 1}-{run.path.name}" if several else out
        pngs = report(run.path, folder)
        paths += pngs
        body += [f"<h2>{html.escape(label)}</h2><p class=note>{html.escape(str(run.path.resolve()))}</p>",
                 _summary_table(run)] + [_img(p, label) for p in pngs]
    page = out / "report.html"
    page.write_text("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>equipoise report</title>"
                    f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n",
                    encoding="utf-8")
    return paths + [page]


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "–"
    if kind == "pct" and _number(v) is not None:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{cells}</table>"


def _comparison_table(labels: list[str], runs: list[Run], target: float | None) -> str:
    at = f"time to {100 * target:.1f}% (s)" if target is not None else "time to accuracy (s)"
    targets = {json.dumps(r.config.get("target"), sort_keys=True) for r in runs if r.config.get("target")}
    job_target = _target_name(json.loads(next(iter(targets)))) if len(targets) == 1 else "the job's target"
    header = ["run", "protocol", "samples/s", at, f"time to {job_target} (s)", "final accuracy", "barrier wait",
              "staleness (mean σ)", "iterations", "status"]
    rows = []
    for label, run in zip(labels, runs):
        f = figures(run, target)
        rows.append([label, _fmt(run.protocol), _fmt(f["samples_per_s"]), _fmt(f["time_to_target_s"]),
                     _fmt(f["job_target_s"]), _fmt(f["final_accuracy"], "pct"), _fmt(f["barrier_wait_fraction"], "pct"),
                     _fmt(f["staleness_mean"]), _fmt(f["iterations"]), _fmt(f["status"])])
    return _table(header, rows)


def _summary_table(run: Run) -> str:
    rows = [[k, _fmt(run.summary[k], "pct" if k in ("final_accuracy", "barrier_wait_fraction") else "")]
            for k in SUMMARY_KEYS if k in run.summary]
    rows += [[f"final {k}", _fmt(v)] for k, v in (run.summary.get("final_metrics") or {}).items()
             if k not in ("accuracy", "loss")]
    hit = run.summary.get("time_to_target")
    if run.summary.get("target"):
        rows.append([f"time to {_target_name(run.summary['target'])}",
                     f"{hit['elapsed']:.4g} s, iteration {hit['iteration']}" if hit else "not reached"])
    if _number(run.summary.get("data_s")):
        rows.append(["data_s (all workers)", _fmt(run.summary["data_s"])])
    rows += [["recovered", f"{r.get('role')}{r.get('rank')} at iteration {r.get('iteration')}: {r.get('action')}"]
             for r in run.summary.get("recovered") or () if isinstance(r, dict)]
    rows += [[f"config: {k}", _fmt(run.config[k])] for k in CONFIG_KEYS if run.config.get(k) not in (None, "", [])]
    note = "" if run.summary else "<p class=note>no summary.json: the job is running, or was killed</p>"
    return note + _table(["summary", "value"], rows)


def _target_name(target: dict) -> str:
    bound = ("<", target.get("below")) if "below" in target else (">", target.get("above"))
    return f"{target.get('metric')} {bound[0]} {bound[1]:g}" if _number(bound[1]) is not None else "target"


def _img(path: Path, what: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(f"{path.stem.replace('_', ' ')} ({what})")
    return f'<img alt="{alt}" src="data:image/png;base64,{data}">'
