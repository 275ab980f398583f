"""The Ray launcher: the coordinator runs in this process (Ray's driver), every server and
worker is a Ray actor in a process of its own, on whichever node of the cluster Ray
places it; the roles talk over the job's own ZeroMQ data plane, as under the local
launcher, and run the same main (`launch.proc.host`).

* Placement: one placement group holds a bundle per server (`server_resources`) and per
  worker (`worker_resources`) with `ray_strategy`, so the job starts whole or not at all
  (a cluster that cannot hold it within `timeout` is an error naming what was asked).
* Addresses: the coordinator and heartbeat listeners bind the driver's node address, a
  server its own node's (Ray's node IP); with `auth = "off"` nothing binds beyond
  loopback. Each actor gets its role's keys in its start arguments, never in a log.
* Data once per node: `ray_data = "ship"` puts the driver's dataset in Ray's object
  store once; each node holds one copy in shared memory and its workers map it (numpy
  arrays are read zero-copy). `ray_data = "path"`: one worker per node loads it from the
  node's own disk (`data_dir` or the default path) and shares it the same way.
* Logs: each actor writes its log on its node; a thread of the driver copies new lines
  to `RUN_DIR/logs/NAME.log` every second, and the summary records every process's node.
* Failures: an actor that dies (its node lost, its process killed) or stops answering its
  heartbeat (then killed) is *lost*, as under the local launcher, and the coordinator's
  recovery applies; a replacement starts in the placement-group bundle the lost one held
  (Ray re-places a lost node's bundles on the nodes left) or anywhere the resources fit;
  in a warm standby on the bundle's node where one is ready (launch/ray_standby.py;
  standbys start warming once the job is training, `started`).
* Emulating an unequal cluster: a node labelled ``equipoise-slowdown = F`` (``ray start
  --labels='{"equipoise-slowdown": "2"}'``) stretches every worker placed on it by F.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
import time
import warnings
from pathlib import Path

from ..config import Config, ConfigError, EquipoiseWarning
from ..interrupt import reinstall as reinstall_interrupts
from ..data import DATASETS
from ..wire import make_transport
from ..protocol.checkpoint import Checkpoint
from ..coordinator.pacings import make_coordinator
from ..coordinator.rpc import JobError, LaunchedPeers
from .local import Heartbeats, job_keys, process_keys
from .ray_actor import actor_class, actor_options, log_path
from .ray_fit import infeasible
from .ray_standby import Standbys, may_replace

LOG_PUMP_S = 1.0  # how often actor logs are copied to the driver
CHECK_S = 0.1  # how often actors are polled for an end (check() is called far more often)
log = logging.getLogger("equipoise.ray")


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("launcher = \"ray\" needs Ray: pip install 'equipoise[ray]'") from None
    return ray


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


class RayPeers(LaunchedPeers):
    """The job's actors; the coordinator's `Peers` (as `Children` is under the local
    launcher): it starts a role, says if one died or froze, and hears of planned stops."""

    def __init__(self, cfg: Config, run_dir: Path, coordinator: str, keys, beats: Heartbeats | None, data):
        super().__init__()
        ray = _ray()
        self.ray, self.cfg, self.coordinator, self.keys, self.beats = ray, cfg, coordinator, keys, beats
        self.data = data  # ObjectRef of the driver's dataset ("ship"), else None
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.actors: dict[str, object] = {}
        self.runs: dict[str, object] = {}  # name -> ObjectRef of its run(), until it ended
        self.where: dict[str, dict] = {}
        self.locating: dict[str, object] = {}  # name -> ObjectRef of locate(), until read
        self.bundle: dict[str, int] = {}  # name -> its placement group bundle
        self.free: dict[str, list[int]] = {"server": [], "worker": []}  # bundles of lost actors
        self.bundle_node: dict[int, str] = {}  # a lost actor's bundle -> the node it held it on
        self.adopted: set[str] = set()  # roles running in a standby (launch/ray_standby.py)
        self.standby = Standbys(ray, may_replace(cfg))
        self.offsets: dict[str, int] = {}
        self.node_data: dict[str, object] = {}  # node -> ObjectRef ("path")
        self.tolerated: set[str] = set()
        self.placing: set[str] = set()  # replacements started in a lost actor's bundle, not yet seen running
        self.stopped: set[str] = set()
        self.checked = 0.0
        self._pump_stop = threading.Event()
        self._pump = threading.Thread(target=self._pump_logs, name="ray-logs", daemon=True)
        self.pg = self._place()
        try:
            names = [("server", r) for r in range(cfg.servers)] + [("worker", r) for r in range(cfg.workers)]
            for i, (role, rank) in enumerate(names):
                self._create(role, rank, i)
            self._locate(self.cfg.timeout)
            self._check_specs()
            if cfg.ray_data == "path" and cfg.dataset in DATASETS:
                self._share()
            for role, rank in names:
                self._start(role, rank)
            self.write_nodes()
        except BaseException:
            self.stop(grace=0.0)  # no actor and no placement group outlives a failed start
            raise
        self._pump.start()

    # -- placement --------------------------------------------------------------------
    def _place(self):
        from ray.util.placement_group import placement_group, remove_placement_group

        cfg = self.cfg
        bundles = ([{k: v for k, v in cfg.resources("server", r).items() if v > 0} for r in range(cfg.servers)]
                   + [{k: v for k, v in cfg.resources("worker", r).items() if v > 0} for r in range(cfg.workers)])
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        reason = infeasible(bundles, cfg.ray_strategy, nodes)
        if reason:  # a user mistake, reported at once: waiting would not help
            raise ConfigError(f"the Ray cluster can never hold this job: {reason}; ask for less per actor "
                              f"(e.g. fractional amounts in worker_resources and server_resources), fewer "
                              f"workers or servers, or add nodes")
        self.bundles = bundles  # a replacement in a lost actor's bundle asks for what that bundle holds
        pg = placement_group(bundles, strategy=cfg.ray_strategy, name=f"equipoise-{os.getpid()}")
        try:
            self.ray.get(pg.ready(), timeout=cfg.timeout)
        except self.ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise JobError(
                f"the Ray cluster could not place the job within {cfg.timeout:.0f} s: it asks for "
                f"{cfg.servers} × server_resources = {cfg.server_resources} and {cfg.workers} × "
                f"worker_resources = {cfg.worker_resources} ({cfg.ray_strategy}); the cluster has "
                f"{self.ray.available_resources()} free") from None
        return pg

    def _create(self, role: str, rank: int, bundle: int | None) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = f"{role}{rank}"
        opts = actor_options(self.cfg.resources(role, rank) if bundle is None else self.bundles[bundle])
        if bundle is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle)
            self.bundle[name] = bundle
        self.actors[name] = actor_class().options(**opts).remote(name)
        self.locating[name] = self.actors[name].locate.remote()
        self.offsets[name] = 0
        (self.logs / f"{name}.log").touch()

    def _locate(self, timeout: float) -> None:
        """Learn where the actors started since the last call run (within `timeout` s)."""
        names = list(self.locating)
        try:
            found = self.ray.get([self.locating.pop(n) for n in names], timeout=timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise JobError(f"Ray did not start the job's actors within {timeout:.0f} s") from None
        except self.ray.exceptions.RayError as exc:
            raise JobError(f"a Ray actor of the job failed to start: {exc}") from None
        self.where.update(zip(names, found))

    def _check_specs(self) -> None:
        """Every actor imports the user's specs before any role starts: a spec the
        driver imports and an actor cannot is a ConfigError in one line, before start."""
        specs = self.cfg.user_specs()
        if not specs:
            return
        refs = [self.actors[n].check_specs.remote(specs) for n in sorted(self.actors)]
        try:
            errors = self.ray.get(refs, timeout=self.cfg.timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise JobError(f"the job's Ray actors did not import the user's code within {self.cfg.timeout:.0f} s") \
                from None
        error = next((e for e in errors if e), None)
        if error:
            raise ConfigError(error)

    def _share(self) -> None:
        """ray_data = "path": the first worker on each node loads the dataset for that node."""
        first: dict[str, str] = {}
        for name, where in self.where.items():
            if name.startswith("worker"):
                first.setdefault(where["node"], name)
        refs = {node: self.actors[name].share.remote(self.cfg.to_dict()) for node, name in first.items()}
        try:
            for node, ref in refs.items():
                self.node_data[node] = self.ray.get(ref, timeout=self.cfg.timeout)[0]
        except self.ray.exceptions.RayError as exc:
            raise JobError(f"loading {self.cfg.dataset!r} on a node failed: {exc}") from None

    def _start(self, role: str, rank: int) -> None:
        name = f"{role}{rank}"
        keys = process_keys(self.keys, role, rank)
        job = {"config": self.cfg.to_dict(), "keys": keys,
               "beats": self.beats.listener.address if self.beats else ""}
        data = None
        if role == "worker" and self.cfg.dataset in DATASETS:  # a replacement under "path" loads its own copy
            data = self.data if self.cfg.ray_data == "ship" else self.node_data.get(self.where.get(name, {}).get("node"))
        adopted = self.locating.get(name) if name in self.adopted else None  # run after the adoption
        self.runs[name] = self.actors[name].run.remote(role, rank, self.coordinator, job, data, adopted)

    # -- Peers ------------------------------------------------------------------------
    def spawn(self, role: str, rank: int) -> None:
        """Start `role` `rank` (again, if it was lost: in the bundle a lost one held, in
        the standby on that bundle's node if one is ready)."""
        name = f"{role}{rank}"
        if name in self.reported:
            self.reported.discard(name)
            if self.beats is not None:
                self.beats.last.pop(name, None)
            old = self.logs / f"{name}.log"
            if old.exists():
                old.replace(self.logs / f"{name}.lost.log")
        bundle = self.free[role].pop(0) if self.free[role] else None
        got = None if bundle is None or self.bundles[bundle].get("GPU") else self.standby.take(self.bundle_node[bundle])
        if got is not None:  # it runs on the bundle's reservation, which it now holds
            self.actors[name], self.bundle[name], self.offsets[name], self.where[name] = got[0], bundle, 0, got[1]
            self.locating[name] = got[0].adopt.remote(name)
            self.adopted.add(name)
            self.placing.add(name)
            (self.logs / f"{name}.log").touch()
        else:
            self.adopted.discard(name)  # (a server rank started again, now in a fresh actor)
            if bundle is not None:
                self.placing.add(name)
            self._create(role, rank, bundle)
        self._start(role, rank)

    def _never_started(self, name: str) -> bool:
        """Whether `name`'s actor died before it could say where it runs."""
        ref = self.locating.get(name)
        if ref is None:
            return False
        try:
            self.where[name] = self.ray.get(ref, timeout=1)
            del self.locating[name]
            return False
        except self.ray.exceptions.RayError:  # its creation failed (a timeout: it is not running either)
            return True

    def _replace_unplaced(self, name: str, role: str) -> None:
        """A replacement died before it started: the bundle it was given was still on
        the lost node (Ray had not yet seen the node go). Start it again outside the
        placement group, wherever its resources fit."""
        self.placing.discard(name)
        self.locating.pop(name, None)
        bundle = self.bundle.pop(name, None)
        if name in self.adopted:  # the standby died first: a fresh actor on the bundle it held
            self.adopted.discard(name)
            log.warning("%s: the standby it was given died before it started; starting a fresh actor", name)
            self._create(role, int(name[len(role):]), bundle)
            return self._start(role, int(name[len(role):]))
        log.warning("%s could not start in its placement-group bundle; starting it outside the group", name)
        self._create(role, int(name[len(role):]), None)
        self._start(role, int(name[len(role):]))

    def retired(self, role: str, rank: int) -> None:
        self.stopped.add(f"{role}{rank}")

    def started(self) -> None:
        """The job is training: a standby starts warming on each node its roles run on. Not
        before: started with the roles, the standbys' imports of torch competed with theirs
        (three standbys beside five roles on two cores: the first iteration 3 s later)."""
        for node in sorted({w["node"] for w in self.where.values()}):
            self.standby.keep(node)

    def tolerate(self, role: str) -> None:
        self.tolerated.add(role)

    def check(self) -> None:
        """Raise JobError naming the first actor that failed beyond recovery (PeerLost
        for a lost server of a tolerated role), as `Children.check` does."""
        now = time.monotonic()
        if now - self.checked < CHECK_S:
            return
        self.checked = now
        self.standby.poll()
        if self.standby.changed:
            self.write_nodes(wait=False)
        pending = {ref: name for name, ref in self.runs.items()}
        ended, _ = self.ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in ended:
            name = pending[ref]
            del self.runs[name]
            role = name.rstrip("0123456789")
            try:
                error = self.ray.get(ref, timeout=5)
            except self.ray.exceptions.RayError as exc:
                if name in self.placing and self._never_started(name):
                    self._replace_unplaced(name, role)
                    continue
                self._lose(name, f"its Ray actor died ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})", now)
                continue
            if error is not None:
                raise JobError(f"{name} failed: {error}")
            if role == "server" and name not in self.stopped:
                raise JobError(f"{name} ended before the job did")
        if self.beats is not None:
            for name in list(self.runs):
                stuck = self.beats.stuck(name, self.cfg.stuck_s)
                if stuck is not None:
                    raise JobError(f"{name} (node {self.where.get(name, {}).get('ip', '?')}) {stuck}")
                quiet = self.beats.quiet(name, now)
                if quiet is not None:
                    self.ray.kill(self.actors[name], no_restart=True)  # fenced: it must not come back
                    del self.runs[name]
                    self._lose(name, f"stopped answering for {quiet:.1f} s (no heartbeat); killed", now)

    def _lose(self, name: str, reason: str, now: float) -> None:
        role = name.rstrip("0123456789")
        if role not in self.tolerated:
            raise JobError(f"{name} (node {self.where.get(name, {}).get('ip', '?')}) {reason}")
        self.ray.kill(self.actors[name], no_restart=True)
        if self.where.get(name, {}).get("hostname") == socket.gethostname():  # its log, which it cannot remove
            log_path(self.where[name]["pid"], name).unlink(missing_ok=True)
        if name in self.bundle:
            self.bundle_node[self.bundle[name]] = self.where.get(name, {}).get("node", "")
            self.free[role].append(self.bundle.pop(name))
        log.warning("%s lost: %s", name, reason)
        self._report(role, int(name[len(role):]), reason, now)

    # -- logs, nodes, the end -----------------------------------------------------------
    def _pump_logs(self) -> None:
        while not self._pump_stop.wait(LOG_PUMP_S):
            self._copy_logs(list(self.runs))

    def _copy_logs(self, names: list[str]) -> None:
        refs = {name: self.actors[name].tail.remote(self.offsets[name], name) for name in names}
        ready = set(self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=5)[0]) if refs else set()
        for name, ref in refs.items():
            try:
                chunk = self.ray.get(ref, timeout=1) if ref in ready else b""
            except Exception:  # a dead actor: its log stops here
                continue
            if chunk:
                with (self.logs / f"{name}.log").open("ab") as fh:
                    fh.write(chunk)
                self.offsets[name] += len(chunk)

    def write_nodes(self, wait: bool = True) -> None:
        """RUN_DIR/nodes.json: where each process runs (rewritten at the end with any
        replacements, and when a standby is ready: then without waiting for an actor
        still starting), so that an operator can tell which machine holds what."""
        self.standby.changed = False
        docs = [(self.nodes() if wait else dict(self.where), "nodes.json")]
        for doc, name in docs + ([(self.standby.nodes(), "standbys.json")] if self.standby.enabled else []):
            tmp = self.logs.parent / f"{name}.tmp"
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            tmp.replace(self.logs.parent / name)

    def nodes(self) -> dict[str, dict]:
        """Where every process of the job ran (a replacement that never started: absent)."""
        for name, ref in list(self.locating.items()):
            try:
                self.where[name] = self.ray.get(ref, timeout=5)
            except Exception:
                pass  # died before it could say
        self.locating.clear()
        return dict(self.where)

    def stop(self, grace: float) -> None:
        """Wait up to `grace` s for the actors' mains to end, copy the rest of their logs,
        kill them and free the placement group."""
        from ray.util.placement_group import remove_placement_group

        self._pump_stop.set()
        if self._pump.is_alive():
            self._pump.join(timeout=10)
        if self.runs and grace > 0:
            self.ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=grace)
        alive = [n for n in self.actors if n not in self.reported]
        self._copy_logs(alive)
        if alive:
            self.ray.wait([self.actors[n].discard.remote() for n in alive], num_returns=len(alive), timeout=5)
        for actor in self.actors.values():
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass  # already gone
        self.standby.stop()
        # Ray's call has no timeout, and waits forever once this machine's raylet is gone
        # (a Ctrl-C or SIGTERM to the whole process group ends it with the job)
        remover = threading.Thread(target=remove_placement_group, args=(self.pg,), name="ray-pg-remove", daemon=True)
        remover.start()
        remover.join(timeout=10)
        if remover.is_alive():
            log.warning("the job's placement group was not freed within 10 s (is a Ray node gone?): "
                        "left to Ray")


