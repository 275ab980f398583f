"""Read a run directory and draw its plots.

A run directory holds `metrics.jsonl` (see `coordinator.stats.RunStats.iteration_record`,
`coordinator.base.Coordinator._evaluate/_event/_checkpoint`), and when the job ended
`summary.json` and `config.toml`.  `load_run` (runs.py) turns these into a `Run`; the `plot_*`
functions draw one PNG each; `report` draws them all.

Every figure is its own `matplotlib.figure.Figure` rendered by Agg: nothing here imports
pyplot or changes matplotlib's global state, and matplotlib is only imported when a plot
is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ..telemetry.metrics import read_metrics
from .runs import MEMBERSHIP, ReportError, Run, _int, _number, load_run  # noqa: F401 (re-exported)
from .figure import HEIGHT, WIDTH, _figure, _no_data, _save
from .wire import plot_wire, wire_record

__all__ = ["Run", "ReportError", "load_run", "plot_accuracy", "plot_batch_sizes", "plot_throughput",
           "plot_time_split", "plot_timeline", "report"]

_MARKER_STYLE = {  # event kind -> (legend label, colour, line style)
    "worker_left": ("worker left", "tab:red", "--"),
    "worker_joined": ("worker joined", "tab:green", "--"),
    "resumed": ("resumed from checkpoint", "0.4", ":"),
}
_PART_COLOURS = {"compute_s": "tab:blue", "data_s": "tab:green", "wait_s": "tab:orange", "comm_s": "0.65"}
MANY = 20  # with more workers (a simulated cluster), no per-worker legend entries or bar labels


def _colour(rank: int, n: int):
    from matplotlib import colormaps
    if n <= 10:
        return colormaps["tab10"](rank % 10)
    if n <= 20:
        return colormaps["tab20"](rank % 20)
    return colormaps["viridis"](rank / max(n - 1, 1))


def _slowdown_note(run: Run) -> str:
    slow = run.config.get("slowdown") or []
    if not slow or all(float(s) == 1.0 for s in slow):
        return ""
    return "slowdown " + ", ".join(f"w{i} ×{float(s):g}" for i, s in enumerate(slow))


def _draw_markers(ax, run: Run, x: str, *, labels: bool = True) -> list:
    """Vertical lines at membership changes and resumes; returns legend handles."""
    from matplotlib.lines import Line2D
    seen: dict[str, Any] = {}
    for m in run.markers():
        label, colour, style = _MARKER_STYLE[m["kind"]]
        pos = m[x]
        ax.axvline(pos, color=colour, linestyle=style, linewidth=1.2, alpha=0.9, zorder=1)
        if labels:
            ax.annotate(m["text"], (pos, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3),
                        textcoords="offset points", rotation=90, ha="left", va="top", fontsize=8,
                        color=colour, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                            "alpha": 0.85})
        seen.setdefault(m["kind"], Line2D([], [], color=colour, linestyle=style, label=label))
    return list(seen.values())


def _title(run: Run, what: str) -> str:
    return f"{what} — {run.label}"


# -- the plots ------------------------------------------------------------------------------

def plot_batch_sizes(run: Run, path: str | Path) -> Path:
    """Each worker's batch size against training time: one step line per worker (the size
    holds from an iteration's start to its end), membership changes as vertical lines."""
    fig = _figure()
    ax = fig.add_subplot()
    series = run.per_worker("batch")
    starts = run.iteration_starts()
    n = len(series)
    for rank, points in series.items():
        xs = [starts[rec["iteration"]] for rec, _ in points]
        ys = [v for _, v in points]
        if not xs:
            continue
        end = _number(points[-1][0].get("elapsed"))
        xs.append(end if end is not None else xs[-1])
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", color=_colour(rank, n), linewidth=1.6 if n <= MANY else 0.6,
                label=f"worker {rank}" if n <= MANY else None)
    handles = _draw_markers(ax, run, "elapsed")
    if not any(series.values()):
        _no_data(ax, "no iteration records")
    ax.set_title(_title(run, "Per-worker batch size"))
    note = _slowdown_note(run)
    ax.set_xlabel("training time (s)" + (f"      [{note}]" if note else ""))
    ax.set_ylabel("batch size (samples / iteration)")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    if any(series.values()) and (n <= MANY or handles):
        ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return _save(fig, path)


