"""bench_psld's job: the presets (``Spec``), the config of one run of a placement, and
its figures (``run_one``); shared by bench_psld.py and psld_sweep.py."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = "bench_psld"
POLICIES = ("mxnet", "byteps", "greedy", "psld", "oracle")
BASELINES = ("mxnet", "byteps", "greedy")


@dataclass(frozen=True)
class Spec:
    model: str = "cnn"
    dataset: str = "fashion-mnist"
    workers: int = 4
    servers: int = 4
    global_batch: int = 128
    iterations: int = 50
    block_size: int = 32768
    bandwidth: float = 200.0  # MB/s per server link
    factor: float = 4.0
    cases: tuple[int | str, ...] = ("greedy", "mxnet", "byteps")  # which server is slow (rank or policy)
    interval: int = 5
    settled: int = 20
    scenario: str = "static"
    switch: int = 50
    switch_to: int = 2
    policies: tuple[str, ...] = POLICIES
    every_default: bool = True  # False: run mxnet/byteps only where the case is their worst server
    reps: int = 3
    transport: str = "ipc"
    seed: int = 0
    protocol: str = "bsp"  # "ssp": PSLD without a barrier (blocks handed over while workers run)
    staleness_bound: int = 2
    sweep_cases: int = 20  # scenario "random": how many seeded cases (benchmarks/psld_sweep.py)


MLP = dict(model="mlp-deep")
# The placement targets are about server links deciding the iteration time. At 200 MB/s
# this machine's compute does (greedy within 1.14x of the oracle: no placement could be
# 1.5x greedy), so the "full" and "dynamic" presets run at 50 MB/s; "full-200" keeps the
# faster links.
LINK_BOUND = dict(every_default=False, bandwidth=50.0)
DYNAMIC = dict(scenario="dynamic", iterations=100, settled=30, cases=("greedy",), bandwidth=50.0,
               policies=("greedy", "psld", "oracle_initial", "oracle"))
PRESETS = {
    "ci": Spec(dataset="digits", model="mlp", iterations=30, block_size=4000, bandwidth=20.0, settled=10,
               cases=("greedy",), policies=("mxnet", "greedy", "psld", "oracle"), reps=1),
    # the server greedy gives its largest block, and each default's worst server
    "full": Spec(cases=("greedy", "mxnet"), **LINK_BOUND),
    "full-byteps": Spec(cases=("byteps",), **LINK_BOUND),  # the rest of full, run alongside
    "full-mlp": Spec(cases=("greedy", "mxnet"), **LINK_BOUND, **MLP),
    "full-mlp-byteps": Spec(cases=("byteps",), **LINK_BOUND, **MLP),  # the rest of full-mlp, run alongside
    "full-200": Spec(every_default=False, cases=("greedy", "mxnet")),  # links fast enough that compute decides
    # every server slowed in turn
    "sweep": Spec(cases=(0, 1, 2, 3)),
    "sweep-mlp": Spec(cases=(0, 1, 2, 3), **MLP),
    # the same case without a barrier: SSP (s = 2), PSLD moving blocks while workers run
    "ssp": Spec(cases=("greedy",), policies=("greedy", "psld", "oracle"), protocol="ssp", **LINK_BOUND),
    "ssp-ci": Spec(dataset="digits", model="mlp", iterations=30, block_size=4000, bandwidth=20.0, settled=10,
                   cases=("greedy",), policies=("greedy", "psld"), reps=1, protocol="ssp"),
    # a case no rule was tuned on: 2 workers, the slow server holding as its whole share the
    # one large block (the CNN's first fully connected layer, kept whole), 200 MB/s links
    "single-block": Spec(workers=2, iterations=100, settled=30, block_size=1 << 19, cases=("greedy",),
                         policies=("greedy", "psld", "oracle"), every_default=False),
    "single-block-ssp": Spec(workers=2, iterations=100, settled=30, block_size=1 << 19, cases=("greedy",),
                             policies=("greedy", "psld", "oracle"), every_default=False, protocol="ssp"),
    "dynamic": Spec(**DYNAMIC),
    # seeded random cases (random_cases): 2 workers, 60 iterations each, settled = last 20
    "unseen": Spec(workers=2, iterations=60, settled=20, reps=1, scenario="random", seed=39),
    # a draw of another seed, for a rule changed after the sweep above showed where it failed
    "unseen-fresh": Spec(workers=2, iterations=60, settled=20, reps=1, scenario="random", seed=40, sweep_cases=12),
    # the cases below 1.0x greedy in a sweep, greedy run twice beside PSLD (run_unseen_aa)
    "unseen-aa": Spec(workers=2, iterations=60, settled=20, reps=5, scenario="random-aa", seed=39),
    # the same draw in the simulator, 200 cases (pre-screen: the real runs decide)
    "unseen-sim": Spec(workers=2, iterations=60, settled=20, reps=1, scenario="random-sim", seed=39),
    "dynamic-mlp": Spec(**DYNAMIC, **MLP),
}


def server_loads(spec: Spec, policy: str) -> tuple[list[int], int]:
    """Bytes per server under `policy` for the spec's model (equal speeds), and the server
    of that placement's largest block (lowest key on ties)."""
    from equipoise.data.load import load_dataset
    from equipoise.models import build_model
    from equipoise.policy.placement import placement_blocks
    from equipoise.protocol.blocks import model_tensors

    data = load_dataset(spec.dataset)
    model = build_model(spec.model, data.input_shape, data.num_classes)
    blocks, owner = placement_blocks(policy, model_tensors(model), spec.servers, spec.block_size)
    loads = [0] * spec.servers
    for b in blocks:
        loads[owner[b.key]] += b.nbytes
    largest = max(blocks, key=lambda b: (b.nbytes, -b.key))
    return loads, owner[largest.key]