def _connect(cfg: Config) -> bool:
    """Join `ray_address`, or start Ray on this machine; True if this call started or
    joined it (and so shuts it down after the job). An already initialised Ray is used
    as it is."""
    ray = _ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    if cfg.ray_address:
        try:
            ray.init(address=cfg.ray_address, **kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"ray_address = {cfg.ray_address!r}: cannot join a Ray cluster there "
                              f"({str(exc).splitlines()[0][:200]})") from None
    else:  # as many CPUs as the job asks for: the local launcher also oversubscribes
        demand = (sum(cfg.resources("server", r).get("CPU", 0) for r in range(cfg.servers))
                  + sum(cfg.resources("worker", r).get("CPU", 0) for r in range(cfg.workers)))
        # address="local": a new instance, whatever Ray's state file (ray_current_cluster, in
        # its temp folder) or RAY_ADDRESS names: a stale one would capture this job
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(demand + 0.999)), **kwargs)
    reinstall_interrupts()  # ray.init's SIGTERM handler exits wherever the main thread is
    return True


def preflight(cfg: Config) -> None:
    """What can be checked before the run directory is made: Ray is installed and the
    cluster at `ray_address` answers (ConfigError otherwise)."""
    _ray()
    if cfg.ray_address:
        _reachable(cfg.ray_address, min(cfg.timeout, 10.0))


