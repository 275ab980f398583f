"""Host-level faults on the testbed (equipoise.testbed; root): BSP jobs under the Ray
launcher across emulated hosts, each run dealt one blow to a whole host — its
processes killed and its link gone, its link cut for a while (a partition), or every
process on it frozen (cgroup freezer) — at an iteration drawn from a seeded generator.

Hosts: 0 runs the Ray head and the driver (the coordinator); 1 and 2 one server each;
3 a server *and* a worker (the node whose loss is two losses at once); 4 and 5 one
worker each; 6 is a standby that joins the cluster only in the runs that need a
replacement server (the snapshot rollback), after the job has started, so that Ray
re-places the lost host's bundle there. Capacities are exact (custom resources `srv`
and `wrk`), so every rank's host is known.

A blow is *below* the loss threshold (MISSED_BEATS × `heartbeat_s` = 6 s) or *above* it.
Below, the job must ride through with nothing lost; above (and for a kill), every
process of the host must be in summary.json's `recovered` and, if it comes back after a
partition or a thaw, be fenced (nothing it sends is applied). Every run must complete
with final weights within 1e-5 of `train_reference` on the run's own splits
(tests/integration/test_recovery.py argues the tolerance).

Presets:

* `chaos`: 20 runs — worker host killed (3), partitioned below (3) and above (3) the
  threshold, frozen below (2) and above (2); server host (replication = 1) killed (3),
  partitioned above (2) and frozen above (2).
* `pair`: the host of a server and a worker killed, 10 runs: 5 under `replication = 1`
  (the backup takes the blocks; the survivors the worker's slices) and 5 under the
  snapshot rollback (`snapshot_every = 10`, a replacement server on the standby host).
* `ci`: two runs (a worker host partitioned below the threshold, the pair killed under
  replication = 1), to check the script.

Writes benchmarks/results/bench_testbed_chaos_<preset>.json: every run's blow, what the
job recorded, its oracle difference, and the counts.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import load_average, markdown_table, preset_main, write_results

NAME = "bench_testbed_chaos"
ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_S = 2.0
THRESHOLD_S = 3 * HEARTBEAT_S  # launch/local.py MISSED_BEATS
BELOW_S, ABOVE_S = 1.0, 10.0  # how long a partition or a freeze lasts
SERVER_HOST, PAIR_HOST, WORKER_HOST, STANDBY = 1, 3, 4, 6
RESOURCES = [{}, {"srv": 1}, {"srv": 1}, {"srv": 1, "wrk": 1}, {"wrk": 1}, {"wrk": 1}, {"srv": 1}]


@dataclass(frozen=True)
class Blow:
    kind: str  # kill | partition | freeze
    host: int
    seconds: float = 0.0  # partition, freeze: how long
    mode: str = "replication"  # replication | snapshot: how a lost server is recovered

    @property
    def above(self) -> bool:
        return self.kind == "kill" or self.seconds > THRESHOLD_S


def _n(blow: Blow, n: int) -> list[Blow]:
    return [blow] * n


PRESETS: dict[str, list[Blow]] = {
    "chaos": (_n(Blow("kill", WORKER_HOST), 3) + _n(Blow("partition", WORKER_HOST, BELOW_S), 3)
              + _n(Blow("partition", WORKER_HOST, ABOVE_S), 3) + _n(Blow("freeze", WORKER_HOST, BELOW_S), 2)
              + _n(Blow("freeze", WORKER_HOST, ABOVE_S), 2) + _n(Blow("kill", SERVER_HOST), 3)
              + _n(Blow("partition", SERVER_HOST, ABOVE_S), 2) + _n(Blow("freeze", SERVER_HOST, ABOVE_S), 2)),
    "pair": _n(Blow("kill", PAIR_HOST), 5) + _n(Blow("kill", PAIR_HOST, mode="snapshot"), 5),
    "ci": [Blow("partition", WORKER_HOST, BELOW_S), Blow("kill", PAIR_HOST)],
}


def job(blow: Blow, address: str) -> dict[str, Any]:
    """BSP, 3 servers and 3 workers; `slowdown` only paces the iterations (about 0.15 s)
    so that a blow falls mid-run: the faults, not the stragglers, are the subject here."""
    cfg = dict(dataset="digits", model="mlp", protocol="bsp", servers=3, workers=3, global_batch=48,
               iterations=150, lr=0.05, momentum=0.9, eval_every=0, checkpoint_every=0, progress=False,
               timeout=60.0, heartbeat_s=HEARTBEAT_S, slowdown=[150.0, 150.0, 150.0], seed=7,
               launcher="ray", ray_address=address, auth="curve",
               server_resources={"CPU": 0.1, "srv": 1}, worker_resources={"CPU": 0.1, "wrk": 1})
    if blow.mode == "replication":
        cfg["replication"] = 1
    else:
        cfg["snapshot_every"] = 10
    return cfg


def _raylet_on(tb, i: int) -> bool:
    out = subprocess.run(["ip", "netns", "pids", tb.ns(i)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            if "raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return True
        except OSError:
            continue
    return False


def ensure_nodes(tb, hosts: range) -> list[int]:
    """Every host of `hosts` runs a Ray node: one whose raylet is gone (killed, or
    ended by Ray after a partition it declared the node dead for) is built again and
    joins. Returns the hosts restarted."""
    restarted = []
    for i in hosts:
        if i and not _raylet_on(tb, i):
            tb.revive(i)
            tb.start_ray_node(i, 1, RESOURCES[i])
            restarted.append(i)
    return restarted


def strike(tb, blow: Blow) -> None:
    if blow.kind == "kill":
        tb.kill(blow.host)
    elif blow.kind == "partition":
        tb.link(blow.host, up=False)
        time.sleep(blow.seconds)
        tb.link(blow.host, up=True)
    else:
        tb.freeze(blow.host)
        time.sleep(blow.seconds)
        tb.freeze(blow.host, False)


def iterations_recorded(run: Path) -> int:
    try:
        return sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if '"type":"iteration"' in line)
    except OSError:
        return 0


def one(tb, blow: Blow, address: str, at: int, tmp: Path) -> dict[str, Any]:
    from equipoise.config import Config
    from equipoise.reference import oracle_diff

    run = tmp / f"{blow.kind}-{blow.host}-{time.monotonic_ns()}"
    cfg = job(blow, address)
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); import equipoise, json; "
            f"s = equipoise.train({cfg!r}, out={str(run)!r}); "
            f"print(json.dumps({{'recovered': s['recovered'], 'nodes': s['nodes'], 'train_s': s['train_s']}}))")
    driver = tb.popen(0, [sys.executable, "-c", code], env=tb.ray_env(), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    out: dict[str, Any] = {"blow": asdict(blow), "at": at}
    try:
        deadline = time.monotonic() + 240
        while iterations_recorded(run) < at and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if blow.mode == "snapshot":  # a standby host joins, for the replacement server
            tb.start_ray_node(STANDBY, 1, RESOURCES[STANDBY])
        out["struck_at"] = iterations_recorded(run)
        nodes = run / "nodes.json"  # where each process ran when struck
        placed = json.loads(nodes.read_text()) if nodes.exists() else {}
        strike(tb, blow)
        stdout, stderr = driver.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        driver.kill()
        stdout, stderr = driver.communicate()
        out["error"] = "the job did not end within 400 s"
    if driver.returncode != 0 and "error" not in out:
        out["error"] = (stderr.strip().splitlines() or ["(no output)"])[-1][:400]
    if "error" in out:
        return out
    got = json.loads(stdout.strip().splitlines()[-1])
    on_host = sorted(name for name, n in placed.items() if n["ip"] == tb.address(blow.host))
    out["replacements_on"] = {name: n["ip"] for name, n in got["nodes"].items()
                              if name in placed and n["ip"] != placed[name]["ip"]}
    lost = sorted(f"{r['role']}{r['rank']}" for r in got["recovered"])
    diff, moved = oracle_diff(Config.from_dict(cfg), run)
    # A struck process that came back (a partition healed, a host thawed) before it was
    # ended: the servers' logs name each push of it they refused (logged once per kind).
    out["fenced_log_lines"] = sum(path.read_text(errors="replace").count("which was declared lost")
                                  for path in (run / "logs").glob("server*.log"))
    out.update(recovered=got["recovered"], on_host=on_host, lost=lost, oracle_diff=diff, moved=moved,
               train_s=got["train_s"])
    # Every process of the host that took a blow above the threshold is lost and recovered;
    # below it, none is. (A replacement started on the standby is not the struck host's.)
    expected = on_host if blow.above else []
    out["ok"] = bool(lost == expected and diff <= 1e-5 and moved > 1e-3)
    return out


def run(preset: str, results_path: str | None = None, plots: str | None = None) -> dict:
    from equipoise.testbed import Host, Testbed, available

    reason = available()
    if reason:
        raise SystemExit(f"{NAME}: {reason}")
    blows = PRESETS[preset]
    rng = random.Random(f"{NAME}-{preset}")
    ats = [rng.randrange(15, 60) for _ in blows]
    result: dict[str, Any] = {"preset": preset, "heartbeat_s": HEARTBEAT_S, "threshold_s": THRESHOLD_S,
                              "loadavg_at_start": load_average(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as name, \
            Testbed([Host() for _ in RESOURCES], prefix="eqch") as tb:
        tmp = Path(name)
        tb.start_ray_node(0, 0, None)
        address = f"{tb.address(0)}:6379"
        for i, blow in enumerate(blows):
            restarted = ensure_nodes(tb, range(1, STANDBY))
            got = {**one(tb, blow, address, ats[i], tmp), "restarted_hosts": restarted}
            tb.kill(STANDBY)  # out of the cluster again: only runs that need it see it
            tb.revive(STANDBY)
            print(f"run {i + 1}/{len(blows)}: {blow.kind} host {blow.host} "
                  f"{blow.seconds:g} s ({blow.mode}) at {got.get('struck_at')}: "
                  f"{'ok' if got.get('ok') else 'FAILED'} lost {got.get('lost')} "
                  f"diff {got.get('oracle_diff', float('nan')):.2g} {got.get('error', '')}", flush=True)
            result["runs"].append(got)
    runs = result["runs"]
    result["completed"] = sum(1 for r in runs if "error" not in r)
    result["ok"] = sum(1 for r in runs if r.get("ok"))
    result["of"] = len(runs)
    rows = []
    for key in sorted({(r["blow"]["kind"], r["blow"]["host"], r["blow"]["seconds"], r["blow"]["mode"]) for r in runs}):
        mine = [r for r in runs if (r["blow"]["kind"], r["blow"]["host"], r["blow"]["seconds"], r["blow"]["mode"]) == key]
        rows.append([f"{key[0]} host {key[1]}" + (f" {key[2]:g} s" if key[2] else ""), key[3],
                     f"{sum(1 for r in mine if r.get('ok'))}/{len(mine)}",
                     f"{max((r.get('oracle_diff', float('nan')) for r in mine), default=float('nan')):.2g}"])
    print(f"\n## {NAME}, preset {preset}: {result['ok']}/{result['of']} runs ok\n")
    print(markdown_table(["blow", "servers recovered by", "ok", "max oracle diff"], rows))
    print(f"\nwrote {write_results(f'{NAME}_{preset}', result, results_path)}")
    return result


if __name__ == "__main__":
    preset_main(__doc__, PRESETS, run, "(unused)")
