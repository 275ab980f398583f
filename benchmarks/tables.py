"""``python -m benchmarks.tables``: the measurement tables of docs/benchmarks.md and the README's headline
numbers, rewritten from benchmarks/results/*.json (not trials/) between ``<!-- tables:NAME -->`` and
``<!-- /tables:NAME -->``. Each table names its results file, the commit it was measured at and how many
commits touching src/ landed since. Targets and labels are written here; every measured number is read.
"""

import math
from collections import Counter
from typing import Any

from benchmarks.tables_sparse import sparse_tables
from benchmarks.tables_format import (MARKER, ROOT, X, all_ok, at, count, grid, load, met, ms, num, one_file, pct,
                                     pct_range, points, provenance, rng, secs, signed, summ, table)
from benchmarks.tables_psld import psld_tables

# ------------------------------------------------------------------ the summary: a row per target
# A row is (results file, what, target, cell); cell(data) returns (measured, verdict).


def R(*path: Any, ge: float | None = None, le: float | None = None, f=X):
    """The value at `path` (a summary shown by `f`, or one ratio) held within [ge, le]."""
    def cell(d):
        v = at(d, *path)
        m = v["median"] if isinstance(v, dict) else v
        ok = (ge is None or m >= ge) and (le is None or m <= le)
        return f(v) if isinstance(v, dict) else f"**{num(v)}×**", "reported" if ge is le is None else met(ok)
    return cell


def compare(d, ge: float | None = None):
    """compare_commits' equipoise samples/s, head/base: at least `ge`, or within noise (pairs straddle 1)."""
    m = d["metrics"]["equipoise.samples_per_s"]
    ok = m["ratio"] >= ge if ge else m["pair_ratio_min"] <= 1 <= m["pair_ratio_max"]
    return (f"**{num(m['ratio'])}×** (pairs {num(m['pair_ratio_min'])}–{num(m['pair_ratio_max'])}); DDP control "
            f"{num(d['metrics']['ddp.samples_per_s']['ratio'])}×"), met(ok)


def psld(d):
    """A static PSLD preset: × the default rule (≥ 2), × greedy (≥ 1.5), settled × oracle (≤ 1.1)."""
    r, out, ok = d["cases"][0]["ratios"], [], []
    for key, limit in (("mxnet", 2), ("byteps", 2), ("greedy", 1.5), ("oracle", 1.1)):
        if s := r.get(f"psld speed-up × {key}") or r.get(f"psld settled × {key}"):
            out.append(f"{'settled ' if key == 'oracle' else ''}× {key} {X(s)}")
            ok.append(s["median"] <= limit if key == "oracle" else s["median"] >= limit)
    return "; ".join(out), met(all(ok))


def chaos(d):
    t = d["totals"]
    diff = "" if t["max_diff"] is None else f", max difference from the oracle {num(t['max_diff'])}"
    return (f"**{t['ok']} of {t['reps']}** completed, {t['blows_landed']} blows, {t['recovered']} in `recovered`, "
            f"{t['lost_updates']} lost updates{diff}"), met(t["ok"] == t["reps"] and not t["blows_unaccounted"])


def convergence(d, rules: tuple[str, ...]):
    """Rudra's study to convergence: at each n the best of `rules`, points against hardsync."""
    s = d["study"]["systems"]
    best = [max(s[f"{n}-softsync {r}"]["delta_points"]["median"] for r in rules) for n in (1, 2, 4, 8)]
    return " / ".join(map(signed, best)) + " points at n = 1 / 2 / 4 / 8", " / ".join(met(v >= -1) for v in best)


def seeds(d):
    diffs = [r["equipoise_val_loss"] - r["plain_pytorch_val_loss"] for r in d["runs"]]
    return (f"differences {', '.join(map(signed, diffs))} nats; seed-to-seed spread {num(d['spread_all'])}",
            met(max(map(abs, diffs)) < d["spread_all"]))


def sim_validate(d):
    errors = {k: v["steady_iteration_s_error"] for k, v in d["validate"]["runs"].items() if "calibration" not in k}
    return ("steady iteration time " + ", ".join(f"{k} {pct(e)}" for k, e in errors.items()),
            f"{sum(e <= 0.1 for e in errors.values())} of {len(errors)} within")


def unseen(d):
    """A sweep's cases at or above 1.0× greedy; where some are below, whether any is below the
    lowest of the cases' A/A medians (greedy run twice: what a three-round median resolves)."""
    o, g = d["overall"], d["overall"]["psld speed-up × greedy, per case"]
    speed = 1 / o["psld × oracle (whole run), per case"]["median"]
    cases, below = o["cases psld ≥ 1.0× greedy"], o.get("cases psld below the A/A floor")
    floor = "" if below is None else (f", {len(below) or 'none'} below the lowest A/A median "
                                      f"({num(o['greedy again × greedy, per case']['min'])}×)")
    every = met(True) if cases == g["n"] else ("the rest within the A/A noise" if below == [] else met(False))
    return (f"**{cases} of {g['n']}** cases ≥ 1.0× greedy (worst {num(g['min'])}×{floor}); median {num(speed)}× the "
            "oracle's speed"), f"{every}; {met(speed >= 0.9)}"


