"""The coordinator's main loop: it owns the plan of the job.

It registers servers and workers, hands each worker its slice of every iteration,
collects worker reports into metrics.jsonl, and finally stops everyone. Its parts own
their own state: the server manager (server_manager.py), the planner (planner.py),
snapshots (snapshots.py), the metrics writer and recovery (recovery.py), which asks the
plan what it must through the `Plan` methods below.

Two pacings share this loop (coordinator/pacings.py). Under a barrier (BSP, LB-BSP) the
coordinator answers the plan requests of iteration t once every worker has asked, i.e.
once all pushes of t−1 are acknowledged: nothing extra (the servers' barrier waits for
the same last push), the batching policy decides t from all reports of t−1, and the
snapshot of version t gets a quiet moment with no update in flight. Without a barrier
(ASP, softsync, SSP) each request gets the next positions of the sample stream at once.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import torch

from ..config import Config, ConfigError
from ..models import build_model
from ..policy.placement import Block
from ..scenario import Scenario
from ..telemetry.metrics import MetricsWriter
from ..telemetry.progress import ProgressDisplay
from ..telemetry.tensorboard import TensorBoardLog
from ..wire import Listener, Message, Transport
from ..workload import as_workload
from ..protocol.blocks import model_tensors, read_values, table_widths
from ..protocol.checkpoint import Checkpoint, CheckpointError
from .recovery import Memory, Plan, Recovery, plan_message
from .planner import PlanSettings, Planner
from .assignments import Assignments
from .rpc import JobError, OriginCheck, PeerLost, Peers, Rpc
from .server_manager import ServerManager, ServerSettings
from .snapshots import SnapshotSettings, Snapshots, State
from .stats import RunStats, ServerTotals, check_report
from ..protocol.optimizer import OptimizerSpec, user_schedule

log = logging.getLogger("equipoise.coordinator")


class Coordinator:
    """What both pacings share; `BarrierCoordinator` and `StreamCoordinator` decide
    when a plan request is answered and when an iteration ends."""

    recovers_servers = False  # whether a lost server is replaced and the job rolled back
    barrier_paced = False  # whether plans go out at barriers (BSP, LB-BSP)

    def __init__(self, cfg: Config, run_dir: Path, transport: Transport, listener: Listener, data, *,
                 peers: Peers, resume: Checkpoint | None = None,
                 on_tick: Callable[[float], None] | None = None):
        """`peers`: the launcher; `on_tick(elapsed)`: about every 0.1 s of training."""
        data = as_workload(cfg, data)  # a launcher may hand over a built-in Dataset in memory
        self.cfg, self.run_dir, self.listener, self.data = cfg, Path(run_dir), listener, data
        self.peers, self.resume, self.on_tick = peers, resume, on_tick
        self.rpc = Rpc(cfg.timeout, peers)
        self.scenario = Scenario.of(cfg)
        self.total = cfg.total_iterations(len(data))
        self.iteration = resume.iteration if resume else 0
        self.cursor = resume.cursor if resume else self.iteration * cfg.global_batch
        self.display = ProgressDisplay(self.total, cfg.progress, start=self.iteration)
        self.clip_due: int | None = None  # clip_grad_norm, barrier: the iteration whose update awaits its norm
        self.grad_norms: dict[int, float] = {}  # and each iteration's norm (before clipping) until its record
        self.tensorboard = TensorBoardLog(self.run_dir / "tensorboard") if cfg.tensorboard else None
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl",  # the display and TensorBoard see every record
                                     [self.display.record] + ([self.tensorboard.record] if self.tensorboard else []))
        self.stats = RunStats(cfg.global_batch)
        self.snapshots = Snapshots(cfg.slice(SnapshotSettings), self.run_dir, data, self.metrics,
                                   self._new_model, self.total)
        spec = OptimizerSpec.of(cfg, self.total)
        try:  # a user schedule that cannot be imported or gives no factor fails here, in one line
            spec.rate(0, user_schedule(cfg.lr_schedule))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.servers = ServerManager(
            cfg.slice(ServerSettings), self.scenario, transport, self.rpc, peers,
            init_fields={"optimizer": spec.to_dict(), "protocol": cfg.protocol,
                         "softsync_n": cfg.softsync_n or cfg.workers, "staleness_bound": cfg.staleness_bound,
                         "lr_modulation": cfg.lr_modulation, "async_scaling": cfg.async_scaling,
                         "delay_compensation": cfg.delay_compensation, "dc_lambda": cfg.dc_lambda,
                         "eager_update": cfg.eager_update},
            control_path=self.run_dir / "control.jsonl", event=self._event, record=self.metrics.write,
            elapsed=self.stats.elapsed, await_hello=self.await_hello, epoch=lambda: self.epoch, total=self.total)
        self.servers.barrier = self.barrier_paced
        self.planner = Planner(cfg.slice(PlanSettings), list(range(cfg.workers)))
        self.blocks: list[Block] = []
        self.workers: dict[int, bytes] = {}  # rank -> the peer its hello came from
        self.stopped: set[int] = set()
        self.done: set[int] = set()  # stopped and every request of theirs answered
        self.stops: dict[int, int] = {}  # stop replies sent to each worker
        self.waiting: dict[int, tuple[bytes, float]] = {}  # plan requests held: rank -> (peer, since)
        self.reports: dict[int, list[dict]] = {}  # reports by iteration, until it ends
        self.ended = -1  # barrier: the last iteration whose record was written (they end in order)
        self.known_table: dict[int, int] = {}  # the table version each worker was sent
        self.events_done: set[int] = set()  # scenario membership events applied
        self.assign = Assignments()  # barrier: the slices of the iteration in flight
        plan = Plan(lambda: self.iteration, self.drop_worker, self.active, self.after_loss, self.restart_from,
                    self.await_hello)  # what recovery may ask of the plan and do to it: never the coordinator
        self.recovery = Recovery(cfg, self.servers, peers, plan, recovers_servers=self.recovers_servers,
                                 event=self._event, elapsed=self.stats.elapsed, note=self.display.note)
        self.plans = 0  # no barrier: plans handed out (each is one gradient for every server)
        self._origins = OriginCheck(log)  # a message's authenticated role against what it claims
        self._handlers = {"table_req": self._on_table_req, "plan_req": self._on_plan_req}
        peers.tolerate("worker")
        if self.recovers_servers and (cfg.snapshot_every or cfg.replication):
            peers.tolerate("server")

    # -- the job ------------------------------------------------------------------------
    def run(self) -> dict:
        start = time.time()
        try:
            servers, workers = self._register()
            self._init_servers(servers)
            for rank, peer in sorted(workers.items()):
                self.listener.send(peer, self._welcome(rank))
            self._event("started", self.iteration, time=start, resumed=self.resume is not None)
            self.started_at = time.time()  # every process registered and initialised
            self.peers.started()  # (the Ray launcher's standbys start warming now)
            self._train()
            return self._finish(start)
        finally:
            self.display.close()
            self.snapshots.close()
            self.servers.close()
            self.metrics.close()
            if self.tensorboard is not None:
                self.tensorboard.close()

    def _register(self) -> tuple[list[str], dict[int, bytes]]:
        """Wait until every server and worker has said hello (worker replies are held)."""
        servers: dict[int, str] = {}
        workers: dict[int, bytes] = {}
        deadline = self.rpc.deadline()
        while len(servers) < self.cfg.servers or len(workers) < self.cfg.workers:
            self.rpc.tick(deadline, "waiting for servers and workers to register "
                          f"({len(servers)}/{self.cfg.servers} servers, {len(workers)}/{self.cfg.workers} workers)")
            got = self._recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if msg.type != "hello":
                self.listener.send(peer, Message("error", {"message": f"unexpected {msg.type!r} before start"}))
            elif msg.fields["role"] == "server":
                servers[msg.fields["rank"]] = msg.fields["address"]
            elif msg.fields["role"] == "worker":
                workers[msg.fields["rank"]] = peer
        self.workers = dict(workers)
        return [servers[r] for r in range(self.cfg.servers)], workers

    def _init_servers(self, addresses: list[str]) -> None:
        torch.manual_seed(self.cfg.seed)
        model = self._new_model()
        self.blocks, table = self.servers.place(model_tensors(model), table_widths(model))
        values, optim, version, samples = read_values(model, self.blocks), {}, 0, 0
        if self.resume is not None:
            if [Block.from_list(r) for r in self.resume.blocks] != self.blocks:
                raise CheckpointError("checkpoint blocks do not match this model and block_size: "
                                      "resume with the configuration the checkpoint was written with"
                                      + (" (block_size = 0 sizes blocks by servers: the same servers too)"
                                         if self.cfg.block_size == 0 else ""))
            values, optim = self.resume.values, self.resume.optim
            version, samples = self.resume.version, self.resume.samples
        self.servers.start(addresses, self.blocks, table, values, optim, version, samples, len(self.workers))
        self.recovery.memory = Memory(self.iteration, State(values, optim, version, samples), list(table),
                                      cursor=self.cursor)
        if self.cfg.replication:
            self.servers.replicate()

    def _new_model(self) -> torch.nn.Module:
        return build_model(self.cfg.model, self.data.input_shape, self.data.num_classes, self.cfg.model_args)

    # -- training -----------------------------------------------------------------------
    def _train(self) -> None:
        self.servers.start_planned()
        while len(self.done) < len(self.workers):
            try:
                self._step()
            except PeerLost:
                continue  # a server was lost: the next step hands it to recovery

    def _step(self) -> None:
        """Handle what was lost, then one message (or none within 0.1 s)."""
        self.recovery.handle(self.peers.lost())
        self.rpc.tick(None, "")
        self.snapshots.check()  # a failed evaluation (the user's metrics) ends the job now
        if self.snapshots.reached is not None and self.cfg.stop_at_target:
            self._stop_at_target()
        if self.on_tick is not None and self.stats.t_start is not None:
            self.on_tick(self.stats.elapsed())
        got = self._recv(timeout=0.1)
        if got is None:
            return self._check_stalled()
        peer, msg = got
        try:
            if self.servers.note_hello(msg) or self.recovery.note_replacement(msg):
                return
            handler = self._handlers.get(msg.type)
            if handler is None:
                raise ValueError(f"coordinator does not accept {msg.type!r} now")
            handler(peer, msg.fields)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError) as exc:
            # A bad message never stops the coordinator: refused, logged (bounded), and on.
            self._origins.refuse(self.listener, peer, f"{msg.type}: {type(exc).__name__}: {exc}")

    def _on_table_req(self, peer: bytes, f: dict) -> None:
        if int(f.get("epoch", 0)) != self.epoch:
            return  # sent before a rollback: the reset tells the worker the table
        if int(f["worker"]) not in self.workers:  # no state for a rank nobody registered
            raise ValueError(f"unknown worker {f['worker']!r}")
        self.known_table[int(f["worker"])] = self.servers.version
        reply = self.servers.table_reply()
        reply.fields["epoch"] = self.epoch
        self.listener.send(peer, reply)

    def _on_plan_req(self, peer: bytes, f: dict) -> None:
        try:
            worker = int(f["worker"])
            if int(f.get("epoch", 0)) != self.epoch:
                return  # sent before a rollback: the worker asks again
            if worker not in self.workers:
                self.listener.send(peer, Message("error", {"message": f"unknown worker {worker}"}))
                return
            self._probes(worker, f)
            oom = bool(f["report"].get("oom")) if f["step"] > 0 and f["report"] else False
            if f["step"] > 0 and f["report"] and not oom:
                self._collect(worker, f["report"])
            self.waiting[worker] = (peer, time.monotonic())
            if oom:
                self._out_of_memory(worker, f["report"])
            if worker in self.stopped:  # with overlap, a request sent ahead of the stop
                return self._stop(worker)
            self._advance(worker)
        except (KeyError, TypeError, ValueError, AttributeError):
            self.waiting = {w: v for w, v in self.waiting.items() if v[0] != peer}
            raise  # refused by `_step`, naming the message type and the error

    def _advance(self, worker: int) -> None:
        """A plan request of `worker` is waiting: answer what can be answered."""
        raise NotImplementedError

    def _out_of_memory(self, worker: int, report: dict) -> None:
        """A slice ran out of memory on `worker` (only a barrier can cut it again)."""
        raise JobError(f"{report.get('message', f'worker {worker} ran out of memory')}: under {self.cfg.protocol} "
                       "its slice cannot be split again; lower max_batch")

    def _reply_plan(self, worker: int, iteration: int, start: int, size: int, version: int,
                    await_table: bool = False) -> None:
        peer, since = self.waiting.pop(worker)
        self.stats.begin()
        extra = {}
        if await_table:  # blocks move while this iteration computes: ask before pushing
            extra = {"await_table": True}
        elif self.known_table.get(worker, 0) < self.servers.version:  # route by the new table
            extra = {"table": self.servers.table, "servers": self.servers.addresses}
            self.known_table[worker] = self.servers.version
        self.listener.send(peer, plan_message(iteration, start, size, version, stop=False, epoch=self.epoch,
                                       held_s=time.monotonic() - since, elapsed=self.stats.elapsed(), **extra))

    def _stop(self, worker: int) -> None:
        """Tell a worker to stop. A worker with requests sent ahead (overlap) is done once
        it has had a stop for each; the servers stop counting it at once."""
        peer, _ = self.waiting.pop(worker)
        self.listener.send(peer, plan_message(self.iteration, 0, 0, 0, stop=True, held_s=0.0, epoch=self.epoch))
        self.stops[worker] = self.stops.get(worker, 0) + 1
        if self.stops[worker] > int(self.cfg.overlap):
            self.done.add(worker)
        if worker not in self.stopped:
            self.stopped.add(worker)
            self.servers.members(len(self.workers) - len(self.stopped), retired=[worker])

    def _stop_all(self) -> None:
        for w in sorted(self.waiting):
            self._stop(w)

    def await_hello(self, what: str, wanted: Callable[[Message], bool],
                    gone: Callable[[], bool] | None = None) -> bytes | None:
        """At a barrier, wait up to `timeout` for the hello `wanted` accepts; returns its
        sender, or None once `gone()` says it will never come. Meanwhile a plan request is
        kept (it cannot come at a barrier, but is never dropped) and a started server's
        hello is recorded by the server manager."""
        deadline = self.rpc.deadline()
        while True:
            self.rpc.tick(deadline, f"waiting for {what}")
            if gone is not None and gone():
                return None
            got = self._recv(timeout=0.2)
            if got is None:
                continue
            peer, msg = got
            if not self.servers.note_hello(msg) and msg.type == "plan_req" and msg.fields.get("epoch", 0) == self.epoch:
                self._keep_plan_req(peer, msg.fields)
            if msg.type == "hello" and wanted(msg):
                return peer

    def _probes(self, worker: int, f: dict) -> None:  # a worker's, with its first plan request
        fixed, cap = self.planner.take_probes(worker, f)
        if fixed is not None:
            self._event("fixed_cost", self.iteration, worker=worker, seconds=fixed)
        if cap is not None:
            self._event("memory_cap", self.iteration, worker=worker, cap=cap, source="probe")

    def _keep_plan_req(self, peer: bytes, f: dict) -> None:
        """A plan request that came while a hello was awaited: its report is collected
        (a lost worker's last report may come now, after its loss: that iteration's
        record must hold its slice) and the request kept for the barrier, or answered
        with a stop if its worker has stopped (a lost one's must not count as waiting)."""
        try:
            worker, report = int(f["worker"]), f.get("report")
            if worker not in self.workers:
                return
            self._probes(worker, f)
            if f.get("step", 0) > 0 and report and not report.get("oom"):
                self._collect(worker, report)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return self._origins.refuse(self.listener, peer, f"bad plan request: {type(exc).__name__}: {exc}")
        self.waiting[worker] = (peer, time.monotonic())
        if worker in self.stopped:
            self._stop(worker)

    def _recv(self, timeout: float) -> tuple[bytes, Message] | None:
        """The next message, unless its sender's authenticated role (`origin`) contradicts
        what it claims: a hello's role, or a worker's request from another role."""
        got = self.listener.recv(timeout=timeout)
        refusal = None if got is None else self._origins.refusal(got[1])
        if refusal is None:
            return got
        self.listener.send(got[0], refusal)
        return None

    def _welcome(self, rank: int) -> Message:
        self.known_table[rank] = self.servers.version
        return Message("welcome", {"rank": rank, "servers": self.servers.addresses, "table": self.servers.table,
                                   "blocks": [b.to_list() for b in self.blocks], "epoch": self.epoch})

    def _stop_at_target(self) -> None:
        """The target was met (`stop_at_target`): the job ends at the next iteration it
        can end at — the coming barrier, or the stream's current iteration."""
        met = self.snapshots.reached["iteration"]  # after a rollback the job may be back before it
        end = max(1, min(self.total, self.iteration if self.iteration > met else met + 1))
        if end < self.total:
            self._event("stop_at_target", self.iteration, end=end)
            self.total = self.snapshots.total = end
            self.snapshots.replay_from(end)  # the snapshot at `end` is the final one, even if one was taken

    def _event(self, name: str, t: int, **fields) -> None:
        self.snapshots.event(name, t, **fields)

    # -- the Plan recovery acts through (recovery.py) ------------------------------------
    @property
    def epoch(self) -> int:
        """Rollbacks so far; a plan request of an earlier epoch is stale."""
        return self.recovery.epoch

    def active(self) -> list[int]:
        return sorted(set(self.workers) - self.stopped)

    def drop_worker(self, worker: int, reason: str) -> tuple[bool, list[int]] | None:
        if worker not in self.workers or worker in self.done:
            return None
        # It asked for its next plan: every push of its was acked (with overlap a request
        # goes ahead of the acks, so nothing can be said to be delivered).
        delivered = worker in self.waiting and not self.cfg.overlap
        self.waiting.pop(worker, None)
        self.stopped.add(worker)
        self.done.add(worker)
        active = self.active()
        # Without a barrier the others may have stopped because the stream is handed out:
        # the lost worker's slice is simply not computed, as for any lost worker there.
        if not active and (self.barrier_paced or self.cursor < self.total * self.cfg.global_batch):
            raise JobError(f"worker{worker} {reason}, and no worker is left")
        return delivered, active

    def after_loss(self, worker: int, delivered: bool, active: list[int], replies: dict[int, Message]) -> str:
        """The pacing's: finish the iteration in flight without `worker`."""
        raise NotImplementedError

    def restart_from(self, memory: Memory, epoch: int) -> None:
        self._rewind(memory)
        self.clip_due, self.grad_norms = None, {}
        self.waiting, self.assign = {}, Assignments()
        self.snapshots.replay_from(memory.iteration)
        # Every worker not yet done, also one stopped with a request still owed an answer
        # (overlap): after the reset it asks again, and is stopped again.
        for w in sorted(set(self.workers) - self.done):
            self.known_table[w] = self.servers.version
            self.listener.send(self.workers[w], plan_message(memory.iteration, 0, 0, memory.iteration, stop=False,
                                                             reset=True, epoch=epoch, table=self.servers.table,
                                                             servers=self.servers.addresses))

    def _rewind(self, mem: Memory) -> None:
        """The plan goes back to `mem`: at a barrier every slice before it was applied on
        every server, and every report after it is replayed."""
        self.iteration, self.cursor = mem.iteration, mem.iteration * self.cfg.global_batch
        self.reports = {t: r for t, r in self.reports.items() if t < mem.iteration}
        self.ended = min(self.ended, mem.iteration - 1)  # replayed: recorded again

    # -- reports and metrics ------------------------------------------------------------
    def _collect(self, worker: int, report: dict) -> None:
        exchange = check_report(worker, report)
        report["worker"] = worker
        if self.barrier_paced and int(report["iteration"]) <= self.ended:
            # A lost worker's report that came after its iteration's record (which holds
            # its slice, applied everywhere): counting it again would count its samples
            # twice. (Without a barrier a plan may cross into the next iteration, whose
            # record can come first: its report counts where it arrives.)
            log.warning("worker %d's report of iteration %s came after that iteration's record: ignored",
                        worker, report["iteration"])
            return
        held = self.reports.setdefault(int(report["iteration"]), [])
        if any(r["worker"] == worker and r.get("start") == report.get("start") for r in held):
            log.warning("worker %d's report of iteration %s, slice at %s, came twice: the second is ignored",
                        worker, report["iteration"], report.get("start"))
            return
        if exchange:
            self.servers.observe_exchange({r: float(sec) for r, sec in exchange})
        self.stats.add(report)
        held.append(report)
        self._reported(int(report["iteration"]))

    def _reported(self, t: int) -> None:
        """A report of iteration t arrived."""

    def _end_iteration(self, t: int) -> None:
        reports = self.reports.pop(t, [])
        if not reports:
            return
        self.ended = max(self.ended, t)
        self.planner.observe({r["worker"]: r for r in reports if not r.get("recovery")})
        record = self.stats.iteration_record(t, reports)
        if t in self.grad_norms:
            record["grad_norm"] = self.grad_norms.pop(t)
        if self.cfg.protocol == "lbbsp":
            record["predictor_mape"] = self.planner.mape()
            record["predicted_speed"] = [self.planner.predict(w) for w in sorted(r["worker"] for r in reports)]
        self.metrics.write(record)

    def _snapshot(self, t: int, version: int, cursor: int, *, force: bool = False) -> None:
        """Take the snapshot of iteration t if one is due (`force`: the final one), and keep
        one in memory for a rollback when recovery's `pace` says (recovery.py)."""
        want_eval, want_ckpt = (True, True) if force else self.snapshots.due(t)
        want_mem = self.recovery.memory_due(t, self.total, fetching=want_eval or want_ckpt)
        if want_eval or want_ckpt or want_mem:
            self.servers.note_hold(t)  # PSLD's interval counts what holding the workers here cost them
            started = self.recovery.pace.clock()
            state = self.snapshots.fetch(self.servers.broadcast, version)
            if want_mem:
                self.recovery.remember(Memory(t, state, list(self.servers.table), cursor, self.plans), started)
            self.snapshots.take(t, state, cursor=cursor, blocks=self.blocks, table=self.servers.table,
                                elapsed=self.stats.elapsed(), want_eval=want_eval, want_ckpt=want_ckpt)

    def _finish(self, start: float) -> dict:
        self._wind_down()
        evals = self.snapshots.results()
        evaluated = time.time()  # every evaluation in: what training did not hide ends here
        totals = ServerTotals.of(self.servers.stop("job finished"))
        summary = self.stats.summary(self.cfg, self.total, evals[-1] if evals else {},
                                     wall_s=time.time() - start, staleness=totals.histogram, blocks=self.blocks)
        summary.update(resumed_from=self.resume.iteration if self.resume else None,
                       target=self.snapshots.settings.target or None, time_to_target=self.snapshots.reached,
                       evaluations={"run": [e["iteration"] for e in evals], "superseded": self.snapshots.superseded},
                       marks=self.stats.marks(evaluated))  # marks: api.train's startup_s, eval_s, shutdown_s
        summary["recovered"] = self.recovery.recovered  # lost_updates: 0 under a barrier (stats), counted below without
        if not self.barrier_paced:  # each plan: a gradient owed to every block (a shard: if touched)
            shards = {b.key for b in self.blocks if b.kind == "rows"}
            counts = [n for k, n in totals.applied.items() if k not in shards] or [0]
            summary["gradients"] = {"owed": self.plans, "applied_min": min(counts), "applied_max": max(counts)}
            # owed, never applied, on the block short of most (a lost worker's last, a rollback's)
            summary["lost_updates"] = max([self.plans - n for n in counts] + [0])
            summary.update(forwarded=totals.forwarded, duplicates=totals.duplicates, too_old=totals.too_old)
        if totals.steps.updates:  # async_scaling = "bsp": how the servers stepped, on average over updates
            summary["async_steps"] = totals.steps.means()
        if self.cfg.delay_compensation != "none":
            summary["dc_compensated"] = totals.compensated
        if self.cfg.protocol == "lbbsp":
            summary["predictor_mape"] = self.planner.mape()
            summary["predictor"] = self.cfg.predictor
        return summary

    def _wind_down(self) -> None:
        """Every worker stopped: what is left before the servers stop."""

    def _check_stalled(self) -> None:
        """Fail, naming the laggards, if some workers wait and others are silent too long."""
        if not self.waiting:
            return
        oldest = min(since for _, since in self.waiting.values())
        if time.monotonic() - oldest > self.cfg.timeout:
            silent = sorted(set(self.workers) - set(self.waiting) - self.stopped)
            raise JobError(f"workers {silent} sent nothing for {self.cfg.timeout:.0f} s")


__all__ = ["Coordinator", "JobError"]
