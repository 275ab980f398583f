"""The Ray launcher on a cluster emulated on this machine (`ray.cluster_utils.Cluster`):
a head node that holds only the driver and three nodes of 2 CPUs each; two have a
custom resource `srv`, one `wrk`, so a test can pin roles to nodes. One cluster serves
the whole module (about 7 s to start)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray")  # the dev extra installs it: the README's test command runs these
from ray.cluster_utils import Cluster  # noqa: E402

import equipoise  # noqa: E402
from equipoise.coordinator.rpc import JobError  # noqa: E402

from .helpers import all_gone, assert_equals_reference, assert_near_reference, records, wait_for  # noqa: E402

pytestmark = pytest.mark.slow  # every test here runs real jobs

NODES = 3
BASE = {"dataset": "digits", "model": "mlp", "protocol": "bsp", "servers": 2, "workers": 3, "global_batch": 48,
        "iterations": 12, "lr": 0.1, "eval_every": 0, "checkpoint_every": 0, "progress": False,
        "timeout": 60.0, "heartbeat_s": 2.0}
# heartbeat_s: a process is lost after three missed beats. With Ray, five roles, standbys
# importing torch and another test beside them on two cores, a live server's beats were
# seen 2.5 s apart, and 0.5 s beats (1.5 s) declared it lost. 2 s beats (6 s, the default)
# leave more than twice that; the losses these tests cause are killed processes, which
# Ray reports as dead actors at once, or a node whose processes stop, found in 6 s.


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for i in range(NODES):  # two nodes that can hold a server each, one that holds the workers
        c.add_node(num_cpus=2, resources={"srv": 1} if i < 2 else {"wrk": 3})
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(autouse=True)
def no_orphans():
    """Replaces the package's check: the emulated nodes are children of this process and
    Ray keeps idle workers of its own; each test checks its job's actors are gone."""
    yield


def _gone(summary: dict) -> bool:
    return all_gone([where["pid"] for where in summary["nodes"].values()])


def _train_and_meanwhile(cfg: dict, run_dir: Path, action):
    """Train `cfg` in a thread; after five iterations call `action(nodes)` with the job's
    nodes.json. Returns (the summary, what `action` returned); a failed job fails the test."""
    result: dict = {}

    def train():
        try:
            result["summary"] = equipoise.train(cfg, out=run_dir)
        except BaseException as exc:  # reported by the assertion below
            result["error"] = exc

    job = threading.Thread(target=train)
    job.start()
    try:
        wait_for(lambda: len(records(run_dir, "iteration")) >= 5, 120, "five iterations")
        done = action(json.loads((run_dir / "nodes.json").read_text()))
    finally:
        job.join(timeout=300)
    assert "error" not in result, result.get("error")
    return result["summary"], done


def test_bsp_on_three_nodes_equals_the_local_launcher(cluster, tmp_path):
    """The job under Ray ends bit for bit where single-process SGD ends, as the same job
    under the local launcher does (test_bsp_oracle): both run the same main
    (launch.proc.host) with the same thread count and seeds and move weights as raw
    bytes (assert_equals_reference argues it). The processes ran on all three nodes,
    each log reached the driver."""
    ray_run = equipoise.train({**BASE, "launcher": "ray"}, out=tmp_path / "ray")
    assert_equals_reference({**BASE, "launcher": "ray"}, tmp_path / "ray")
    nodes = ray_run["nodes"]
    assert set(nodes) == {"server0", "server1", "worker0", "worker1", "worker2"}
    assert len({n["node"] for n in nodes.values()}) == NODES  # SPREAD over the three nodes
    assert json.loads((tmp_path / "ray" / "nodes.json").read_text()) == nodes
    assert ray_run["launcher"]["kind"] == "ray"
    assert {p.name for p in (tmp_path / "ray" / "logs").iterdir()} == {f"{n}.log" for n in nodes}
    assert "listening on tcp://" in (tmp_path / "ray" / "logs" / "server0.log").read_text()
    assert _gone(ray_run)


def test_shared_data_from_each_nodes_disk_with_curve(cluster, tmp_path):
    """ray_data = "path" (each node loads the dataset once for its workers) and CURVE
    between the nodes: the job still equals the reference bit for bit."""
    cfg = {**BASE, "launcher": "ray", "ray_data": "path", "auth": "curve", "servers": 1, "workers": 2}
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert_equals_reference(cfg, tmp_path / "run")
    assert _gone(summary)


