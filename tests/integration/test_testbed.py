"""The testbed (equipoise.testbed): emulated hosts with their own addresses and TCP
stacks, kernel-shaped links, CPU quotas, partitions and freezes, and a teardown that
leaves nothing behind, also after a crash; and the Ray launcher's tests (test_ray.py,
on `ray.cluster_utils` there) on hosts with their own addresses, host faults included.
Root only; elsewhere skipped with the reason. No timing is asserted: the shaping is
checked as the kernel reports it (the measured rate is a benchmark's business)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from equipoise.testbed import Host, Testbed, available, down, ray_dir, status

from .helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(available() is not None, reason=str(available()))]
PREFIX = "eqtst"  # not the default, so a user's own testbed is never touched

SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9000))
s.listen()
print("ready", flush=True)
c, _ = s.accept()
n = 0
while (d := c.recv(1 << 16)):
    n += len(d)
print(n, flush=True)
"""
# Connects until `timeout`: right after a partition heals the kernel may still hold the
# failed ARP resolution of the partition and answer "no route to host" (as on a real
# network) until it resolves again.
CLIENT = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        s = socket.create_connection((sys.argv[1], 9000), timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
s.sendall(b"x" * int(sys.argv[3]))
s.close()
"""


def leftovers(prefix: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    cgroups = subprocess.run(["sh", "-c", f"ls -d /sys/fs/cgroup/*/{prefix}-* 2>/dev/null"], capture_output=True,
                             text=True).stdout
    ray = [str(ray_dir(prefix))] if ray_dir(prefix).exists() else []  # Ray's state files, a session's
    return [line for line in (netns + links + cgroups).splitlines() if f"{prefix}-" in line] + ray


def send(tb: Testbed, src: int, dst: int, nbytes: int, timeout: float = 10.0) -> int | None:
    """Bytes host `dst` received from host `src` over TCP (None if the connection failed)."""
    server = tb.popen(dst, [sys.executable, "-c", SERVER, tb.address(dst)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        client = tb.run(src, [sys.executable, "-c", CLIENT, tb.address(dst), str(timeout), str(nbytes)],
                        timeout=timeout + 30)
        if client.returncode != 0:
            print(client.stderr)
            return None
        return int(server.communicate(timeout=30)[0].strip())
    finally:
        server.kill()
        server.wait(timeout=10)


def test_hosts_have_their_own_addresses_shaped_links_quotas_and_nothing_is_left():
    hosts = [Host(), Host(rate_mbit=100, burst_kib=32), Host(cpus=0.5, memory_mib=256)]
    with Testbed(hosts, prefix=PREFIX) as tb:
        up = status(PREFIX)
        assert [up[tb.ns(i)]["address"] for i in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
        assert "tbf" in up[tb.ns(1)]["qdisc"] and "rate 100Mbit" in up[tb.ns(1)]["qdisc"]
        outer = subprocess.run(["tc", "qdisc", "show", "dev", f"{PREFIX}-v1"], capture_output=True, text=True).stdout
        assert "rate 100Mbit" in outer  # what host 1 receives is shaped too
        assert "tbf" not in up[tb.ns(0)]["qdisc"]
        assert send(tb, 1, 0, 1 << 20) == 1 << 20  # real TCP between two stacks
        groups = tb.run(2, ["cat", "/proc/self/cgroup"]).stdout
        assert f"cpu:/{PREFIX}-h2" in groups.replace("cpu,cpuacct", "cpu") and f"memory:/{PREFIX}-h2" in groups
        quota, period = (int((tb._cgroup("cpu", 2) / f"cpu.cfs_{k}_us").read_text()) for k in ("quota", "period"))
        assert (quota, period) == (1000, 2000)  # half a CPU, in the shortest period that allows it
        # no way out: the hosts have no route beyond the testbed's /24
        out = tb.run(0, [sys.executable, "-c", "import socket; socket.create_connection(('192.0.2.1', 80), 2)"])
        assert out.returncode != 0 and "unreachable" in out.stderr.lower()
    assert leftovers(PREFIX) == []


def test_a_partition_cuts_a_host_off_until_its_link_is_back_and_a_frozen_host_is_torn_down():
    tb = Testbed([Host(), Host()], prefix=PREFIX)
    tb.up()
    try:
        tb.link(1, up=False)
        assert send(tb, 1, 0, 1024, timeout=2.0) is None
        tb.link(1, up=True)
        assert send(tb, 1, 0, 1024) == 1024
        sleeper = tb.popen(0, ["sleep", "600"])
        tb.freeze(0)
        # A crash: this object is dropped without `down`; a new testbed (or `down`)
        # removes what it left, frozen processes included.
        Testbed([Host()], prefix=PREFIX).up()
        assert sleeper.wait(timeout=30) != 0
        assert [ns for ns in status(PREFIX)] == [f"{PREFIX}-h0"]
    finally:
        down(PREFIX)
    assert leftovers(PREFIX) == []


RAY_JOB = dict(dataset="digits", model="mlp", protocol="bsp", servers=2, workers=3, global_batch=48,
               iterations=12, lr=0.1, eval_every=0, checkpoint_every=0, progress=False, timeout=60.0,
               heartbeat_s=2.0, seed=3, launcher="ray", auth="curve",
               server_resources={"CPU": 0.1, "srv": 1}, worker_resources={"CPU": 0.1, "wrk": 1})
# heartbeat_s 2 (lost after 6 s of silence), as test_ray.py's BASE argues: a live server's
# beats were seen 2.5 s apart under load, which 0.5 s beats took for a loss.
# The Ray cluster these tests share, as the cluster_utils one of test_ray.py (whose tests
# these are, on hosts with their own addresses): host 0 holds the head and the drivers,
# hosts 1 and 2 a server each (srv), hosts 2 and 3 the workers (wrk). Each host also
# has a resource named after it, so that a test can put a rank on a host.
RAY_HOSTS = [{}, {"srv": 1, "h1": 3}, {"srv": 1, "wrk": 1, "h2": 3}, {"wrk": 3, "h3": 3}]
RAY_PREFIX = "eqtsr"  # the shared cluster's: the tests above bring PREFIX up and down
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install -e '.[ray]')")


USER_TOKEN = Path.home() / ".ray" / "auth_token"  # a local ray.init() writes one


@contextlib.contextmanager
def user_token(content: str | None):
    """~/.ray/auth_token holding `content` (None: absent) for the block, then as it was
    (~/.ray too: removed again if the block made it)."""
    before = USER_TOKEN.read_bytes() if USER_TOKEN.exists() else None
    made = not USER_TOKEN.parent.exists()
    if content is None:
        USER_TOKEN.unlink(missing_ok=True)
    else:
        USER_TOKEN.parent.mkdir(parents=True, exist_ok=True)
        USER_TOKEN.write_text(content)
    try:
        yield
    finally:
        if before is None:
            USER_TOKEN.unlink(missing_ok=True)
        else:
            USER_TOKEN.write_bytes(before)
        if made:
            try:
                USER_TOKEN.parent.rmdir()
            except OSError:  # something else wrote there meanwhile: not ours to remove
                pass


@needs_ray
def test_the_testbeds_ray_nodes_agree_on_their_own_token_without_a_users():
    """Ray's token authentication is on: every node and driver of a testbed read the
    token from the testbed's own file (readable by its owner only). Here without a
    user's ~/.ray/auth_token; the shared cluster below is started with a stale one (a
    local `ray.init()` writes one, which nodes started without it used to refuse), so
    both states are tried. A driver with the testbed's environment sees both nodes."""
    tb = Testbed([Host(), Host()], prefix="eqttk")
    try:
        with user_token(None):
            tb.up()
            address = tb.start_ray(cpus=[0, 1])
            probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                     "print(sum(n['Alive'] for n in ray.nodes())); ray.shutdown()")
            done = tb.run(0, [sys.executable, "-c", probe, address], timeout=120, env=tb.ray_env())
        assert done.returncode == 0, done.stderr[-1500:]
        assert done.stdout.strip().splitlines()[-1] == "2"
        assert (tb.ray_token().stat().st_mode & 0o777) == 0o600
    finally:
        tb.down()
    assert leftovers("eqttk") == []


