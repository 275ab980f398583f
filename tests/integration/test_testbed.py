"""The testbed (equipoise.testbed): emulated hosts with their own addresses and TCP
stacks, kernel-shaped links, CPU quotas, partitions and freezes, and a teardown that
leaves nothing behind, also after a crash. Root only; elsewhere skipped with the reason.
No timing is asserted: the shaping is checked as the kernel reports it (the measured
rate is a benchmark's business)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from equipoise.testbed import Host, Testbed, available, down, ray_env, status

pytestmark = [pytest.mark.timeout(120),
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
    return [line for line in (netns + links + cgroups).splitlines() if f"{prefix}-" in line]


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
               heartbeat_s=0.5, seed=3)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install -e '.[ray]')")
def test_bsp_under_ray_across_three_testbed_hosts_equals_the_local_launcher(tmp_path):
    """A Ray head on host 0 (the servers' host: resource srv), nodes on hosts 1 and 2
    (the workers': wrk), each at its own address; the driver on host 0. The servers and
    workers talk ZeroMQ between the hosts' addresses (recorded in summary.json's nodes),
    and the weights are exactly those of the same job under the local launcher."""
    import equipoise
    import torch

    local = tmp_path / "local"
    equipoise.train(RAY_JOB, out=local)
    run = tmp_path / "ray"
    cfg = {**RAY_JOB, "launcher": "ray", "auth": "curve",
           "server_resources": {"CPU": 0.5, "srv": 1}, "worker_resources": {"CPU": 0.5, "wrk": 1}}
    with Testbed([Host(), Host(), Host()], prefix=PREFIX) as tb:
        cfg["ray_address"] = tb.start_ray(cpus=[2, 2, 2], resources=[{"srv": 2}, {"wrk": 2}, {"wrk": 2}])
        code = (f"import equipoise, json; s = equipoise.train({cfg!r}, out={str(run)!r}); "
                f"print(json.dumps(s['nodes']))")
        done = tb.run(0, [sys.executable, "-c", code], timeout=300, env=ray_env())
        assert done.returncode == 0, done.stderr[-2000:]
        nodes = json.loads(done.stdout.strip().splitlines()[-1])
    assert {n["ip"] for r, n in nodes.items() if r.startswith("server")} == {"10.77.0.1"}
    assert {n["ip"] for r, n in nodes.items() if r.startswith("worker")} <= {"10.77.0.2", "10.77.0.3"}
    got, ref = (torch.load(d / "model.pt", weights_only=True) for d in (run, local))
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert leftovers(PREFIX) == []
