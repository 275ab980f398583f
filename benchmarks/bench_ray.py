"""The Ray launcher against the local launcher, and unequal nodes on an emulated cluster.

    python -m benchmarks.bench_ray --preset overhead
    python -m benchmarks.bench_ray --preset lbbsp
    python -m benchmarks.bench_ray --preset memory

* ``overhead``: bench_ddp's homogeneous BSP job (CNN on Fashion-MNIST, 4 workers,
  2 servers, global batch 128), under the local launcher and under the Ray launcher on a
  Ray instance this process starts (one node: the same machine), interleaved (local, ray,
  local, ray, ...), 5 repetitions. Steady samples/s (iterations after bench_ddp's warm-up,
  from metrics.jsonl), the cores used over that window by the servers and workers, by
  the coordinator's process and by Ray's own processes (raylet, GCS, agents, idle
  workers), and start-up time: from the call to `train` until every process has
  registered and been initialised (summary ``launcher.startup_s``); `ray.init` itself is
  timed once, apart, as joining a running cluster does not pay it.
* ``lbbsp``: a cluster emulated with `ray.cluster_utils.Cluster`: four worker nodes
  labelled ``equipoise-slowdown`` 4, 4, 8 and 16 (every worker placed there has its
  compute stretched by that factor: the project's stretch), one CPU and one worker slot
  each, and a node of 2 CPUs for the 2 servers; global batch 512. That is slowdowns
  [1, 1, 2, 4] on machines 4× slower than this one's cores, as bench_lbbsp's full preset
  emulates them: on a real cluster each node computes on its own cores, while here six
  processes share two, so unstretched machines would measure this machine's contention
  rather than the nodes' speeds. BSP and LB-BSP interleaved; steady samples/s over the
  iterations after the first `warmup`.
* ``memory``: 4 workers on one node (the same job as ``overhead``), local launcher vs
  Ray launcher, interleaved: at iteration `probe` the workers' resident (RSS), unique (USS)
  and proportional (PSS) memory, summed over the 4 workers, and what of Ray's object store
  (the shared-memory file /dev/shm/plasma*, where the dataset is) they have mapped:
  resident, and private to a worker (a copy would be private). /dev/shm's growth during
  the first Ray job is the store's size with the dataset in it (the file stays, so later
  repetitions show no growth).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.bench_ddp import Spec, _steady_rate
from benchmarks.common import git_state, interleave, load_average, markdown_table, median, ratio, write_results

NAME = "bench_ray"
SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)
MACHINE = 4.0  # lbbsp: how much slower than this machine's cores every emulated node is


@dataclass(frozen=True)
class Preset:
    kind: str
    iterations: int
    reps: int
    warmup: int = 2
    probe: int = 30  # memory: the iteration at which memory is read


PRESETS = {
    "ci": Preset("overhead", iterations=10, reps=1),
    "overhead": Preset("overhead", iterations=200, reps=5),
    "lbbsp": Preset("lbbsp", iterations=60, reps=3, warmup=15),
    "memory": Preset("memory", iterations=60, reps=3, probe=30),
}


def _env() -> None:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _job(spec: Spec, run_dir: Path, **extra: Any) -> dict[str, Any]:
    import equipoise

    cfg = dict(protocol="bsp", workers=spec.workers, servers=spec.servers, global_batch=spec.global_batch,
               iterations=spec.iterations, model=spec.model, dataset=spec.dataset, lr=spec.lr,
               momentum=spec.momentum, seed=spec.seed, threads=1, eval_every=0, checkpoint_every=0,
               progress=False, timeout=spec.timeout)
    cfg.update(extra)
    summary = equipoise.train(cfg, out=run_dir)
    return {"steady_samples_per_s": _steady_rate(run_dir / "metrics.jsonl", spec),
            "samples_per_s": summary["samples_per_s"], "startup_s": summary["launcher"]["startup_s"],
            "nodes": summary["nodes"]}


def _once(spec: Spec, **extra: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        run_dir = Path(tmp) / "run"
        out: dict[str, Any] = {}
        job = threading.Thread(target=lambda: out.update(_job(spec, run_dir, **extra)))
        job.start()
        out["cpu"] = _cpu_window(run_dir, extra.get("launcher", "local"), spec, job)
        job.join(timeout=1200)
    print(f"{extra}: {out['steady_samples_per_s']:.1f} samples/s, start-up {out['startup_s']:.1f} s, "
          f"cores used {out['cpu']}", flush=True)
    return out


def _cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _ray_daemons(exclude: set[int]) -> list[psutil.Process]:
    """Every process of the Ray instance but the job's actors: raylet, GCS, agents, idle
    workers Ray keeps started."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.pid not in exclude and "site-packages/ray/" in cmd:
            out.append(proc)
    return out