def _reachable(address: str, timeout: float) -> None:
    """ConfigError unless `address` ("auto" or HOST:PORT of a Ray head) answers within
    `timeout` s: Ray itself retries an unreachable head for minutes."""
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://") or not sep or not port.isdigit():
        raise ConfigError(f"ray_address = {address!r} is neither \"auto\" nor HOST:PORT of a Ray head "
                          "(Ray Client's ray:// addresses are not supported: run the job on the cluster)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(f"ray_address = {address!r}: no Ray head answers there within {timeout:g} s "
                          f"({exc})") from None


def _check_addresses(cfg: Config, ray) -> str:
    """The driver's node address; refuse to listen beyond loopback unauthenticated."""
    here = ray.util.get_node_ip_address()
    ips = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")} | {here})
    remote = [ip for ip in ips if not _loopback(ip)]
    if remote and cfg.auth == "off":
        raise ConfigError(f"auth = \"off\" on a Ray cluster with nodes at {', '.join(remote)}: anyone who can "
                          "reach them could join the job; use auth = \"curve\"")
    if remote and cfg.auth == "plain":
        warnings.warn(f"auth = \"plain\" on a Ray cluster with nodes at {', '.join(remote)}: the job's "
                      "passwords cross the network in clear; use auth = \"curve\" (encrypted)",
                      EquipoiseWarning, stacklevel=3)
    return here


