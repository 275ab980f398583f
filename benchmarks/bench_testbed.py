"""equipoise on the testbed (equipoise.testbed; root): emulated hosts whose CPUs and
links the kernel limits, with Ray across them, and no emulation key of equipoise's own
(no `slowdown`, `server_slowdown` or `server_bandwidth`).

Presets:

* `lbbsp`: four worker hosts under CPU quotas in the ratio [1, 1, 1/2, 1/4] (cgroup
  v1: 0.4, 0.4, 0.2 and 0.1 CPUs), the two servers on a host of their own. BSP against LB-BSP, interleaved. LB-BSP
  must find the slow hosts from what it measures; goal ≥ 2× BSP's samples/s.
* `cost-hosts`: the testbed's own cost, like for like: the same Ray job on the same cluster
  (`auth = "curve"`), its workers either on hosts of their own (every exchange crosses
  veth pairs and the bridge) or on the servers' host 0 (exchanges stay in that host's
  stack, as on loopback). Same daemons, same launcher; only the path differs.
  Goal: within 5%.
* `cost`: unshaped testbed hosts under Ray against the local launcher on this
  machine's loopback (the launchers differ too: Ray's raylets, one per host, share the
  two cores with the job).
* `ddp`: equipoise BSP against PyTorch DDP (gloo, one rank per worker host) on the
  same four worker hosts, whose links are capped at `rate_mbit` each way; equipoise's two
  servers on hosts of their own, unshaped (as BytePS deploys them). equipoise runs five times
  per round: exchanging after backward, pipelined (`backward_push` and `forward_pull`:
  the push leaves during backward, the forward starts on the first layers' weights) and
  pipelined with `eager_update` (each block updated by its server once every worker's
  gradient of it is in, and sent down while the rest still go up); both pipelined runs
  with blocks and parts of 128 KiB (`PIPELINED`); then with `eager_update` and blocks and
  parts sized from the model (`block_size = 0`, `fragment_kb = 0`: the cnn's 421,642
  floats on 2 servers give the floor, 16,384 floats = 64 KiB); and the last with the
  default blocks (1 MiB) and parts (256 KiB), to show what the block size does. Each equipoise run
  also records where its iterations' time goes (`split`, `wire`) and, per iteration, a
  floor no exchange can beat (`bound_s`: the last worker's first gradient byte, then its
  whole gradient at the link's rate); `ceiling` is DDP's iteration over each run's
  floor, the most a parameter server could reach against DDP on these links with that
  run's compute.
  A parameter server
  moves each gradient byte once each way per worker; ring all-reduce about 2(n−1)/n
  times. Goal ≥ 1.2×.
* `psld`: PSLD against greedy and the oracle, with a server host behind a slower link:
  four server hosts (one server each, placed by per-rank resources), links capped at
  `rate_mbit` each way, except the host of the server greedy gives its largest block,
  at a quarter of it; the four workers on the driver's host, unshaped. bench_psld's
  `full` case (cnn, 32 768-float blocks, PSLD every 5 iterations), with the kernel's
  link caps in place of `server_bandwidth` and `server_slowdown`. The oracle is the
  best static placement for the true link rates (`server_speeds`, which slows
  nothing). Goals: PSLD ≥ 1.5× greedy's samples/s, and settled ≤ 1.1× the oracle's
  seconds per iteration (the mean of the servers' records over the last `settled`
  iterations, as bench_psld).
* `ci`: `lbbsp` tiny, one round, to check the script.

One testbed and one Ray cluster per invocation; the systems run interleaved (A, B, A, B,
…) over `reps` rounds. Samples/s over a steady window (the iterations after `warmup`).
Medians with ranges, and ratios taken within each round. Writes
benchmarks/results/bench_testbed_<preset>.json.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.bench_lbbsp import steady_window
from benchmarks.common import (fmt_range, interleave, load_average, markdown_table, preset_main, summary,
                               write_results)

NAME = "bench_testbed"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Spec:
    kind: str = "lbbsp"  # lbbsp | cost | cost-hosts | ddp | psld
    rate_mbit: float = 0.0  # ddp: the worker hosts' links; psld: the server hosts' (one at a quarter)
    model: str = "cnn"
    dataset: str = "fashion-mnist"
    global_batch: int = 256
    iterations: int = 40
    warmup: int = 10
    # CPUs of each worker host: [1, 1, 1/2, 1/4] scaled to 0.4 so that the four (1.1 CPUs)
    # leave this 2-core machine room for the servers and the coordinator: each quota is
    # then what its host really gets, not a share of an over-committed machine.
    quotas: tuple[float, ...] = (0.4, 0.4, 0.2, 0.1)
    reps: int = 3
    settled: int = 20  # psld: the last iterations the settled time is the mean over


PRESETS = {
    "ci": Spec(dataset="digits", model="mlp", global_batch=64, iterations=8, warmup=2, reps=1),
    "lbbsp": Spec(),
    "cost": Spec(kind="cost", quotas=(0.0, 0.0, 0.0, 0.0), global_batch=128),
    "cost-hosts": Spec(kind="cost-hosts", quotas=(0.0, 0.0, 0.0, 0.0), global_batch=128),
    "ddp": Spec(kind="ddp", quotas=(0.0, 0.0, 0.0, 0.0), global_batch=128, rate_mbit=100.0),
    # 400 Mbit/s = 50 MB/s, bench_psld's link-bound `full` case; 100 Mbit/s on the slow host
    "psld": Spec(kind="psld", quotas=(0.0, 0.0, 0.0, 0.0), global_batch=128, iterations=50, rate_mbit=400.0),
}
PSLD_POLICIES = ("greedy", "psld", "oracle")
# The pipelined runs' parts: 128 KiB take 10 ms at 100 Mbit/s; a pipeline of parts up to
# the servers and back down costs about two parts' time to fill and drain, and a part's
# fixed cost (tens of µs) is under 1% of it. Blocks of 32,768 floats are one part each,
# so that a layer's gradient travels in several (the cnn's classifier: 13).
PIPELINED = {"backward_push": True, "forward_pull": True, "block_size": 32768, "fragment_kb": 128}


def psld_slow(spec: Spec) -> int:
    """The server rank greedy gives its largest block (bench_psld's "greedy" case)."""
    from benchmarks.psld_job import Spec as PsldSpec
    from benchmarks.psld_job import server_loads

    return server_loads(PsldSpec(model=spec.model, dataset=spec.dataset, servers=4), "greedy")[1]


def psld_on_testbed(tb, spec: Spec, policy: str, slow: int, address: str, tmp: Path) -> dict:
    """One run of `policy`; server rank r on host 1 + r (resource h<r>), workers on host 0."""
    from benchmarks.psld_job import Spec as PsldSpec

    base = PsldSpec()
    out = tmp / f"psld-{policy}-{time.monotonic_ns()}"
    speeds = [0.25 if r == slow else 1.0 for r in range(4)]
    cfg = {**job(spec, "bsp"), "servers": 4, "placement": policy, "block_size": base.block_size,
           "psld_interval": base.interval, "lr": 0.02, "launcher": "ray", "ray_address": address, "auth": "curve",
           "server_resources": [{"CPU": 0.25, f"h{r}": 1} for r in range(4)],
           "worker_resources": {"CPU": 0.25, "wrk": 1}}
    if policy == "oracle":
        cfg["server_speeds"] = speeds
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); import equipoise, json; "
            f"s = equipoise.train({cfg!r}, out={str(out)!r}); print(json.dumps({{'nodes': s['nodes'], "
            f"'train_s': s['train_s'], 'samples_per_s': s['samples_per_s']}}))")
    done = tb.run(0, [sys.executable, "-c", code], timeout=900, env=tb.ray_env())
    if done.returncode != 0:
        raise RuntimeError(f"the job on the testbed failed: {done.stderr.strip().splitlines()[-3:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r.get("type") == "iteration"]
    servers = [r for r in records if r.get("type") == "servers" and r.get("iteration_s")]
    last = [r["iteration_s"] for r in servers if r["iteration"] > spec.iterations - spec.settled]
    moves = [r for r in records if r.get("type") == "event" and r.get("event") == "block_moved"]
    return {"samples_per_s": got["samples_per_s"], "iteration_s": got["train_s"] / max(len(iters), 1),
            "settled_iteration_s": sum(last) / len(last) if last else float("nan"), "moves": sum(len(m["blocks"]) for m in moves),
            "hosts": {r: n["ip"] for r, n in sorted(got["nodes"].items())}}


def job(spec: Spec, protocol: str) -> dict[str, Any]:
    return dict(dataset=spec.dataset, model=spec.model, protocol=protocol, workers=len(spec.quotas), servers=2,
                global_batch=spec.global_batch, iterations=spec.iterations, eval_every=0, checkpoint_every=0,
                progress=False, timeout=300.0, heartbeat_s=10.0, lr=0.05, seed=0)


def on_testbed(tb, spec: Spec, protocol: str, address: str, tmp: Path, workers_on: str = "wrk",
               **extra: Any) -> dict:
    """One job under Ray: servers on host 0 (resource srv), workers where `workers_on`
    is (wrk: hosts of their own; local: host 0 too); `extra`: more config keys."""

    out = tmp / f"{protocol}-{time.monotonic_ns()}"
    cfg = {**job(spec, protocol), **extra, "launcher": "ray", "ray_address": address, "auth": "curve",
           "server_resources": {"CPU": 0.5, "srv": 1}, "worker_resources": {"CPU": 0.5, workers_on: 1}}
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); import equipoise, json; "
            f"s = equipoise.train({cfg!r}, out={str(out)!r}); print(json.dumps(s['nodes']))")
    done = tb.run(0, [sys.executable, "-c", code], timeout=900, env=tb.ray_env())
    if done.returncode != 0:
        raise RuntimeError(f"the job on the testbed failed: {done.stderr.strip().splitlines()[-3:]}")
    nodes = json.loads(done.stdout.strip().splitlines()[-1])
    window = steady_window(out / "metrics.jsonl", spec.warmup)
    link_s = model_bytes(spec) * 8 / (spec.rate_mbit * 1e6) if spec.rate_mbit else 0.0
    return {"samples_per_s": window["samples_per_s"], "batch": window["batch"], "split": window["split"],
            "wire": wire_times(out / "metrics.jsonl", spec.warmup, link_s),
            "hosts": {r: n["ip"] for r, n in sorted(nodes.items())}}


