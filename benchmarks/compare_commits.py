"""One benchmark run against two commits in the same invocation: is the newer one slower?

Both revisions are checked out side by side as detached git worktrees in a temporary
folder (removed at the end, also on an error or Ctrl-C). Each checkout's own benchmark
module runs as a subprocess with that checkout's code (cwd = the checkout, PYTHONPATH =
<checkout>/src:<checkout>), interleaved base, head, base, head, ... `--reps` times, so
both sides see the same drift of the shared machine; each pair (base run i, head run i)
ran back to back. The report is, per throughput metric, each side's median (min–max),
the ratio head/base of the medians and the range of the per-pair ratios: a regression
shows as a ratio below the noise the pair ratios span.

Run from the repository root (both revisions must be commits; uncommitted changes are
not measured, so a dirty checkout is refused unless --allow-dirty)::

    python -m benchmarks.compare_commits --base HEAD~1 --head HEAD --bench bench_ddp --preset full
    python -m benchmarks.compare_commits --base HEAD~1 --head HEAD --bench bench_lbbsp --preset full

Arguments after `--` go to the benchmark itself (the same on both sides, e.g.
`-- --reps 1` for bench_ddp).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import fmt, load_average, markdown_table, median, ratio

REPO = Path(__file__).resolve().parent.parent
SIDES = ("base", "head")
GIT_TIMEOUT = 120.0


# -- metrics -------------------------------------------------------------------------------

def number(value: Any) -> float | None:
    """`value` as a float; None when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def at(doc: Any, path: str) -> float | None:
    """The number at dotted `path` in `doc`, None when absent, not a number or not finite."""
    for key in path.split("."):
        if not isinstance(doc, Mapping) or key not in doc:
            return None
        doc = doc[key]
    return number(doc)


def samples_per_s_leaves(doc: Any, prefix: str = "") -> dict[str, float | None]:
    """Every numeric leaf named `samples_per_s` in `doc`, keyed by its JSON path
    (`a.b[2].samples_per_s`): the fallback for a benchmark without an extractor."""
    if isinstance(doc, Mapping):
        items = [(f"{prefix}.{k}" if prefix else str(k), k, v) for k, v in doc.items()]
    elif isinstance(doc, list):
        items = [(f"{prefix}[{i}]", i, v) for i, v in enumerate(doc)]
    else:
        return {}
    found: dict[str, float | None] = {}
    for path, key, value in items:
        if key == "samples_per_s" and not isinstance(value, (Mapping, list)):
            found[path] = number(value)
        else:
            found.update(samples_per_s_leaves(value, path))
    return found


def ddp_metrics(doc: Mapping[str, Any]) -> dict[str, float | None]:
    """bench_ddp: the medians of equipoise BSP (whole run and steady window) and of DDP."""
    return {p: at(doc, p) for p in ("equipoise.samples_per_s", "equipoise.steady_samples_per_s",
                                    "ddp.samples_per_s")}


def lbbsp_metrics(doc: Mapping[str, Any]) -> dict[str, float | None]:
    """bench_lbbsp: every system's samples/s (bsp, lbbsp-<predictor>, asp, ddp), and the
    ideal (the workers' standalone speeds summed, a measure of the machine's speed then)."""
    systems = doc.get("results") if isinstance(doc.get("results"), Mapping) else {}
    out = {f"{name}.samples_per_s": at(r, "samples_per_s") for name, r in systems.items()}
    out["ideal.samples_per_s"] = at(doc, "ideal_samples_per_s")
    return out


EXTRACTORS: dict[str, Callable[[Mapping[str, Any]], dict[str, float | None]]] = {
    "bench_ddp": ddp_metrics,
    "bench_lbbsp": lbbsp_metrics,
}


def extract(bench: str, doc: Mapping[str, Any]) -> dict[str, float | None]:
    """The throughput metrics of one run's results JSON."""
    return EXTRACTORS.get(bench, samples_per_s_leaves)(doc)


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """values (None for a failed run), and the median, min and max of the others."""
    ok = [v for v in values if v is not None]
    return {"values": list(values), "median": median(ok),
            "min": min(ok) if ok else math.nan, "max": max(ok) if ok else math.nan}


