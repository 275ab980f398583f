"""The worker's main loop (Rudra's learner loop: Gupta, Zhang and Wang, "Model Accuracy
and Runtime Tradeoff in Distributed Deep Learning: A Systematic Study", ICDM 2016).

Each step: ask the coordinator for a plan (a slice of the global sample order), pull the
weights the plan names from every server, compute the gradient of the mean loss over the
slice, push each server its blocks' gradients tagged with (worker, version, samples), and
report what the step cost. The servers are reached through a `PSClient`; `cfg.overlap`
exchanges are kept in flight while the next step computes (0 or 1). The same loop runs
in a local process or a Ray actor.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections import deque
from contextlib import nullcontext

import psutil
import torch

from ..config import Config
from ..data import SliceSampler
from ..data.loader import Loader
from ..models import build_model
from ..policy.placement import Block
from ..policy.sync import make_sync_policy
from ..scenario import Scenario
from ..wire import Message, Transport
from .probes import fixed_cost, memory_cap
from ..device import DeviceError, DeviceLink, OutOfMemory, autocast, set_deterministic, to_device, worker_setup
from .client import ClientError, PSClient, Pulled, Ticket
from .forward_pull import ForwardPull
from .backward_push import BackwardPush
from ..user_code import USER_CODE
from ..workload import SampleError, StepError, load_workload
from .coordinator_link import CoordinatorLink, Reset, WorkerError, exchange_times, oom_report, plan_table
from ..sparse.remote import IdError, RemoteTables, with_rows
from ..sparse.tables import untouched_tables
from .rows import RowsAhead, slice_seed
from .stretch import Stretch, noise_seed


class Worker:
    def __init__(self, cfg: Config, rank: int, transport: Transport, coordinator: str, data=None,
                 machine_factor: float = 1.0):
        """`data`: the built-in dataset a launcher shares between a node's workers, else
        built here. `machine_factor`: how much slower this machine is emulated to be (a
        Ray node's label), on top of the config's slowdowns."""
        self.cfg, self.rank, self.transport, self.data = cfg, rank, transport, data
        self.machine_factor = machine_factor
        self.depth = int(cfg.overlap)  # exchanges kept in flight while a step computes
        if self.depth not in (0, 1):
            raise WorkerError(f"worker {rank}: overlap = {cfg.overlap!r} exchanges in flight; "
                              f"only 0 and 1 are supported")
        self.coord = CoordinatorLink(transport.connect(coordinator), rank, cfg.timeout)
        self.proc = psutil.Process()
        self.policy = make_sync_policy(cfg.protocol, softsync_n=cfg.softsync_n or cfg.workers,
                                       staleness_bound=cfg.staleness_bound)
        self._pending_staleness: list[int] = []
        self.memory_cap: int | None = None  # the batch this worker's device memory holds (its probe)
        self.fixed_s: float | None = None  # LB-BSP: a step's cost that does not grow with its batch (its probe)
        self.client: PSClient | None = None  # the servers' client, from the coordinator's welcome on
        self.early: BackwardPush | None = None  # backward_push: the hooks that stream a step's gradients
        self.lazy: ForwardPull | None = None  # forward_pull: the hooks that take a pull's weights as they come
        self._tags: dict = {}  # backward_push: the tags of the push being streamed
        self._next_pull: Ticket | None = None  # eager_update: the next version's pull, sent before backward
        self._step_t: tuple[float, float] | None = None  # the last step's forward start and backward end
        self._pulled: tuple[dict[int, int], dict[int, int], float] | None = None  # forward_pull: finished by a step
        self.scenario = Scenario.of(cfg)  # neighbours are the launcher's processes: only factors emulated here

    @property
    def epoch(self) -> int:
        """Rollbacks so far (the client's: every request carries it; older ones are ignored)."""
        return self.client.epoch if self.client is not None else 0

    def run(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        set_deterministic(cfg.deterministic)
        try:
            self.device, self.precision = worker_setup(cfg, self.rank)
        except DeviceError as exc:
            raise WorkerError(str(exc)) from None
        data = load_workload(cfg, shared=self.data)
        self.loader = self.ahead = None
        welcome = self._request(Message("hello", {
            "role": "worker", "rank": self.rank, "address": "", "pid": os.getpid()}), "welcome")
        self.blocks = [Block.from_list(r) for r in welcome.fields["blocks"]]
        # the least a part of a streamed push or pull carries (fragment_kb 0: the largest block)
        self.part_kb = cfg.fragment_kb or max(1, max((b.nbytes for b in self.blocks), default=1024) // 1024)
        self.client = PSClient(self.transport, self.rank, self.blocks, cfg.timeout, interrupt=self.coord.look)
        self.client.epoch = int(welcome.fields.get("epoch", 0))
        try:
            self.client.set_table(welcome.fields["table"], welcome.fields["servers"])
            with untouched_tables():  # a table's rows stay on the servers: never held here
                self.model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.model_args)
            self.tables = RemoteTables.install(self.model, self.blocks, self.client.rows)  # sparse tables: by rows
            self.model.to(self.device)
            self.link = DeviceLink(self.model, [b for b in self.blocks if b.kind != "rows"], self.device, self.depth)
            if cfg.backward_push:
                self.early = BackwardPush(self.model, self.blocks, self.link, self.part_kb * 1024)
            if cfg.forward_pull:
                self.lazy = ForwardPull(self.model, self.blocks, self.link, self.client, cfg.timeout)
            self.barrier = cfg.has_barrier
            self.model.train()
            self.stretch = Stretch(self.model, noise=cfg.slowdown_noise, seed=noise_seed(cfg.seed, self.rank))
            self._mem_total = psutil.virtual_memory().total
            sampler = SliceSampler(len(data), cfg.global_batch, cfg.seed)
            self.loader = Loader(data, sampler, cfg.loader_workers, timeout=cfg.timeout)
            self.end = cfg.total_iterations(len(data)) * cfg.global_batch  # the stream's last position
            self.ahead = RowsAhead(self.tables, self.client, ClientError, data, self.loader, cfg, self.end,
                                   early=self.barrier and not self.depth and self.lazy is None  # worker/rows.py
                                   ) if self.tables is not None and data.sparse_ids_fn is not None else None
            # what this worker measures of itself before its first step (worker/probes.py)
            self.memory_cap = memory_cap(cfg, self.rank, self.model, self.loader, data, self.device, self.precision)
            self.fixed_s = fixed_cost(cfg, self.model, self.loader, data, self.device, self.precision)
            while True:
                try:
                    return self._loop(data, sampler)
                except Reset as reset:  # start again from the plan the coordinator sends
                    f = reset.msg.fields
                    self._pending_staleness = []
                    self.coord.inbox.clear()
                    self.client.reset(f["table"], f["servers"], int(f["epoch"]))
        finally:
            if self.loader is not None:
                self.loader.close()
            self.client.close()
            self.coord.close()

    def _plan_table(self, plan: Message, versions: dict[int, int], in_flight: int) -> dict[int, int]:
        return plan_table(self.client, self.barrier, self.rank, plan, versions, in_flight)

    def _new_table(self, versions: dict[int, int], in_flight: int) -> dict[int, int]:
        """Wait for the block table the moves under way make, and route by it."""
        table = self._request(Message("table_req", {"worker": self.rank, "epoch": self.epoch}), "table")
        return self._plan_table(table, versions, in_flight)

    # -- the loop -----------------------------------------------------------------------
    def _loop(self, data, sampler: SliceSampler) -> None:
        """Compute step k, send exchange k (the push of its gradient, the pull of the
        weights for a later step) and report; then collect an exchange and the next
        plan. The first plan and the weights it names come before either pipeline: with
        no exchange in flight (`_sequential`, cfg.overlap off) or with one in flight
        while the next step computes (`_overlapped`). A report describes one iteration:
        its compute and the exchange that fed it."""
        self._disarm()  # a rollback may have ended a streamed step
        self._next_pull = None
        if self.lazy is not None:
            self.lazy.disarm()
            self._pulled = None
        t0 = time.perf_counter()
        plan = self._request(self._plan_req(0, {}), "plan")
        if plan.fields["stop"]:
            return
        self._plan_table(plan, {}, 0)
        versions, reads, held = self._take(self.client.pull(plan.fields["version"]))
        exchange = exchange_times(t0, held, plan)
        (self._overlapped if self.depth else self._sequential)(data, sampler, plan, versions, reads, exchange)

    def _sequential(self, data, sampler: SliceSampler, plan: Message, versions: dict[int, int],
                    reads: dict[int, int], exchange: dict) -> None:
        """Exchange k is complete before step k+1 computes. Under a barrier the pull goes
        out first, so the server registers it before our push can complete the update
        (nothing is in flight at the barrier, when blocks may move); otherwise the push
        goes first, so the weights the pull brings include our own gradient. The acks are
        in before the plan request, whose report carries their σ. The next plan is read
        before the pulled weights are written: if it is a recovery plan (a share of a
        lost worker's slice) the model still holds the weights of the iteration in flight.
        With sparse tables, blocks moving during a step (`await_table`) are waited for
        before it: its forward fetches rows by the new table."""
        step = 0
        while True:
            f = plan.fields
            if self.tables is not None and f.get("await_table"):  # a moved shard's rows: from its new server
                versions = self._new_table(versions, 0)
                f = {**f, "await_table": False}
            self._arm(f)
            try:
                loss, count, measured = self._step(data, sampler, f)
            except OutOfMemory as oom:
                self._disarm()  # the fragments sent are abandoned: the server drops them
                if self._lazy_armed():
                    versions, reads, _ = self.lazy.rest()
                if not self.barrier:
                    raise WorkerError.unsplittable(oom) from None
                plan, versions, exchange = self._out_of_memory(oom, data, sampler, f, versions, step)
                step += 1
                if plan.fields["stop"]:
                    return
                continue
            if self._pulled is not None:  # the pull the forward began on, finished by the step
                (versions, reads, _), self._pulled = self._pulled, None
            push, pull, versions, t3 = self._send(f, versions, reads, count, step, measured, in_flight=0)
            staleness = self.client.wait(push)
            step += 1
            asked = time.perf_counter()  # the report's making, the coordinator's barrier, the plan
            with self.stretch.local():
                self.coord.send(self._plan_req(step, self._report(f, loss, count, versions, staleness,
                                                                  measured, exchange)))
            plan = self._recv_coord("plan")  # before the weights: a recovery plan computes on the ones just used
            self.client.note("plan", asked, time.perf_counter())
            while plan.fields.get("recover"):
                plan = self._recover(data, sampler, plan, versions, step)
            if self.lazy is not None and not plan.fields["stop"] and "table" not in plan.fields:
                self.lazy.arm(pull)  # the next forward writes the weights as they come
                exchange = exchange_times(t3, 0.0, plan)
                continue
            versions, reads, held = self._take(pull)
            if plan.fields["stop"]:
                return
            versions = self._plan_table(plan, versions, 0)
            exchange = exchange_times(t3, held, plan)

    def _overlapped(self, data, sampler: SliceSampler, plan: Message, versions: dict[int, int],
                    reads: dict[int, int], exchange: dict) -> None:
        """Rudra-adv* (communication decoupled from compute; protocols without a
        barrier): exchange k stays in flight while step k+1 computes on the weights
        exchange k−1 brought, and its pull asks for the clock of step k+2. Every
        gradient is tagged with the version it was really computed on, so the extra
        staleness is measured, not hidden. Plans are requested `depth` steps ahead; a
        stop therefore answers depth + 1 requests, and the exchanges still in flight are
        collected before returning."""
        d = self.depth
        for ahead in range(1, d + 1):
            self.coord.send(self._plan_req(ahead, {}))
        in_flight: deque = deque()  # (push ticket, pull ticket) of exchanges sent
        step = 0
        while True:
            f = plan.fields
            self._arm(f)
            try:
                loss, count, measured = self._step(data, sampler, f)
            except OutOfMemory as oom:
                raise WorkerError.unsplittable(oom) from None
            push, pull, versions, t3 = self._send(f, versions, reads, count, step, measured, len(in_flight))
            step += 1
            with self.stretch.local():  # σ of the acks collected so far rides on the next report
                self.coord.send(self._plan_req(step + d, self._report(f, loss, count, versions, [],
                                                                      measured, exchange)))
            in_flight.append((push, pull))
            held = 0.0
            if len(in_flight) > d:  # the oldest exchange: its acks and weights
                push, pull = in_flight.popleft()
                self._pending_staleness += self.client.wait(push)
                versions, reads, held = self._take(pull)
            plan = self._recv_coord("plan")
            if plan.fields["stop"]:
                for push, pull in in_flight:
                    self.client.wait(push)
                    self.client.wait(pull)
                for _ in range(d):
                    self._recv_coord("plan")  # the answers to the requests sent ahead
                return
            versions = self._plan_table(plan, versions, len(in_flight))
            exchange = exchange_times(t3, held, plan)

    def _send(self, f: dict, versions: dict[int, int], reads: dict[int, int], count: float, step: int,
              measured: dict, in_flight: int) -> tuple[object, object, dict[int, int], float]:
        """Send exchange `step` once its compute is done: if blocks moved meanwhile, ask
        for the new table first; read the gradients; push and pull in the policy's order.
        Returns the push and pull tickets, the versions (the table's) and when compute
        ended."""
        t3 = time.perf_counter()
        if f.get("await_table"):  # blocks moved during this compute: route by the new table
            versions = self._new_table(versions, in_flight)
            measured["table_wait_s"] = time.perf_counter() - t3
        sent, streamed = self._disarm()
        if self.cfg.clip_grad_norm and not self.barrier:
            # No barrier, no update of the global batch to take the norm of: each push is
            # clipped by its own norm (under a barrier the servers clip the update).
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad_norm)
        with self.stretch.local():  # packing the push: slow on a slow machine too
            # With exchanges in flight, copies: the next backward overwrites .grad while these may be queued.
            if streamed is None:
                pushes = self.link.read(copy=bool(self.depth))
            else:  # what backward's fragments did not carry
                pushes = self.link.read_part([b for b in self.blocks if b.key not in streamed], copy=bool(self.depth))
            pushes, rows = with_rows(self.tables, pushes)
        pull_version = self.policy.pull_version(step + 1 + self.depth, f["iteration"])
        part_kb = self.part_kb if self.lazy is not None else 0  # forward_pull: the weights in parts
        if self.policy.pull_first():
            pull = self._pull(pull_version, part_kb)
            push = self.client.push(pushes, versions, f["size"], start=f["start"], count=count, sent=sent, rows=rows)
        else:
            push = self.client.push(pushes, versions, f["size"], count=count, reads=reads, step=step, sent=sent,
                                    rows=rows)
            pull = self._pull(pull_version, part_kb)
        if self.ahead is not None and not in_flight:  # the next step's rows, beside the pull
            self.ahead.ask_next(f, pull_version)
        return push, pull, versions, t3

    def _arm(self, f: dict) -> None:
        """backward_push: stream this step's gradients to their servers as backward makes
        them final (worker/backward_push.py). Not when blocks move during the step
        (`await_table`): the push routes by a table not known yet."""
        if self.early is None or f.get("await_table") or not f["size"]:
            return
        server_of = {b.key: r for r, blocks in self.client.by_server.items() for b in blocks}
        # the push's tags ride on its fragments (eager_update: the servers combine the
        # gradients before the push ends); the loss's count joins them before backward
        self._tags = {"samples": int(f["size"]), "start": int(f.get("start", -1))}
        self.early.arm(server_of, functools.partial(self.client.push_fragment, tags=self._tags),
                       copy=bool(self.depth))

    def _disarm(self) -> tuple[dict[int, tuple[int, int]], set[int] | None]:
        """Stop streaming: the fragments sent to each server ((seq, count)) and the blocks
        they carried; ({}, None) if this step was not streamed."""
        if self.early is None or not self.early.armed:
            return {}, None
        return self.early.finish()

    def _out_of_memory(self, oom: OutOfMemory, data, sampler: SliceSampler, f: dict, versions: dict[int, int],
                       step: int) -> tuple[Message, dict[int, int], dict]:
        """This step ran out of device memory (barrier protocols, no exchange in flight):
        nothing is pushed; the coordinator lowers our cap and cuts the slice again among
        the workers (shares, as for a lost worker's slice), which we may be given a
        piece of. Then the iteration's weights are pulled as usual; returns the next
        plan, the versions and the exchange's times."""
        t3 = time.perf_counter()
        if f.get("await_table"):  # blocks moved during this iteration: the shares route by the new table
            versions = self._new_table(versions, 0)
        pull = self._pull(self.policy.pull_version(step + 1, f["iteration"]))
        self.coord.send(self._plan_req(step + 1, oom_report(f, oom, versions)))
        plan = self._recv_coord("plan")
        while plan.fields.get("recover"):
            plan = self._recover(data, sampler, plan, versions, step + 1)
        versions, _, held = self._take(pull)
        if plan.fields["stop"]:
            return plan, versions, {}
        versions = self._plan_table(plan, versions, 0)
        return plan, versions, exchange_times(t3, held, plan)

    def _recover(self, data, sampler: SliceSampler, plan: Message, versions: dict[int, int],
                 step: int) -> Message:
        """A worker died or a slice ran out of memory (barrier protocols): compute the
        share of its slice this plan names on the weights of the iteration in flight —
        the model still holds them, the next pull is not taken yet — push it only to the
        servers that have not applied that iteration, report it, and return the next
        plan. A share that runs out of memory itself is cut again."""
        f = plan.fields
        try:
            loss, count, measured = self._step(data, sampler, f)
        except OutOfMemory as oom:
            self.coord.send(self._plan_req(step, oom_report(f, oom, versions)))
            return self._recv_coord("plan")
        pushes, rows = with_rows(self.tables, self.link.read())
        ticket = self.client.push(pushes, versions, f["size"], part=int(f["part"]), rows=rows,
                                  only=[int(r) for r in f["servers"]], start=f["start"], count=count)
        staleness = self.client.wait(ticket)
        report = self._report(f, loss, count, versions, staleness, measured, {"wait_s": 0.0, "comm_s": 0.0})
        self.coord.send(self._plan_req(step, {**report, "recovery": True}))
        return self._recv_coord("plan")

    def _pull(self, version: int, part_kb: int = 0) -> Ticket:
        """Ask for the weights of `version`: the pull already sent before backward
        (eager_update) if there is one."""
        ticket, self._next_pull = self._next_pull, None
        return ticket if ticket is not None else self.client.pull(version, part_kb)

    def _lazy_armed(self) -> bool:
        return self.lazy is not None and self.lazy.armed

    def _take(self, pull) -> tuple[dict[int, int], dict[int, int], float]:
        """Wait for a pull and write its weights into the model; returns each server's
        version and stamp of them, and the longest time a server held the pull back."""
        pulled: Pulled = self.client.wait(pull)
        with self.stretch.local():  # unpacking the weights: slow on a slow machine too
            self.link.write(pulled.values)
        if self.tables is not None:  # the next forward's rows: of these weights' version (None: the latest)
            self.tables.version = min(pulled.versions.values(), default=0) if self.barrier else None
        return pulled.versions, pulled.reads, pulled.held_s

    def _step(self, data, sampler: SliceSampler, f: dict) -> tuple[float, float, dict]:
        """Compute one gradient, stretched by this worker's slowdown factor (a slower
        machine, emulated); returns the loss, the units it averages over (the servers'
        weight), and the measured data wait, compute time and CPU use."""
        self.stretch.factor = self.machine_factor * self.scenario.worker_factor(
            self.rank, elapsed=float(f.get("elapsed", 0.0)), iteration=f["iteration"])
        # Seeded by the slice before its samples are read: dropout-like randomness (and a
        # dataset's own) is the same on any split or resume. The CPU generator alone:
        # torch.manual_seed would also queue a CUDA seeding (~0.3 ms per step here).
        torch.default_generator.manual_seed(slice_seed(self.cfg.seed, f["start"]))
        USER_CODE.iteration = int(f["iteration"])  # what the heartbeat names a stuck call by
        if not f["size"]:  # planned no samples (LB-BSP, min_batch = 0): a gradient of zeros that weighs nothing
            return self._no_step()
        try:
            batch = (self.ahead or self.loader).get(f["start"], f["size"])  # read ahead with the rows, or now
        except (SampleError, StepError, TimeoutError) as exc:
            raise WorkerError(f"worker {self.rank}: iteration {f['iteration']}: {exc}") from None
        ahead = f["start"] + self.cfg.global_batch
        if self.barrier and not f.get("recover") and ahead + f["size"] <= self.end:
            self.loader.prefetch(ahead, f["size"])  # the same offset in the next iteration, most likely
        cpu0, t1 = time.process_time(), time.perf_counter()
        self.stretch.start(f["size"])
        try:
            loss, count = self._compute(data, batch, f)
        finally:
            self.stretch.finish()
        if self._lazy_armed():  # the rest of the weights, before the time is read
            self._pulled = self.lazy.rest()
        t2 = time.perf_counter()
        cpu = min(1.0, max(0.0, (time.process_time() - cpu0) / max(t2 - t1, 1e-9)))
        waited = self.lazy.take_wait() if self.lazy is not None else 0.0
        # gap_s: from the end of the last backward to this forward's start (the exchange
        # and the plan between, unless they are hidden)
        gap = {} if self._step_t is None else {"gap_s": max(0.0, t1 - self._step_t[1])}
        self._step_t = (t1, t2)
        return loss, count, {"compute_s": t2 - t1 - waited, "cpu": cpu, "data_s": self.loader.data_s,
                             "pull_wait_s": waited, **gap}

    def _no_step(self) -> tuple[float, float, dict]:
        """No samples planned: zero gradients (no rows), pushed with a weight of zero."""
        self.model.zero_grad(set_to_none=False)
        if self.tables is not None:
            self.tables.clear()
        if self._lazy_armed():
            self._pulled = self.lazy.rest()
        self._step_t = (t := time.perf_counter(), t)
        return 0.0, 0.0, {"compute_s": 0.0, "cpu": 0.0, "data_s": 0.0}

    def _report(self, f: dict, loss: float, count: float, versions: dict[int, int], staleness: list[int],
                measured: dict, exchange: dict) -> dict:
        """One iteration's report. `staleness` lists σ of this worker's gradients that
        servers applied since the last report (one per server and gradient)."""
        staleness, self._pending_staleness = self._pending_staleness + staleness, []
        waited = measured.pop("pull_wait_s", 0.0)  # forward_pull: the forward's wait is communication
        exchange = {**exchange, "comm_s": exchange.get("comm_s", 0.0) + waited} if waited else exchange
        return {"iteration": f["iteration"], "start": f["start"], "samples": f["size"], "loss": loss, "count": count,
                "version": min(versions.values()), "staleness": staleness, **measured, **self.link.take_times(),
                "mem": self.proc.memory_info().rss / self._mem_total, **exchange,
                "server_s": [[r, sec] for r, sec in sorted(self.client.take_server_s().items())],
                "wire_bytes": self.client.take_wire(), **(self.tables.take_counts() if self.tables else {}),
                # the wire's events since the last report, in seconds from this step's forward start
                "timeline": self.client.take_timeline(self._step_t[0] if self._step_t else 0.0)}

    def _compute(self, data, batch, plan: dict) -> tuple[float, float]:
        self.model.zero_grad(set_to_none=False)
        if self.tables is not None:
            self.tables.clear()  # a probe's lookups, a step given up: not pushed
        try:
            with self.lazy.guard() if self._lazy_armed() else nullcontext():  # forward_pull: ops wait for weights
                return self._forward_backward(data, batch, plan)
        except torch.OutOfMemoryError:
            pass  # outside the handler, so the exception's frames (and the memory they hold) are gone
        self.model.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        raise OutOfMemory(plan["size"], f"worker {self.rank}: out of memory on {self.device} at iteration "
                                        f"{plan['iteration']} with a batch of {plan['size']}")

    def _forward_backward(self, data, batch, plan: dict) -> tuple[float, float]:
        if self.device.type != "cpu":  # the batch's copy is host -> device time too
            t0 = time.perf_counter()
            batch = to_device(batch, self.device, non_blocking=True)
            self.link.h2d_s += time.perf_counter() - t0
        try:
            if self.ahead is not None:  # every table's rows in one request, or asked for ahead
                self.ahead.rows(batch, plan)
            with autocast(self.device, self.precision):
                step = data.loss_of(self.model, batch, plan["size"])
        except (StepError, IdError) as exc:  # IdError: an id outside its sparse table
            raise WorkerError(f"worker {self.rank}: iteration {plan['iteration']}: {exc}") from None
        if not math.isfinite(step.value):
            raise WorkerError(f"worker {self.rank}: loss is {step.value} at iteration "
                              f"{plan['iteration']} (diverged: try a smaller lr)")
        if self.early is not None and self.early.armed:
            if step.count is not None and step.count != plan["size"]:
                self._tags["count"] = float(step.count)  # as the push sends it
            if self.cfg.eager_update and self._next_pull is None:
                # The next version's pull goes ahead of the fragments: a server sends the blocks
                # it computes ahead while the rest of the gradients come up (server/ahead.py).
                self._next_pull = self.client.pull(self.policy.pull_version(0, plan["iteration"]),
                                                   self.part_kb, early=True)
        step.objective.backward()
        return step.value, step.count

    # -- the coordinator ----------------------------------------------------------------
    def _plan_req(self, step: int, report: dict) -> Message:
        cap = {"memory_cap": self.memory_cap} if step == 0 and self.memory_cap else {}
        if step == 0 and self.fixed_s is not None:
            cap["fixed_s"] = self.fixed_s
        return Message("plan_req", {"worker": self.rank, "step": step, "report": report, "epoch": self.epoch,
                                    **cap})

    def _request(self, msg: Message, expect: str) -> Message:
        self.coord.send(msg)
        return self._recv_coord(expect)

    def _recv_coord(self, expect: str) -> Message:
        """The coordinator's next message (Reset if it rolled the job back); a plan's
        slice is prefetched at once."""
        beside = self.client.wait_beside if self.client is not None else None
        msg = self.coord.recv(expect, self.epoch, beside)
        if msg.type == "plan" and not msg.fields.get("stop") and self.loader is not None:
            (self.ahead or self.loader).prefetch(int(msg.fields["start"]), int(msg.fields["size"]))
        return msg