PROVIDER = '''
import json, os
import torch
from torch.utils.data import TensorDataset

def provide(data_dir):
    import ray
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "driver"
    with open(os.path.join(data_dir, f"built-{os.getpid()}.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "node": node}, fh)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 1, 8, 8, generator=g)
    y = (x.flatten(1).sum(1) > 0).long()
    train = TensorDataset(x[:480], y[:480])
    train.input_shape, train.num_classes = (1, 8, 8), 2
    return train, TensorDataset(x[480:], y[480:])
'''


def test_a_user_dataset_is_built_by_every_worker_on_its_node(cluster, tmp_path):
    """dataset = "file.py:fn" under Ray: nothing is shipped; each worker actor calls the
    provider in its own process on its node (the provider records where), and the job
    equals the reference bit for bit."""
    (tmp_path / "user.py").write_text(PROVIDER)
    (tmp_path / "built").mkdir()
    cfg = {**BASE, "launcher": "ray", "dataset": f"{tmp_path / 'user.py'}:provide",
           "data_dir": str(tmp_path / "built"), "eval_every": 6}
    summary = equipoise.train(cfg, out=tmp_path / "run")
    built = {b["pid"]: b["node"] for b in (json.loads(p.read_text()) for p in (tmp_path / "built").iterdir())}
    workers = {w["pid"]: w["node"] for name, w in summary["nodes"].items() if name.startswith("worker")}
    assert {pid: built.get(pid) for pid in workers} == workers  # every worker, on its own node
    assert summary["final_accuracy"] is not None
    assert_equals_reference(cfg, tmp_path / "run")
    assert _gone(summary)


def test_a_project_folders_functions_train_in_ray_actors(cluster, tmp_path, monkeypatch):
    """A user's project (tests/integration/test_project_folder.py's: a module whose
    dataset imports a neighbour module) passed from Python as functions, the module found
    only through this process's sys.path: recorded by its file, so every actor, in its
    own working directory, imports it and its neighbour."""
    import importlib
    import textwrap

    from .test_project_folder import HELPER, WLM

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text(textwrap.dedent(HELPER))
    (proj / "wlm_ray.py").write_text(textwrap.dedent(WLM))
    monkeypatch.syspath_prepend(str(proj))
    wlm = importlib.import_module("wlm_ray")
    cfg = {**BASE, "launcher": "ray", "workers": 2, "global_batch": 16, "iterations": 3}
    summary = equipoise.train(cfg, dataset=wlm.datasets, model=wlm.model, loss=wlm.loss, model_args={"hidden": 6},
                              out=tmp_path / "run")
    assert summary["iterations"] == 3
    assert f'dataset = "{proj / "wlm_ray.py"}:datasets"' in (tmp_path / "run" / "config.toml").read_text()
    assert _gone(summary)


def test_a_spec_the_actors_cannot_import_fails_before_any_role_starts(cluster, tmp_path, monkeypatch):
    """A spec by module name that only this process's sys.path finds: every actor tries
    to import the user's specs before a role starts, so the job fails in one line naming
    the spec and the actor, and releases what it held."""
    import textwrap

    from equipoise.config import ConfigError

    from .test_project_folder import HELPER, WLM

    proj = tmp_path / "hidden"
    proj.mkdir()
    (proj / "helper.py").write_text(textwrap.dedent(HELPER))
    (proj / "wlm_hidden.py").write_text(textwrap.dedent(WLM))
    monkeypatch.syspath_prepend(str(proj))
    cfg = {**BASE, "launcher": "ray", "workers": 2, "global_batch": 16, "iterations": 3,
           "dataset": "wlm_hidden:datasets", "model": "wlm_hidden:model", "loss": "wlm_hidden:loss"}
    free = ray.available_resources().get("CPU", 0)
    with pytest.raises(ConfigError) as exc:
        equipoise.train(cfg, out=tmp_path / "run")
    message = str(exc.value)
    assert "\n" not in message and "cannot import 'wlm_hidden'" in message and "Ray actor" in message, message
    # the job's placement group and actors are gone: the cluster's CPUs are free again
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= free, 30, "the job's CPUs released")


