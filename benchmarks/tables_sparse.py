"""The tables of docs/sparse.md (``python -m benchmarks.tables`` writes them): MovieLens-100k,
the DLRM-style example's throughput and TorchRec beside it, from their results files."""

from benchmarks.tables_format import X, load, num, one_file, pct, rng, signed, summ


def sparse_tables() -> dict[str, str]:
    """docs/sparse.md: MovieLens-100k, equipoise against one plain PyTorch process."""
    d = load("bench_sparse_movielens")
    rows = [[label, rng(d["rmse"][k]), rng(d["wall_s"][k]), rng(d["train_s"][k]), rng(d["samples_per_s"][k])]
            for label, k in (("equipoise BSP, 2 workers, 2 servers", "equipoise"), ("plain PyTorch, one process",
                                                                                     "plain"))]
    rows.append(["equipoise − plain, per seed", rng(d["rmse_difference"], signed), "", "", ""])
    wire = d["wire_share"]
    rows.append(["a worker's bytes per iteration, sent / received, as a share of the whole model's",
                 f"{rng(wire['push'], pct)} / {rng(wire['pull'], pct)}", "", "", ""])
    out = {"movielens": one_file("bench_sparse_movielens", [
        f"seeds {', '.join(map(str, d['seeds']))}", "held-out RMSE", "wall s, start to result", "training s",
        "samples/s"], rows)}
    g = load("bench_sparse_dlrm")
    out["dlrm"] = one_file("bench_sparse_dlrm", [
        "4 tables × 16, 4 workers, 4 servers", "samples/s", "a worker's bytes per iteration, pushed / pulled",
        "rows served per busy second over the gather bound"], [
        [f"{'sparse' if k.startswith('sparse') else 'dense'}, {num(int(k.split('/')[1]))} rows a table",
         rng(g["samples_per_s"][k]), " / ".join(num(g["wire_bytes_per_iteration"][k][d]) for d in ("push", "pull")),
         rng(g["rows_per_s_over_gather_bound"][k], pct) if k in g["rows_per_s_over_gather_bound"] else ""]
        for k in g["samples_per_s"]])
    t = load("bench_sparse_torchrec")
    tr = t["runs"]["torchrec"]

    def med(values) -> float:
        return summ(list(values))["median"]

    def ours(name: str, what: str) -> list[str]:
        runs = t["runs"][name]
        split = {k: med(r["split"][k] for r in runs) for k in ("compute", "imbalance", "rest")}
        cpu = {k: med(r["cpu_ms_per_iteration"][k] for r in runs) for k in ("worker", "server", "coordinator", "cores")}
        return [what, rng(t["samples_per_s"][name]), rng(summ([r["samples_per_s"] for r in runs])),
                f"workers' compute {pct(split['compute'])}, the slowest's extra {pct(split['imbalance'])}, "
                f"the barrier's exchange {pct(split['rest'])}",
                f"{num(sum(cpu[k] for k in ('worker', 'server', 'coordinator')))} (workers {num(cpu['worker'])}, "
                f"servers {num(cpu['server'])}, coordinator {num(cpu['coordinator'])}); {num(cpu['cores'])} cores"]

    phases = {k: med(r["phases_s"][k] for r in tr) for k in tr[0]["phases_s"]}
    cores = med(r["cpu_ms_per_iteration"] / 1e3 * r["steady_samples_per_s"] / t["settings"]["global_batch"] for r in tr)
    out["torchrec"] = one_file("bench_sparse_torchrec", [
        "DLRM-style, 8 tables of 10⁵ rows × 16, global batch 512", "samples/s (steady)", "whole run",
        "where an iteration goes (medians)", "CPU ms per iteration (medians)"], [
        ours("equipoise", "equipoise BSP, 4 workers, 4 servers (9 processes)"),
        ours("equipoise-4p", "equipoise BSP, 2 workers, 1 server (4 processes)"),
        [f"TorchRec {t['versions']['torchrec']} (fbgemm-gpu-cpu {t['versions']['fbgemm_gpu']}), 4 processes",
         rng(t["samples_per_s"]["torchrec"]), rng(summ([r["samples_per_s"] for r in tr])),
         ", ".join(f"{k.replace('_', ' ')} {num(v * 1e3)} ms" for k, v in phases.items()),
         f"{num(med(r['cpu_ms_per_iteration'] for r in tr))}; {num(cores)} cores"],
        ["equipoise ÷ TorchRec, per round (9 processes)", X(t["equipoise_x_torchrec"]),
         rng(t["whole_run_equipoise_x_torchrec"], lambda x: num(x) + "×"), "", ""],
        ["equipoise ÷ TorchRec, per round (4 processes)", X(t["equipoise_4p_x_torchrec"]), "", "", ""]])
    return out


__all__ = ["sparse_tables"]
