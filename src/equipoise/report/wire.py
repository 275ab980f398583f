"""One step's traffic per block, from an iteration record's `timeline`: when each block's
gradient left the worker, when its server computed the block's update, and when the new
weights arrived — the overlap of communication with the backward and forward passes,
drawn (docs/run-directory.md, `timeline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .figure import WIDTH, _figure, _no_data, _save

MAX_PANELS = 4  # workers drawn, one panel each
# kind -> (which time of the event, marker, colour, legend label)
_STYLE = {
    "fragment": (2, "^", "tab:blue", "gradient sent"),
    "push": (2, "^", "tab:blue", "gradient sent"),
    "applied": (2, "o", "tab:orange", "updated by its server"),
    "early": (3, "v", "tab:green", "weights arrived"),
    "part": (3, "v", "tab:green", "weights arrived"),
    "pull": (3, "v", "tab:green", "weights arrived"),  # unless it came in parts: those are drawn
    "rows": (3, "v", "tab:purple", "table rows arrived"),
}


def wire_record(run: Any, iteration: int | None = None) -> dict | None:
    """Of a `Run` (report/plots.py), the iteration record drawn: `iteration`'s, or by
    default the middle one of those with wire events (away from the cold start); None if
    no record has any."""
    recs = [r for r in run.iterations if any(r.get("timeline") or [])]
    if iteration is not None:
        return next((r for r in recs if r.get("iteration") == iteration), None)
    return recs[len(recs) // 2] if recs else None


def plot_wire(run: Any, path: str | Path, iteration: int | None = None) -> Path:
    """Each of (up to four) workers' wire events of one iteration against milliseconds
    from the start of its forward, one row per block: a gradient leaving (a fragment
    during backward, or the push), its server's update of the block, the weights
    arriving (the pull's reply, or each of its parts and the parts sent early as they
    came); the report and the next plan as a grey span. Weights that arrive before 0
    are the ones this forward used; an event of a kind it does not know is left out."""
    rec = wire_record(run, iteration)
    workers = list(rec.get("workers") or [])[:MAX_PANELS] if rec else []
    fig = _figure(WIDTH, 2.2 + 1.6 * max(1, len(workers)))
    axes = fig.subplots(max(1, len(workers)), 1, sharex=True, squeeze=False)[:, 0]
    if rec is None:
        _no_data(axes[0], "no wire events (timeline) in this run")
        fig.suptitle(f"One step's traffic per block — {run.label}")
        return _save(fig, path)
    seen: dict[str, object] = {}
    for ax, (i, worker) in zip(axes, enumerate(workers)):
        events = (rec.get("timeline") or [])[i] or []
        parted = {(e[1], e[2]) for e in events if e[0] in ("part", "early")}  # pulls answered in parts
        for kind, server, sent, arrived, blocks in events:
            if kind == "plan":
                handle = ax.axvspan(sent * 1e3, arrived * 1e3, color="0.85", zorder=0)
                seen.setdefault("report → plan", handle)
                continue
            if kind not in _STYLE or (kind == "pull" and (server, sent) in parted):
                continue
            which, marker, colour, label = _STYLE[kind]
            at = (sent, arrived)[which - 2]
            if at is None or not blocks:
                continue
            handle = ax.scatter([at * 1e3] * len(blocks), blocks, marker=marker, s=22, color=colour,
                                alpha=0.6 if kind == "early" else 1.0, zorder=3)
            seen.setdefault(label, handle)
        ax.axvline(0, color="0.3", linewidth=0.8, linestyle="--")
        ax.set_ylabel(f"worker {worker}\nblock")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("ms from the start of this step's forward (dashed)")
    shown = f" (workers {', '.join(map(str, workers))} of {len(rec.get('workers') or [])})" \
        if len(rec.get("workers") or []) > len(workers) else ""
    fig.suptitle(f"Iteration {rec.get('iteration')}: traffic per block{shown} — {run.label}")
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=len(seen), fontsize=9,
                   frameon=False)
    return _save(fig, path)


__all__ = ["plot_wire", "wire_record"]
