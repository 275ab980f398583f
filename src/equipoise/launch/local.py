"""The local launcher: the coordinator runs in this process, servers and workers as child
processes on this machine, all talking ZeroMQ over loopback.

With `auth` other than "off" it generates the job's keys (wire/auth.py) and gives each
child its role's keys, with the config, on the child's stdin (launch/proc.py): never on
a command line, in the environment, a log or the run directory.

Whatever happens — success, a dead child, a timeout, Ctrl-C — every child (and every
noisy-neighbour burner and cgroup) is cleaned up before `run_local` returns or raises, so
no process is orphaned and every port is freed.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..config import Config
from ..neighbour import Burner, start_burner
from ..scenario import Scenario, ServerAdd, WorkerJoin
from ..wire import JobKeys, Listener, Message, generate_keys, make_transport
from ..wire.auth import identity
from ..protocol.checkpoint import Checkpoint
from ..user_code import Busy
from ..coordinator.pacings import make_coordinator
from ..coordinator.rpc import JobError, LaunchedPeers
from .cgroup import CpuLimit
from .warm import Template, WarmProcess, adopt, job_env, job_folder

MISSED_BEATS = 3  # heartbeats missed before a process counts as lost
SPARE_SERVERS = 16  # server ranks with credentials beyond those the config can add (control.jsonl's)
MAX_RANK, MAX_BEATING = 1 << 20, 4096  # bounds on what a beat may name, and on the names kept


def job_keys(cfg: Config) -> dict[str, JobKeys] | None:
    """The job's credentials (None under auth = "off"): one per process it may ever run,
    every worker rank including those the scenario adds and replacements, every server
    rank including those added while it runs (PSLD, the scenario, and SPARE_SERVERS more
    for control.jsonl)."""
    if cfg.auth == "off":
        return None
    scenario = Scenario.of(cfg)
    joins = sum(e.count for e in scenario.membership if isinstance(e, WorkerJoin))
    added = sum(e.count for e in scenario.server_events if isinstance(e, ServerAdd)) + max(0, cfg.psld_max_servers)
    return generate_keys(cfg.auth, workers=cfg.workers + joins + cfg.worker_restarts,
                         servers=cfg.servers + added + SPARE_SERVERS)


def process_keys(keys: dict[str, JobKeys] | None, role: str, rank: int) -> dict | None:
    """The credentials of `role` `rank`, as the document a child reads; JobError if the
    job has none for it (more servers added than it made credentials for)."""
    if keys is None:
        return None
    mine = keys.get(identity(role, rank))
    if mine is None:
        raise JobError(f"no credentials for {role} {rank}: this job made them for "
                       f"{sum(k.role == role for k in keys.values())} {role}s")
    return mine.to_dict()


class Heartbeats:
    """A thread that takes every child's heartbeat and answers it (so a child can tell
    that the coordinator is gone). A child that has beaten once and then misses
    MISSED_BEATS periods is `quiet`. Under authentication a beat counts only for the
    process whose credentials sent it: no process can keep another alive."""

    def __init__(self, listener: Listener, period: float):
        self.listener, self.period = listener, period
        self.last: dict[str, float] = {}
        self.busy: dict[str, Busy] = {}  # a worker's longest call into user code, as its last beat said
        self.polled = time.monotonic()  # when this thread last looked: it may be starved too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.listener.recv(timeout=0.2)
            self.polled = time.monotonic()
            if got is None:
                continue
            peer, msg = got
            try:
                if msg.type == "beat":
                    role, rank = msg.fields["role"], int(msg.fields["rank"])
                    name = f"{role}{rank}"
                    if role not in ("worker", "server") or not 0 <= rank < MAX_RANK or (
                            name not in self.last and len(self.last) >= MAX_BEATING):
                        raise ValueError(f"not a process of this job: {name[:40]!r}")
                    if msg.origin is not None and (msg.origin, msg.origin_rank) != (role, rank):
                        raise ValueError(f"a beat for {name} from {msg.origin} {msg.origin_rank}")  # spoofed
                    self.last[name] = time.monotonic()
                    busy = _busy(msg.fields.get("busy")) if role == "worker" else None
                    if busy is None:
                        self.busy.pop(name, None)
                    else:
                        self.busy[name] = busy
                    self.listener.send(peer, Message("beat", {"role": "coordinator", "rank": 0}))
            except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):
                pass  # not a beat we understand: nothing to answer, nothing kept

    def quiet(self, name: str, now: float) -> float | None:
        """Seconds since `name`'s last beat, if that is more than MISSED_BEATS periods
        (and this thread has been reading beats meanwhile)."""
        last = self.last.get(name)
        if last is None or now - last <= MISSED_BEATS * self.period or now - self.polled > self.period:
            return None
        return now - last

    def stuck(self, name: str, bound: float) -> str | None:
        """What `name` is stuck in, if its last beat said it had been inside one call of
        user code for more than `bound` seconds (0: never)."""
        busy = self.busy.get(name)
        if not bound or busy is None or busy.for_s <= bound:
            return None
        return (f"is stuck in {busy.describe()} for {busy.for_s:.0f} s (stuck_s = {bound:g}); "
                "its slice is not re-planned: the other workers would reach the same sample")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.listener.close()


def _busy(value) -> Busy | None:
    """A beat's `busy` field ([what, iteration, sample, for_s]) read, or None if absent or
    malformed (a beat is never refused for it)."""
    if not isinstance(value, list) or len(value) != 4:
        return None
    what, iteration, sample, for_s = value
    if not (isinstance(what, str) and all(isinstance(v, int) and not isinstance(v, bool) for v in (iteration, sample))
            and isinstance(for_s, (int, float)) and not isinstance(for_s, bool) and math.isfinite(for_s)):
        return None
    return Busy(what[:80], max(-1, min(iteration, MAX_RANK << 20)), max(-1, min(sample, 1 << 62)), max(0.0, float(for_s)))


class Children(LaunchedPeers):
    """The job's child processes, with their logs under run_dir/logs/; the
    coordinator's `Peers`: it starts a role, says if one died or froze, hears of
    planned stops. A process of a tolerated role killed by a signal or silent for
    MISSED_BEATS heartbeats (then killed, so that it cannot come back) is `lost`; a
    process that exits with an error of its own fails the job."""

    def __init__(self, cfg: Config, run_dir: Path, coordinator: str, keys: dict[str, JobKeys] | None = None,
                 beats: Heartbeats | None = None):
        super().__init__()
        self.cfg, self.coordinator, self.keys, self.beats = cfg, coordinator, keys, beats
        self.procs: dict[str, subprocess.Popen | WarmProcess] = {}
        self.tolerated: set[str] = set()
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # The children's temporary files (their ipc sockets) in a folder of the job's: a
        # process killed by a signal cannot remove its own; `stop` removes the folder.
        # Children start warm (launch/warm.py), from the template started early if any.
        early = adopt(cfg.threads)
        if early is not None:
            self.env, self.tmp, self.template = early
        else:
            self.env = child_env(cfg)
            self.tmp = job_folder(self.env)
            self.template = Template(self.env, min(cfg.timeout, 120.0), self.logs / "template.log")
        self.limits: dict[int, CpuLimit] = {}
        self.stopped: set[str] = set()  # processes stopped on purpose (elastic servers)
        tag = f"equipoise-{os.getpid()}"
        try:
            for rank, cpus in enumerate(cfg.cpu_limit):
                self.limits[rank] = CpuLimit(f"{tag}-worker{rank}", cpus)
            for rank in range(cfg.servers):
                self.spawn("server", rank)
            for rank in range(cfg.workers):
                self.spawn("worker", rank)
        except BaseException:
            self.template.close()
            for proc in self.procs.values():  # those started before the failure
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            self._remove_tmp()
            raise

    def spawn(self, role: str, rank: int) -> None:
        """Start `role` `rank` (again, if it was lost: its log is kept as NAME.lost.log)."""
        name = f"{role}{rank}"
        if name in self.reported:  # a replacement under the same name
            self.reported.discard(name)
            if self.beats is not None:
                self.beats.last.pop(name, None)
            (self.logs / f"{name}.log").replace(self.logs / f"{name}.lost.log")
        job = {"config": self.cfg.to_dict(), "keys": process_keys(self.keys, role, rank),
               "beats": self.beats.listener.address if self.beats else ""}
        warm = self.template.spawn(role, rank, self.coordinator, self.logs / f"{name}.log", job)
        if warm is not None:
            self.procs[name] = warm
        else:  # cold: a fresh interpreter, the job on its stdin
            with (self.logs / f"{name}.log").open("w") as log:
                self.procs[name] = proc = subprocess.Popen(
                    [sys.executable, "-m", "equipoise.launch.proc", role, str(rank), self.coordinator],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=self.env)
            _write_all(proc.stdin, json.dumps(job).encode(), self.cfg.timeout)
        if role == "worker" and rank in self.limits:
            self.limits[rank].add(self.procs[name].pid)

    def retired(self, role: str, rank: int) -> None:
        """`role` `rank` was stopped on purpose (an elastic server): its exit is no failure."""
        self.stopped.add(f"{role}{rank}")

    def tolerate(self, role: str) -> None:
        self.tolerated.add(role)

    def check(self) -> None:
        """Raise JobError naming the first child that failed beyond recovery. Workers
        exit 0 when told to stop; servers only after the job."""
        now = time.monotonic()
        for name, proc in self.procs.items():
            if name in self.reported:
                continue
            role = name.rstrip("0123456789")
            code = proc.poll()
            if code is None:
                stuck = self.beats.stuck(name, self.cfg.stuck_s) if self.beats else None
                if stuck is not None:
                    raise JobError(f"{name} (pid {proc.pid}) {stuck}")
                quiet = self.beats.quiet(name, now) if self.beats else None
                if quiet is None:
                    continue
                proc.kill()  # fenced: a frozen process must not come back
                proc.wait(timeout=5)
                reason = f"stopped answering for {quiet:.1f} s (no heartbeat); killed"
            elif code == 0 and (role != "server" or name in self.stopped):
                continue
            elif code >= 0:
                raise JobError(f"{name} (pid {proc.pid}) exited with code {code}: {self.last_error(name)}")
            else:
                reason = f"exited with code {code} (signal {-code})"
            if role not in self.tolerated:
                raise JobError(f"{name} (pid {proc.pid}) {reason}: {self.last_error(name)}")
            self._report(role, int(name[len(role):]), reason, now)

    def last_error(self, name: str) -> str:
        lines = (self.logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("error:")]
        return (errors or lines or ["(no output)"])[-1][:300]

    def stop(self, grace: float) -> None:
        try:
            deadline = time.monotonic() + grace
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.terminate()
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=3)
            for limit in self.limits.values():
                limit.remove()
        finally:
            self.template.close()
            self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self.tmp is not None:
            early_log = Path(self.tmp) / "template.log"  # an early template's (warm.prestart)
            try:
                if early_log.exists() and early_log.stat().st_size:
                    shutil.copyfile(early_log, self.logs / "template.log")
            except OSError:  # the log is a help, not a reason to leave the folder behind
                pass
            shutil.rmtree(self.tmp, ignore_errors=True)


def _write_all(pipe, data: bytes, timeout: float) -> None:
    """Write `data` to a child's stdin and close it, within `timeout` seconds; a child
    that died meanwhile is left for `Children.check` to report."""
    fd, deadline = pipe.fileno(), time.monotonic() + timeout
    os.set_blocking(fd, False)
    try:
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError(f"a child did not read its job from stdin within {timeout:g} s")
            data = data[os.write(fd, data):]
    except BrokenPipeError:
        pass
    finally:
        pipe.close()


class Neighbours:
    """Starts and stops the scenario's CPU burners beside their workers on schedule."""

    def __init__(self, cfg: Config, children: Children):
        self.specs = Scenario.of(cfg).neighbours
        self.children = children
        self.running: dict[int, Burner] = {}

    def tick(self, elapsed: float) -> None:
        for i, n in enumerate(self.specs):
            active = n.active(elapsed)
            if active and i not in self.running:
                self.running[i] = self._start(n)
            elif not active and i in self.running:
                self.running.pop(i).stop()

    def _start(self, n) -> Burner:
        pid = self.children.procs[f"worker{n.worker}"].pid
        burner = start_burner(pid, n.share)
        limit = self.children.limits.get(n.worker)
        if limit is not None:  # compete for the worker's own quota, like a co-located job
            limit.add(burner.pid)
        return burner

    def stop(self) -> None:
        for burner in self.running.values():
            burner.stop()
        self.running.clear()


