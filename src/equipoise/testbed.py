"""A cluster in a box: emulated hosts with network stacks of their own, on one Linux
machine (root only).

Each host is a network namespace joined to a bridge by a veth pair, with its own address
in a private range (10.77.0.0/24 by default), so processes on different hosts talk over
real TCP through the kernel, not over loopback. Links are shaped in the kernel by `tc`'s
token bucket filter (`tbf`), in both directions: the host's side shapes what it sends
(the veth end in its namespace), the bridge's side what it receives. A host may also
get a CPU quota (cgroup v1 `cpu`), a memory limit (`memory`) and be frozen (`freezer`);
its link can be taken down and brought up again (a partition).

Every name carries a prefix (`eqtb` by default): `down` removes whatever has it —
namespaces and the processes in them, links, cgroups — also what a crashed run left, and
`up` starts with a `down`. Traffic stays on the testbed's own addresses: the bridge has
none and no route leads out.

    with Testbed([Host(rate_mbit=400), Host(rate_mbit=400, cpus=0.5)]) as tb:
        server = tb.popen(0, ["python", "-m", "http.server", "--bind", tb.address(0)])
        tb.run(1, ["curl", f"http://{tb.address(0)}:8000/"])

What it does not emulate: latency and loss (`netem` is not available on the machines it
was built on; `tbf`'s queue adds delay only when a link is saturated), separate kernels,
clocks or file systems (hosts share this machine's), and a NIC's hardware.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

PREFIX = "eqtb"
SUBNET = "10.77.0"  # hosts are SUBNET.1, SUBNET.2, …; /24
CGROUPS = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "memory", "freezer")


class TestbedError(RuntimeError):
    """The testbed cannot be set up here (not root, a tool missing) or a command failed;
    one line naming what."""

    __test__ = False


@dataclass(frozen=True)
class Host:
    """One emulated host: link rate in Mbit/s each way (0: unshaped) and its burst in
    KiB, CPUs (a cgroup quota; 0: none) and memory in MiB (0: none)."""

    rate_mbit: float = 0.0
    burst_kib: int = 64
    cpus: float = 0.0
    memory_mib: int = 0

    def __post_init__(self):
        for name in ("rate_mbit", "cpus"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} = {getattr(self, name)!r} must be ≥ 0")
        if self.burst_kib < 1 or self.memory_mib < 0:
            raise ValueError(f"burst_kib = {self.burst_kib} must be ≥ 1 and memory_mib = {self.memory_mib} ≥ 0")


def available() -> str | None:
    """None if a testbed can be built here, else the reason (for tests to skip with)."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc, cgroups)"
    for tool in ("ip", "tc", "bridge"):
        if shutil.which(tool) is None:
            return f"the testbed needs `{tool}` (iproute2)"
    missing = [c for c in CONTROLLERS if not (CGROUPS / c).is_dir()]
    if missing:
        return f"the testbed needs the cgroup v1 controllers {missing} under {CGROUPS}"
    return None