def fuzz(d):
    ok = not (d["valid_checks_failed"] or d["crashed"] or d["hung"] or d["strangers"]["replies"])
    return (f"{d['valid_checks'] - d['valid_checks_failed']:,} of {d['valid_checks']:,} valid exchanges exact; "
            f"{d['impostor']['refused']:,} of {d['impostor']['sent']:,} impostors refused"), met(ok)


def ssp(d):
    s = d["ssp"]["systems"]
    return (" / ".join(rng(s[k]["samples_per_s"]) for k in ("ssp s=1", "ssp s=4")),
            " / ".join(map(met, d["ssp"]["checks"]["between_bsp_and_asp"].values())))


def scale(d):
    h = d["scale"]["headline"].values()
    return " / ".join(f"**{num(v['median_s'])}** s" for v in h), met(max(v["median_s"] for v in h) <= 60)


COMPARES = ("compare_bench_ddp_full", "compare_bench_lbbsp_full", "compare_bench_lbbsp_ci",
            "compare_bench_ddp_full_workloads", "compare_bench_ddp_full_recovery", "compare_bench_lbbsp_ci_recovery")
SYS, GREEDY, SETTLED = ("cases", 0, "ratios"), "psld speed-up × greedy", "psld settled × oracle"
SUMMARY = [
    ("bench_ddp", "equipoise BSP vs PyTorch DDP, equal workers, samples/s", "≥ 1.1×", R("steady_pair_ratio", ge=1.1)),
    ("bench_wire", "push+pull of a 4 MB block via a server vs raw pyzmq", "≤ 1.3×", R("results", 0, "ratio", le=1.3)),
    ("bench_wire", "the same, 40 MB", "≤ 1.3×", R("results", 1, "ratio", le=1.3)),
    ("bench_lbbsp_full", "LB-BSP vs BSP, workers slowed [1,1,2,4]", "≥ 2.4×", R("ratios", "lbbsp/bsp", ge=2.4)),
    ("bench_lbbsp_full", "LB-BSP vs PyTorch DDP, same stragglers", "≥ 2×", R("ratios", "lbbsp/ddp", ge=2)),
    ("bench_lbbsp_full", "LB-BSP vs ASP (no barrier), same stragglers", "≥ 0.95×", R("ratios", "lbbsp/asp", ge=.95)),
    ("bench_lbbsp_hysteresis", "LB-BSP vs ASP, quiet machine", "≥ 0.95×", R("ratios", "lbbsp/asp", ge=0.95)),
    ("bench_lbbsp_overlap", "LB-BSP, exchange overlapped, vs ASP", "≥ 0.97×", R("ratios", "lbbsp-eager/asp", ge=0.97)),
    ("bench_rudra_study", "Rudra (λ = 8, 1 epoch): per-gradient modulation at n = 8, Δ points vs hardsync",
     "within 1 point", R("study", "systems", "8-softsync per_gradient", "delta_points", ge=-1, f=points)),
    ("bench_rudra_convergence", "Rudra's study to convergence at BSP's settings: its rules at their best vs "
     "hardsync", "within 1 point at every n", lambda d: convergence(d, ("none", "per_gradient", "mean"))),
    ("bench_rudra_convergence", "the same with `async_scaling = \"bsp\"`", "within 1 point at every n",
     lambda d: convergence(d, ("bsp",))),
    ("bench_rudra_ssp", "SSP samples/s, s = 1 / s = 4, transient 4× straggler", "between BSP's and ASP's", ssp),
    *[("bench_async_full", f"BSP's settings under {k}: Δ accuracy vs hardsync, points", "within 1.5 points",
       R(section, "systems", k, "delta_points", ge=-1.5, f=points)) for section, k in (
        ("carry", "4-softsync per_gradient"), ("carry", "ssp s=2"), ("carry", "asp"),
        ("dc", "8-softsync async_scaling bsp"))],
    *[("bench_async_target", f"{k} vs hardsync: time to the target accuracy, transient 4× straggler", "sooner",
       R("target", "systems", k, "time_to_target_ratio", ge=1)) for k in ("4-softsync", "ssp s=2")],
    ("bench_psld_full", "PSLD, `cnn`, 4 servers behind 50 MB/s links, one 4× slower", "≥ 2× MXNet, ≥ 1.5× "
     "greedy, settled ≤ 1.1× the oracle", psld),
    ("bench_psld_full-mlp", "the same, `mlp-deep`", "the same", psld),
    ("bench_psld_full-byteps", "the same, `cnn`, against BytePS's default", "≥ 2× BytePS, ≥ 1.5× greedy, settled "
     "≤ 1.1× the oracle", psld),
    ("bench_psld_full-mlp-byteps", "the same, `mlp-deep`", "the same", psld),
    ("bench_psld_dynamic", "PSLD after the slow server moves, settled vs the oracle for the new speeds", "≤ 1.1×",
     R(*SYS, SETTLED, le=1.1)),
    ("bench_psld_ssp", "PSLD vs greedy under SSP (blocks move as workers run)", "≥ 1.5×", R(*SYS, GREEDY, ge=1.5)),
    ("bench_psld_single-block", "PSLD vs greedy on a case no rule was tuned on", "≥ 1.5×", R(*SYS, GREEDY, ge=1.5)),
    ("bench_psld_single-block-ssp", "the same case under SSP", "≥ 1.3×", R(*SYS, GREEDY, ge=1.3)),
    ("bench_psld_unseen", "PSLD on seeded random cases nobody tuned on", "≥ 1.0× greedy in every case; median ≥ "
     "0.9× the oracle", unseen),
    ("bench_psld_unseen-fresh", "the same, 12 cases of another seed (drawn after a change made for case 13 above)",
     "the same", unseen),
    ("bench_fuzz", "a live server under fuzzed messages (auth plain)", "no crash or hang, valid traffic exact, "
     "strangers unanswered", fuzz),
    ("bench_chaos", "BSP jobs with 1–3 workers/servers killed or frozen at random moments", "every job completes, "
     "oracle-equal", chaos),
    ("bench_chaos_async", "asp / softsync / ssp jobs, the same blows", "every job completes", chaos),
    ("compare_bench_ddp_full", "BSP samples/s after the runtime split vs the commit before", "within noise", compare),
    ("compare_bench_ddp_full_recovery", "BSP samples/s with recovery and authentication vs the commit before",
     "within noise", compare),
    ("compare_bench_ddp_full_workloads", "the default job through the generic step vs the commit before", "≥ 0.97×",
     lambda d: compare(d, 0.97)),
    ("bench_costs_live", "BSP with the live view vs none", "reported", R("results", "live view", "ratio_to_default")),
    ("bench_ray_overhead", "Ray launcher vs local launcher, BSP samples/s", "≥ 0.9×", R("ray_over_local", ge=0.9)),
    ("bench_ray_lbbsp", "LB-BSP vs BSP under Ray, nodes labelled [1,1,2,4]", "≥ 1.5×", R("lbbsp_over_bsp", ge=1.5)),
    ("bench_ray_memory", "4 workers on one node under Ray: MB of the dataset private to a worker", "0 (resident "
     "once)", R("memory", "store_private_mb", "ray", le=0, f=lambda s: f"**{num(s['median'])}**")),
    ("bench_workloads_memory", "2 GiB of shards read lazily: RSS growth", "< 10%", R("growth", le=.1, f=pct_range)),
    ("bench_workloads_lm", "a GPT on Debian's fortunes, equipoise BSP vs PyTorch DDP, samples/s", "≥ 1.0× (goal)",
     R("pair_ratio", ge=1.0)),
    ("bench_workloads_lm-seeds", "the fortunes GPT's validation loss, equipoise vs plain PyTorch", "within noise",
     seeds),
    ("bench_sparse_movielens", "MovieLens-100k, sparse tables on the servers: held-out RMSE", "≤ 0.94",
     R("rmse", "equipoise", le=0.94, f=lambda s: f"**{num(s['median'])}** ({num(s['min'])}–{num(s['max'])})")),
    ("bench_sparse_lbbsp", "LB-BSP vs BSP with sparse tables (DLRM-style), workers slowed [1,1,2,4] on a base of 4",
     "≥ 2×", R("lbbsp_speed_up_x_bsp", ge=2)),
    ("bench_sparse_psld", "PSLD on a DLRM-style job's shards, Zipf ids, one of 4 servers 4× slower, vs the hash "
     "placement", "≥ 1.5×", R("psld_speed_up_x_hash", ge=1.5)),
    ("bench_sparse_psld", "the same, settled vs the oracle (s/iteration)", "≤ 1.1×", R("psld_settled_x_oracle", le=1.1)),
    ("bench_sparse_psld-500-h400", "the same job over 500 iterations (`psld_horizon = 400`), vs the hash placement",
     "≥ 1.5×", R("psld_speed_up_x_hash", ge=1.5)),
    ("bench_sparse_psld-500-h400", "the same, settled vs the oracle (s/iteration)", "≤ 1.1×",
     R("psld_settled_x_oracle", le=1.1)),
    ("bench_sparse_torchrec", "DLRM-style, equipoise vs TorchRec, 4 processes each (2 workers, 1 server, the "
     "coordinator), CPU, samples/s", "≥ 1.0×", R("equipoise_4p_x_torchrec", ge=1.0)),
    ("bench_sparse_torchrec", "the same, equipoise's example as shipped (4 workers, 4 servers: 9 processes on 2 cores)",
     "reported", R("equipoise_x_torchrec")),
    ("bench_startup_replace", "a killed worker's replacement, loss to its first step, warm (cold in the file)",
     "reported", R("first_step_s", "warm", f=secs)),
    ("bench_startup_ray-replace", "the same under the Ray launcher: a warm standby against a fresh actor (cold in "
     "the file)", "reported", R("first_step_s", "warm", f=secs)),
    ("bench_startup_default", "the default job from the command line: command to first iteration, warm children "
     "(cold in the file)", "≤ 3 s", R("startup_s", "warm", le=3, f=secs)),
    ("bench_startup_default", "the same: wall time over training time", "≤ 1.15×", R("wall_over_train", "warm", le=1.15)),
    ("bench_startup_start", "4 workers + 2 servers, command to first iteration, warm (cold in the file)", "reported",
     R("startup_s", "warm", f=secs)),
    ("bench_startup_plain", "time to result: the default job's wall time over a plain PyTorch loop's (2 threads, "
     "the same model, batch, epoch and evaluation points)", "reported", R("wall_equipoise_over_plain")),
    ("bench_startup_single", "1 worker + 1 server vs a plain PyTorch loop, batch 128, samples/s, 1 thread each",
     "≥ 0.97×", R("equipoise_over_plain", "1t", ge=0.97)),
    ("bench_startup_single", "the same, 2 threads each", "≥ 0.97×", R("equipoise_over_plain", "2t", ge=0.97)),
    ("compare_bench_ddp_full_time", "BSP samples/s after the time-to-result changes vs the commit before them",
     "≥ 0.97×", lambda d: compare(d, 0.97)),
    ("bench_testbed_lbbsp", "LB-BSP vs BSP, testbed CPU quotas [1,1,½,¼]", "≥ 2×", R("ratio", "lbbsp/bsp", ge=2)),
    ("bench_testbed_psld", "PSLD vs greedy on testbed hosts, the slow server's host at 100 Mbit/s", "≥ 1.5×",
     R("ratio", "psld/greedy samples/s", ge=1.5)),
    ("bench_testbed_psld", "the same, settled vs the oracle (s/iteration)", "≤ 1.1×",
     R("ratio", "psld/oracle settled s/iteration", le=1.1)),
    ("bench_testbed_ddp", "equipoise BSP (`eager_update`, model-sized blocks) vs PyTorch DDP, testbed hosts at "
     "100 Mbit/s", "≥ 1.3×", R("ratio", "equipoise_eager_auto/ddp", ge=1.3)),
    ("bench_testbed_cost-hosts", "the testbed's own cost: one host vs hosts of their own", "0.95–1.05×",
     R("ratio", "one host/hosts", ge=0.95, le=1.05)),
    ("bench_testbed_cost", "loopback (local launcher) vs unshaped testbed hosts under Ray", "0.95–1.05×",
     R("ratio", "loopback/testbed", ge=0.95, le=1.05)),
    ("bench_testbed_chaos_chaos", "testbed hosts killed, partitioned and frozen mid-run", "every job completes, "
     "oracle-equal", all_ok),
    ("bench_testbed_chaos_pair", "a testbed host holding a server and a worker removed mid-run", "the same", all_ok),
    ("bench_sim_scale", "`equipoise simulate`, 1,000 workers × 100 servers × 1,000 iterations: BSP / LB-BSP / ASP",
     "≤ 60 s", scale),
    ("bench_sim_validate", "simulated vs real runs, cost model calibrated on one BSP run", "within 10%", sim_validate),
    ("bench_sim_validate_9d72c31-runs", "the same, against an earlier set of real runs", "within 10%", sim_validate),
]
HEADLINE = [next(row for row in SUMMARY if row[0] == name) for name in (  # each file's first row
    "bench_lbbsp_full", "bench_psld_full", "bench_sparse_lbbsp", "bench_sparse_torchrec", "bench_ddp",
    "bench_workloads_lm-seeds", "bench_chaos")]