def child_env(cfg: Config) -> dict[str, str]:
    """The environment the job's processes start with (the working directory is this
    process's): this one's, with `threads` for OpenMP and MKL."""
    return job_env(cfg.threads)


def run_local(cfg: Config, run_dir: Path, data, resume: Checkpoint | None = None) -> dict:
    """Run one job on this machine and return its summary."""
    t0 = time.time()
    keys = job_keys(cfg)
    transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20,
                               keys=keys["coordinator"] if keys else None)
    listener = transport.listen(cfg.listen_host)
    children = neighbours = beats = None
    clean = False
    try:
        if cfg.heartbeat_s > 0:
            beats = Heartbeats(transport.listen(cfg.listen_host), cfg.heartbeat_s)
        children = Children(cfg, run_dir, listener.address, keys, beats)
        neighbours = Neighbours(cfg, children)
        coord = make_coordinator(cfg, run_dir, transport, listener, data, peers=children, resume=resume,
                                 on_tick=neighbours.tick if cfg.neighbours else None)
        summary = coord.run()
        host = socket.gethostname()
        summary["launcher"] = {"kind": "local", "startup_s": round(coord.started_at - t0, 3),
                               "driver": {"ip": cfg.listen_host, "hostname": host, "pid": os.getpid()}}
        summary["nodes"] = {name: {"ip": cfg.listen_host, "hostname": host, "pid": proc.pid}
                            for name, proc in children.procs.items()}
        clean = True
        return summary
    finally:
        if neighbours is not None:
            neighbours.stop()
        if children is not None:
            children.stop(grace=10.0 if clean else 0.0)
        if beats is not None:
            beats.close()
        listener.close()
        transport.close()