def run_ray(cfg: Config, run_dir: Path, data, resume: Checkpoint | None = None) -> dict:
    """Run one job on a Ray cluster and return its summary."""
    t0 = time.time()
    started = _connect(cfg)
    ray = _ray()
    transport = listener = peers = beats = None
    clean = False
    try:
        here = _check_addresses(cfg, ray)
        keys = job_keys(cfg)
        transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20,
                                   keys=keys["coordinator"] if keys else None)
        listener = transport.listen(here)
        if cfg.heartbeat_s > 0:
            beats = Heartbeats(transport.listen(here), cfg.heartbeat_s)
        builtin = getattr(data.train, "data", None) if cfg.dataset in DATASETS else None
        # A built-in dataset travels once per node; a user's provider runs on every node.
        shipped = ray.put(builtin.to_arrays()) if cfg.ray_data == "ship" and builtin is not None else None
        peers = RayPeers(cfg, run_dir, listener.address, keys, beats, shipped)
        coord = make_coordinator(cfg, run_dir, transport, listener, data, peers=peers, resume=resume)
        summary = coord.run()
        gcs = ray.get_runtime_context().gcs_address  # the instance used: started here, or the caller's
        own = f"(started here: {gcs})" if started else f"(the caller's: {gcs})"
        summary["launcher"] = {"kind": "ray", "address": cfg.ray_address or own,
                               "driver": {"ip": here, "hostname": socket.gethostname(), "pid": os.getpid()},
                               "startup_s": round(coord.started_at - t0, 3)}
        summary["nodes"] = peers.nodes()
        peers.write_nodes()
        clean = True
        return summary
    finally:
        if peers is not None:
            peers.stop(grace=10.0 if clean else 0.0)
        if beats is not None:
            beats.close()
        if listener is not None:
            listener.close()
        if transport is not None:
            transport.close()
        if started:
            ray.shutdown()
