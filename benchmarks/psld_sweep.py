"""bench_psld's seeded sweep of cases nobody tuned PSLD on (presets ``unseen``,
``unseen-aa``, ``unseen-sim``): the cases drawn, the interleaved real runs, and the
simulator's pre-screen. Run through bench_psld (``--preset unseen``)."""

from __future__ import annotations

import random
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.psld_job import NAME, PRESETS, Spec, job, run_one, server_loads
from benchmarks.common import fmt, fmt_range, interleave, load_average, markdown_table, summary, write_results


# Seeded random cases nobody tuned the rule on (preset "unseen"): block-size spreads
# (the CNN's first layer whole: one dominant block; the CNN cut in 32k blocks: many equal
# ones; mlp-deep's three large layers whole; the small mlp in 4k blocks: a long tail), the
# slow server where greedy puts the largest block, a middle share or only small blocks,
# links of 50-1,000 MB/s (log-uniform), slowdowns of 2-6x, 2-8 servers, a third of the
# cases with the slowdown moving to another server half-way, a third under SSP.
SHAPES = (("cnn", 1 << 20, "one dominant block"), ("cnn", 32768, "many equal blocks"),
          ("mlp-deep", 1 << 20, "three large layers"), ("mlp", 4096, "a long tail"))
WHERE = ("largest", "middle", "smallest")


