"""The measurement tables of docs/psld.md (``python -m benchmarks.tables`` writes them with the
others): the preset cases, the single-block cases, the dynamic case and the sweep of cases nobody
tuned on."""

from typing import Any

from benchmarks.tables_format import count, grid, load, num, one_file, rng, summ

PRESET_COLUMNS = [("s/iteration, whole run", ("iteration_s",), rng),
                  ("s/iteration, settled", ("settled_iteration_s",), rng),
                  ("samples/s", ("samples_per_s",), rng), ("block moves", ("moves",), lambda s: rng(s, count))]


def preset(name: str) -> str:
    """A preset's placements (median (min–max) over its interleaved rounds), then PSLD's ratios."""
    case = load(name)["cases"][0]
    placements = grid(name, case["summary"].items(), PRESET_COLUMNS, "placement")
    ratios = " · ".join(f"{k}: **{rng(v)}**" for k, v in case["ratios"].items())
    return placements + f"\n\nPSLD's ratios, per round then median (min–max): {ratios}."


AA = "greedy again × greedy"  # the sweep's A/A ratio (results written before it had none)


def unseen_rows(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in d["cases"]:
        r = c["ratios"]
        rows.append([str(c["case"]), c["shape"], str(c["servers"]), num(c["bandwidth"]), num(c["factor"]),
                     f"{c['slow']} ({c['where']})", c["protocol"],
                     c["scenario"] + (f" → {c['switch_to']}" if c["switch_to"] is not None else ""),
                     rng(r["psld speed-up × greedy"])] + ([rng(r[AA])] if AA in r else []) +
                    [rng(r["psld × oracle"]), rng(r["psld settled × oracle"]),
                     rng(summ([r["moves"] for r in c["runs"]["psld"]]), count)])
    return rows


def unseen(name: str = "bench_psld_unseen") -> str:
    d = load(name)
    o = d["overall"]
    g, t = o["psld speed-up × greedy, per case"], o["psld × oracle (whole run), per case"]
    aa = AA in d["cases"][0]["ratios"]
    head = ["case", "blocks", "servers", "link MB/s", "slowdown", "slow server", "protocol", "scenario",
            "psld speed-up × greedy"] + (["greedy again × greedy (A/A)"] if aa else []) + [
            "psld × oracle (s/iteration)", "settled × oracle", "moves"]
    floor = ""
    if aa:
        below = o["cases psld below the A/A floor"]
        floor = (f" Greedy run again against greedy (per-case medians): {rng(o[AA + ', per case'])}; PSLD below "
                 f"the lowest of them in {', '.join(f'case {c}' for c in below) if below else 'no case'}.")
    return one_file(name, head, unseen_rows(d)) + (
        f"\n\nPSLD ≥ 1.0× greedy in **{o['cases psld ≥ 1.0× greedy']} of {g['n']}** cases; speed-up over greedy "
        f"{rng(g)}; whole run at {num(t['median'])}× the oracle's seconds per iteration (median; "
        f"{num(1 / t['median'])}× its speed); worst case {o['worst case']}.{floor}")


def unseen_aa() -> str:
    """The A/A check of the sweep's cases below 1.0×: greedy run twice beside PSLD."""
    d = load("bench_psld_unseen-aa")
    head = ["case", "blocks", "protocol", "scenario", "greedy again × greedy (A/A)", "psld speed-up × greedy",
            "psld moves"]
    rows = [[str(c["case"]), c["shape"], c["protocol"], c["scenario"], rng(c["ratios"]["greedy-again speed-up × greedy"]),
             rng(c["ratios"]["psld speed-up × greedy"]), rng(summ([r["moves"] for r in c["runs"]["psld"]]), count)]
            for c in d["cases"]]
    return one_file("bench_psld_unseen-aa", head, rows)


def psld_tables() -> dict[str, str]:
    return {**{f"psld-{p}": preset(f"bench_psld_{p}") for p in ("full", "full-byteps", "full-mlp", "full-mlp-byteps",
                                                                 "ssp")},
            "psld-single-block": preset("bench_psld_single-block"),
            "psld-single-block-ssp": preset("bench_psld_single-block-ssp"),
            "psld-dynamic": preset("bench_psld_dynamic"), "psld-unseen": unseen(), "psld-unseen-aa": unseen_aa(),
            "psld-unseen-fresh": unseen("bench_psld_unseen-fresh")}
