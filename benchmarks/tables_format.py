"""What the table writers share (benchmarks/tables.py, tables_psld.py): reading a results
file, naming it with the commit it was measured at, and formatting numbers and tables."""

import functools
import json
import math
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!-- tables:([\w-]+) -->\n(.*?)\n?<!-- /tables:\1 -->", re.S)

# ------------------------------------------------------------------ files and provenance


@functools.cache
def load(name: str) -> dict[str, Any]:
    """One results file, named without .json."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def commit_of(d: dict[str, Any]) -> str | None:
    """git_at_start's commit, else the machine's git, else compare_commits' head; or None."""
    for git in (d.get("git_at_start"), d.get("machine", {}).get("git"), d.get("head")):
        if isinstance(git, dict) and git.get("commit"):
            return git["commit"]
    return None


@functools.cache
def src_commits_since(commit: str) -> str:
    """Commits touching src/ after `commit`; "unknown" if it is not in this history."""
    try:
        out = subprocess.run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", "src/"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def provenance(name: str, base: str) -> list[str]:
    """[link to the file, the commit it was measured at, src/ commits since]."""
    d = load(name)
    commit, link = commit_of(d), f"[{name}.json]({base}benchmarks/results/{name}.json)"
    if commit is None:
        return [link, "commit not recorded", "unknown"]
    at = f"`{commit[:7]}`" + (f" (base `{d['base']['commit'][:7]}`)" if "base" in d else "")
    return [link, at, src_commits_since(commit)]


def command(name: str) -> str:
    """The command line a results file was written by (its recorded argv, paths outside
    the repository elided), as ``python -m benchmarks.X ...``; a comparison of two
    commits, the comparison's own command."""
    d = load(name)
    if isinstance(d.get("command"), list):  # compare_commits: its own command line, as run
        return "`" + " ".join(str(a) for a in d["command"]) + "`"
    argv = [str(a) for a in d.get("argv") or []]
    if not argv:
        return "an unrecorded command"
    script = argv[0].removesuffix(".py").replace("/", ".")
    args = ["…" if a.startswith("/") else a for a in argv[1:]]
    return "`" + " ".join(["python -m", script, *args]) + "`"


def one_file(name: str, head: list[str], rows: list[list[Any]]) -> str:
    """A table that comes from one file, and the line that names the file and the
    command that wrote it."""
    link, at, since = provenance(name, "../")
    return (table(head, rows) + f"\n\n*From {link}, written by {command(name)} at {at}; "
            f"commits touching src/ since: {since}.*")


def num(x: Any, digits: int = 3) -> str:
    """3 significant digits, thousands separated, a true minus sign; '–' for none."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, int) and not isinstance(x, bool):
        text = f"{x:,}"
    elif abs(x) >= 1000:
        text = f"{x:,.0f}"
    else:
        text = "0" if x == 0 else f"{x:#.{digits}g}".rstrip(".")
    return text.replace("-", "−")


# Small formats and helpers, one line each: X is a ratio's summary, its median in bold.
def ms(x: float) -> str: return num(x * 1000)
def pct(x: float) -> str: return num(100 * x) + "%"
def signed(x: float) -> str: return ("+" if x > 0 else "") + num(x)
def count(x: float) -> str: return num(int(x)) if x == int(x) else num(x)
def met(ok: bool) -> str: return "met" if ok else "missed"
def at(d: Any, *path: Any) -> Any: return functools.reduce(lambda v, key: v[key], path, d)
def X(s: dict[str, Any]) -> str: return f"**{num(s['median'])}×** ({num(s['min'])}–{num(s['max'])})"
def secs(s: dict[str, Any]) -> str: return f"**{num(s['median'])} s** ({num(s['min'])}–{num(s['max'])})"
def points(s: dict[str, Any]) -> str: return f"**{signed(s['median'])}** ({signed(s['min'])} to {signed(s['max'])})"
def all_ok(d: dict[str, Any]) -> tuple[str, str]: return f"**{d['ok']} of {d['of']}**", met(d["ok"] == d["of"])
def pct_range(s: dict[str, Any]) -> str: return rng(s, pct)
def summ(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rng(s: dict[str, Any], f=num) -> str:
    """'median (min–max)' of a summary; the median alone when min and max agree."""
    if s["min"] == s["max"]:
        return f(s["median"])
    return f"{f(s['median'])} ({f(s['min'])}{' to ' if s['min'] < 0 else '–'}{f(s['max'])})"


def table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def grid(name: str, items, columns: list[tuple], first: str = "system") -> str:
    """A row per (label, value) of `items`, a column per (header, path in the value, format)."""
    return one_file(name, [first, *(c[0] for c in columns)],
                    [[label, *(f(at(v, *path)) for _, path, f in columns)] for label, v in items])
