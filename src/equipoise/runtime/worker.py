"""The worker's main loop (Rudra's learner loop, PAPERS.md §1).

Each step: ask the coordinator for a plan (a slice of the global sample order), pull the
weights the plan names from every server, compute the gradient of the mean loss over the
slice, push each server its blocks' gradients tagged with (worker, version, samples), and
report what the step cost. The loop takes its endpoints and config as arguments and
returns, so the same function runs in a local process or a Ray actor.
"""

from __future__ import annotations

import math
import os
import time

import psutil
import torch
import torch.nn.functional as F

from ..config import Config
from ..data import SliceSampler, load_dataset
from ..models import build_model
from ..policy.placement import Block
from ..policy.sync import make_sync_policy
from ..scenario import Scenario
from ..wire import Connection, Message, Transport
from .blocks import read_pushes, write_values
from .stretch import Stretch


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


class WorkerError(RuntimeError):
    """A fault of this worker's step (non-finite loss, refused push); names the worker."""


class Worker:
    def __init__(self, cfg: Config, rank: int, transport: Transport, coordinator: str):
        self.cfg, self.rank, self.transport = cfg, rank, transport
        self.coord = transport.connect(coordinator)
        self.proc = psutil.Process()
        self.servers: list[Connection | None] = []
        self.policy = make_sync_policy(cfg.protocol, softsync_n=cfg.softsync_n or cfg.workers,
                                       staleness_bound=cfg.staleness_bound)
        self._pending_staleness: list[int] = []
        self._stash: dict[int, list[Message]] = {}
        # Neighbours are real processes the launcher runs; the worker only emulates factors.
        self.scenario = Scenario.from_config({k: v for k, v in cfg.scenario_dict().items()
                                              if k != "neighbours"})

    def run(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        data = load_dataset(cfg.dataset, cfg.data_dir or None, seed=cfg.seed)
        welcome = self._request(self.coord, Message("hello", {
            "role": "worker", "rank": self.rank, "address": "", "pid": os.getpid()}), "welcome")
        self.blocks = [Block.from_list(r) for r in welcome.fields["blocks"]]
        self._set_table(welcome.fields["table"], welcome.fields["servers"])
        self.model = build_model(cfg.model, data.input_shape, data.num_classes)
        self.model.train()
        self.stretch = Stretch(self.model)
        self._mem_total = psutil.virtual_memory().total
        sampler = SliceSampler(len(data), cfg.global_batch, cfg.seed)
        try:
            self._loop(data, sampler)
        finally:
            for c in [c for c in self.servers if c is not None] + [self.coord]:
                c.close()

    def _set_table(self, table: list[int], addresses: list[str]) -> None:
        """Route by a (new) block → server table. `addresses[r]` is server r's address,
        "" for a server that was removed; servers that hold no block are not talked to."""
        while len(self.servers) < len(addresses):
            self.servers.append(None)
        for r, address in enumerate(addresses):
            conn = self.servers[r]
            if conn is not None and (not address or conn.address != address):
                conn.close()
                self.servers[r] = conn = None
            if conn is None and address:
                self.servers[r] = self.transport.connect(address)
        self.by_server = [[b for b in self.blocks if table[b.key] == r] for r in range(len(self.servers))]
        self.active = [r for r in range(len(self.servers)) if self.by_server[r]]
        if any(self.servers[r] is None for r in self.active):
            raise WorkerError(f"worker {self.rank}: the block table names a server without an address")

    def _plan_table(self, plan: Message, versions: dict[int, int]) -> dict[int, int]:
        """Apply a block table that came with a plan (a barrier: every server is at the
        plan's version, so the weights just pulled are current on the new owners too)."""
        if "table" not in plan.fields:
            return versions
        self._set_table(plan.fields["table"], plan.fields["servers"])
        return {r: int(plan.fields["version"]) for r in self.active}

    # -- the loop -----------------------------------------------------------------------
    def _loop(self, data, sampler: SliceSampler) -> None:
        """Compute, then one pipelined exchange: pull-ahead and push go out together on
        each server's (ordered) connection (under a barrier the pull first, so it is
        registered before our push can complete the update), the plan request follows
        the acks, and the next weights and plan arrive while the coordinator and servers
        close the barrier.
        A report describes one iteration: its compute and the exchange that fed it."""
        t0 = time.perf_counter()
        plan = self._recv(self._send_plan(0, {}), "plan")
        if plan.fields["stop"]:
            return
        self._plan_table(plan, {})
        self._send_pulls(plan.fields["version"])
        versions, held = self._recv_params()
        exchange = self._exchange_times(t0, held, plan)
        if self.cfg.overlap:
            return self._loop_overlapped(data, sampler, plan, versions, exchange)
        step = 0
        while True:
            f = plan.fields
            loss, measured = self._step(data, sampler, f)
            t3 = time.perf_counter()
            if f.get("await_table"):  # blocks moved during this compute: route by the new table
                table = self._request(self.coord, Message("table_req", {"worker": self.rank}), "table")
                versions = self._plan_table(table, versions)
                measured["table_wait_s"] = time.perf_counter() - t3
            pull = self.policy.pull_version(step + 1, f["iteration"])
            if self.policy.barrier():
                # Pull first: the server holds it until the update, so by the time every
                # ack is in, every pull-ahead is answered — nothing is in flight at the
                # barrier, when blocks may move between servers.
                self._send_pulls(pull)
                self._send_pushes(self._pushes(), versions, f["size"])
            else:  # push first: the weights this pull brings include our own gradient
                self._send_pushes(self._pushes(), versions, f["size"])
                self._send_pulls(pull)
            staleness = self._recv_acks()
            step += 1
            self._send_plan(step, self._report(f, loss, versions, staleness, measured, exchange))
            versions, held = self._recv_params()
            plan = self._recv(self.coord, "plan")
            if plan.fields["stop"]:
                return
            versions = self._plan_table(plan, versions)
            exchange = self._exchange_times(t3, held, plan)

    def _loop_overlapped(self, data, sampler: SliceSampler, plan: Message, versions: dict[int, int],
                         exchange: dict) -> None:
        """Rudra-adv*: communication decoupled from compute. Exchange k (push of step k,
        pull, next plan request) is sent and left in flight while step k+1 computes on
        the weights that exchange k−1 brought; the transport's I/O threads move the
        bytes meanwhile. Every gradient is tagged with the version it was really
        computed on, so the extra staleness is measured, not hidden. Plans are requested
        one step ahead; a stop therefore answers two requests, and both are awaited."""
        self.coord.send(Message("plan_req", {"worker": self.rank, "step": 1, "report": {}}))
        step = 0
        while True:
            f = plan.fields
            loss, measured = self._step(data, sampler, f)
            t3 = time.perf_counter()
            # Copies: the next backward overwrites .grad while these may still be queued.
            self._send_pushes({k: t.clone() for k, t in self._pushes().items()}, versions, f["size"])
            # The weights this pull brings feed the step after next: ask for that step's clock.
            self._send_pulls(self.policy.pull_version(step + 2, f["iteration"]))
            step += 1
            self._send_plan(step + 1, self._report(f, loss, versions, [], measured, exchange))
            if step > 1:  # exchange k−1: its acks and weights arrived during this compute
                self._pending_staleness += self._recv_acks()
                versions, held = self._recv_params()
            else:
                held = 0.0
            plan = self._recv(self.coord, "plan")
            if plan.fields["stop"]:
                self._recv_acks()
                self._recv_params()
                self._recv(self.coord, "plan")  # the answer to the request sent ahead
                return
            exchange = self._exchange_times(t3, held, plan)

    def _step(self, data, sampler: SliceSampler, f: dict) -> tuple[float, dict]:
        """Compute one gradient, stretched by this worker's slowdown factor (a slower
        machine, emulated); returns the loss and the measured compute time and CPU use."""
        self.stretch.factor = self.scenario.worker_factor(
            self.rank, elapsed=float(f.get("elapsed", 0.0)), iteration=f["iteration"])
        cpu0, t1 = time.process_time(), time.perf_counter()
        self.stretch.start(f["size"])
        loss = self._compute(data, sampler, f)
        self.stretch.finish()
        t2 = time.perf_counter()
        cpu = _clamp01((time.process_time() - cpu0) / max(t2 - t1, 1e-9))
        return loss, {"compute_s": t2 - t1, "cpu": cpu}

    def _report(self, f: dict, loss: float, versions: dict[int, int], staleness: list[int], measured: dict,
                exchange: dict) -> dict:
        """One iteration's report. `staleness` lists σ of this worker's gradients that
        servers applied since the last report (one per server and gradient)."""
        staleness, self._pending_staleness = self._pending_staleness + staleness, []
        return {"iteration": f["iteration"], "samples": f["size"], "loss": loss,
                "version": min(versions.values()), "staleness": staleness, **measured,
                "mem": self.proc.memory_info().rss / self._mem_total, **exchange}

    def _exchange_times(self, since: float, pull_held: float, plan: Message) -> dict:
        """Split an exchange into waiting (a server or the coordinator held our request
        for the barrier) and communication (the rest)."""
        total = time.perf_counter() - since
        wait = min(total, max(pull_held, float(plan.fields.get("held_s", 0.0))))
        return {"wait_s": wait, "comm_s": total - wait}

    def _send_plan(self, step: int, report: dict) -> Connection:
        self.coord.send(Message("plan_req", {"worker": self.rank, "step": step, "report": report}))
        return self.coord

    def _send_pulls(self, min_version: int) -> None:
        for s in self.active:
            self.servers[s].send(Message("pull", {"worker": self.rank, "min_version": min_version}))

    def _recv_params(self) -> tuple[dict[int, int], float]:
        """Write every server's blocks into the model; returns each server's version and
        the longest time a server held the pull back (time spent waiting, not moving)."""
        versions, held = {}, 0.0
        for s in self.active:
            reply = self._recv(self.servers[s], "params")
            values = {b.key: reply.tensors[f"b{b.key}"] for b in self.by_server[s]}
            write_values(self.model, self.by_server[s], values)
            versions[s] = int(reply.fields["version"])
            held = max(held, float(reply.fields["held_s"]))
        return versions, held

    def _compute(self, data, sampler: SliceSampler, plan: dict) -> float:
        idx = sampler.positions(plan["start"], plan["size"])
        x, y = data.train_batch(idx)
        # Seeded by the slice, so dropout-like randomness is the same on any split or resume.
        # (The CPU generator alone: torch.manual_seed would also queue a CUDA seeding
        # with a stack capture: ~0.3 ms per step here.)
        torch.default_generator.manual_seed(self.cfg.seed * 1_000_003 + plan["start"])
        self.model.zero_grad(set_to_none=False)
        loss = F.cross_entropy(self.model(x), y)
        if not math.isfinite(loss.item()):
            raise WorkerError(f"worker {self.rank}: loss is {loss.item()} at iteration "
                              f"{plan['iteration']} (diverged: try a smaller lr)")
        loss.backward()
        return float(loss.item())

    def _pushes(self) -> dict:
        return read_pushes(self.model, self.blocks)

    def _send_pushes(self, pushes: dict, versions: dict[int, int], samples: int) -> None:
        """Push gradients tagged with the version they were computed on. Without overlap
        the gradient tensors are sent without copying; they are not touched again until
        the acks (which follow the server's receipt) are in."""
        for s in self.active:
            tensors = {f"g{b.key}": pushes[b.key] for b in self.by_server[s]}
            self.servers[s].send(Message("push", {"worker": self.rank, "version": versions[s],
                                       "samples": samples}, tensors))

    def _recv_acks(self) -> list[int]:
        """Wait for every server's ack; returns σ of each of our gradients the servers
        applied since their last ack (under softsync a push may wait in a group and be
        applied when another worker's push completes it: its σ comes with our next ack)."""
        out: list[int] = []
        for c in (self.servers[s] for s in self.active):
            sigmas = self._recv(c, "ack").fields.get("staleness", [])
            if not isinstance(sigmas, list) or not all(isinstance(x, int) for x in sigmas):
                raise WorkerError(f"worker {self.rank}: {c.address} sent a malformed ack")
            out += sigmas
        return out

    # -- messaging ----------------------------------------------------------------------
    def _request(self, conn: Connection, msg: Message, expect: str) -> Message:
        conn.send(msg)
        return self._recv(conn, expect)

    def _recv(self, conn: Connection, expect: str) -> Message:
        """The next `expect` reply on `conn`. With overlap a server may answer out of
        request order (a held pull is overtaken by the ack of a later push), so replies
        of another expected type are kept, in order, for their own `_recv`."""
        stash = self._stash.setdefault(id(conn), [])
        for i, m in enumerate(stash):
            if m.type == expect:
                return stash.pop(i)
        deadline = time.monotonic() + self.cfg.timeout
        while True:
            reply = conn.recv(timeout=max(0.001, deadline - time.monotonic()))
            if reply.type == "error":
                raise WorkerError(f"worker {self.rank}: {conn.address} refused: {reply.fields['message']}")
            if reply.type == expect:
                return reply
            if not self.cfg.overlap or reply.type not in ("ack", "params") or len(stash) > 8:
                raise WorkerError(f"worker {self.rank}: expected {expect!r} from {conn.address}, "
                                  f"got {reply.type!r}")
            stash.append(reply)