def wire_times(metrics: Path, warmup: int, link_s: float = 0.0) -> dict[str, float]:
    """Where a step's exchange goes, from the iteration records after `warmup`: medians
    over every (iteration, worker) of its `gap_s` and of its timeline's times (s from the
    start of its forward): the first fragment sent, the last early block and the last
    push ack arrived; and of the slowest and fastest worker's compute per iteration.
    Per iteration: its time (`iteration_s`), the round trip of the plan request the
    barrier waited for (`plan_last_s`: the shortest of the workers', whose report came
    last), and `bound_s`, a floor no exchange can beat: the last worker to send a
    gradient byte (its first fragment) still has to move the whole gradient up its link,
    `link_s` (the model's bytes at the link's rate). A barrier releases every worker's
    forward within a ms, so times from each worker's own forward start are comparable."""
    recs = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    window = sorted((r for r in recs if r.get("type") == "iteration"), key=lambda r: r["iteration"])[warmup:]
    got: dict[str, list[float]] = {}
    for a, b in zip(window, window[1:]):
        got.setdefault("iteration_s", []).append(b["elapsed"] - a["elapsed"])
    for r in window:
        computes = [c for c, b in zip(r.get("compute_s") or [], r["batch"]) if b]
        if computes:
            got.setdefault("slowest_compute_s", []).append(max(computes))
            got.setdefault("fastest_compute_s", []).append(min(computes))
        got.setdefault("gap_s", []).extend(g for g in r.get("gap_s") or [] if g is not None)
        firsts, plans = [], []
        for events in r.get("timeline") or []:
            for name, kind, pick, at in (("first_fragment_s", "fragment", min, 2), ("last_early_s", "early", max, 3),
                                         ("last_ack_s", "push", max, 3)):
                times = [e[at] for e in events if e[0] == kind and e[at] is not None and e[at] >= 0]
                if times:
                    got.setdefault(name, []).append(pick(times))
                    if kind == "fragment":
                        firsts.append(pick(times))
            plans += [e[3] - e[2] for e in events if e[0] == "plan" and e[3] is not None]
        if plans:
            got.setdefault("plan_last_s", []).append(min(plans))
        if firsts and link_s and len(firsts) == len(r["timeline"]):
            got.setdefault("bound_s", []).append(max(firsts) + link_s)
    return {k: statistics.median(v) for k, v in sorted(got.items()) if v}