def random_cases(seed: int, n: int) -> list[dict[str, Any]]:
    """`n` cases drawn from `random.Random(seed)`: each a dict of Spec fields (model,
    block_size, servers, bandwidth, factor, protocol, scenario) and `where` the slow
    server sits in greedy's placement (`slow_rank` turns it into a rank)."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        model, block_size, shape = SHAPES[rng.randrange(len(SHAPES))]
        cases.append({"case": i, "model": model, "block_size": block_size, "shape": shape,
                      "servers": rng.randint(2, 8), "bandwidth": round(50 * 20 ** rng.random(), 1),
                      "factor": round(rng.uniform(2, 6), 2), "where": WHERE[rng.randrange(3)],
                      "scenario": "dynamic" if rng.random() < 1 / 3 else "static",
                      "protocol": "ssp" if rng.random() < 1 / 3 else "bsp", "switch_draw": rng.random()})
    return cases


def slow_rank(spec: Spec, where: str) -> int:
    """The server greedy gives the most bytes ("largest"), the fewest ("smallest", lowest
    rank on ties) or the median share ("middle"), for the spec's model."""
    loads, _ = server_loads(spec, "greedy")
    order = sorted(range(spec.servers), key=lambda j: (-loads[j], j))
    return {"largest": order[0], "middle": order[len(order) // 2], "smallest": order[-1]}[where]


def case_spec(base: Spec, case: dict[str, Any]) -> tuple[Spec, int]:
    """The Spec of a random case, and its slow server; a dynamic case's slowdown moves at
    half the run to another server (drawn), so a placement right for the first half is
    wrong for the second."""
    spec = replace(base, model=case["model"], block_size=case["block_size"], servers=case["servers"],
                   bandwidth=case["bandwidth"], factor=case["factor"], protocol=case["protocol"],
                   scenario=case["scenario"], switch=base.iterations // 2)
    slow = slow_rank(spec, case["where"])
    others = [r for r in range(spec.servers) if r != slow]
    spec = replace(spec, switch_to=others[int(case["switch_draw"] * len(others))])
    return spec, slow


def overall(speedups: list[float], to_oracle: list[float]) -> dict[str, Any]:
    """A sweep's summary: PSLD's speed-up over greedy and its time over the oracle's, one
    value per case (cases numbered in order), and the worst case."""
    return {"psld speed-up × greedy, per case": summary(speedups),
            "psld × oracle (whole run), per case": summary(to_oracle),
            "cases psld ≥ 1.0× greedy": sum(x >= 1.0 for x in speedups),
            "worst case": min(range(len(speedups)), key=lambda i: speedups[i])}


def interleaved_cases(base: Spec, indices, labels: tuple[str, ...], reps: int):
    """Run the random cases `indices` of `base.seed` under each of `labels` (placements;
    "<placement>-again" runs it a second time), interleaved: round r runs the first case's
    runs, then the next case's, ..., each case's starting one later in each round, so
    that no label always runs right after another case's runs. Yields (case, spec, slow
    server, {label: runs}) in the order of `indices`."""
    drawn = random_cases(base.seed, max(indices) + 1)
    specs = {i: case_spec(base, drawn[i]) for i in indices}
    with tempfile.TemporaryDirectory(prefix="bench-psld-") as name:
        tmp = Path(name)
        systems = {f"{i}/{label}": (lambda spec=spec, slow=slow, label=label:
                                    run_one(spec, label.removesuffix("-again"), slow, tmp))
                   for i, (spec, slow) in specs.items() for label in labels}
        runs = interleave(systems, reps, rotate=len(labels))
    for i, (spec, slow) in specs.items():
        mine = {label: runs[f"{i}/{label}"] for label in labels}
        for rs in mine.values():
            for r in rs:
                r.pop("run_dir")
        yield drawn[i], spec, slow, mine


def run_unseen(preset: str, results_path: str | None = None, reps: int | None = None,
               cases: int | None = None) -> dict[str, Any]:
    """Every random case under greedy, greedy again, PSLD and the oracle (the best static
    placement for the speeds in force at the end), interleaved (`interleaved_cases`).
    Ratios per case and round: PSLD's whole-run speed-up over greedy, greedy again's (two
    runs of one placement: the noise PSLD's ratio is judged against), and PSLD's
    whole-run and settled iteration time over the oracle's."""
    base = PRESETS[preset]
    n = cases if cases is not None else base.sweep_cases
    reps = base.reps if reps is None else reps
    result: dict[str, Any] = {"preset": preset, "spec": asdict(replace(base, reps=reps)), "cases_drawn": n,
                              "loadavg_at_start": load_average(), "cases": []}
    for case, spec, slow, mine in interleaved_cases(base, range(n), ("greedy", "greedy-again", "psld", "oracle"),
                                                    reps):
        ratios = {
            "psld speed-up × greedy": summary([g["iteration_s"] / p["iteration_s"]
                                               for g, p in zip(mine["greedy"], mine["psld"])]),
            "greedy again × greedy": summary([g["iteration_s"] / a["iteration_s"]
                                              for g, a in zip(mine["greedy"], mine["greedy-again"])]),
            "psld × oracle": summary([p["iteration_s"] / o["iteration_s"] for p, o in zip(mine["psld"], mine["oracle"])]),
            "psld settled × oracle": summary([p["settled_iteration_s"] / o["settled_iteration_s"]
                                              for p, o in zip(mine["psld"], mine["oracle"])])}
        result["cases"].append({**case, "slow": slow, "switch_to": spec.switch_to if spec.scenario == "dynamic" else None,
                                "runs": mine, "ratios": ratios})
    result["overall"] = overall([c["ratios"]["psld speed-up × greedy"]["median"] for c in result["cases"]],
                                [c["ratios"]["psld × oracle"]["median"] for c in result["cases"]])
    # the noise floor: the lowest per-case median of greedy again over greedy (one
    # placement run twice); a case below it is below greedy by more than that noise
    aa = [c["ratios"]["greedy again × greedy"]["median"] for c in result["cases"]]
    floor = min(aa)
    result["overall"]["greedy again × greedy, per case"] = summary(aa)
    result["overall"]["cases psld below the A/A floor"] = [
        c["case"] for c in result["cases"] if c["ratios"]["psld speed-up × greedy"]["median"] < floor]
    # the cases below greedy, with PSLD's moves in each round (none: greedy's placement
    # throughout, the ratio two runs of one placement)
    result["overall"]["below 1.0× greedy: case, ratio, psld moves per round"] = [
        [c["case"], c["ratios"]["psld speed-up × greedy"]["median"], [r["moves"] for r in c["runs"]["psld"]]]
        for c in result["cases"] if c["ratios"]["psld speed-up × greedy"]["median"] < 1.0]
    rows = [[c["case"], c["shape"], c["servers"], fmt(c["bandwidth"]), fmt(c["factor"]),
             f"{c['slow']} ({c['where']})", c["protocol"],
             c["scenario"] + (f" → {c['switch_to']}" if c["switch_to"] is not None else ""),
             fmt_range(c["ratios"]["psld speed-up × greedy"]), fmt_range(c["ratios"]["greedy again × greedy"]),
             fmt_range(c["ratios"]["psld × oracle"]),
             fmt_range(c["ratios"]["psld settled × oracle"]), fmt(c["runs"]["psld"][0]["moves"])]
            for c in result["cases"]]
    print(f"## PSLD on {n} seeded random cases (seed {base.seed}), {base.workers} workers, {base.iterations} "
          f"iterations, {reps} interleaved round(s); median (min–max) over rounds\n")
    print(markdown_table(["case", "blocks", "servers", "link MB/s", "slowdown", "slow server", "protocol",
                          "scenario", "psld × greedy (speed-up)", "greedy again × greedy", "psld × oracle",
                          "settled × oracle",
                          "moves (round 1)"], rows))
    o = result["overall"]
    print(f"\nPSLD ≥ 1.0× greedy in {o['cases psld ≥ 1.0× greedy']} of {n} cases; speed-up over greedy "
          f"{fmt_range(o['psld speed-up × greedy, per case'])}; whole run × oracle "
          f"{fmt_range(o['psld × oracle (whole run), per case'])}; worst case {o['worst case']}; greedy again × "
          f"greedy {fmt_range(o['greedy again × greedy, per case'])}; below that floor: "
          f"{o['cases psld below the A/A floor'] or 'none'}")
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


# The cases of the sweep (seed 39) whose median was below 1.0x greedy at b043810
# (results/bench_psld_unseen.json); at e084bdb they were 5, 7, 9, 13, 15 and 18.
UNSEEN_AA_CASES = (1, 7, 9, 10, 17)


def run_unseen_aa(preset: str, results_path: str | None = None, reps: int | None = None) -> dict[str, Any]:
    """Some cases of the sweep (UNSEEN_AA_CASES) under greedy, greedy again and PSLD,
    interleaved as `run_unseen` does: greedy-again against greedy is the ratio of two runs
    of one placement (an A/A comparison), the spread that PSLD's ratio must be judged
    against."""
    base = PRESETS[preset]
    reps = base.reps if reps is None else reps
    result: dict[str, Any] = {"preset": preset, "spec": asdict(replace(base, reps=reps)),
                              "cases_drawn": list(UNSEEN_AA_CASES), "loadavg_at_start": load_average(), "cases": []}
    for case, _, slow, mine in interleaved_cases(base, UNSEEN_AA_CASES, ("greedy", "greedy-again", "psld"), reps):
        g = mine["greedy"]
        ratios = {f"{label} speed-up × greedy": summary([a["iteration_s"] / b["iteration_s"]
                                                         for a, b in zip(g, mine[label])])
                  for label in ("greedy-again", "psld")}
        result["cases"].append({**case, "slow": slow, "runs": mine, "ratios": ratios})
    rows = [[c["case"], c["shape"], c["protocol"], fmt_range(c["ratios"]["greedy-again speed-up × greedy"]),
             fmt_range(c["ratios"]["psld speed-up × greedy"]),
             fmt_range(summary([r["moves"] for r in c["runs"]["psld"]]))] for c in result["cases"]]
    print(f"## Cases {list(UNSEEN_AA_CASES)} of the sweep, {reps} interleaved rounds; median (min–max)\n")
    print(markdown_table(["case", "blocks", "protocol", "greedy again × greedy", "psld × greedy", "psld moves"], rows))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


def simulated(spec: Spec, label: str, slow: int, tmp: Path) -> float:
    """Seconds per iteration of one run of `label` in the simulator (same policies, same
    config; PSLD is simulated at barriers only, so a case drawn under SSP runs as BSP;
    a 1 ms one-way latency, so that an exchange's fixed cost is there to mislead)."""
    from equipoise.sim.run import simulate

    cfg = {**job(replace(spec, protocol="bsp"), label, slow, tmp), "sim_latency_s": 0.001}
    return simulate(cfg, write=False)["train_s"] / spec.iterations


def prescreen(base: Spec, n: int, tmp: Path) -> list[dict[str, Any]]:
    """The first `n` random cases of `base.seed` in the simulator: each case's seconds
    per iteration under greedy, PSLD and the oracle."""
    out = []
    for case in random_cases(base.seed, n):
        spec, slow = case_spec(base, case)
        out.append({**case, "slow": slow,
                    **{label: simulated(spec, label, slow, tmp) for label in ("greedy", "psld", "oracle")}})
    return out


def run_prescreen(preset: str, results_path: str | None = None, cases: int = 200) -> dict[str, Any]:
    base = PRESETS[preset]
    with tempfile.TemporaryDirectory(prefix="bench-psld-") as name:
        rows = prescreen(base, cases, Path(name))
    o = overall([r["greedy"] / r["psld"] for r in rows], [r["psld"] / r["oracle"] for r in rows])
    worst = o["worst case"]
    result = {"preset": preset, "spec": asdict(base), "cases_drawn": cases, "simulated": True, "cases": rows,
              "overall": o}
    print(f"## PSLD on {cases} seeded random cases (seed {base.seed}) in the simulator (all at barriers)\n\n"
          f"PSLD ≥ 1.0× greedy in {o['cases psld ≥ 1.0× greedy']} of {cases} cases; speed-up over greedy "
          f"{fmt_range(o['psld speed-up × greedy, per case'])}; whole run × oracle "
          f"{fmt_range(o['psld × oracle (whole run), per case'])}; worst case {worst}: {rows[worst]['shape']}, "
          f"{rows[worst]['servers']} servers, {rows[worst]['bandwidth']} MB/s, slow server {rows[worst]['slow']} "
          f"({rows[worst]['where']}), {rows[worst]['scenario']}")
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result