def summarise(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric: each side's values in run order with median/min/max, the ratio
    head/base of the medians, and the per-pair ratios (pair i = base run i, head run i)
    with their range. `runs` holds dicts with "side" and "metrics", in run order."""
    names: dict[str, None] = {}
    for r in runs:
        names.update(dict.fromkeys(r["metrics"]))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        per = {s: [r["metrics"].get(name) for r in runs if r["side"] == s] for s in SIDES}
        pairs = [ratio(h, b) for b, h in zip(per["base"], per["head"]) if b is not None and h is not None]
        pairs = [p for p in pairs if math.isfinite(p)]
        m = {s: spread(per[s]) for s in SIDES}
        out[name] = {**m, "ratio": ratio(m["head"]["median"], m["base"]["median"]), "pair_ratios": pairs,
                     "pair_ratio_min": min(pairs) if pairs else math.nan,
                     "pair_ratio_max": max(pairs) if pairs else math.nan}
    return out


def report_table(metrics: Mapping[str, Mapping[str, Any]]) -> str:
    """metric | base median (min–max) | head median (min–max) | head/base (pair range)."""
    def cell(m: Mapping[str, Any]) -> str:
        return f"{fmt(m['median'])} ({fmt(m['min'])}–{fmt(m['max'])})"

    def r3(x: float) -> str:
        return f"{x:.3f}" if math.isfinite(x) else "–"

    rows = [[name, cell(m["base"]), cell(m["head"]),
             f"{r3(m['ratio'])} (pairs {r3(m['pair_ratio_min'])}–{r3(m['pair_ratio_max'])})"]
            for name, m in metrics.items()]
    return markdown_table(["metric", "base median (min–max)", "head median (min–max)", "head/base"], rows)


def finite(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def relative_argv(argv: Sequence[str], root: Path) -> list[str]:
    """argv with absolute paths made relative to `root` (a path outside it keeps its name
    only), so the recorded command line names no folder of this machine."""
    out = []
    for a in argv:
        p = Path(a)
        if p.is_absolute():
            a = os.path.relpath(p, root) if p.is_relative_to(root) else f"<outside>/{p.name}"
        out.append(a)
    return out


# -- git and runs --------------------------------------------------------------------------

def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=GIT_TIMEOUT, check=True).stdout.strip()


def resolve(rev: str) -> str:
    """The full hash of commit `rev`; a clear error when it is not one."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"compare_commits: {rev!r} is not a commit of {REPO.name}") from None


def machine() -> dict[str, Any]:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch_version, "platform": platform.platform()}


def bench_env(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout}"}


def check_imports(checkout: Path, bench: str) -> None:
    """Fail unless `equipoise` and the benchmark import from `checkout` itself (not from
    an editable install elsewhere)."""
    code = f"import equipoise, benchmarks.{bench} as b; print(equipoise.__file__); print(b.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=bench_env(checkout),
                         capture_output=True, text=True, timeout=300)
    files = [Path(line) for line in out.stdout.split()]
    if out.returncode or len(files) != 2 or not all(f.resolve().is_relative_to(checkout.resolve())
                                                      for f in files):
        tail = out.stderr.strip().splitlines()[-1:] or files
        raise SystemExit(f"compare_commits: {checkout.name} does not import its own equipoise and "
                         f"benchmarks.{bench}: {tail}")