@functools.lru_cache(maxsize=None)
def model_bytes(spec: Spec) -> int:
    """The bytes of a push of the spec's model: every tensor a block holds (parameters,
    floating point buffers)."""
    from equipoise.data import load_dataset
    from equipoise.models import build_model
    from equipoise.protocol.blocks import model_tensors

    data = load_dataset(spec.dataset)
    model = build_model(spec.model, data.input_shape, data.num_classes)
    return sum(numel * itemsize for _, numel, _, itemsize in model_tensors(model))


def on_loopback(spec: Spec, tmp: Path) -> dict:
    import equipoise

    out = tmp / f"loopback-{time.monotonic_ns()}"
    equipoise.train({**job(spec, "bsp"), "auth": "curve"}, out=out)  # encrypted as on the testbed
    return {"samples_per_s": steady_window(out / "metrics.jsonl", spec.warmup)["samples_per_s"]}


def ddp_on_testbed(tb, spec: Spec, first: int) -> dict:
    """DDP with rank r on host `first` + r; rank 0's host is the rendezvous. A gloo rank
    sometimes aborts at start ("terminate called without an active exception", as
    bench_ddp sees on loopback): one more start, then the error."""
    for attempt in (1, 2):
        try:
            return _ddp_once(tb, spec, first)
        except RuntimeError as exc:
            print(f"DDP attempt {attempt} failed: {exc}", file=sys.stderr)
            if attempt == 2:
                raise