def _cpu_window(run_dir: Path, launcher: str, spec: Spec, job: threading.Thread) -> dict[str, float] | None:
    """Cores used over the steady window (iteration `warmup` to 3 before the end) by the
    job's servers and workers, by this process (the coordinator) and by Ray's own
    processes: where the time goes."""
    def wait_for(n: int) -> bool:
        while _iterations(run_dir) < n and job.is_alive():
            time.sleep(0.05)
        return job.is_alive()

    if not wait_for(spec.warmup):
        return None
    roles = [psutil.Process(pid) for pid in _role_pids(run_dir, launcher)]
    me = psutil.Process()
    daemons = _ray_daemons({p.pid for p in roles} | {me.pid})
    t0, a0, b0, c0 = time.monotonic(), _cpu_seconds(roles), _cpu_seconds([me]), _cpu_seconds(daemons)
    if not wait_for(spec.iterations - 3):
        return None
    dt = time.monotonic() - t0
    return {"roles": (_cpu_seconds(roles) - a0) / dt, "coordinator": (_cpu_seconds([me]) - b0) / dt,
            "ray_daemons": (_cpu_seconds(daemons) - c0) / dt}


def _summarise(runs: dict[str, list[dict]], key: str) -> dict[str, dict]:
    return {name: {"median": median([r[key] for r in rs]), "min": min(r[key] for r in rs),
                   "max": max(r[key] for r in rs), "runs": [r[key] for r in rs]} for name, rs in runs.items()}