def summary_table(rows: list[tuple], base: str) -> str:
    out = [[what, target, *cell(load(name)), *provenance(name, base)] for name, what, target, cell in rows]
    return table(["what", "target", "measured", "verdict", "results file", "measured at", "src/ commits since"], out)

# ------------------------------------------------------------------ the tables of docs/benchmarks.md, by family


def exchange_tables():
    d, bp = load("bench_ddp"), load("bench_ddp")["runs"]["equipoise_bp"]
    wire = [("one block ms", "equipoise", rng), ("to the ack", "push_median_ms", num), ("then to the params",
            "pull_median_ms", num), ("raw pyzmq ms", "raw", rng), ("ratio of medians", "ratio", num), ("per-round "
            "ratio", "round_ratio", rng), ("streamed in 4 blocks ms", "streamed", rng), ("raw in 4 messages ms",
            "raw_streamed", rng), ("streamed ÷ raw in 4", "streamed_to_raw_streamed", num), ("per round",
            "streamed_round_ratio", rng)]
    return {
        "ddp": one_file("bench_ddp", ["", "equipoise BSP", "equipoise BSP, `backward_push`", "PyTorch DDP"], [
            ["steady samples/s", rng(d["equipoise_steady"]), rng(summ([r["steady_samples_per_s"] for r in bp])),
             rng(d["ddp_steady"])],
            ["÷ DDP, each round", f"**{rng(d['steady_pair_ratio'])}**", rng(d["bp_steady_pair_ratio"]), ""],
            ["÷ equipoise BSP, each round", "", rng(d["bp_vs_off_pair_ratio"]), ""],
            ["final training loss", num(d["equipoise"]["final_train_loss"]), num(bp[-1]["final_train_loss"]),
             num(d["ddp"]["final_train_loss"])],
            ["barrier wait (share of a worker's time)", num(d["equipoise"]["barrier_wait_fraction"]),
             num(d["equipoise_bp"]["barrier_wait_fraction"]), "–"]]),
        "wire": grid("bench_wire", [(f"{r['nbytes'] / 1e6:g} MB", r) for r in load("bench_wire")["results"]],
                     [(h, (k,), f) for h, k, f in wire], "payload"),
        "overlap": one_file("bench_overlap", ["model", "exchange", "samples/s", "÷ off, per round", "gap, ms",
                                              "step compute, ms"], [
            [model if k == "off" else "", k, rng(m[f"{k}_samples_per_s"]), rng(m[f"{k}_ratio"]) if k != "off" else "1",
             rng(m[f"{k}_gap_s"], ms), ms(m[f"{k}_compute_s"]["median"])]
            for model, m in load("bench_overlap")["models"].items() for k in ("off", "push", "pipelined", "eager")])}