@pytest.fixture(scope="module")
def cluster():
    """Run with a stale ~/.ray/auth_token in place (its nodes and drivers use the
    testbed's own token, so it changes nothing; the file is then put back as it was)."""
    tb = Testbed([Host() for _ in RAY_HOSTS], prefix=RAY_PREFIX)
    tb.up()
    try:
        with user_token("0" * 64):
            address = tb.start_ray(cpus=[0] + [2] * (len(RAY_HOSTS) - 1), resources=RAY_HOSTS)
            yield tb, address
    finally:
        tb.down()
    assert leftovers(RAY_PREFIX) == []


def drive(tb: Testbed, cfg: dict, run, action=None, at: int = 5, env: dict | None = None) -> tuple[dict, object]:
    """Train `cfg` with the driver on host 0 (`env` added to its environment); once `at`
    iterations are recorded call `action(nodes.json)`. Returns (summary, what `action`
    returned); a failed job fails the test with its last lines."""
    code = (f"import equipoise, json; s = equipoise.train({cfg!r}, out={str(run)!r}); "
            "print(json.dumps({k: s[k] for k in ('recovered', 'nodes', 'iterations')}))")
    driver = tb.popen(0, [sys.executable, "-c", code], env={**tb.ray_env(), **(env or {})}, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    done = None
    try:
        if action is not None:
            metrics = run / "metrics.jsonl"
            wait_for(lambda: driver.poll() is not None or (metrics.exists() and
                                                           metrics.read_text().count('"type":"iteration"') >= at),
                     120, f"{at} iterations")
            if driver.poll() is None:  # else it failed: its error is below
                done = action(json.loads((run / "nodes.json").read_text()))
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1]), done


