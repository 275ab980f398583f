"""PSLD under a parameter-server straggler (Chen et al., SoCC 2020): iteration time of
every placement policy, interleaved in one invocation, against the oracle (the best
static assignment for the true server speeds).

Every server sits behind an emulated link of `bandwidth` MB/s (a token bucket in the
server, which block migrations pass too) and the slow server is `factor`× slower on top
(its link time is multiplied), so "4× slower" is exact.

Which server is slow decides how badly a fixed rule does, so a preset names its cases:
a server rank, or a placement policy meaning "the server that policy hurts most" — for
`greedy` the server it gives its largest block, for any other policy the server it gives
the most bytes (computed from policy/placement.py for the preset's model, not hard-coded).
Greedy, PSLD and the oracle run in every case; MXNet and BytePS in every case, or (presets
"full", "full-mlp", to keep them short) only in the case that is their worst server.

Repetitions are interleaved: round 1 runs every (case, policy) once, round 2 again, and
so on. Each run reports its whole-run seconds per iteration and its "settled" seconds
per iteration (the mean over the last `settled` iterations, warm-up and PSLD's first
moves excluded). Ratios (PSLD against MXNet, BytePS, greedy, and settled against the
oracle) are computed within each round, then summarised as median (min–max) over rounds.

Scenario "dynamic": the slow server changes at iteration `switch` (a server trace), to
`switch_to`. Two references then: `oracle` is the best static assignment for the speeds
after the switch (the ones the settled window measures), `oracle_initial` the best
static assignment for the speeds before it. `settle iterations` counts the iterations
after the switch until PSLD's interval iteration time is within 1.1× of its settled level.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.common import (fmt, fmt_range, interleave, load_average, markdown_table, preset_main, summary,
                               write_results)

from benchmarks import psld_sweep
from benchmarks.psld_job import BASELINES, NAME, PRESETS, labels, run_one, slow_servers


def round_ratios(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """PSLD's speed-ups in each round (baseline s / PSLD s, whole run and settled) and
    its settled time × each reference's, summarised over the rounds."""
    psld = runs.get("psld")
    if not psld:
        return {}
    out = {}
    for base in BASELINES:
        for key, suffix in (("iteration_s", ""), ("settled_iteration_s", " settled")):
            if base in runs:
                out[f"psld speed-up × {base}{suffix}"] = summary(
                    [b[key] / p[key] for b, p in zip(runs[base], psld)])
    for ref in ("oracle", "oracle_initial"):
        if ref in runs:
            out[f"psld settled × {ref}"] = summary(
                [p["settled_iteration_s"] / o["settled_iteration_s"] for p, o in zip(psld, runs[ref])])
    return out


def case_table(case: dict) -> str:
    rows = []
    for label, s in case["summary"].items():
        rows.append([label, fmt_range(s["iteration_s"]), fmt_range(s["settled_iteration_s"]),
                     fmt(s["samples_per_s"]["median"]), fmt_range(s["moves"]), fmt(s["worker_pause_s_max"]["max"]),
                     fmt_range(s["settle_iterations"]) if "settle_iterations" in s else "–"])
    return markdown_table(["placement", "s/iteration, whole run", "s/iteration, settled", "samples/s",
                           "block moves", "longest worker pause s (max)", "settle iterations"], rows)


def ratio_table(cases: list[dict]) -> str:
    names = list(dict.fromkeys(n for c in cases for n in c["ratios"]))
    rows = [[f"{c['slow']} ({', '.join(c['stands_for'])})"] + [fmt_range(c["ratios"][n]) if n in c["ratios"] else "–"
                                                             for n in names] for c in cases]
    return markdown_table(["slow server"] + names, rows)


def run(preset: str, results_path: str | None = None, plots: str | None = None,
        reps: int | None = None) -> dict[str, Any]:
    if PRESETS[preset].scenario.startswith("random"):  # the seeded sweep (benchmarks/psld_sweep.py)
        return {"random": psld_sweep.run_unseen, "random-aa": psld_sweep.run_unseen_aa,
                "random-sim": lambda p, r, _: psld_sweep.run_prescreen(p, r)}[PRESETS[preset].scenario](
                    preset, results_path, reps)
    spec = PRESETS[preset] if reps is None else replace(PRESETS[preset], reps=reps)
    slow = slow_servers(spec)
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average(),
                              "ratios_computed": "within each round, then median (min–max) over rounds",
                              "cases": []}
    with tempfile.TemporaryDirectory(prefix="bench-psld-") as name:
        tmp = Path(name)
        systems = {f"{s}/{label}": (lambda s=s, label=label: run_one(spec, label, s, tmp))
                   for s, stands_for in slow.items() for label in labels(spec, stands_for)}
        runs = interleave(systems, spec.reps)
        for s, stands_for in slow.items():
            mine = {label: runs[f"{s}/{label}"] for label in labels(spec, stands_for)}
            first = next(iter(mine.values()))[0]
            keys = [k for k in first if isinstance(first[k], (int, float)) or k == "settle_iterations"]
            result["cases"].append({
                "slow": s, "stands_for": stands_for, "runs": mine, "ratios": round_ratios(mine),
                "summary": {label: {k: summary([r[k] for r in rs]) for k in keys if k in rs[0]}
                            for label, rs in mine.items()}})
        if plots and "psld" in spec.policies:
            from equipoise.report.plots import plot_servers
            result["plot"] = str(plot_servers(runs[f"{next(iter(slow))}/psld"][-1]["run_dir"],
                                              Path(plots) / f"psld-{preset}-servers.png"))
        for case in result["cases"]:
            for rs in case["runs"].values():
                for r in rs:
                    r.pop("run_dir")
    print(f"## PSLD benchmark, preset {preset}: {spec.model} on {spec.dataset}, {spec.workers} workers, "
          f"{spec.servers} servers behind {spec.bandwidth} MB/s links, one {spec.factor}× slower"
          + (f" until iteration {spec.switch}, then server {spec.switch_to}" if spec.scenario == "dynamic" else "")
          + f"; {spec.iterations} iterations, settled = last {spec.settled}; {spec.reps} interleaved rounds; "
            "median (min–max)\n")
    for case in result["cases"]:
        print(f"### server {case['slow']} slow ({', '.join(case['stands_for'])})\n\n{case_table(case)}\n")
    print(f"### PSLD's ratios, per round then median (min–max)\n\n{ratio_table(result['cases'])}")
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for the per-server plot of PSLD's last run (e.g. docs/img)",
                reps=True)