LABELS = {"bsp": "BSP", "lbbsp": "LB-BSP", "asp": "ASP", "ddp": "PyTorch DDP", "ideal": "ideal (Σ standalone)",
          "lbbsp-h0.01": "LB-BSP, hysteresis 0.01", "lbbsp-h0": "LB-BSP, hysteresis 0",
          "lbbsp-eager": "LB-BSP, exchange overlapped", "lbbsp-eager-auto": "the same, blocks sized from the model"}


def lbbsp_tables():
    full = load("bench_lbbsp_full")
    tables = {"lbbsp-full": one_file("bench_lbbsp_full", ["system or ratio", "median (min–max) over rounds"], [
        [LABELS[k], rng(s)] for k, s in full["systems"].items()] + [
        [" ÷ ".join(LABELS[x] for x in k.split("/")), f"**{rng(s)}**"] for k, s in full["ratios"].items()])}
    for name in ("bench_lbbsp_hysteresis", "bench_lbbsp_overlap"):
        d = load(name)
        rest = {k: ", ".join(pct(r[k]["split"]["rest"]) for r in d["rounds"]) for k in d["systems"] if k != "asp"}
        tables[name[6:].replace("_", "-")] = one_file(name, [
            "system", "samples/s", "÷ ASP, per round, then median (min–max)", "the barrier's share of an iteration "
            "(`rest`), per round"], [[LABELS[k], rng(s), rng(d["ratios"][f"{k}/asp"]) if k in rest else "–",
                                      rest.get(k, "–")] for k, s in d["systems"].items()])

    def spread(rounds, *path):
        return "{}–{}".format(*(num(f(at(r, "lbbsp", *path) for r in rounds)) for f in (min, max)))
    tables["lbbsp-noise"] = one_file("bench_lbbsp_noise", [
        "`slowdown_noise`", "LB-BSP samples/s", "ASP samples/s", "LB-BSP ÷ ASP",
        "LB-BSP iteration: compute / imbalance / rest", "MAPE last / EWMA / NARX"], [
        [level[6:], rng(v["systems"]["lbbsp"]), rng(v["systems"]["asp"]), f"**{rng(v['ratios']['lbbsp/asp'])}**",
         " / ".join(spread(v["rounds"], "split", k) for k in ("compute", "imbalance", "rest")),
         " / ".join(spread(v["rounds"], "predictor_mape", k) for k in ("last", "ewma", "narx"))]
        for level, v in load("bench_lbbsp_noise")["levels"].items()])
    return tables