@needs_ray
def test_bsp_under_ray_across_testbed_hosts_equals_the_local_launcher(cluster, tmp_path):
    """Servers on hosts 1 and 2, workers on 2 and 3, the driver on 0, each at its own
    address (summary.json's nodes); ray_data = "path" (each node loads the dataset for
    its workers) and CURVE between the hosts. The weights are exactly those of
    single-process SGD on the run's splits, as under the local launcher (test_bsp_oracle)."""
    from .helpers import assert_equals_reference

    tb, address = cluster
    run = tmp_path / "ray"
    cfg = {**RAY_JOB, "ray_address": address, "ray_data": "path"}
    summary, _ = drive(tb, cfg, run)
    nodes = summary["nodes"]
    assert {n["ip"] for r, n in nodes.items() if r.startswith("server")} == {"10.77.0.2", "10.77.0.3"}
    assert {n["ip"] for r, n in nodes.items() if r.startswith("worker")} <= {"10.77.0.3", "10.77.0.4"}
    assert_equals_reference(cfg, run)


@needs_ray
def test_a_job_the_testbed_cluster_can_never_hold_is_refused_at_once(cluster, tmp_path):
    """Four servers of a cluster with three `srv` in all: the command exits 2 at once
    with one line naming what was asked and what the cluster has (no `timeout` wait)."""
    tb, address = cluster
    job = tmp_path / "job.toml"
    job.write_text('dataset = "digits"\nmodel = "mlp"\nservers = 4\nworkers = 2\niterations = 2\n'
                   'timeout = 60.0\nauth = "curve"\nprogress = false\n[ray]\n'
                   'server_resources = {CPU = 0.1, srv = 1}\nworker_resources = {CPU = 0.1, wrk = 1}\n')
    done = tb.run(0, [sys.executable, "-m", "equipoise.cli", "train", str(job), "--out", str(tmp_path / "run"),
                      "--launcher", "ray", "--ray-address", address], timeout=120, env=tb.ray_env())
    assert done.returncode == 2, done.stderr[-1000:]
    [line] = [ln for ln in done.stderr.splitlines() if "can never hold" in ln]
    assert "4 srv" in line and "3 srv" in line