def slow_servers(spec: Spec) -> dict[int, list[str]]:
    """Server rank -> the cases it stands for (a rank, "greedy: largest block" or
    "<policy>: most bytes"), in the order first named."""
    out: dict[int, list[str]] = {}
    for case in spec.cases:
        if isinstance(case, int):
            out.setdefault(case, []).append(f"server {case}")
            continue
        loads, largest = server_loads(spec, case)
        if case == "greedy":
            out.setdefault(largest, []).append("greedy's largest block")
        else:
            out.setdefault(max(range(spec.servers), key=lambda j: (loads[j], -j)), []).append(f"{case}'s most bytes")
    return out


def labels(spec: Spec, stands_for: list[str]) -> list[str]:
    """The policies run in a case: all, or without the defaults whose worst it is not."""
    return [p for p in spec.policies if spec.every_default or p not in BASELINES[:2]
            or any(s.startswith(f"{p}'s") for s in stands_for)]


def job(spec: Spec, label: str, slow: int, tmp: Path) -> dict[str, Any]:
    """The config of one run; `label` is a placement, or "oracle_initial" (dynamic)."""
    factors = [1.0] * spec.servers
    factors[slow] = spec.factor
    after = [1.0] * spec.servers
    after[spec.switch_to] = spec.factor
    dynamic = spec.scenario == "dynamic"
    # The oracle is placed for the speeds the settled window sees (after any switch).
    known = after if dynamic and label == "oracle" else factors
    cfg = dict(model=spec.model, dataset=spec.dataset, workers=spec.workers, servers=spec.servers,
               global_batch=spec.global_batch, iterations=spec.iterations, block_size=spec.block_size,
               placement="oracle" if label == "oracle_initial" else label, server_slowdown=known,
               server_rate=spec.bandwidth, server_bandwidth=[spec.bandwidth] * spec.servers,
               psld_interval=spec.interval, psld_epsilon=0.05 if dynamic else 0.0,
               eval_every=0, checkpoint_every=0, progress=False, timeout=300.0, transport=spec.transport,
               heartbeat_s=10.0,  # a loaded machine can starve a process for seconds: not a lost peer
               seed=spec.seed, lr=0.02, protocol=spec.protocol)
    if spec.protocol == "ssp":
        cfg["staleness_bound"] = spec.staleness_bound
    if dynamic:  # the trace covers every server, so it, not server_slowdown, sets the speeds
        rows = ["iteration,server,factor"] + [f"0,{s},{factors[s]}" for s in range(spec.servers)]
        rows += [f"{spec.switch},{slow},1.0", f"{spec.switch},{spec.switch_to},{spec.factor}"]
        path = tmp / f"server_trace_{slow}.csv"
        path.write_text("\n".join(rows) + "\n")
        cfg["server_trace"] = str(path)
    return cfg


def run_one(spec: Spec, label: str, slow: int, tmp: Path) -> dict[str, Any]:
    import equipoise

    out = tmp / f"{label}-{slow}-{time.monotonic_ns()}"
    result = equipoise.train(job(spec, label, slow, tmp), out=out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r.get("type") == "iteration"]
    servers = [r for r in records if r.get("type") == "servers" and r.get("iteration_s")]
    moves = [r for r in records if r.get("type") == "event" and r.get("event") == "block_moved"]
    waits = [max(r["table_wait_s"]) for r in iters if r.get("table_wait_s")]
    last = [r["iteration_s"] for r in servers if r["iteration"] > spec.iterations - spec.settled]
    run = {"iteration_s": result["train_s"] / max(len(iters), 1),
           "settled_iteration_s": sum(last) / len(last) if last else math.nan,
           "samples_per_s": result["samples_per_s"], "moves": sum(len(m["blocks"]) for m in moves),
           "pause_s_max": max((m["pause_s"] for m in moves), default=0.0),
           "worker_pause_s_max": max(waits, default=0.0), "final_accuracy": result["final_accuracy"],
           "run_dir": str(out), "interval_iteration_s": [[r["iteration"], r["iteration_s"]] for r in servers]}
    if spec.scenario == "dynamic":
        run["settle_iterations"] = settle_after(servers, spec)
    return run


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