def rudra_tables():
    columns = [("samples/s", ("samples_per_s",), rng), ("÷ hardsync", ("speedup",), rng),
               ("final accuracy", ("final_accuracy",), pct_range),
               ("Δ points", ("delta_points",), lambda s: rng(s, signed)), ("mean σ", ("staleness_mean",), rng),
               ("max σ", ("staleness_max",), lambda s: rng(s, count))]
    return {name.replace("bench_rudra_", "rudra-"): grid(name, load(name)[section]["systems"].items(), columns)
            for name, section in (("bench_rudra_study", "study"), ("bench_rudra_ssp", "ssp"))}


def compare_tables():
    """compare_commits: each metric measured on both sides, base and head, and head/base."""
    def rows(d):
        return [[k, rng(m["base"]), rng(m["head"]), f"**{num(m['ratio'])}**" + (
            f" ({num(m['pair_ratio_min'])}–{num(m['pair_ratio_max'])})" if len(m["pair_ratios"]) > 1 else "")]
            for k, m in d["metrics"].items() if m["ratio"] is not None]
    return {name.replace("_", "-"): one_file(name, ["metric", f"{load(name)['base']['commit'][:7]} median (min–max)",
                                                    f"{load(name)['head']['commit'][:7]} median (min–max)",
                                                    "head/base (pairs)"], rows(load(name))) for name in COMPARES}


