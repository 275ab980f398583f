"""Shared helpers of the benchmarks: interleaved repetitions, medians and ratios,
Markdown tables, JSON results and a description of the machine.

The machine the benchmarks run on is shared and noisy, so a benchmark never reports an
absolute number alone: it runs the compared systems side by side in one process,
interleaving their repetitions (A, B, A, B, ...), and reports the median of each and the
ratio of the medians.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def median(values: Sequence[float]) -> float:
    """The median of `values` (NaN when empty)."""
    return float(statistics.median(values)) if values else math.nan


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is zero or not finite."""
    if not (math.isfinite(denominator) and denominator != 0):
        return math.nan
    return numerator / denominator


def interleave(systems: Mapping[str, Callable[[], T]], reps: int, *,
               warmup: int = 0, rotate: int = 1) -> dict[str, list[T]]:
    """Run each system `warmup` times (results dropped), then `reps` rounds of one call
    of every system in turn, in the mapping's order (A, B, A, B, ...). With `rotate` = k,
    each run of k consecutive systems starts one later in each round (A B C, B C A,
    C A B, ...), so that none of them always runs first, right after another case's
    runs. Returns each system's results in call order."""
    for _ in range(warmup):
        for fn in systems.values():
            fn()
    results: dict[str, list[T]] = {name: [] for name in systems}
    names = list(systems)
    k = max(1, rotate)
    for r in range(reps):
        for start in range(0, len(names), k):
            group = names[start:start + k]
            for name in group[r % len(group):] + group[:r % len(group)]:
                results[name].append(systems[name]())
    return results


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of `fn` takes (perf_counter)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats to `digits` significant digits (at least one decimal for
    numbers ≥ 1), NaN/None as '–', anything else with str()."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "–"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:#.{digits}g}".rstrip(".")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells go through `fmt`."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]

    def line(items: Sequence[str]) -> str:
        return "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): how busy the
    shared machine was, to read next to the numbers."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: versions, CPU count, load, git state (at the
    time of the call: benchmarks record it at their start too)."""
    import torch
    import zmq

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "hostname": socket.gethostname(),
    }
    info["loadavg"] = load_average()
    info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    try:
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in
                                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu_model"] = platform.processor()
    info["git"] = git_state()
    return info


def git_state() -> dict[str, Any]:
    """The commit checked out and whether the code it runs has uncommitted changes
    (src/, benchmarks/ outside results/, pyproject.toml): `dirty` is then true and
    `src_changes` lists them. Empty when this is not a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks",
                                 ":!benchmarks/results", "pyproject.toml"], cwd=root,
                                capture_output=True, text=True, timeout=5, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    changes = [line.strip() for line in status if line.strip()]
    return {"commit": commit, "dirty": bool(changes), "src_changes": changes}


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and count of repeated measurements (NaN-free values only), plus
    the values themselves in the order measured."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return {"median": median(finite), "min": min(finite, default=math.nan),
            "max": max(finite, default=math.nan), "n": len(finite), "values": list(values)}


def fmt_range(s: Mapping[str, Any], digits: int = 3) -> str:
    """A `summary` as 'median (min–max)'."""
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}–{fmt(s['max'], digits)})"


def _finite(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def relative_argv() -> list[str]:
    """The command line, with paths inside this checkout relative to it (a results file
    names the command, not the machine's folders)."""
    root = Path(__file__).resolve().parent.parent
    out = []
    for arg in sys.argv:
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(root):
            arg = str(path.resolve().relative_to(root))
        out.append(arg)
    return out


class DirtyCheckout(SystemExit):
    """A benchmark was asked to write into benchmarks/results/ from a checkout whose code
    has uncommitted changes (exit status 2, the message on stderr)."""

    def __init__(self, message: str) -> None:
        print(message, file=sys.stderr)
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def write_results(name: str, payload: Mapping[str, Any], path: str | Path | None = None) -> Path:
    """Write `payload` plus the time, the command line (relative to the checkout) and
    machine_info() as JSON to `path`, by default benchmarks/results/<name>.json; returns
    the path written. The results folder only takes results of committed code: from a
    dirty checkout (see git_state) writing there raises DirtyCheckout (exit status 2),
    after the results are saved beside it as <name>.dirty.json for a look."""
    target = Path(path) if path is not None else RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "argv": relative_argv(), "machine": machine_info(), **payload}
    text = json.dumps(_finite(doc), indent=2) + "\n"
    git = doc["machine"].get("git", {})
    if target.resolve().parent == RESULTS_DIR.resolve() and (not git or git.get("dirty")):
        aside = Path(tempfile.gettempdir()) / f"{name}.dirty.json"
        aside.write_text(text, encoding="utf-8")
        raise DirtyCheckout(f"benchmarks/results/{target.name}: not written, the checkout has uncommitted "
                            f"changes {git.get('src_changes', ['(not a git checkout)'])[:3]}; commit and run "
                            f"from a clean clone (results saved to {aside})")
    target.write_text(text, encoding="utf-8")
    return target


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class scoped_env:
    """Context manager setting environment variables, restoring them on exit (child
    processes started with spawn inherit the environment at start time)."""

    def __init__(self, **values: str) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> "scoped_env":
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["RESULTS_DIR", "DirtyCheckout", "fmt", "fmt_range", "free_port", "git_state", "interleave",
           "load_average", "machine_info", "markdown_table", "median", "ratio", "scoped_env", "summary",
           "timed", "write_results"]


def preset_main(doc: str, presets: Mapping[str, Any], run: Callable[..., Any], plots_help: str,
                reps: bool = False) -> None:
    """The command line of a preset benchmark: --preset, --results, --plots, and with
    `reps` --reps (rounds of interleaved repetitions; default: the preset's), passed to
    `run` as reps=."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(presets), default="ci")
    parser.add_argument("--results", default=None, help="JSON path (default benchmarks/results/)")
    parser.add_argument("--plots", default=None, help=plots_help)
    if reps:
        parser.add_argument("--reps", type=int, default=None, help="interleaved rounds (default: the preset's)")
    args = parser.parse_args()
    if reps and args.reps is not None and args.reps < 1:
        parser.error(f"--reps {args.reps}: must be ≥ 1")
    run(args.preset, args.results, args.plots, **({"reps": args.reps} if reps else {}))
