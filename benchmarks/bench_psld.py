"""PSLD under a parameter-server straggler (Chen et al., SoCC 2020): iteration time and samples/s
of every placement policy, side by side in one invocation, against the oracle (the best
static assignment for the true server speeds).

Every server sits behind an emulated link of `bandwidth` MB/s (a token bucket in the
server) and server `slow` is `factor`× slower on top (its link time is multiplied), so
"4× slower" is exact. The model is the default CNN, whose first fully connected layer
holds 95% of the parameters: where that layer lands decides the iteration time. The
slowed server is server 0, the one MXNet's rule and round-robin both give that layer —
the case PSLD was built for; say so when quoting these numbers.

Scenarios: "static" (one slow server for the whole run) and "dynamic" (the slow server
changes at `switch` iterations, from a server trace). PSLD is "settled" over the last
`settled` iterations of a run; after the switch we count the iterations until its
interval iteration time is back within 1.1× of its settled level.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import preset_main, load_average, markdown_table, write_results

NAME = "bench_psld"
POLICIES = ("round_robin", "mxnet", "byteps", "greedy", "psld", "oracle")


@dataclass(frozen=True)
class Spec:
    model: str = "cnn"
    dataset: str = "fashion-mnist"
    workers: int = 4
    servers: int = 4
    global_batch: int = 128
    iterations: int = 150
    block_size: int = 32768
    bandwidth: float = 200.0  # MB/s per server link
    factor: float = 4.0
    slow: int = 0
    interval: int = 5
    settled: int = 50
    scenario: str = "static"
    switch: int = 100
    switch_to: int = 2
    policies: tuple[str, ...] = POLICIES
    sweep: tuple[int, ...] = ()  # run every policy once with each of these servers slowed
    transport: str = "ipc"
    seed: int = 0


PRESETS = {
    "ci": Spec(dataset="digits", model="mlp", iterations=30, block_size=4000, bandwidth=20.0, settled=10,
               interval=5, policies=("mxnet", "psld", "oracle")),
    "full": Spec(),
    "dynamic": Spec(scenario="dynamic", iterations=220, policies=("psld", "oracle")),
    # Which server is slow decides how badly a fixed rule does: try each in turn.
    "sweep": Spec(iterations=100, settled=40, policies=("mxnet", "byteps", "psld", "oracle"), sweep=(0, 1, 2, 3)),
}


def job(spec: Spec, policy: str, tmp: Path) -> dict[str, Any]:
    factors = [1.0] * spec.servers
    factors[spec.slow] = spec.factor
    cfg = dict(model=spec.model, dataset=spec.dataset, workers=spec.workers, servers=spec.servers,
               global_batch=spec.global_batch, iterations=spec.iterations, block_size=spec.block_size,
               placement=policy, server_slowdown=factors, server_rate=spec.bandwidth,
               server_bandwidth=[spec.bandwidth] * spec.servers, psld_interval=spec.interval,
               psld_epsilon=0.0 if spec.scenario == "static" else 0.05,
               eval_every=0, checkpoint_every=0, progress=False, timeout=300.0, transport=spec.transport,
               seed=spec.seed, lr=0.02)
    if spec.scenario == "dynamic":
        rows = ["iteration,server,factor"]
        rows += [f"0,{s},{factors[s]}" for s in range(spec.servers)]
        rows += [f"{spec.switch},{spec.slow},1.0", f"{spec.switch},{spec.switch_to},{spec.factor}"]
        path = tmp / "server_trace.csv"
        path.write_text("\n".join(rows) + "\n")
        cfg["server_trace"] = str(path)
        cfg.pop("server_slowdown")
    return cfg


def run_policy(spec: Spec, policy: str, tmp: Path) -> dict[str, Any]:
    import equipoise

    out = tmp / f"{policy}-{time.monotonic_ns()}"
    summary = equipoise.train(job(spec, policy, tmp), out=out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r.get("type") == "iteration"]
    servers = [r for r in records if r.get("type") == "servers" and r.get("iteration_s")]
    moves = [r for r in records if r.get("type") == "event" and r.get("event") == "block_moved"]
    waits = [max(r["table_wait_s"]) for r in iters if r.get("table_wait_s")]
    last = [r["iteration_s"] for r in servers if r["iteration"] > spec.iterations - spec.settled]
    settled_s = sum(last) / len(last) if last else math.nan
    result = {"policy": policy, "samples_per_s": summary["samples_per_s"], "train_s": summary["train_s"],
              "iteration_s_mean": summary["train_s"] / max(len(iters), 1), "settled_iteration_s": settled_s,
              "moves": len(moves), "pause_s_max": max((m["pause_s"] for m in moves), default=0.0),
              "pause_s_mean": sum(m["pause_s"] for m in moves) / len(moves) if moves else 0.0,
              "worker_pause_s_max": max(waits, default=0.0),
              "final_accuracy": summary["final_accuracy"], "run_dir": str(out),
              "interval_iteration_s": [[r["iteration"], r["iteration_s"]] for r in servers]}
    if spec.scenario == "dynamic":
        result["settle_iterations"] = settle_after(servers, spec)
    return result


def settle_after(servers: list[dict], spec: Spec) -> int | None:
    """Iterations after the switch until the interval iteration time is within 1.1× of
    the settled level (mean of the last `settled` iterations); None if never."""
    last = [r["iteration_s"] for r in servers if r["iteration"] > spec.iterations - spec.settled]
    if not last:
        return None
    level = sum(last) / len(last)
    for r in servers:
        # a record at iteration i covers (i − interval, i]: it is clean once it starts after the switch
        if r["iteration"] - spec.interval >= spec.switch and r["iteration_s"] <= 1.1 * level:
            return r["iteration"] - spec.switch
    return None


def table(results: dict[str, dict], oracle: dict) -> str:
    rows = []
    for name, r in results.items():
        rows.append([name, r["iteration_s_mean"], r["settled_iteration_s"],
                     r["settled_iteration_s"] / oracle["settled_iteration_s"], r["samples_per_s"], r["moves"],
                     r["pause_s_max"], r["worker_pause_s_max"], r.get("settle_iterations", "–")])
    return markdown_table(["placement", "iteration s (whole run)", "iteration s (settled)", "settled × oracle",
                           "samples/s", "block moves", "longest migration s", "longest worker pause s",
                           "settle iterations"], rows)


def run_sweep(spec: Spec, preset: str, results_path: str | None) -> dict[str, Any]:
    """Every policy with each server in `spec.sweep` slowed; the geometric mean over the
    sweep of each policy's whole-run iteration time relative to PSLD's."""
    from dataclasses import replace

    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average(), "runs": []}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-psld-") as name:
        for slow in spec.sweep:
            one = replace(spec, slow=slow)
            for p in spec.policies:
                r = run_policy(one, p, Path(name))
                r.pop("run_dir")
                r["slow"] = slow
                result["runs"].append(r)
    by = {(r["slow"], r["policy"]): r for r in result["runs"]}
    ratios = {}
    for p in spec.policies:
        logs = [math.log(by[(s, p)]["iteration_s_mean"] / by[(s, "psld")]["iteration_s_mean"]) for s in spec.sweep]
        ratios[p] = math.exp(sum(logs) / len(logs))
    for s in spec.sweep:
        rows.append([s] + [by[(s, p)]["iteration_s_mean"] for p in spec.policies])
    rows.append(["geo-mean × psld"] + [ratios[p] for p in spec.policies])
    result["vs_psld_geomean"] = ratios
    print(f"## PSLD sweep, preset {preset}: {spec.model}, {spec.servers} servers behind {spec.bandwidth} MB/s, "
          f"one {spec.factor}× slower (each in turn), {spec.iterations} iterations; whole-run s per iteration\n")
    print(markdown_table(["slow server"] + list(spec.policies), rows))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict[str, Any]:
    spec = PRESETS[preset]
    if spec.sweep:
        return run_sweep(spec, preset, results_path)
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench-psld-") as name:
        tmp = Path(name)
        results = {p: run_policy(spec, p, tmp) for p in spec.policies}
        oracle = results["oracle"]
        for r in results.values():
            r["vs_oracle"] = r["settled_iteration_s"] / oracle["settled_iteration_s"]
            r["speedup_vs_mxnet"] = (results["mxnet"]["iteration_s_mean"] / r["iteration_s_mean"]
                                     if "mxnet" in results else None)
        if plots and "psld" in results:
            from equipoise.report.plots import plot_servers
            result["plot"] = str(plot_servers(results["psld"]["run_dir"],
                                              Path(plots) / f"psld-{spec.scenario}-servers.png"))
        print(f"## PSLD benchmark, preset {preset}: {spec.model} on {spec.dataset}, {spec.workers} workers, "
              f"{spec.servers} servers behind {spec.bandwidth} MB/s links, server {spec.slow} {spec.factor}× slower"
              + (f", moving to server {spec.switch_to} at iteration {spec.switch}" if spec.scenario == "dynamic" else "")
              + f", {spec.iterations} iterations\n")
        print(table(results, oracle))
        for r in results.values():
            r.pop("run_dir")
        result["results"] = results
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "folder for the per-server plot (e.g. docs/img)")