def chaos_rows(t: dict[str, Any], reps: list[dict]) -> list[list[Any]]:
    """A chaos run's totals; its repetitions say which protocol each ran and how many blows it took."""
    per_job = ", ".join(f"{n} blow{'s' * (n > 1)} in {c} repetitions" for n, c in sorted(
        Counter(len(r["schedule"]) for r in reps).items()))
    return [["repetitions completed and checked", f"**{t['ok']} of {t['reps']}** (" + ", ".join(
        f"{n} {p}" for p, n in Counter(r.get("protocol", "bsp") for r in reps).most_common()) + ")"],
        ["blows landed", f"{t['blows_landed']} of {t['blows']} ({t['blows_by_role']['server']} on servers, "
         f"{t['blows_by_role']['worker']} on workers; " + ", ".join(f"{v} {k}" for k, v in t["blows_by_signal"].items())
         + f"); {per_job}"],
        ["listed in `recovered`", t["recovered"]],
        ["max \\|diff\\| vs the oracle", "–" if t["max_diff"] is None else
         f"**{num(t['max_diff'])}** (weights moved ≥ {num(t['min_moved'])})"],
        ["lost updates", f"{t['lost_updates']} (per job {rng(summ([r['lost_updates'] for r in reps]), count)})"],
        ["wall time per repetition, s", rng(summ([r["wall_s"] for r in reps]))]]


def failure_tables():
    d = load("bench_fuzz")
    imp, st, h, types = d["impostor"], d["strangers"], d["strangers"]["handshakes"], d["impostor"]["sent_by_type"]
    sent = sorted(d["sent_by_category"].items(), key=lambda kv: -kv[1])
    return {"fuzz": one_file("bench_fuzz", ["", ""], [
        ["messages sent", f"{d['messages']:,} (" + ", ".join(f"{k} {v:,}" for k, v in sent) + ")"],
        ["valid exchanges", f"{d['valid_checks']:,}, {d['valid_checks_failed']} not exact; median "
                            f"{num(d['valid_exchange_ms_median'])} ms, max {num(d['valid_exchange_ms_max'])} ms"],
        ["impostors", f"{imp['sent']:,} sent ({min(types.values())}–{max(types.values())} a type, {len(types)} "
                      f"types), {imp['refused']:,} refused, {imp['answered_otherwise']} answered otherwise"],
        ["strangers", f"{st['sockets']} sockets, {st['replies']} replies; handshakes: {h.get('succeeded', 0)} "
                      f"succeeded, {h.get('failed_auth', 0)} failed on authentication, "
                      f"{h.get('failed_protocol', 0) + h.get('failed_no_detail', 0)} on the protocol or without "
                      f"detail; {st['unsent']} not queued"],
        ["server", f"RSS {' → '.join(num(d['server_rss_mb'][k]) for k in ('start', 'max', 'end'))} MB (start, max, "
                   f"end); {d['held']['end']} requests held at the end, {d['held']['max']} at most; {d['log_lines']} "
                   f"log lines, {d['log_tracebacks']} tracebacks; {num(d['seconds'])} s (server CPU "
                   f"{num(d['server_cpu_s'])} s), stopped cleanly: {'yes' if d['stopped_cleanly'] else 'no'}"]]),
        **{name[6:].replace("_", "-"): one_file(name, ["", ""], chaos_rows(load(name)["totals"],
                                                                          load(name)["repetitions"]))
           for name in ("bench_chaos", "bench_chaos_async")}}