def plot_time_split(run: Run, path: str | Path) -> Path:
    """Per worker, the mean compute / data / wait / comm seconds of an iteration as stacked
    bars: under a barrier the fast workers' bars are mostly wait, the slowest's mostly
    compute; a worker starved by its input pipeline shows a data bar."""
    parts = ("compute_s", "data_s", "wait_s", "comm_s")
    names = {"compute_s": "compute", "data_s": "waiting for data", "wait_s": "barrier wait",
             "comm_s": "communication"}
    series = {p: run.per_worker(p) for p in parts}
    batches = run.per_worker("batch")
    workers = run.workers
    many = len(workers) > MANY
    fig = _figure(WIDTH, HEIGHT * 1.5 if many else max(HEIGHT, 1.6 + 0.55 * len(workers)))
    ax = fig.add_subplot()
    if not workers:
        _no_data(ax, "no iteration records")
        ax.set_title(_title(run, "Time per iteration"))
        return _save(fig, path)
    slow = run.config.get("slowdown") or []
    means = {p: [_mean(v for _, v in series[p][w]) for w in workers] for p in parts}
    totals = {p: sum(v for w in workers for _, v in series[p][w]) for p in parts}
    grand = sum(totals.values())
    wait_fraction = totals["wait_s"] / grand if grand > 0 else 0.0
    ys = list(range(len(workers)))
    left = [0.0] * len(workers)
    for p in parts:
        widths = [m or 0.0 for m in means[p]]
        ax.barh(ys, widths, left=left, height=1.0 if many else 0.6, color=_PART_COLOURS[p], label=names[p],
                linewidth=0)
        left = [a + b for a, b in zip(left, widths)]
    scale = max(left) or 1.0
    for y, w, end in zip([] if many else ys, workers, left):
        sizes = [v for _, v in batches[w]]
        note = f"mean batch {_mean(sizes):.0f}, {len(sizes)} it" if sizes else ""
        ax.text(end + 0.01 * scale, y, note, va="center", fontsize=8, color="0.25")
    ax.set_xlim(0, scale * 1.3)
    ticks = []
    for w in workers:
        s = f"\n(×{float(slow[w]):g} slowdown)" if w < len(slow) and float(slow[w]) != 1.0 else ""
        ticks.append(f"worker {w}{s}")
    if many:
        ax.set_ylabel(f"worker ({len(workers)}, in rank order)")
    else:
        ax.set_yticks(ys, ticks)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per iteration (s)")
    ax.set_title(_title(run, "Where each worker's iteration goes") +
                 f"\nbarrier wait = {wait_fraction:.0%} of all worker time" + _job_split(run.summary), fontsize=11)
    ax.grid(True, axis="x", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=9,
               frameon=False)
    return _save(fig, path)


def _job_split(summary: dict) -> str:
    """The job's own split (summary.json), as a title line: '' for a run without it."""
    parts = [(k, summary.get(k)) for k in ("startup_s", "train_s", "eval_s", "shutdown_s")]
    if any(_number(v) is None for _, v in parts):
        return ""
    names = {"startup_s": "start-up", "train_s": "training", "eval_s": "evaluation after training",
             "shutdown_s": "shutdown"}
    return "\njob: " + " · ".join(f"{names[k]} {float(v):.1f} s" for k, v in parts)


