"""The coordinator's main loop: it owns the plan of the job.

It registers servers and workers, cuts the model into blocks and places them, hands each
worker its slice of every iteration, collects worker reports into metrics.jsonl, takes
consistent snapshots for evaluation and checkpoints, and finally stops everyone.

Under a barrier protocol the coordinator answers the plan requests of iteration t only
once every worker has asked, i.e. once all pushes of t−1 are acknowledged. That costs
nothing extra (the servers' barrier waits for the same last push), lets the batching
policy decide iteration t from all reports of t−1, and gives the snapshot of version t a
quiet moment in which no update is in flight.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch

from ..config import Config
from ..models import build_model
from ..policy.placement import Block, greedy_placement, make_blocks, oracle_placement, placement_blocks
from ..policy.sync import make_sync_policy
from ..telemetry.metrics import MetricsWriter
from ..telemetry.progress import ProgressDisplay
from ..wire import Listener, Message, Transport
from .blocks import model_tensors, read_values, write_values
from .checkpoint import Checkpoint, CheckpointError, save_checkpoint
from .elastic import ServerPool
from .evaluate import evaluate
from .planner import Planner
from .psld import PsldController
from .stats import RunStats
from .store import OptimizerSpec

log = logging.getLogger("equipoise.coordinator")


REPORT_KEYS = ("iteration", "samples", "loss", "compute_s", "wait_s", "comm_s")


class JobError(RuntimeError):
    """The job cannot go on (a peer died, timed out or refused); the message names it."""


class Coordinator:
    def __init__(self, cfg: Config, run_dir: Path, transport: Transport, listener: Listener, data,
                 *, check_peers: Callable[[], None] = lambda: None, resume: Checkpoint | None = None,
                 spawn_worker: Callable[[int], None] | None = None,
                 on_tick: Callable[[float], None] | None = None,
                 spawn_server: Callable[[int], None] | None = None,
                 retire_server: Callable[[int], None] | None = None):
        """`check_peers` raises if a peer process died; `spawn_worker(rank)` starts a
        worker process for a membership join; `on_tick(elapsed)` is called about every
        0.1 s of training with the seconds since training started (noisy neighbours);
        `spawn_server(rank)` starts a server process and `retire_server(rank)` says one
        stopped on purpose (elastic servers)."""
        self.spawn_server, self.retire_server = spawn_server, retire_server
        self.cfg, self.run_dir, self.transport, self.listener = cfg, Path(run_dir), transport, listener
        self.data, self.check_peers, self.resume = data, check_peers, resume
        self.spawn_worker, self.on_tick = spawn_worker, on_tick
        self.events_done: set[int] = set()
        self.total = cfg.total_iterations(len(data))
        self.sync = make_sync_policy(cfg.protocol, softsync_n=cfg.softsync_n or cfg.workers,
                                     staleness_bound=cfg.staleness_bound, lr_modulation=cfg.lr_modulation)
        self.iteration = resume.iteration if resume else 0
        self.cursor = resume.cursor if resume else self.iteration * cfg.global_batch
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")
        self.stats = RunStats(cfg.global_batch)
        self.display = ProgressDisplay(self.total, cfg.progress, start=self.iteration)
        self.evals: ThreadPoolExecutor = ThreadPoolExecutor(1, thread_name_prefix="eval")
        self.pending_eval: list[Future] = []
        self.stopped: set[int] = set()
        self.done: set[int] = set()  # stopped and every request of theirs answered
        self.histogram: dict[int, int] = {}  # σ of every gradient applied, over all servers
        self.workers: dict[int, bytes] = {}
        self.pool: ServerPool | None = None
        self.known_table: dict[int, int] = {}  # the table version each worker was sent
        self._snapshot_at: int | None = None  # a barrier re-entered after a join snapshots once
        self.servers_done: set[int] = set()  # iterations whose server work is done (re-entered barriers)
        self.psld = None
        self._barrier_at: dict[int, float] = {}
        self._control_offset = 0
        self._factors: dict[int, tuple] = {}
        self._added: list[int] = []
        self._table_at = 0
        self._spawning: dict[int, tuple[float, bool]] = {}  # rank -> (started, asked by PSLD)
        self._hellos: dict[int, str] = {}  # servers that registered while training ran
        self._planned: dict[int, int] = {}  # server_events additions: rank -> join iteration
        self._last_rates: dict[int, float] = {}

    # -- the job ------------------------------------------------------------------------
    def run(self) -> dict:
        start = time.time()
        try:
            servers, held_hellos = self._register()
            self._init_servers(servers)
            for rank, peer in sorted(held_hellos.items()):
                self.listener.send(peer, self._welcome(rank))
            self._event("started", self.iteration, time=start, resumed=self.resume is not None)
            self._train()
            return self._finish(start)
        finally:
            self.display.close()
            self.evals.shutdown(wait=True)
            if self.pool is not None:
                self.pool.close()
            self.metrics.close()

    def _register(self) -> tuple[list[str], dict[int, bytes]]:
        """Wait until every server and worker has said hello (worker replies are held)."""
        servers: dict[int, str] = {}
        workers: dict[int, bytes] = {}
        deadline = time.monotonic() + self.cfg.timeout
        while len(servers) < self.cfg.servers or len(workers) < self.cfg.workers:
            self._tick(deadline, "waiting for servers and workers to register "
                       f"({len(servers)}/{self.cfg.servers} servers, {len(workers)}/{self.cfg.workers} workers)")
            got = self.listener.recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if msg.type != "hello":
                self.listener.send(peer, Message("error", {"message": f"unexpected {msg.type!r} before start"}))
            elif msg.fields["role"] == "server":
                servers[msg.fields["rank"]] = msg.fields["address"]
            elif msg.fields["role"] == "worker":
                workers[msg.fields["rank"]] = peer
        self.workers = workers
        return [servers[r] for r in range(self.cfg.servers)], workers

    def _init_servers(self, addresses: list[str]) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, self.data.input_shape, self.data.num_classes)
        self.blocks, table = self._place(model_tensors(self.model))
        values, optim, version, samples = read_values(self.model, self.blocks), {}, 0, 0
        if self.resume is not None:
            self._check_resume_blocks()
            values, optim = self.resume.values, self.resume.optim
            version, samples = self.resume.version, self.resume.samples
        spec = OptimizerSpec(cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.lr_schedule,
                             self.total, cfg.lr_step_size, cfg.lr_gamma, cfg.global_batch)
        self.spec = spec
        self.pool = ServerPool(self, addresses, table, self.blocks)
        for s in self.pool.live():
            mine = [b for b in self.blocks if table[b.key] == s]
            self.pool.conns[s].send(self._init_message(s, mine, values, optim, version, samples))
        for s in self.pool.live():
            self._expect(self.pool.conns[s], "ready", f"server {s}")
        if cfg.placement == "psld":
            self.psld = PsldController([b.nbytes for b in self.blocks], epsilon=cfg.psld_epsilon,
                                       max_servers=cfg.psld_max_servers, seed=cfg.seed)

    def _place(self, tensors) -> tuple[list[Block], list[int]]:
        """Blocks and their servers by the `placement` policy. `oracle` is the best
        static assignment for the configured `server_slowdown` (throughput 1/factor)."""
        cfg = self.cfg
        if cfg.placement == "oracle":
            blocks = make_blocks(tensors, cfg.block_size)
            rates = [1.0 / f for f in (cfg.server_slowdown or [1.0] * cfg.servers)]
            return blocks, oracle_placement([b.nbytes for b in blocks], rates)
        if cfg.placement in ("greedy", "psld"):
            blocks = make_blocks(tensors, cfg.block_size)
            return blocks, greedy_placement([b.nbytes for b in blocks], cfg.servers)
        return placement_blocks(cfg.placement, tensors, cfg.servers, cfg.block_size)

    def _init_message(self, rank: int, mine: list[Block], values, optim, version: int, samples: int) -> Message:
        cfg = self.cfg
        keys = {b.key for b in mine}
        tensors = {f"b{b.key}": values[b.key] for b in mine}
        tensors.update({f"s{n}": t for n, t in optim.items() if int(n.split(".")[0]) in keys})
        return Message("init", {
            "blocks": [b.to_list() for b in mine], "optimizer": self.spec.to_dict(),
            "version": version, "samples": samples, "protocol": cfg.protocol,
            "workers": len(self.workers) - len(self.stopped) if self.workers else cfg.workers,
            "softsync_n": cfg.softsync_n or cfg.workers,
            "staleness_bound": cfg.staleness_bound, "lr_modulation": cfg.lr_modulation,
            "straggler": self._straggler(rank, 0.0, 0)}, tensors)

    def _straggler(self, rank: int, elapsed: float, t: int) -> dict:
        """Server `rank`'s emulated slowdown now (static factor or trace) and link cap."""
        cfg = self.cfg
        factor = cfg.server_slowdown[rank] if rank < len(cfg.server_slowdown) else 1.0
        if cfg.server_trace:
            trace = self._server_trace()
            factor = trace.factor(rank, elapsed if trace.unit == "time" else t) if rank in trace._index else factor
        out = {"factor": factor, "rate_mbps": cfg.server_rate}
        if rank < len(cfg.server_bandwidth):
            out["bandwidth_mbps"] = cfg.server_bandwidth[rank]
        return out

    def _server_trace(self):
        if not hasattr(self, "_trace"):
            from ..scenario import Trace
            self._trace = Trace.from_csv(self.cfg.server_trace, column="server")
        return self._trace

    def _check_resume_blocks(self) -> None:
        if [Block.from_list(r) for r in self.resume.blocks] != self.blocks:
            raise CheckpointError("checkpoint blocks do not match this model and block_size: "
                                  "resume with the configuration the checkpoint was written with")

    # -- training -----------------------------------------------------------------------
    def _train(self) -> None:
        self._start_planned_servers()
        self.planner = Planner(self.cfg, sorted(self.workers))
        self.waiting: dict[int, tuple[bytes, float]] = {}
        self.reports: dict[int, list[dict]] = {}
        while len(self.done) < len(self.workers):
            self._tick(None, "")
            if self.on_tick is not None and self.stats.t_start is not None:
                self.on_tick(self.stats.elapsed())
            got = self.listener.recv(timeout=0.1)
            if got is None:
                self._check_stalled()
                continue
            peer, msg = got
            if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self._spawning:
                self._hellos[int(msg.fields["rank"])] = str(msg.fields["address"])
                continue
            if msg.type == "table_req":
                try:
                    self._on_table_req(peer, msg.fields)
                except (KeyError, TypeError, ValueError) as exc:
                    self.listener.send(peer, Message("error", {"message": f"bad table request: {exc}"}))
                continue
            if msg.type != "plan_req":
                self.listener.send(peer, Message("error", {"message": f"coordinator does not accept {msg.type!r} now"}))
                continue
            try:
                self._on_plan_req(peer, msg.fields)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("refused a plan request from %s: %s: %s", peer.hex(), type(exc).__name__, exc)
                self.waiting = {w: v for w, v in self.waiting.items() if v[0] != peer}
                self.listener.send(peer, Message("error", {"message": f"bad plan request: {exc}"}))

    def _on_plan_req(self, peer: bytes, f: dict) -> None:
        worker = int(f["worker"])
        if worker not in self.workers:
            self.listener.send(peer, Message("error", {"message": f"unknown worker {worker}"}))
            return
        if f["step"] > 0 and f["report"]:
            self._collect(worker, f["report"])
        self.waiting[worker] = (peer, time.monotonic())
        if worker in self.stopped:  # with overlap, a request sent ahead of the stop
            return self._stop(worker)
        if self.sync.barrier():
            if len(self.waiting) == len(self.workers) - len(self.stopped):
                self._advance_barrier()
        else:
            self._advance_async(worker)

    def _advance_barrier(self) -> None:
        """Every worker waits for iteration t: snapshot if due, then hand out slices.
        The reports of t−1 are digested after the replies, so predictor training overlaps
        the workers' pulls; LB-BSP sizes thus react to speeds up to t−2."""
        t = self.iteration
        self._maybe_snapshot(t)
        if t >= self.total:
            self._end_iteration(t - 1)
            return self._stop_all()
        if self._membership(t):
            return  # a joining worker's first plan request completes the barrier
        actions = self._servers_at_barrier(t)
        sizes = self.planner.sizes()
        for w, (offset, size) in self.planner.slices(sizes).items():
            self._reply_plan(w, t, t * self.cfg.global_batch + offset, size, version=t,
                             await_table=bool(actions))
        self.iteration += 1
        if actions:  # workers compute meanwhile; they ask for the table before pushing
            self._carry_out(t, actions)
        self._end_iteration(t - 1)

    def _advance_async(self, worker: int) -> None:
        """ASP: the asking worker gets the next μ positions of the global stream."""
        end = self.total * self.cfg.global_batch
        if self.cursor >= end:
            return self._stop(worker)
        size = min(self.planner.sizes()[worker], end - self.cursor)
        before = self.cursor // self.cfg.global_batch
        self._reply_plan(worker, before, self.cursor, size, version=0)
        self.cursor += size
        self.iteration = self.cursor // self.cfg.global_batch
        if self.iteration > before:
            self._maybe_snapshot(self.iteration)

    def _reply_plan(self, worker: int, iteration: int, start: int, size: int, version: int,
                    await_table: bool = False) -> None:
        peer, since = self.waiting.pop(worker)
        self.stats.begin()
        extra = {}
        if await_table:  # blocks move while this iteration computes: ask before pushing
            extra = {"await_table": True}
        elif self.known_table.get(worker, 0) < self.pool.version:  # route by the new table
            extra = {"table": self.pool.table, "servers": self.pool.addresses}
            self.known_table[worker] = self.pool.version
        self.listener.send(peer, _plan(iteration, start, size, version, stop=False,
                                       held_s=time.monotonic() - since, elapsed=self.stats.elapsed(), **extra))

    def _stop(self, worker: int) -> None:
        """Tell a worker to stop. A worker with requests sent ahead (overlap) is done once
        it has had a stop for each; under SSP the servers stop counting its clock."""
        peer, _ = self.waiting.pop(worker)
        self.listener.send(peer, _plan(self.iteration, 0, 0, 0, stop=True, held_s=0.0))
        if worker in self.stopped or not self.cfg.overlap:
            self.done.add(worker)
        if worker in self.stopped:
            return
        self.stopped.add(worker)
        if self.sync.clocked:
            active = len(self.workers) - len(self.stopped)
            self.pool.broadcast(Message("members", {"workers": max(1, active), "retired": [worker]}), "ack")

    def _stop_all(self) -> None:
        for w in sorted(self.waiting):
            self._stop(w)

    # -- servers: measurements, stragglers, migration, elasticity (PSLD) ---------------------
    def _servers_at_barrier(self, t: int) -> list[tuple]:
        """At the barrier of iteration t (every server at version t, nothing pending or
        in flight): update emulated server slowdowns, measure the servers every
        `psld_interval` iterations, and return the block moves and server additions and
        removals due — from `server_events`, run_dir/control.jsonl and PSLD — which
        `_carry_out` performs once the plans of t are out."""
        if t in self.servers_done:
            return []
        self.servers_done.add(t)
        cfg = self.cfg
        self._barrier_at[t] = time.perf_counter()
        if cfg.server_trace:
            for r in self.pool.live():
                now = self._straggler(r, self.stats.elapsed(), t)
                if self._factors.get(r) != tuple(sorted(now.items())):
                    self._factors[r] = tuple(sorted(now.items()))
                    self.pool.request(r, Message("straggle", now), "ack")
        actions: list[tuple] = []
        for rank, at in sorted(self._planned.items()):
            if at <= t:  # started when the job did; joins now, waiting for it if need be
                del self._planned[rank]
                actions.append(("join", rank, self._await_server(rank)))
        for ev in cfg.server_events:
            if ev["iteration"] == t and "add" not in ev:
                actions.append(("remove", ev["remove"]) if "remove" in ev else ("move", ev["move"], None, ev["to"]))
        actions += self._control_actions()
        actions += self._arrived_servers(t)
        if t > 0 and t % cfg.psld_interval == 0:
            measured = self._measure_servers(t)
            if self.psld is not None and not actions and measured["iteration_s"]:
                actions = self.psld.decide(self.pool.table, self.pool.live(), measured["throughput"],
                                           measured["iteration_s"], set(self._added))
        return actions

    def _carry_out(self, t: int, actions: list[tuple]) -> None:
        """Perform server actions while the workers compute iteration t on the weights
        they already pulled; each asks for the resulting table (`table_req`) before its
        first push, so a worker waits only if the moves outlast its compute."""
        pause = 0.0
        for action in actions:
            try:
                pause += self._server_action(t, action)
            except (ValueError, KeyError) as exc:  # a bad request is refused, training goes on
                log.warning("server action %s refused: %s", action, exc)
                self._event("server_action_refused", t, action=list(action), reason=str(exc))
        self._table_at = t
        if pause and self.psld is not None:
            self.psld.charge(pause)

    def _on_table_req(self, peer: bytes, f: dict) -> None:
        worker = int(f["worker"])
        self.known_table[worker] = self.pool.version
        self.listener.send(peer, Message("table", {"table": self.pool.table, "servers": self.pool.addresses,
                                                   "version": self._table_at}))

    def _server_action(self, t: int, action: tuple) -> float:
        kind = action[0]
        if kind == "move":
            done = self.pool.move([int(action[1])], int(action[3]))
            if done["blocks"]:
                self._event("block_moved", t, **done, table_version=self.pool.version)
            return done["pause_s"]
        if kind == "add":  # start the process now; it joins at a barrier once registered
            if self.spawn_server is None:
                raise ValueError("this launcher cannot add servers while training runs")
            rank = max([len(self.pool.conns) - 1, *self._spawning]) + 1
            self._spawning[rank] = (time.monotonic(), len(action) > 1)
            self.spawn_server(rank)
            self._event("server_starting", t, server=rank)
            return 0.0
        if kind == "join":  # a started server registered: initialise it empty
            rank, address = int(action[1]), str(action[2])
            version, samples = self._server_progress()
            done = self.pool.add(rank, address, self._init_message(rank, [], {}, {}, version, samples))
            self._added.append(rank)
            self._event("server_added", t, **done, table_version=self.pool.version)
            return done["pause_s"]
        if kind == "remove":
            rank = int(action[1])
            done = self.pool.remove(rank, self._last_rates)
            self._event("server_removed", t, **done, table_version=self.pool.version)
            return done["pause_s"]
        raise ValueError(f"unknown server action {action!r}")

    def _server_progress(self) -> tuple[int, int]:
        """(version, samples) every server holds at this barrier."""
        r = self.pool.table[0]  # a server that holds blocks, so is at the current version
        reply = self.pool.request(r, Message("state_req", {"version": 0}), "state")
        return int(reply.fields["version"]), int(reply.fields["samples"])

    def _measure_servers(self, t: int) -> dict:
        """Each server's busy seconds, bytes and load since the last measurement, and the
        mean iteration time — written as a "servers" record."""
        interval = self.cfg.psld_interval
        stats = self.pool.broadcast(Message("stats_req", {}), "stats")
        since = self._barrier_at.get(t - interval)
        # Wall time per iteration, any worker pause for migrations included: that is the
        # migrations' measured cost.
        iteration_s = (self._barrier_at[t] - since) / interval if since is not None else None
        throughput = {r: m.fields["bytes"] / m.fields["busy_s"] for r, m in stats.items()
                      if m.fields["busy_s"] > 0 and m.fields["bytes"] > 0}
        self._last_rates = throughput
        ranks = sorted(stats)
        self.metrics.write({
            "type": "servers", "iteration": t, "time": time.time(), "elapsed": self.stats.elapsed(),
            "servers": ranks, "load_bytes": [stats[r].fields["load_bytes"] for r in ranks],
            "blocks": [stats[r].fields["blocks"] for r in ranks],
            "busy_s": [stats[r].fields["busy_s"] for r in ranks],
            "bytes": [stats[r].fields["bytes"] for r in ranks],
            "throughput_mbps": [throughput.get(r, 0.0) / 1e6 for r in ranks],
            "iteration_s": iteration_s, "table_version": self.pool.version})
        return {"throughput": throughput, "iteration_s": iteration_s}

    def _control_actions(self) -> list[tuple]:
        """Requests a user appended to run_dir/control.jsonl while the job runs
        (`equipoise ctl`); a malformed line is reported and skipped."""
        path = self.run_dir / "control.jsonl"
        try:
            with path.open("rb") as fh:
                fh.seek(self._control_offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # only whole lines
        self._control_offset += end
        out = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            try:
                out.append(parse_control(line))
            except ValueError as exc:
                log.warning("control.jsonl: %s", exc)
                self._event("control_refused", self.iteration, line=line[:200], reason=str(exc))
        return out

    def _start_planned_servers(self) -> None:
        """Servers that `server_events` add at iteration N start with the job, so the
        join at N costs an initialisation, not a process start."""
        for ev in sorted(self.cfg.server_events, key=lambda e: e["iteration"]):
            for _ in range(ev.get("add", 0)):
                if self.spawn_server is None:
                    raise JobError("this launcher cannot add servers while training runs")
                rank = max([len(self.pool.conns) - 1, *self._spawning, *self._planned]) + 1
                self._planned[rank] = ev["iteration"]
                self._spawning[rank] = (time.monotonic(), False)
                self.spawn_server(rank)

    def _await_server(self, rank: int) -> str:
        deadline = time.monotonic() + self.cfg.timeout
        while rank not in self._hellos:
            self._tick(deadline, f"waiting for new server {rank} to register")
            got = self.listener.recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self._spawning:
                self._hellos[int(msg.fields["rank"])] = str(msg.fields["address"])
            elif msg.type == "plan_req":  # cannot happen at a barrier, but never drop one
                self.waiting[int(msg.fields["worker"])] = (peer, time.monotonic())
        del self._spawning[rank]
        return self._hellos.pop(rank)

    def _arrived_servers(self, t: int) -> list[tuple]:
        """Servers started earlier that have registered since: join them now (PSLD's
        then get blocks by its next decision). A server that never registers fails
        the job after `timeout`."""
        out = []
        for rank, (started, _) in sorted(self._spawning.items()):
            if rank in self._planned:
                continue
            if rank in self._hellos:
                out.append(("join", rank, self._hellos.pop(rank)))
                del self._spawning[rank]
            elif time.monotonic() - started > self.cfg.timeout:
                raise JobError(f"new server {rank} did not register within {self.cfg.timeout:.0f} s")
        return out

    def retire_server_process(self, rank: int) -> None:
        if self.retire_server is not None:
            self.retire_server(rank)

    # -- membership -----------------------------------------------------------------------
    def _membership(self, t: int) -> bool:
        """Apply the membership events due at iteration t (a quiet moment: no update in
        flight). Returns True if workers joined and their first plan request is awaited."""
        joined = False
        for i, ev in enumerate(self.cfg.membership):
            if i in self.events_done or ev["iteration"] > t:
                continue
            self.events_done.add(i)
            if "leave" in ev and ev["leave"] in self.workers and ev["leave"] not in self.stopped:
                self._stop(ev["leave"])
                self._event("worker_left", t, worker=ev["leave"])
            elif "join" in ev:
                for _ in range(ev["join"]):
                    self._join(t)
                    joined = True
        active = sorted(set(self.workers) - self.stopped)
        if not active:
            raise JobError(f"no worker left at iteration {t}")
        if active != self.planner.workers:
            self.planner.set_workers(active)
            self.pool.broadcast(Message("members", {"workers": len(active)}), "ack")
        return joined

    def _join(self, t: int) -> None:
        if self.spawn_worker is None:
            raise JobError("this launcher cannot add workers while training runs")
        rank = max(self.workers) + 1
        self.spawn_worker(rank)
        deadline = time.monotonic() + self.cfg.timeout
        while True:
            self._tick(deadline, f"waiting for joining worker {rank} to register")
            got = self.listener.recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if msg.type == "hello" and msg.fields["role"] == "worker" and msg.fields["rank"] == rank:
                break
            if msg.type == "plan_req":  # cannot happen at a barrier, but never drop one
                self.waiting[int(msg.fields["worker"])] = (peer, time.monotonic())
        self.workers[rank] = peer
        self.listener.send(peer, self._welcome(rank))
        self._event("worker_joined", t, worker=rank)

    def _welcome(self, rank: int) -> Message:
        self.known_table[rank] = self.pool.version
        return Message("welcome", {"rank": rank, "servers": self.pool.addresses, "table": self.pool.table,
                                   "blocks": [b.to_list() for b in self.blocks]})

    def _event(self, name: str, t: int, **fields) -> None:
        self.metrics.write({"type": "event", "event": name, "iteration": t, "time": time.time(), **fields})

    # -- reports and metrics ------------------------------------------------------------
    def _collect(self, worker: int, report: dict) -> None:
        missing = [k for k in REPORT_KEYS if not isinstance(report.get(k), (int, float))]
        if missing:
            raise ValueError(f"report of worker {worker} lacks numeric {missing}")
        stale = report.get("staleness")
        if not isinstance(stale, list) or not all(isinstance(x, int) and x >= 0 for x in stale):
            raise ValueError(f"report of worker {worker}: staleness must be a list of σ ≥ 0")
        report["worker"] = worker
        self.stats.add(report)
        t = int(report["iteration"])
        bucket = self.reports.setdefault(t, [])
        bucket.append(report)
        if not self.sync.barrier() and sum(r["samples"] for r in bucket) >= self.cfg.global_batch:
            self._end_iteration(t)

    def _end_iteration(self, t: int) -> None:
        reports = self.reports.pop(t, [])
        if not reports:
            return
        self.planner.observe({r["worker"]: r for r in reports})
        record = self.stats.iteration_record(t, reports)
        if self.cfg.protocol == "lbbsp":
            record["predictor_mape"] = self.planner.mape()
            record["predicted_speed"] = [self.planner.predictors[self.cfg.predictor][r["worker"]].predict()
                                         for r in sorted(reports, key=lambda r: r["worker"])]
        self.metrics.write(record)
        self.display.update(t + 1, sps=record["samples_per_s"], loss=record["loss"])

    # -- snapshots: evaluation and checkpoints ------------------------------------------
    def _maybe_snapshot(self, t: int) -> None:
        cfg = self.cfg
        if self._snapshot_at == t:
            return  # a barrier re-entered after workers joined
        self._snapshot_at = t
        final = t >= self.total
        want_eval = final or (cfg.eval_every and t % cfg.eval_every == 0 and t > 0)
        want_ckpt = final or (cfg.checkpoint_every and t % cfg.checkpoint_every == 0 and t > 0)
        if not (want_eval or want_ckpt) or (final and not self.sync.barrier()):
            return
        values, optim, version, samples = self._fetch_state(t if self.sync.barrier() else 0)
        if want_ckpt:
            self._checkpoint(t, values, optim, version, samples)
        if final:
            self._save_model(values)
        if want_eval:
            self.pending_eval.append(self.evals.submit(self._evaluate, t, values, self.stats.elapsed()))

    def _fetch_state(self, version: int):
        values, optim, versions, samples = {}, {}, [], []
        for reply in self.pool.broadcast(Message("state_req", {"version": version}), "state").values():
            if reply.fields.get("blocks", 1) == 0:
                continue  # an empty server's version stood still: it has nothing to say
            for name, t in reply.tensors.items():
                if name[0] == "b":
                    values[int(name[1:])] = t
                elif name[0] == "s":
                    optim[name[1:]] = t
            versions.append(reply.fields["version"])
            samples.append(reply.fields["samples"])
        return values, optim, min(versions), min(samples)

    def _checkpoint(self, t, values, optim, version, samples) -> None:
        path = save_checkpoint(self.run_dir, Checkpoint(
            t, self.cursor if not self.sync.barrier() else t * self.cfg.global_batch, version, samples,
            [b.to_list() for b in self.blocks], self.pool.table, values, optim))
        self._event("checkpoint", t, path=str(path))

    def _save_model(self, values) -> None:
        """model.pt: the final weights as a plain state_dict (load with weights_only=True)."""
        write_values(self.model, self.blocks, values)
        torch.save(self.model.state_dict(), self.run_dir / "model.pt")

    def _evaluate(self, t: int, values, elapsed: float) -> dict:
        """Test loss and accuracy of the snapshot taken `elapsed` training seconds in."""
        torch.set_num_threads(1)
        model = build_model(self.cfg.model, self.data.input_shape, self.data.num_classes)
        write_values(model, self.blocks, values)
        limit = 0 if t >= self.total else self.cfg.eval_samples
        loss, acc = evaluate(model, self.data, limit=limit)
        record = {"type": "eval", "iteration": t, "time": time.time(), "elapsed": elapsed,
                  "test_loss": loss, "test_accuracy": acc,
                  "test_samples": min(limit, self.data.num_test) if limit else self.data.num_test}
        self.metrics.write(record)
        self.display.update(min(t, self.total), acc=acc)
        return record

    def _finish(self, start: float) -> dict:
        for t in sorted(self.reports):  # ASP: partial last iterations
            self._end_iteration(t)
        if not self.sync.barrier():  # the final snapshot once every worker stopped
            self.pool.broadcast(Message("flush", {}), "ack")  # apply half-filled softsync groups
            values, optim, version, samples = self._fetch_state(0)
            self._checkpoint(self.total, values, optim, version, samples)
            self._save_model(values)
            self.pending_eval.append(self.evals.submit(self._evaluate, self.total, values,
                                                       self.stats.elapsed()))
        evals = [f.result(timeout=max(60.0, self.cfg.timeout)) for f in self.pending_eval]
        final = evals[-1] if evals else {}
        for ack in self.pool.broadcast(Message("stop", {"reason": "job finished"}), "ack").values():
            for sigma, count in ack.fields.get("histogram", []):
                self.histogram[int(sigma)] = self.histogram.get(int(sigma), 0) + int(count)
        summary = self.stats.summary(self.cfg, self.total, final, wall_s=time.time() - start,
                                     staleness=self.histogram)
        summary["resumed_from"] = self.resume.iteration if self.resume else None
        if self.cfg.protocol == "lbbsp":
            summary["predictor_mape"] = self.planner.mape()
            summary["predictor"] = self.cfg.predictor
        return summary

    # -- helpers ------------------------------------------------------------------------
    def _expect(self, conn, kind: str, who: str) -> Message:
        deadline = time.monotonic() + self.cfg.timeout
        while True:
            self.check_peers()
            try:
                reply = conn.recv(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise JobError(f"{who} did not answer within {self.cfg.timeout:.0f} s") from None
        if reply.type == "error":
            raise JobError(f"{who} refused: {reply.fields['message']}")
        if reply.type != kind:
            raise JobError(f"{who} sent {reply.type!r}, expected {kind!r}")
        return reply

    def _tick(self, deadline: float | None, what: str) -> None:
        self.check_peers()
        if deadline is not None and time.monotonic() > deadline:
            raise JobError(f"timed out after {self.cfg.timeout:.0f} s {what}")

    def _check_stalled(self) -> None:
        """Fail, naming the laggards, if some workers wait and others are silent too long."""
        if not self.waiting:
            return
        oldest = min(since for _, since in self.waiting.values())
        if time.monotonic() - oldest > self.cfg.timeout:
            silent = sorted(set(self.workers) - set(self.waiting) - self.stopped)
            raise JobError(f"workers {silent} sent nothing for {self.cfg.timeout:.0f} s")


def parse_control(line: str) -> tuple:
    """One control.jsonl request as a server action: {"action": "add_server"},
    {"action": "remove_server", "server": R} or {"action": "move", "block": K, "to": R}."""
    import json

    try:
        req = json.loads(line)
    except json.JSONDecodeError:
        raise ValueError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(req, dict):
        raise ValueError(f"not an object: {line[:80]!r}")
    action = req.get("action")

    def number(key: str) -> int:
        v = req.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{action}: {key} = {v!r} must be an integer ≥ 0")
        return v

    if action == "add_server":
        return ("add",)
    if action == "remove_server":
        return ("remove", number("server"))
    if action == "move":
        return ("move", number("block"), None, number("to"))
    raise ValueError(f"unknown action {action!r} (add_server, remove_server, move)")


def _plan(iteration: int, start: int, size: int, version: int, *, stop: bool, **extra) -> Message:
    """A plan reply; `step` is the worker's own counter and is not echoed back."""
    return Message("plan", {"step": 0, "iteration": iteration, "start": start, "size": size,
                            "stop": stop, "version": version, **extra})