def test_a_job_the_cluster_can_never_hold_is_refused_at_once_one_it_cannot_hold_now_waits(cluster, tmp_path):
    """Asking for a GPU of a cluster without one is a user mistake, reported before any
    placement group is made; a job that fits the cluster (5 of its 6 CPUs) but not what
    is free now (4 held by another placement group) waits `timeout`, then fails naming
    what it asked and what was free."""
    from equipoise.config import ConfigError

    before = len(ray.util.placement_group_table())
    cfg = {**BASE, "launcher": "ray", "worker_resources": {"CPU": 1, "GPU": 1}, "timeout": 60.0}
    with pytest.raises(ConfigError, match=r"can never hold this job: it asks for 3 GPU in all .* 0 GPU"):
        equipoise.train(cfg, out=tmp_path / "run")
    assert len(ray.util.placement_group_table()) == before
    hold = ray.util.placement_group([{"CPU": 2}, {"CPU": 2}])
    ray.get(hold.ready(), timeout=30)
    try:
        with pytest.raises(JobError, match=r"could not place the job within 3 s.*CPU"):
            equipoise.train({**BASE, "launcher": "ray", "timeout": 3.0}, out=tmp_path / "run2")
    finally:
        ray.util.remove_placement_group(hold)
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


def test_a_node_lost_mid_run_with_replication(cluster, tmp_path):
    """cluster.remove_node takes server 1 with its node (servers are pinned one per `srv`
    node, the workers to the `wrk` node). With replication = 1 the backup takes the
    server's blocks, every server restarts from the newest version all blocks still have,
    the workers recompute the iteration in flight, and the weights equal the reference on
    the run's own splits within the 1e-5 that test_recovery argues for a recovered run.
    The stretch (slowdown 20) keeps the job running long enough for the node to go
    mid-run."""
    cfg = {**BASE, "launcher": "ray", "replication": 1, "iterations": 40, "slowdown": [20.0, 20.0, 20.0],
           "server_resources": {"CPU": 1, "srv": 1}, "worker_resources": {"wrk": 1}}
    run_dir = tmp_path / "run"

    def remove_node_of_server1(nodes: dict) -> list[str]:
        doomed = nodes["server1"]["node"]
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == doomed)
        cluster.remove_node(victim, allow_graceful=False)
        # A lost machine takes every process on it. An emulated node's raylet killed
        # leaves its actors' processes to notice on their own, and once in the suite
        # server 1 never did: the job ran its 40 iterations with it, nothing lost.
        for where in nodes.values():
            if where["node"] == doomed and where["pid"] != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(where["pid"], signal.SIGKILL)
        # A machine takes its place, as an autoscaler would start one (for later tests).
        cluster.add_node(num_cpus=2, resources={"srv": 1})
        return sorted(name for name, where in nodes.items() if where["node"] == doomed)

    summary, on_it = _train_and_meanwhile(cfg, run_dir, remove_node_of_server1)
    assert on_it == ["server1"]
    assert [f"{r['role']}{r['rank']}" for r in summary["recovered"]] == on_it, (
        summary["recovered"], summary["iterations"], records(run_dir, "failure"))
    assert summary["iterations"] == cfg["iterations"]
    assert_near_reference(cfg, run_dir)
    assert _gone(summary)