def _ddp_once(tb, spec: Spec, first: int) -> dict:
    from benchmarks.common import free_port
    from equipoise.testbed import ray_env

    n, port = len(spec.quotas), free_port()
    env = {**ray_env(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
           "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    procs = [tb.popen(first + r, [sys.executable, "-m", "benchmarks.bench_testbed", "--ddp-rank", str(r),
                                  tb.address(first), str(port), json.dumps(asdict(spec))],
                      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(n)]
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a DDP rank failed: {[o[1].strip().splitlines()[-1:] for o in outs]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def ddp_rank_main(argv: list[str]) -> None:
    """`--ddp-rank R MASTER PORT SPEC`: one DDP rank (bench_ddp's), on this host."""
    from benchmarks.bench_ddp import Spec as DdpSpec
    from benchmarks.bench_ddp import _ddp_rank

    rank, master, port, raw = int(argv[0]), argv[1], int(argv[2]), json.loads(argv[3])
    spec = DdpSpec(model=raw["model"], dataset=raw["dataset"], workers=len(raw["quotas"]), global_batch=raw["global_batch"],
                   iterations=raw["iterations"], warmup=raw["warmup"], lr=0.05, momentum=0.9, seed=0, timeout=300.0)

    class Out:
        def put(self, value):
            print(json.dumps(value), flush=True)

    _ddp_rank(rank, spec, port, Out(), master=master)


def run(preset: str, results_path: str | None = None, plots: str | None = None, reps: int | None = None) -> dict:
    from equipoise.testbed import Host, Testbed, available

    spec = PRESETS[preset] if reps is None else replace(PRESETS[preset], reps=reps)
    reason = available()
    if reason:
        raise SystemExit(f"bench_testbed: {reason}")
    # Host 0: the driver and both servers (resource srv); hosts 1..4: one worker each (wrk),
    # each under its CPU quota.
    hosts = [Host()] + [Host(cpus=q) for q in spec.quotas]
    if spec.kind == "ddp":  # the driver; two server hosts; the worker hosts behind capped links
        hosts = [Host(), Host(), Host()] + [Host(rate_mbit=spec.rate_mbit) for _ in spec.quotas]
    if spec.kind == "psld":  # the driver and the workers; four server hosts, one behind a slower link
        slow = psld_slow(spec)
        hosts = [Host()] + [Host(rate_mbit=spec.rate_mbit / (4 if r == slow else 1)) for r in range(4)]
        result_extra = {"slow_server": slow, "slow_rate_mbit": spec.rate_mbit / 4}
    result: dict[str, Any] = {"preset": preset, "spec": asdict(spec), "loadavg_at_start": load_average(),
                              "ratios_computed": "within each round, then median (min–max) over rounds"}
    with tempfile.TemporaryDirectory(prefix="bench-testbed-") as name, Testbed(hosts, prefix="eqbn") as tb:
        tmp = Path(name)
        if spec.kind == "psld":
            address = tb.start_ray(cpus=[2, 1, 1, 1, 1], resources=[{"wrk": 4}] + [{f"h{r}": 1} for r in range(4)])
        elif spec.kind == "ddp":
            address = tb.start_ray(cpus=[1, 1, 1] + [1] * len(spec.quotas),
                                   resources=[{}, {"srv": 1}, {"srv": 1}] + [{"wrk": 1}] * len(spec.quotas))
        elif spec.kind == "cost-hosts":  # host 0 holds the servers, and the workers in the one-host runs
            address = tb.start_ray(cpus=[4] + [1] * len(spec.quotas),
                                   resources=[{"srv": 2, "local": len(spec.quotas)}] + [{"wrk": 1}] * len(spec.quotas))
        else:
            address = tb.start_ray(cpus=[2] + [1] * len(spec.quotas),
                                   resources=[{"srv": 2}] + [{"wrk": 1}] * len(spec.quotas))
        if spec.kind == "psld":
            systems = {p: (lambda p=p: psld_on_testbed(tb, spec, p, slow, address, tmp)) for p in PSLD_POLICIES}
        elif spec.kind == "ddp":
            systems = {"ddp": lambda: ddp_on_testbed(tb, spec, 3),
                       "equipoise": lambda: on_testbed(tb, spec, "bsp", address, tmp),
                       "equipoise_pipelined": lambda: on_testbed(tb, spec, "bsp", address, tmp, **PIPELINED),
                       "equipoise_eager": lambda: on_testbed(tb, spec, "bsp", address, tmp, **PIPELINED,
                                                             eager_update=True),
                       # blocks and parts sized from the model (block_size = 0, fragment_kb = 0)
                       "equipoise_eager_auto": lambda: on_testbed(tb, spec, "bsp", address, tmp, backward_push=True,
                                                                  forward_pull=True, eager_update=True, block_size=0,
                                                                  fragment_kb=0),
                       # the default blocks (1 MiB): the classifier is one block per server
                       "equipoise_eager_1mib": lambda: on_testbed(tb, spec, "bsp", address, tmp, backward_push=True,
                                                                  forward_pull=True, eager_update=True)}
        elif spec.kind == "lbbsp":
            systems = {p: (lambda p=p: on_testbed(tb, spec, p, address, tmp)) for p in ("bsp", "lbbsp")}
        elif spec.kind == "cost-hosts":
            systems = {"hosts": lambda: on_testbed(tb, spec, "bsp", address, tmp),
                       "one host": lambda: on_testbed(tb, spec, "bsp", address, tmp, workers_on="local")}
        else:
            systems = {"testbed": lambda: on_testbed(tb, spec, "bsp", address, tmp),
                       "loopback": lambda: on_loopback(spec, tmp)}
        runs = interleave(systems, spec.reps)
    names = list(systems)
    result["runs"] = runs
    if spec.kind == "psld":
        return psld_result(preset, spec, result, runs, result_extra, results_path)
    result["summary"] = {n: summary([r["samples_per_s"] for r in runs[n]]) for n in names}
    b = names[0]
    result["ratio"] = {f"{a}/{b}": summary([x["samples_per_s"] / y["samples_per_s"] for x, y in zip(runs[a], runs[b])])
                       for a in names[1:]}
    result["wire"] = {n: {k: summary([r["wire"][k] for r in runs[n] if k in r.get("wire", {})])
                          for k in sorted({k for r in runs[n] for k in r.get("wire", {})})}
                      for n in names if any(r.get("wire") for r in runs[n])}
    if spec.kind == "ddp":  # the most any exchange could give each run: DDP's iteration over its floor
        result["ceiling"] = {f"{n}: ddp iteration / bound": summary(
            [spec.global_batch / d["samples_per_s"] / r["wire"]["bound_s"] for r, d in zip(runs[n], runs["ddp"])
             if "bound_s" in r.get("wire", {})]) for n in names if any("bound_s" in r.get("wire", {}) for r in runs[n])}
    rows = [[n, fmt_range(result["summary"][n])] for n in names]
    print(f"## bench_testbed, preset {preset}: {spec.model} on {spec.dataset}, worker hosts' CPUs {list(spec.quotas)}, "
          f"{spec.reps} interleaved rounds, samples/s after {spec.warmup} iterations\n")
    print(markdown_table(["system", "samples/s, median (min–max)"], rows))
    for k, v in result["ratio"].items():
        print(f"\n{k}: {fmt_range(v)}")
    for n, times in result["wire"].items():  # medians over rounds of each run's medians, in ms
        print(f"\n{n}: " + ", ".join(f"{k} {1e3 * v['median']:.0f} ms" for k, v in times.items()))
    for k, v in result.get("ceiling", {}).items():
        print(f"\nthe most {k.split(':')[0]} could reach, {k.split(': ')[1]}: {fmt_range(v)}")
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


def psld_result(preset: str, spec: Spec, result: dict, runs: dict, extra: dict, results_path: str | None) -> dict:
    result.update(extra)
    result["summary"] = {p: {k: summary([r[k] for r in runs[p]]) for k in ("samples_per_s", "iteration_s",
                                                                            "settled_iteration_s", "moves")}
                         for p in PSLD_POLICIES}
    result["ratio"] = {
        "psld/greedy samples/s": summary([p["samples_per_s"] / g["samples_per_s"]
                                          for p, g in zip(runs["psld"], runs["greedy"])]),
        "greedy/psld settled s/iteration": summary([g["settled_iteration_s"] / p["settled_iteration_s"]
                                                    for p, g in zip(runs["psld"], runs["greedy"])]),
        "psld/oracle settled s/iteration": summary([p["settled_iteration_s"] / o["settled_iteration_s"]
                                                    for p, o in zip(runs["psld"], runs["oracle"])])}
    rows = [[p, fmt_range(result["summary"][p]["samples_per_s"]), fmt_range(result["summary"][p]["settled_iteration_s"]),
             fmt_range(result["summary"][p]["moves"])] for p in PSLD_POLICIES]
    print(f"## bench_testbed, preset {preset}: server {extra['slow_server']}'s host at {extra['slow_rate_mbit']:g} "
          f"Mbit/s, the others at {spec.rate_mbit:g}; {spec.reps} interleaved rounds\n")
    print(markdown_table(["placement", "samples/s, whole run", "s/iteration, settled", "block moves"], rows))
    for k, v in result["ratio"].items():
        print(f"\n{k}: {fmt_range(v)}")
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ddp-rank"]:
        ddp_rank_main(sys.argv[2:])
    else:
        preset_main(__doc__, PRESETS, run, "(unused)", reps=True)