def overhead(p: Preset) -> dict[str, Any]:
    import ray

    spec = Spec(iterations=p.iterations, warmup=p.warmup)
    t0 = time.perf_counter()
    ray.init(num_cpus=spec.workers + spec.servers, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    init_s = time.perf_counter() - t0
    try:
        runs = interleave({"local": lambda: _once(spec, launcher="local"),
                           "ray": lambda: _once(spec, launcher="ray")}, p.reps)
    finally:
        ray.shutdown()
    rate, startup = _summarise(runs, "steady_samples_per_s"), _summarise(runs, "startup_s")
    cores = {name: {k: median([r["cpu"][k] for r in rs if r.get("cpu")]) for k in ("roles", "coordinator", "ray_daemons")}
             for name, rs in runs.items()}
    pairs = [ratio(r["steady_samples_per_s"], l["steady_samples_per_s"]) for r, l in zip(runs["ray"], runs["local"])]
    return {"spec": asdict(spec), "ray_init_s": init_s, "samples_per_s": rate, "startup_s": startup,
            "cores_used_median": cores, "cpu_runs": {n: [r.get("cpu") for r in rs] for n, rs in runs.items()},
            "ray_over_local": ratio(rate["ray"]["median"], rate["local"]["median"]), "pair_ratios": pairs,
            "table": markdown_table(
                ["launcher", "steady samples/s median (min–max)", "start-up s median (min–max)",
                 "cores: servers+workers / coordinator / Ray's processes"],
                [[n, f"{rate[n]['median']:.0f} ({rate[n]['min']:.0f}–{rate[n]['max']:.0f})",
                  f"{startup[n]['median']:.1f} ({startup[n]['min']:.1f}–{startup[n]['max']:.1f})",
                  " / ".join(f"{cores[n][k]:.2f}" for k in ("roles", "coordinator", "ray_daemons"))] for n in rate])}


def lbbsp(p: Preset) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    spec = Spec(iterations=p.iterations, warmup=p.warmup, global_batch=512)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for f in SLOWDOWNS:
        cluster.add_node(num_cpus=1, resources={"worker_slot": 1}, labels={"equipoise-slowdown": str(MACHINE * f)})
    cluster.add_node(num_cpus=spec.servers)
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    common = dict(launcher="ray", worker_resources={"CPU": 1, "worker_slot": 1}, server_resources={"CPU": 1})
    try:
        runs = interleave({"bsp": lambda: _once(spec, protocol="bsp", **common),
                           "lbbsp": lambda: _once(spec, protocol="lbbsp", **common)}, p.reps)
    finally:
        ray.shutdown()
        cluster.shutdown()
    rate = _summarise(runs, "steady_samples_per_s")
    pairs = [ratio(b["steady_samples_per_s"], a["steady_samples_per_s"]) for a, b in zip(runs["bsp"], runs["lbbsp"])]
    factors = sorted(w["slowdown"] for n, w in runs["bsp"][0]["nodes"].items() if n.startswith("worker"))
    return {"spec": asdict(spec), "node_slowdowns": [MACHINE * f for f in SLOWDOWNS], "worker_factors_placed": factors,
            "samples_per_s": rate, "lbbsp_over_bsp": ratio(rate["lbbsp"]["median"], rate["bsp"]["median"]),
            "pair_ratios": pairs,
            "table": markdown_table(["protocol", "steady samples/s median (min–max)"],
                                    [[n, f"{rate[n]['median']:.0f} ({rate[n]['min']:.0f}–{rate[n]['max']:.0f})"]
                                     for n in rate])}


def _role_pids(run_dir: Path, launcher: str, role: str = "") -> list[int]:
    """The pids of the job's processes of `role` ("": servers and workers)."""
    if launcher == "ray":
        return [w["pid"] for n, w in json.loads((run_dir / "nodes.json").read_text()).items() if n.startswith(role)]
    out = []
    for proc in psutil.Process().children(recursive=True):
        cmd = proc.cmdline()
        if "equipoise.launch.proc" in cmd and cmd[cmd.index("equipoise.launch.proc") + 1].startswith(role):
            out.append(proc.pid)
    return out


def _iterations(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum('"type":"iteration"' in line for line in path.read_text().splitlines())


def _memory_once(spec: Spec, launcher: str, probe: int) -> dict[str, Any]:
    shm0 = psutil.disk_usage("/dev/shm").used
    with tempfile.TemporaryDirectory(prefix="bench-ray-mem-") as tmp:
        run_dir = Path(tmp) / "run"
        result: dict[str, Any] = {}
        job = threading.Thread(target=lambda: result.update(_job(spec, run_dir, launcher=launcher)))
        job.start()
        deadline = time.monotonic() + 600
        while _iterations(run_dir) < probe and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = _role_pids(run_dir, launcher, "worker")
        mem = [psutil.Process(pid).memory_full_info() for pid in pids]
        store = [m for pid in pids for m in psutil.Process(pid).memory_maps(grouped=True)
                 if os.path.basename(m.path).startswith("plasma")]  # Ray's object store, mapped
        shm = psutil.disk_usage("/dev/shm").used - shm0
        job.join(timeout=600)
    mb = 1 << 20
    out = {"workers": len(mem), "rss_mb": sum(m.rss for m in mem) / mb, "uss_mb": sum(m.uss for m in mem) / mb,
           "pss_mb": sum(m.pss for m in mem) / mb, "shared_mb": sum(m.shared for m in mem) / mb,
           "dev_shm_mb": shm / mb, "store_mapped_mb": sum(m.rss for m in store) / mb,
           "store_private_mb": sum(m.private_clean + m.private_dirty for m in store) / mb,
           "steady_samples_per_s": result.get("steady_samples_per_s", float("nan"))}
    print(f"{launcher}: {out}", flush=True)
    return out


def memory(p: Preset) -> dict[str, Any]:
    import ray

    from equipoise.data import load_dataset

    spec = Spec(iterations=p.iterations, warmup=p.warmup)
    data_mb = sum(t.numel() * t.element_size() for t in (lambda d: (d.train_x, d.train_y, d.test_x, d.test_y))(
        load_dataset(spec.dataset))) / (1 << 20)
    ray.init(num_cpus=spec.workers + spec.servers, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False, object_store_memory=512 << 20)
    try:
        runs = interleave({"local": lambda: _memory_once(spec, "local", p.probe),
                           "ray": lambda: _memory_once(spec, "ray", p.probe)}, p.reps)
    finally:
        ray.shutdown()
    keys = ("rss_mb", "uss_mb", "pss_mb", "store_mapped_mb", "store_private_mb")
    table = {k: _summarise(runs, k) for k in keys}
    saved = table["uss_mb"]["local"]["median"] - table["uss_mb"]["ray"]["median"]
    return {"spec": asdict(spec), "probe_iteration": p.probe, "dataset_mb": data_mb, "memory": table,
            "uss_saved_mb": saved, "copies_saved": saved / data_mb,
            "table": markdown_table(["launcher", *[f"{k} (4 workers) median" for k in keys]],
                                    [[n, *[f"{table[k][n]['median']:.0f}" for k in keys]] for n in ("local", "ray")])}


def run(preset: str, results_path: str | None = None) -> dict[str, Any]:
    _env()
    p = PRESETS[preset]
    load_at_start, git_at_start = load_average(), git_state()
    body = {"overhead": overhead, "lbbsp": lbbsp, "memory": memory}[p.kind](p)
    result = {"preset": preset, "params": asdict(p), **body, "loadavg_at_start": load_at_start,
              "git_at_start": git_at_start}
    print(body["table"])
    print(f"wrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    run(args.preset, args.results)