def cost_tables():
    o, lb, mem = load("bench_ray_overhead"), load("bench_ray_lbbsp"), load("bench_ray_memory")["memory"]
    paired = lambda label, x, p: [label, f"**{num(x)}** (pairs {', '.join(map(num, p))})"]  # noqa: E731
    return {
        "costs": grid("bench_costs", load("bench_costs")["results"].items(), [
            ("samples/s", (), rng), ("× bare", ("ratio_to_bare",), lambda x: f"**{num(x)}**")], "variant"),
        "ray-overhead": one_file("bench_ray_overhead", [
            "launcher", "steady samples/s", "start-up s", "cores used: servers + workers / coordinator / Ray's own"], [
            [k, rng(o["samples_per_s"][k]), rng(o["startup_s"][k]), " / ".join(map(num, cores.values()))]
            for k, cores in o["cores_used_median"].items()] + [
            paired("ray ÷ local", o["ray_over_local"], o["pair_ratios"]) + ["", ""]]),
        "ray-lbbsp": one_file("bench_ray_lbbsp", ["protocol", "steady samples/s"], [
            [k, rng(v)] for k, v in lb["samples_per_s"].items()] + [
            paired("lbbsp ÷ bsp", lb["lbbsp_over_bsp"], lb["pair_ratios"])]),
        "ray-memory": one_file("bench_ray_memory", ["launcher", "RSS", "USS (private)", "PSS",
                                                    "Ray's object store mapped: resident / private"], [
            [k, rng(mem["rss_mb"][k]), rng(mem["uss_mb"][k]), rng(mem["pss_mb"][k]),
             f"{rng(mem['store_mapped_mb'][k])} / **{rng(mem['store_private_mb'][k])}**"] for k in ("local", "ray")])}


def workload_tables():
    lo, lm, seeds = load("bench_workloads_loader"), load("bench_workloads_lm"), load("bench_workloads_lm-seeds")
    learn = lm["learning"]
    loss = lambda x: f"{num(x)} ({num(math.exp(x))})"  # noqa: E731
    return {
        "loader": one_file("bench_workloads_loader", ["", "`data_s` per iteration, s", "`compute_s`, s",
                                                      "steady samples/s"], [
            [f"`{k.replace('=', ' = ')}`", rng(v["data_s_median"]), num(v["compute_s_median"]["median"]),
             rng(v["steady_samples_per_s"])] for k, v in lo["systems"].items()] + [
            ["speed-up, per pair", "", "", f"**{rng(lo['pair_speedup'])}**"]]),
        "lm-throughput": one_file("bench_workloads_lm", ["", "steady samples/s (windows of 64 bytes)"], [
            ["equipoise BSP", rng(lm["equipoise_steady"])], ["PyTorch DDP", rng(lm["ddp_steady"])],
            ["equipoise ÷ DDP, each pair", f"**{rng(lm['pair_ratio'])}**"]]),
        "lm-learning": one_file("bench_workloads_lm", ["", "validation loss, nats/byte (perplexity)", "training s"], [
            ["equipoise BSP", loss(learn["equipoise_val_loss"]), num(learn["equipoise_train_s"])],
            ["plain PyTorch", loss(learn["plain_pytorch_val_loss"]), num(learn["plain_pytorch_train_s"])],
            ["byte-unigram entropy of the validation text", loss(learn["unigram_entropy_nats"]), ""]]),
        "lm-seeds": one_file("bench_workloads_lm-seeds", ["seed", "equipoise BSP", "plain PyTorch", "difference"], [
            [r["seed"], num(r["equipoise_val_loss"]), num(r["plain_pytorch_val_loss"]), signed(
                r["equipoise_val_loss"] - r["plain_pytorch_val_loss"])] for r in seeds["runs"]]),
        "lm-recipe": lm_recipe_table()}


def lm_recipe_table() -> str:
    """nanoGPT's recipe, equipoise BSP and plain PyTorch per seed, beside the Adam recipe's loss at each seed."""
    d, adam = load("bench_workloads_lm-recipe"), {r["seed"]: r for r in load("bench_workloads_lm-seeds")["runs"]}
    steps = d["spec"]["iterations"]
    return one_file("bench_workloads_lm-recipe", [
        "seed", "equipoise BSP, nanoGPT's recipe", "plain PyTorch, the same recipe", "difference",
        f"steps clipped (equipoise / plain, of {steps})", "equipoise, Adam at a constant lr (lm-seeds)"], [
        [r["seed"], num(r["equipoise_val_loss"]), num(r["plain_pytorch_val_loss"]),
         signed(r["equipoise_val_loss"] - r["plain_pytorch_val_loss"]),
         f"{r['equipoise_clipped_steps']} / {r['plain_pytorch_clipped_steps']}",
         num(adam[r["seed"]]["equipoise_val_loss"]) if r["seed"] in adam else "–"] for r in d["runs"]])