def plot_timeline(run: Run, path: str | Path) -> Path:
    """Per worker compute_s (top) and wait_s (bottom) against iteration, to watch the
    waits move when the batch sizes adapt.  A record's wait is the one before its compute
    (waiting for the previous barrier)."""
    fig = _figure(WIDTH, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    compute, wait = run.per_worker("compute_s"), run.per_worker("wait_s")
    values = [v for s in (compute, wait) for pts in s.values() for _, v in pts]
    ms = bool(values) and max(values) < 1.0
    unit, k = ("ms", 1000.0) if ms else ("s", 1.0)
    n = len(compute)
    few = len(run.iterations) <= 120
    for ax, series in ((top, compute), (bottom, wait)):
        for rank, pts in series.items():
            ax.plot([rec["iteration"] for rec, _ in pts], [v * k for _, v in pts], color=_colour(rank, n),
                    linewidth=1.2 if n <= MANY else 0.5, marker="o" if few and n <= MANY else None, markersize=2.5,
                    label=f"worker {rank}" if n <= MANY else None)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    handles = _draw_markers(top, run, "iteration")
    _draw_markers(bottom, run, "iteration", labels=False)
    if not values:
        _no_data(top, "no iteration records")
    top.set_ylabel(f"compute ({unit})")
    bottom.set_ylabel(f"barrier wait ({unit})")
    bottom.set_xlabel("iteration")
    fig.suptitle(_title(run, "Compute and barrier wait per iteration"))
    if values and (n <= MANY or handles):
        fig.legend(handles=top.get_legend_handles_labels()[0] + handles, loc="outside right upper",
                   fontsize=9, frameon=False)
    return _save(fig, path)


def plot_accuracy(runs: Mapping[str, Run | str | Path], path: str | Path, x: str = "elapsed") -> Path:
    """Test accuracy against training seconds (x="elapsed") or iteration (x="iteration")
    for several labelled runs (values may also be run directories)."""
    if x not in ("elapsed", "iteration"):
        raise ReportError(f"x = {x!r}: use 'elapsed' or 'iteration'")
    fig = _figure()
    ax = fig.add_subplot()
    drawn, right = 0, 0.0
    for label, run in runs.items():
        run = run if isinstance(run, Run) else load_run(run)
        pts = sorted((_number(e.get(x)), _number(e.get("test_accuracy"))) for e in run.evals
                     if _number(e.get(x)) is not None and _number(e.get("test_accuracy")) is not None)
        if not pts:
            continue
        line, = ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", markersize=4,
                        linewidth=1.6, label=str(label))
        ax.annotate(f"{100 * pts[-1][1]:.1f}%", (pts[-1][0], 100 * pts[-1][1]), xytext=(6, -4),
                    textcoords="offset points", ha="left", va="top", fontsize=9, color=line.get_color())
        drawn += 1
        right = max(right, pts[-1][0])
    if not drawn:
        _no_data(ax, "no evaluation records")
    ax.set_title("Test accuracy " + ("vs training time" if x == "elapsed" else "vs iteration"))
    ax.set_xlabel("training time (s)" if x == "elapsed" else "iteration")
    ax.set_ylabel("test accuracy (%)")
    ax.set_xlim(0, right * 1.1 if right > 0 else None)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(loc="lower right", fontsize=9)
    return _save(fig, path)


def metric_names(run: Run) -> list[str]:
    """The evaluation metrics a run recorded beyond accuracy (test_<name>, by the user's
    names), in the order first seen."""
    names: dict[str, None] = {}
    for e in run.evals:
        for k, v in e.items():
            if k.startswith("test_") and k not in ("test_samples", "test_accuracy") and _number(v) is not None:
                names.setdefault(k[len("test_"):])
    return list(names)