def _sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass
class Testbed:
    """`hosts` as namespaces <prefix>-h0, <prefix>-h1, … on bridge <prefix>-br."""

    __test__ = False  # not a test class, whatever pytest makes of its name
    hosts: Sequence[Host]
    prefix: str = PREFIX
    subnet: str = SUBNET
    _up: bool = field(default=False, init=False)

    def __post_init__(self):
        if not 1 <= len(self.hosts) <= 200:
            raise ValueError(f"{len(self.hosts)} hosts: a testbed has 1 to 200")
        _check_prefix(self.prefix)

    # -- names ------------------------------------------------------------------------
    def ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def _outer(self, i: int) -> str:  # the bridge's end of host i's veth pair
        return f"{self.prefix}-v{i}"

    def _cgroup(self, controller: str, i: int) -> Path:
        return CGROUPS / controller / self.ns(i)

    # -- life -------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        """Build every host (after removing anything left with this prefix); on any
        failure what was built is removed again."""
        reason = available()
        if reason:
            raise TestbedError(reason)
        down(self.prefix)
        try:
            bridge = f"{self.prefix}-br"
            _sh("ip", "link", "add", bridge, "type", "bridge")
            _no_ipv6(bridge)  # no link-local address: the root namespace stays unreachable
            _sh("ip", "link", "set", bridge, "up")
            for i, host in enumerate(self.hosts):
                self._host(i, host, bridge)
        except BaseException:
            down(self.prefix)
            raise
        self._up = True

    def _host(self, i: int, host: Host, bridge: str) -> None:
        ns, outer, inner = self.ns(i), self._outer(i), f"{self.prefix}-i{i}"
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        _sh("ip", "link", "set", inner, "netns", ns)
        _sh("ip", "link", "set", outer, "master", bridge)
        _no_ipv6(outer)
        _sh("ip", "link", "set", outer, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "link", "set", inner, "name", "eth0")
        _sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        if host.rate_mbit:
            self.shape(i, host.rate_mbit, host.burst_kib)
        if host.cpus:
            path = self._cgroup("cpu", i)
            path.mkdir(exist_ok=True)
            # The shortest period the kernel allows for this share (its quota ≥ 1 ms): a
            # step throttled in long periods runs at full speed, then not at all, so its
            # time would depend on where it falls; short ones keep the share steady.
            period = int(min(1_000_000, max(1_000, 1_000 / host.cpus)))
            (path / "cpu.cfs_quota_us").write_text("-1")  # lift first: period and quota must stay consistent
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(max(1_000, int(host.cpus * period))))
        if host.memory_mib:
            path = self._cgroup("memory", i)
            path.mkdir(exist_ok=True)
            (path / "memory.limit_in_bytes").write_text(str(host.memory_mib << 20))
        self._cgroup("freezer", i).mkdir(exist_ok=True)

    def down(self) -> None:
        down(self.prefix)
        self._up = False

    # -- shaping and faults -------------------------------------------------------------
    def shape(self, i: int, rate_mbit: float, burst_kib: int = 64) -> None:
        """Host i's link at `rate_mbit` each way (a tbf on both ends of its veth pair)."""
        for where in (("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "replace", "dev", "eth0"),
                      ("tc", "qdisc", "replace", "dev", self._outer(i))):
            _sh(*where, "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", f"{burst_kib}kb", "latency", "100ms")

    def link(self, i: int, up: bool) -> None:
        """Cut host i off (a partition: the bridge drops its frames both ways; its link
        keeps its carrier, as behind a failed switch) or connect it again."""
        _sh("bridge", "link", "set", "dev", self._outer(i), "state", "3" if up else "0")

    def freeze(self, i: int, frozen: bool = True) -> None:
        """Stop (or resume) every process of host i at once (cgroup freezer)."""
        (self._cgroup("freezer", i) / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def kill(self, i: int) -> None:
        """Host i removed: every process in it killed (a frozen one too), its link gone."""
        self.freeze(i, False)  # a frozen process takes its SIGKILL only once thawed
        _kill_netns(self.ns(i))
        _sh("ip", "link", "del", self._outer(i), check=False)

    def revive(self, i: int) -> None:
        """Host i built again after `kill` (a new machine at the old address): a fresh
        namespace, link and cgroups, nothing running."""
        self.kill(i)
        _sh("ip", "netns", "del", self.ns(i), check=False)
        self._host(i, self.hosts[i], f"{self.prefix}-br")

    # -- running things on a host -----------------------------------------------------------
    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` to run in host i's namespace (start it with `popen` or `run`, which
        also put it in the host's cgroups)."""
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def _joiner(self, i: int):
        """For the child before it execs: join host i's cgroups (inside the namespace
        `ip netns exec` mounts a sysfs of its own, so this happens before)."""
        groups = [self._cgroup(c, i) / "cgroup.procs" for c in CONTROLLERS if self._cgroup(c, i).is_dir()]

        def join() -> None:
            for g in groups:
                g.write_text(str(os.getpid()))
        return join

    def popen(self, i: int, argv: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.command(i, argv), preexec_fn=self._joiner(i), **kw)

    def run(self, i: int, argv: Sequence[str], timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        try:
            return subprocess.run(self.command(i, argv), timeout=timeout, preexec_fn=self._joiner(i), **kw)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"`{' '.join(argv)}` on host {i} did not finish within {timeout:g} s") from None

    def status(self) -> dict:
        return status(self.prefix)

    # -- Ray across the hosts -----------------------------------------------------------------
    def ray_env(self) -> dict[str, str]:
        """The environment of every Ray process of this testbed, its nodes' and its
        drivers': `ray_env()` with Ray's token authentication on and the token read from
        this testbed's own file (written by `start_ray`, readable by its owner only), so
        that every node and driver agree whatever a user's ~/.ray/auth_token holds or
        whether it exists (a local `ray.init()` writes one; RAY_AUTH_TOKEN_PATH takes
        precedence over it)."""
        return {**ray_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.ray_token())}

    def ray_token(self) -> Path:
        return ray_dir(self.prefix) / "auth_token"

    def start_ray(self, cpus: Sequence[float] | None = None, resources: Sequence[dict] | None = None,
                  port: int = 6379, timeout: float = 120.0) -> str:
        """A Ray cluster over the hosts: the head on host 0, a node on every other host,
        each at its host's address with `cpus[i]` CPUs and `resources[i]` custom
        resources, all with this testbed's Ray token (`ray_env`). Returns the head's
        address (HOST:PORT) for `ray_address`; run the driver on host 0 with `ray_env()`.
        `down` ends every Ray process with the hosts (`ray stop` would stop every Ray
        process of this machine, a user's own cluster too)."""
        for i in range(len(self.hosts)):
            self.start_ray_node(i, None if cpus is None else cpus[i], None if resources is None else resources[i],
                                port=port, timeout=timeout)
        return f"{self.address(0)}:{port}"

    def start_ray_node(self, i: int, cpus: float | None = None, resources: dict | None = None, *,
                       port: int = 6379, timeout: float = 120.0) -> None:
        """A Ray node on host i (the head if i = 0), e.g. again after `revive`. The head
        checks its nodes' health every second and declares a node dead after 3 missed
        checks (Ray's default takes about 15 s), so that a lost host's placement-group
        bundles move to the hosts left within seconds."""
        import json

        token = self.ray_token()  # made by the first node started, shared by the others and the drivers
        if not token.exists():
            token.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        env = self.ray_env()
        if i == 0:
            node = ["--head", "--port", str(port), "--include-dashboard=false"]
            env.update(RAY_health_check_period_ms="1000", RAY_health_check_timeout_ms="1000",
                       RAY_health_check_failure_threshold="3", RAY_health_check_initial_delay_ms="1000")
        else:
            node = ["--address", f"{self.address(0)}:{port}"]
        extra = (["--num-cpus", f"{cpus:g}"] if cpus is not None else []) + \
            (["--resources", json.dumps(resources)] if resources else [])
        done = self.run(i, ["ray", "start", *node, "--node-ip-address", self.address(i), "--disable-usage-stats",
                            "--temp-dir", str(ray_dir(self.prefix)), *extra], timeout=timeout, env=env)
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise TestbedError(f"ray start on host {i} failed (exit {done.returncode}): {said[-3:]}")



def ray_dir(prefix: str) -> Path:
    """The Ray temporary folder of the testbed's nodes (sessions, logs, and the
    ray_current_cluster file that a later `ray.init()` without an address would join):
    the testbed's own, removed by `down`, not Ray's default /tmp/ray."""
    return Path(tempfile.gettempdir()) / f"equipoise-{prefix}-ray"


def ray_env() -> dict[str, str]:
    """The environment for Ray on testbed hosts: usage statistics off, and no
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER (set to 0, Ray refuses a cluster of several nodes)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def _kill_netns(ns: str) -> None:
    pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        time.sleep(0.05)


def _check_prefix(prefix: str) -> None:
    """Names are <prefix>-…: at most 6 letters or digits, so that nothing else (another
    tool's namespaces, a glob) can match."""
    if not (isinstance(prefix, str) and prefix.isalnum() and prefix.isascii() and 1 <= len(prefix) <= 6):
        raise TestbedError(f"prefix = {prefix!r}: 1 to 6 ASCII letters or digits")


def _no_ipv6(link: str) -> None:
    path = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if path.exists():
        path.write_text("1")


def _namespaces(prefix: str) -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout.split("\n")
    return sorted(line.split()[0] for line in out if line.strip().startswith(f"{prefix}-"))


def down(prefix: str = PREFIX) -> list[str]:
    """Remove everything named with `prefix`: processes in its namespaces, the
    namespaces, links, cgroups. Returns what was removed (nothing is an error)."""
    _check_prefix(prefix)
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root to tear down (network namespaces, cgroups)")
    removed: list[str] = []
    for c in CONTROLLERS:  # thaw first: a frozen process cannot die
        for path in sorted((CGROUPS / c).glob(f"{prefix}-*")) if (CGROUPS / c).is_dir() else []:
            if c == "freezer" and (path / "freezer.state").exists():
                (path / "freezer.state").write_text("THAWED")
    for ns in _namespaces(prefix):
        _kill_netns(ns)
        _sh("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    links = _sh("ip", "-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"{prefix}-"):
            _sh("ip", "link", "del", name, check=False)
            removed.append(name)
    for c in CONTROLLERS:
        for path in sorted((CGROUPS / c).glob(f"{prefix}-*")) if (CGROUPS / c).is_dir() else []:
            for pid in (path / "cgroup.procs").read_text().split() if (path / "cgroup.procs").exists() else []:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                try:
                    path.rmdir()
                    removed.append(str(path))
                    break
                except OSError:
                    time.sleep(0.05)
    if ray_dir(prefix).exists():  # its processes were killed with the namespaces
        shutil.rmtree(ray_dir(prefix), ignore_errors=True)
        removed.append(str(ray_dir(prefix)))
    return removed


def status(prefix: str = PREFIX) -> dict:
    """The hosts with `prefix` now up: namespace → {address, qdisc, processes}."""
    _check_prefix(prefix)
    out = {}
    for ns in _namespaces(prefix):
        addr = _sh("ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0", check=False).stdout.split()
        qdisc = _sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0", check=False).stdout.strip()
        out[ns] = {"address": addr[3].split("/")[0] if len(addr) > 3 else None, "qdisc": qdisc,
                   "processes": len(_sh("ip", "netns", "pids", ns, check=False).stdout.split())}
    return out


__all__ = ["Host", "Testbed", "TestbedError", "available", "down", "ray_env", "status"]