TESTBED_DDP = {"ddp": "DDP", "equipoise": "equipoise BSP", "equipoise_pipelined": "pipelined",
               "equipoise_eager": "pipelined, `eager_update`", "equipoise_eager_auto": "the same, blocks sized from "
               "the model", "equipoise_eager_1mib": "the same, 1 MiB blocks"}


def testbed_ddp_row(d: dict[str, Any], k: str) -> list[str]:
    """One system of the testbed's DDP preset; DDP's iteration is the global batch over its samples/s."""
    w, s, ceiling = d["wire"].get(k, {}), d["summary"][k], d["ceiling"].get(f"{k}: ddp iteration / bound")
    m = lambda key: ms(w[key]["median"]) if key in w else ""  # noqa: E731
    last = f"{m('last_early_s')} (early)" if "last_early_s" in w else f"{m('last_ack_s')} (ack)" if w else ""
    return [TESTBED_DDP[k], rng(s), rng(d["ratio"][f"{k}/ddp"]) if k != "ddp" else "",
            m("iteration_s") or ms(d["spec"]["global_batch"] / s["median"]), m("bound_s"), rng(ceiling) if ceiling
            else "", m("first_fragment_s"), last, m("plan_last_s")]


def testbed_tables():
    tables = {name[6:].replace("_", "-"): one_file(name, ["system", "samples/s"], [
        [k, rng(v)] for k, v in load(name)["summary"].items()] + [
        [f"**{k}**", f"**{rng(v)}**"] for k, v in load(name)["ratio"].items()])
        for name in ("bench_testbed_lbbsp", "bench_testbed_cost-hosts", "bench_testbed_cost")}
    tables["testbed-psld"] = grid("bench_testbed_psld", load("bench_testbed_psld")["summary"].items(), [
        ("samples/s, whole run", ("samples_per_s",), rng), ("s/iteration, settled", ("settled_iteration_s",), rng),
        ("block moves", ("moves",), lambda s: rng(s, count))], "placement")
    d = load("bench_testbed_ddp")
    tables["testbed-ddp"] = one_file("bench_testbed_ddp", [
        "system", "samples/s", "× DDP", "iteration, ms", "floor, ms", "DDP's iteration ÷ floor", "first fragment, ms",
        "last block in, ms", "plan, ms"], [testbed_ddp_row(d, k) for k in TESTBED_DDP])
    groups: dict[str, list] = {}
    for r in load("bench_testbed_chaos_chaos")["runs"]:
        b, role = r["blow"], "server" if any(p.startswith("server") for p in r["on_host"]) else "worker"
        groups.setdefault(f"{role} host {b['kind']}" + (f" {b['seconds']:g} s" if b["seconds"] else ""), []).append(r)
    tables["testbed-chaos"] = one_file("bench_testbed_chaos_chaos", ["blow", "runs ok", "lost"], [
        [label, f"{sum(r['ok'] for r in runs)}/{len(runs)}", ", ".join(sorted({p for r in runs for p in r["lost"]}))
         or "nothing"] for label, runs in groups.items()])
    return tables


DOCS = {"README.md": lambda: {"headline": summary_table(HEADLINE, "")},
        "docs/benchmarks.md": lambda: {"summary": summary_table(SUMMARY, "../"), **exchange_tables(), **lbbsp_tables(),
                                       **rudra_tables(), **compare_tables(), **failure_tables(), **cost_tables(),
                                       **workload_tables(), **testbed_tables()},
        "docs/psld.md": psld_tables, "docs/sparse.md": sparse_tables}


def blocks(text: str) -> dict[str, str]:
    """A document's generated blocks, by name."""
    return {m[1]: m[2] for m in MARKER.finditer(text)}


def rewrite(doc: str) -> tuple[str, str]:
    """(the document's text, the text with its generated blocks rewritten)."""
    text, bodies = (ROOT / doc).read_text(), DOCS[doc]()
    if set(blocks(text)) != set(bodies):
        raise SystemExit(f"{doc}: its blocks {sorted(blocks(text))} are not the tables {sorted(bodies)}")
    return text, MARKER.sub(lambda m: f"<!-- tables:{m[1]} -->\n{bodies[m[1]]}\n<!-- /tables:{m[1]} -->", text)


if __name__ == "__main__":
    for doc in DOCS:
        old, new = rewrite(doc)
        if new != old:
            (ROOT / doc).write_text(new)
            print(f"rewrote {doc}")