def test_a_killed_worker_actor_is_replaced_in_its_bundle_by_a_warm_standby(cluster, tmp_path):
    """A worker's process killed mid-run (as the kernel's OOM killer would) with
    worker_restarts = 1, once the standby on its node is ready (standbys.json lists it): the
    survivors take its slice, the replacement runs in that standby (torch imported
    before the role was handed to it: `warm`; its pid), on the same node, holding the
    placement-group bundle the lost one held, and joins at a barrier under the next rank;
    the weights equal the reference on the run's own splits within test_recovery's 1e-5.
    After the job no actor is left, standbys included."""
    # The standbys start warming once every role has registered, beside the running job
    # (about 3 s here, the job at iteration ~85 of 100 at slowdown 20): at slowdown 50
    # the kill lands near iteration 35, with room for one twice as slow.
    cfg = {**BASE, "launcher": "ray", "iterations": 100, "slowdown": [50.0, 50.0, 50.0], "worker_restarts": 1,
           "server_resources": {"CPU": 1, "srv": 1}, "worker_resources": {"wrk": 1}}
    run_dir = tmp_path / "run"

    def standbys() -> dict:
        path = run_dir / "standbys.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def kill_worker1(nodes: dict) -> tuple[dict, dict]:
        wait_for(lambda: nodes["worker1"]["node"] in standbys(), 60, "the standby on worker 1's node")
        ready = standbys()
        assert len(records(run_dir, "iteration")) < cfg["iterations"] - 10, "the job ended before the standby was ready"
        os.kill(nodes["worker1"]["pid"], signal.SIGKILL)
        return nodes, ready

    summary, (nodes, ready) = _train_and_meanwhile(cfg, run_dir, kill_worker1)
    assert [f"{r['role']}{r['rank']}" for r in summary["recovered"]] == ["worker1"]
    standby = ready[nodes["worker1"]["node"]]
    assert summary["nodes"]["worker3"]["node"] == nodes["worker1"]["node"]  # the same bundle, the same node
    assert summary["nodes"]["worker3"]["pid"] == standby["pid"] and summary["nodes"]["worker3"]["warm"]
    assert not summary["nodes"]["worker1"]["warm"]  # a role started in a fresh actor imports torch itself
    assert "worker_joined" in {r.get("event") for r in records(run_dir, "event")}
    assert_near_reference(cfg, run_dir)
    assert _gone(summary)
    seen = [*ready.values(), *standbys().values()]  # every standby known to have been ready
    assert all_gone([w["pid"] for w in seen])
    pids = {w["pid"] for w in [*nodes.values(), *seen, *summary["nodes"].values()]}
    left = [p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("equipoise-*.log")
            if p.name.split("-")[1].isdigit() and int(p.name.split("-")[1]) in pids]
    assert left == []  # no actor's log on its node: the killed one's and the standbys' included


def test_a_job_starting_its_own_ray_ignores_a_stale_state_file(tmp_path):
    """Ray's ray_current_cluster file naming a head that is gone (a crashed head, an
    earlier test's testbed) does not capture a job that starts its own instance: it runs,
    and its summary names the instance it started. Run in a child, away from this
    module's cluster (one worker and one server: the job's shape is not the point); the
    state file is put back as it was."""
    import subprocess
    import sys

    state = Path("/tmp/ray/ray_current_cluster")
    before = state.read_bytes() if state.exists() else None
    made = not state.parent.exists()  # removed again at the end: the test leaves nothing behind
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("10.255.255.1:6379")  # nobody there
    script = ("import equipoise, json, sys\n"
              f"s = equipoise.train({{**{BASE!r}, 'launcher': 'ray', 'iterations': 4, 'workers': 1, 'servers': 1}}, "
              "out=sys.argv[1])\n"
              "print(json.dumps(s['launcher']))\n")
    try:
        # RAY_AUTH_MODE disabled: a local instance would otherwise write ~/.ray/auth_token,
        # which the testbed's `ray start` nodes then refuse (they run without it)
        env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled"}
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True,
                              text=True, timeout=240, env=env)
    finally:
        if before is None:
            state.unlink(missing_ok=True)
        else:
            state.write_bytes(before)
        if made:
            try:
                state.parent.rmdir()
            except OSError:  # something else wrote there meanwhile: not ours to remove
                pass
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = json.loads(done.stdout.strip().splitlines()[-1])
    assert launcher["address"].startswith("(started here: ") and "10.255.255.1" not in launcher["address"]


def test_sparse_tables_train_in_ray_actors_as_one_process_does(cluster, tmp_path):
    """The DLRM-style example's tables on servers in Ray actors (the servers pinned to
    the two `srv` nodes, the workers to the `wrk` one): the job ends where single-process
    torch with its sparse step does, within the tolerance tests/unit/test_sparse_jobs.py
    argues."""
    from equipoise.workload import load_workload

    from ..unit.test_sparse_jobs import assert_near_oracle, dlrm_job

    cfg = dlrm_job(workers=2, servers=2, iterations=8, launcher="ray", timeout=60.0,
                   server_resources={"srv": 1}, worker_resources={"wrk": 1})
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["iterations"] == 8 and summary["sparse_tables"]
    assert_near_oracle(cfg, tmp_path / "run", load_workload(cfg))
    assert _gone(summary)