def run_once(checkout: Path, cmd: list[str], timeout_s: float, log: Path) -> tuple[int | None, str | None]:
    """Run `cmd` in `checkout` in its own process group, output to `log`; kill the whole
    group on timeout or interrupt. Returns (exit code, error or None)."""
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=checkout, env=bench_env(checkout), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return None, f"timed out after {timeout_s:.0f} s"
        except BaseException:
            kill_group(proc)
            raise
    return code, None if code == 0 else f"exit code {code}"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during `compare`; `runs` holds the runs completed before it."""

    def __init__(self, runs: list[dict[str, Any]], commits: dict[str, str]):
        super().__init__("interrupted")
        self.runs, self.commits = runs, commits


def compare(base: str, head: str, bench: str, preset: str, reps: int, timeout_min: float,
            bench_args: Sequence[str] = ()) -> dict[str, Any]:
    """Check out both commits, run the benchmark interleaved, return runs and summary.
    Interrupted, it raises `Interrupted` with the runs completed so far."""
    commits = {"base": resolve(base), "head": resolve(head)}
    tmp = Path(tempfile.mkdtemp(prefix="compare-commits-"))
    trees = {s: tmp / s for s in SIDES}
    runs: list[dict[str, Any]] = []
    try:
        for side in SIDES:
            git("worktree", "add", "--detach", str(trees[side]), commits[side])
            if not (trees[side] / "benchmarks" / f"{bench}.py").is_file():
                raise SystemExit(f"compare_commits: {side} {commits[side][:10]} has no benchmarks/{bench}.py")
            check_imports(trees[side], bench)
        for rep in range(reps):
            for side in SIDES:
                out = tmp / f"{side}-{rep}.json"
                cmd = [sys.executable, "-m", f"benchmarks.{bench}", "--preset", preset,
                       "--results", str(out), *bench_args]
                print(f"[{time.strftime('%H:%M:%S')}] rep {rep + 1}/{reps} {side} "
                      f"({commits[side][:10]}) ...", file=sys.stderr, flush=True)
                t0 = time.monotonic()
                code, error = run_once(trees[side], cmd, timeout_min * 60, tmp / f"{side}-{rep}.log")
                seconds = time.monotonic() - t0
                metrics: dict[str, float | None] = {}
                if error is None:
                    try:
                        metrics = extract(bench, json.loads(out.read_text(encoding="utf-8")))
                    except (OSError, ValueError) as exc:
                        error = f"results JSON unreadable: {exc}"
                if error:
                    log = (tmp / f"{side}-{rep}.log").read_text(encoding="utf-8", errors="replace")
                    error += " | " + " / ".join(log.strip().splitlines()[-5:])
                    print(f"  FAILED: {error}", file=sys.stderr, flush=True)
                runs.append({"side": side, "rep": rep, "seconds": seconds, "returncode": code,
                             "error": error, "metrics": metrics})
    except KeyboardInterrupt:
        raise Interrupted(runs, commits) from None
    finally:
        for path in trees.values():
            if path.exists():
                subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO,
                               capture_output=True, timeout=GIT_TIMEOUT)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True, timeout=GIT_TIMEOUT)
    return {"commits": commits, "runs": runs, "metrics": summarise(runs)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit before the change")
    parser.add_argument("--head", required=True, help="the commit with the change")
    parser.add_argument("--bench", required=True, help="module in benchmarks/, e.g. bench_ddp")
    parser.add_argument("--preset", required=True, help="the benchmark's preset, e.g. full")
    parser.add_argument("--reps", type=int, default=3, help="runs per side, interleaved")
    parser.add_argument("--timeout-min", type=float, default=60.0, help="per run")
    parser.add_argument("--out", default=None,
                        help="JSON path (default benchmarks/results/compare_<bench>_<preset>.json)")
    parser.add_argument("--from-runs", nargs="+", metavar="RUN.json", default=None,
                        help="summarise results files of runs made earlier, in run order "
                             "(base, head, base, head, ...) instead of running anything")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run although the checkout has uncommitted changes (recorded)")
    args = parser.parse_args(own)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    dirty_files = git("status", "--porcelain", "--untracked-files=no").splitlines()
    if dirty_files and not args.allow_dirty:
        parser.error(f"{REPO.name} has uncommitted changes ({len(dirty_files)} files); commit them "
                     "or pass --allow-dirty")
    out = Path(args.out or REPO / "benchmarks" / "results" / f"compare_{args.bench}_{args.preset}.json")
    signal.signal(signal.SIGTERM, _sigterm)
    load_start, t0 = load_average(), time.monotonic()
    interrupted = False
    try:
        if args.from_runs:
            result = from_runs(args.base, args.head, args.bench, args.from_runs)
        else:
            result = compare(args.base, args.head, args.bench, args.preset, args.reps, args.timeout_min,
                             bench_args)
    except Interrupted as stop:
        print("compare_commits: interrupted; the runs were stopped and the worktrees removed; "
              f"{len(stop.runs)} completed runs are written", file=sys.stderr)
        result = {"commits": stop.commits, "runs": stop.runs, "metrics": summarise(stop.runs)}
        interrupted = True
    except KeyboardInterrupt:
        print("compare_commits: interrupted; the runs were stopped and the worktrees removed", file=sys.stderr)
        return 130
    reps = len([r for r in result["runs"] if r["side"] == "head"])  # completed pairs
    doc = {"benchmark": "compare_commits", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "command": ["python", "-m", "benchmarks.compare_commits", *relative_argv(argv, REPO)],
           "bench_command": ["python", "-m", f"benchmarks.{args.bench}", "--preset", args.preset,
                             "--results", "<run.json>", *bench_args],
           "bench": args.bench, "preset": args.preset, "reps": reps,
           "base": {"rev": args.base, "commit": result["commits"]["base"]},
           "head": {"rev": args.head, "commit": result["commits"]["head"]},
           "dirty": bool(dirty_files), "dirty_files": [f.strip() for f in dirty_files],
           "loadavg_at_start": load_start, "loadavg_at_end": load_average(),
           "seconds": time.monotonic() - t0, "machine": machine(),
           "metrics": result["metrics"], "runs": result["runs"], "interrupted": interrupted,
           "from_run_files": [Path(f).name for f in args.from_runs] if args.from_runs else None}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite(doc), indent=2) + "\n", encoding="utf-8")
    failed = sum(1 for r in result["runs"] if r["error"])
    print(f"## {args.bench} --preset {args.preset}: head {args.head} ({result['commits']['head'][:10]}) "
          f"vs base {args.base} ({result['commits']['base'][:10]}), {reps} interleaved reps"
          + (f", {failed} runs FAILED" if failed else "") + "\n")
    print(report_table(result["metrics"]))
    print(f"\nload average {load_start} at start, {doc['loadavg_at_end']} at end; "
          f"{doc['seconds'] / 60:.1f} min; wrote {out}")
    return 130 if interrupted else 1 if failed else 0


def from_runs(base: str, head: str, bench: str, files: Sequence[str]) -> dict[str, Any]:
    """The runs of results files made earlier by this harness's runs (in run order:
    base, head, base, head, ...), summarised as `compare` would."""
    runs = []
    for i, name in enumerate(files):
        metrics = extract(bench, json.loads(Path(name).read_text(encoding="utf-8")))
        runs.append({"side": SIDES[i % 2], "rep": i // 2, "seconds": None, "returncode": 0, "error": None,
                     "metrics": metrics})
    return {"commits": {"base": resolve(base), "head": resolve(head)}, "runs": runs, "metrics": summarise(runs)}


if __name__ == "__main__":
    sys.exit(main())