@needs_ray
def test_a_killed_worker_is_replaced_in_its_bundle_on_its_host(cluster, tmp_path):
    """worker1's process killed mid-run (worker_restarts = 1): the survivors take its
    slice, a replacement starts in the placement-group bundle it held, on its host, and
    joins at a barrier; the weights are within test_recovery's 1e-5 of the reference on
    the run's own splits. Without warm standbys (EQUIPOISE_WARM=0): the replacement is a
    fresh actor in that bundle (test_ray's killed-worker test has it adopt a standby)."""
    import os
    import signal

    from equipoise.config import Config
    from equipoise.reference import oracle_diff

    tb, address = cluster
    run = tmp_path / "run"
    cfg = {**RAY_JOB, "ray_address": address, "iterations": 60, "slowdown": [20.0] * 3, "worker_restarts": 1}

    def kill_worker1(nodes: dict) -> dict:
        os.kill(nodes["worker1"]["pid"], signal.SIGKILL)  # one pid space: the hosts share this kernel
        return nodes

    summary, placed = drive(tb, cfg, run, kill_worker1, env={"EQUIPOISE_WARM": "0"})
    assert [f"{r['role']}{r['rank']}" for r in summary["recovered"]] == ["worker1"]
    assert summary["nodes"]["worker3"]["ip"] == placed["worker1"]["ip"]  # its bundle, its host
    assert not summary["nodes"]["worker3"]["warm"] and not (run / "standbys.json").exists()
    assert '"event":"worker_joined"' in (run / "metrics.jsonl").read_text()
    diff, moved = oracle_diff(Config.from_dict(cfg), run)
    assert diff <= 1e-5 and moved > 1e-3


@needs_ray
def test_a_partition_shorter_than_the_loss_threshold_is_ridden_through(cluster, tmp_path):
    """Host 3 (workers only) is cut off for 1 s mid-run, with heartbeats every 2 s: a
    process counts as lost after 3 missed beats, 6 s. TCP resends what the cut dropped
    once the link is back (its retransmission timeout starts at 1 s and doubles: a
    resend within 3 s of the cut), so nothing is lost: `recovered` is empty and the
    weights are exactly single-process SGD's on the run's splits."""
    import time

    from .helpers import assert_equals_reference

    tb, address = cluster
    run = tmp_path / "run"
    cfg = {**RAY_JOB, "ray_address": address, "iterations": 40, "heartbeat_s": 2.0, "slowdown": [20.0] * 3}

    def cut(nodes: dict) -> float:
        tb.link(3, up=False)
        try:
            time.sleep(1.0)
        finally:
            tb.link(3, up=True)
        return time.monotonic()

    summary, healed = drive(tb, cfg, run, cut, at=5)
    assert healed is not None, "the job ended before the cut"
    assert summary["recovered"] == [] and summary["iterations"] == cfg["iterations"]
    assert_equals_reference(cfg, run)


@needs_ray
def test_a_host_holding_a_server_and_a_worker_removed_mid_run_is_recovered(cluster, tmp_path):
    """Host 2 runs server 1 and worker 0 (per-rank resources put them there); it is
    removed mid-run, processes and link at once. replication = 1: server 1's backup
    takes its blocks, worker 1 takes worker 0's slices, and the job ends within 1e-5 of
    the reference on its own splits, with both processes in `recovered`. The host comes
    back afterwards (a new machine at its address) for the tests after this one.
    benchmarks/bench_testbed_chaos.py runs this and the other host faults many times."""
    from equipoise.config import Config
    from equipoise.reference import oracle_diff

    tb, address = cluster
    run = tmp_path / "run"
    cfg = {**RAY_JOB, "ray_address": address, "workers": 2, "iterations": 36, "replication": 1,
           "slowdown": [50.0, 50.0], "momentum": 0.9,
           "server_resources": [{"CPU": 0.1, "h1": 1}, {"CPU": 0.1, "h2": 1}],
           "worker_resources": [{"CPU": 0.1, "h2": 1}, {"CPU": 0.1, "h3": 1}]}
    try:
        summary, placed = drive(tb, cfg, run, lambda nodes: (tb.kill(2), nodes)[1], at=20)
    finally:
        tb.revive(2)
        tb.start_ray_node(2, 2, RAY_HOSTS[2])
    assert sorted(name for name, n in placed.items() if n["ip"] == "10.77.0.3") == ["server1", "worker0"]
    assert sorted(f"{r['role']}{r['rank']}" for r in summary["recovered"]) == ["server1", "worker0"]
    diff, moved = oracle_diff(Config.from_dict(cfg), run)
    assert diff <= 1e-5 and moved > 1e-3
