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
from ..policy.placement import Block
from ..policy.sync import make_sync_policy
from ..telemetry.metrics import MetricsWriter
from ..telemetry.progress import ProgressDisplay
from ..wire import Listener, Message, Transport
from .blocks import model_tensors, read_values, write_values
from .checkpoint import Checkpoint, CheckpointError, save_checkpoint
from .coord_servers import ServerDuties
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


class Coordinator(ServerDuties):
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
        self.servers_done_at: int | None = None  # the barrier whose server work is done
        self.psld = None
        self._barrier_at: dict[int, float] = {}
        self._control_offset = 0
        self._factors: dict[int, tuple] = {}
        self._added: list[int] = []
        self._table_at = 0
        self._spawning: dict[int, float] = {}  # servers started, not yet joined: rank -> start time
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
            if self._note_server_hello(msg):
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
        peer = self._await(f"joining worker {rank} to register",
                           lambda m: m.fields.get("role") == "worker" and m.fields.get("rank") == rank)
        self.workers[rank] = peer
        self.listener.send(peer, self._welcome(rank))
        self._event("worker_joined", t, worker=rank)

    def _await(self, what: str, wanted: Callable[[Message], bool]) -> bytes:
        """At a barrier, wait up to `timeout` for the hello `wanted` accepts; returns its
        sender. Meanwhile a plan request is kept (it cannot come at a barrier, but is never
        dropped) and a started server's hello is recorded in `_hellos`."""
        deadline = time.monotonic() + self.cfg.timeout
        while True:
            self._tick(deadline, f"waiting for {what}")
            got = self.listener.recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if not self._note_server_hello(msg) and msg.type == "plan_req":
                self.waiting[int(msg.fields["worker"])] = (peer, time.monotonic())
            if msg.type == "hello" and wanted(msg):
                return peer

    def _note_server_hello(self, msg: Message) -> bool:
        """Record the hello of a server started while training runs (it joins later)."""
        if msg.type == "hello" and msg.fields.get("role") == "server" and msg.fields.get("rank") in self._spawning:
            self._hellos[int(msg.fields["rank"])] = str(msg.fields["address"])
            return True
        return False

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


def _plan(iteration: int, start: int, size: int, version: int, *, stop: bool, **extra) -> Message:
    """A plan reply; `step` is the worker's own counter and is not echoed back."""
    return Message("plan", {"step": 0, "iteration": iteration, "start": start, "size": size,
                            "stop": stop, "version": version, **extra})