def plot_metrics(run: Run, path: str | Path, most: int = 4) -> Path:
    """Each evaluation metric (up to `most`) against training seconds, one panel each."""
    names = metric_names(run)[:most] or ["loss"]
    fig = _figure(WIDTH, 2.2 + 1.6 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        pts = sorted((_number(e.get("elapsed")), _number(e.get(f"test_{name}"))) for e in run.evals
                     if _number(e.get("elapsed")) is not None and _number(e.get(f"test_{name}")) is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3.5, linewidth=1.4)
            ax.annotate(f"{pts[-1][1]:.4g}", pts[-1], xytext=(6, 0), textcoords="offset points", fontsize=9)
        else:
            _no_data(ax, f"no {name} recorded")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("training time (s)")
    fig.suptitle(_title(run, "Evaluation metrics vs training time"))
    return _save(fig, path)


def plot_throughput(runs: Mapping[str, Run], path: str | Path, points: int = 40) -> Path:
    """Training samples/s against training seconds for several labelled runs: each point
    is the samples of about 1/`points` of a run's iterations over the seconds they took."""
    fig = _figure()
    ax = fig.add_subplot()
    drawn = 0
    for label, run in runs.items():
        recs = [r for r in run.iterations if _number(r.get("elapsed")) is not None]
        step = max(1, len(recs) // points)
        xs, ys, prev = [], [], 0.0
        for i in range(0, len(recs), step):
            chunk = recs[i:i + step]
            end = chunk[-1]["elapsed"]
            if end > prev:
                xs.append(end)
                ys.append(sum(sum(_number(b) or 0 for b in r.get("batch") or ()) for r in chunk) / (end - prev))
            prev = end
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, label=str(label))
            drawn += 1
    if not drawn:
        _no_data(ax, "no iteration records")
    ax.set_title("Training throughput vs training time")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(loc="lower right", fontsize=9)
    return _save(fig, path)


def plot_servers(run_dir: str | Path, path: str | Path) -> Path:
    """PSLD's view of a run: each server's load (bytes it holds) and busy seconds per
    measurement interval, against iteration, with block moves and server additions and
    removals marked; from the "servers" records and events of metrics.jsonl."""
    metrics = Path(run_dir) / "metrics.jsonl"
    records = [r for r in read_metrics(metrics) if isinstance(r, dict)] if metrics.is_file() else []
    rows = [r for r in records if r.get("type") == "servers"]
    changes = [r for r in records if r.get("type") == "event"
               and r.get("event") in ("block_moved", "server_added", "server_removed")]
    fig = _figure(WIDTH, HEIGHT * 1.5)
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2, sharex=None)
    ranks = sorted({s for r in rows for s in r["servers"]})
    for s in ranks:
        pts = [(r["iteration"], r["load_bytes"][r["servers"].index(s)], r["busy_s"][r["servers"].index(s)])
               for r in rows if s in r["servers"]]
        colour = _colour(s, max(len(ranks), 1))
        top.step([p[0] for p in pts], [p[1] / 1e6 for p in pts], where="post", color=colour, label=f"server {s}")
        bottom.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", markersize=3, color=colour,
                    label=f"server {s}")
    for ax in (top, bottom):
        for ev in changes:
            style = {"block_moved": ("tab:grey", ":"), "server_added": ("tab:green", "--"),
                     "server_removed": ("tab:red", "--")}[ev["event"]]
            ax.axvline(ev["iteration"], color=style[0], linestyle=style[1], linewidth=1, alpha=0.8)
        ax.grid(True, alpha=0.3)
    if not rows:
        _no_data(top, "no server measurements")
    top.set_ylabel("load (MB held)")
    top.set_title("Per-server load and busy time (dotted: block moves; dashed: servers added/removed)")
    bottom.set_ylabel("busy s per interval")
    bottom.set_xlabel("iteration")
    if ranks:
        top.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write batch_sizes.png, time_split.png, timeline.png and accuracy.png for a run into
    out_dir (default run_dir/report), metrics.png when it evaluated metrics other than
    accuracy and loss (the user's) or no accuracy, servers.png when the servers were measured, and
    wire.png (report/wire.py) when iteration records hold wire events (a job's always do; a
    simulated one's not); return their paths."""
    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_batch_sizes(run, out / "batch_sizes.png"),
             plot_time_split(run, out / "time_split.png"),
             plot_timeline(run, out / "timeline.png"),
             plot_accuracy({run.label: run}, out / "accuracy.png")]
    names = metric_names(run)
    accuracy = any(_number(e.get("test_accuracy")) is not None for e in run.evals)
    if names and (names != ["loss"] or not accuracy):  # the user's metrics, or no accuracy to plot
        paths.append(plot_metrics(run, out / "metrics.png"))
    if any('"type":"servers"' in line for line in (run.path / "metrics.jsonl").open()):
        paths.append(plot_servers(run.path, out / "servers.png"))
    if wire_record(run) is not None:
        paths.append(plot_wire(run, out / "wire.png"))
    return paths


def _mean(values: Iterable[float]) -> float | None:
    vs = list(values)
    return sum(vs) / len(vs) if vs else None
