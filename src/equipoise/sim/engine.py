"""A discrete-event simulation of a job's coordinator, servers and workers on a virtual
clock, making every decision with the code a real job uses and charging time from a cost
model (cost.py) instead of computing.

What is shared with the runtime, not copied: the protocols (``policy.sync``:
``make_sync_policy`` and, for asp, softsync and ssp, the ``ServerSync`` state machine),
the batch sizes and speed predictors (``coordinator.planner.Planner`` over ``policy.batching``
and ``policy.predict``), placement (``policy.placement``), PSLD (``policy.psld.Psld``),
and the conditions (``scenario.Scenario``: slowdowns, traces, membership and server
events). What the simulator adds is time.

Every push reaches every server holding blocks, and all servers see the pushes in the
same order (one latency for all links), so one ``ServerSync`` stands for all servers'
protocol state; each server's *time* is its own (a FIFO queue per server, in numpy).

Two engines, both vectorised over servers:

* barrier protocols (bsp, lbbsp): one step per iteration over arrays of workers. Pushes
  arrive at each server in order and are served first come first served (the queue's
  departure times are a running maximum, ``np.maximum.accumulate``); the update is
  complete when the last push is served, then the held pulls are answered in arrival
  order. Under a barrier the protocol has one outcome (every active worker's gradient
  in one update, σ = 0), so ``ServerSync``'s per-push bookkeeping (which only detects
  faults a simulation cannot make) is not run: its O(λ) duplicate check per push would
  make 10,000 workers quadratic.
* asp, softsync, ssp: an event queue (``heapq`` of (time, kind, worker, stamp) tuples) of
  compute completions, one per worker; each push is accepted by the shared
  ``ServerSync`` and queued at every server, each pull is answered when ``pull_ready``
  allows. On an emulation host the steps' starts are events too and the cores are
  shared out anew at each start and finish (host.py), which moves every predicted
  completion: only the earliest is queued, and one queued before the last change
  carries an old stamp and is skipped. (Who is runnable changes at the event that
  decides it — a worker held back by SSP's bound from its step's end, one that is done
  from its last push — not a message's time later.)

One iteration's worker exchange, as worker/loop.py does it: after computing, a worker
sends its pull (barrier protocols: first) and its push, waits for the acks, sends its
report with the next plan request to the coordinator, receives the plan, then waits for
the weights; it computes again when it has both.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any, Callable

import numpy as np

from ..config import Config
from ..policy.batching import equal_split
from ..policy.placement import rehome
from ..policy.psld import AddServer, MoveBlock, Psld, RemoveServer
from ..policy.sync import make_sync_policy
from ..coordinator.planner import Planner, PlanSettings
from ..scenario import BlockMove, Scenario, ServerRemove, WorkerJoin, WorkerLeave
from .cost import CostModel
from .host import HostCores
from .state import Servers, WorkerFactors, _Sync

Emit = Callable[[dict[str, Any]], None]
FINISH, START = 0, 1  # kinds of the stream engine's events (a finish first at equal times)
COLUMNS = ("start", "worker", "batch", "compute", "wait", "comm", "cpu", "version", "sig_sum", "sig_n",
           "sig_max", "report")  # what the stream engine keeps of each push


class Simulation:
    """One simulated job: ``run()`` emits metrics records through ``emit`` and returns
    the totals the summary is made of."""

    def __init__(self, cfg: Config, tensors, iterations: int, emit: Emit | None = None):
        self.cfg, self.iterations = cfg, iterations
        self.emit = emit or (lambda record: None)
        self.scenario = Scenario.of(cfg)
        self.cost = CostModel(cfg)
        self.policy = make_sync_policy(cfg.protocol, softsync_n=cfg.softsync_n or cfg.workers,
                                       staleness_bound=cfg.staleness_bound, lr_modulation=cfg.lr_modulation)
        self.servers = Servers(cfg, tensors, self.cost, self.scenario)
        self.factors = WorkerFactors(self.scenario, cfg.workers)
        self.rng = np.random.default_rng(cfg.seed)
        self.busy = {"compute_s": 0.0, "wait_s": 0.0, "comm_s": 0.0}
        self.samples = 0
        self.histogram: Counter[int] = Counter()
        self.planner = Planner(cfg.slice(PlanSettings), list(range(cfg.workers)))

    def run(self) -> dict[str, Any]:
        self.emit({"type": "event", "event": "started", "iteration": 0, "elapsed": 0.0, "resumed": False,
                   "simulated": True})
        train_s = self._barrier() if self.policy.barrier() else self._stream()
        return {"train_s": float(train_s), "samples": self.samples, "busy": self.busy,
                "histogram": dict(self.histogram), "planner": self.planner}

    # -- shared ---------------------------------------------------------------------------
    def _first_exchange(self) -> float:
        """A worker's first plan and pull: four messages and the weights over its link."""
        return 4 * self.cost.latency + self.servers.total * self.cost.link

    def _account(self, batch, compute, wait, comm) -> None:
        self.samples += int(batch.sum())
        self.busy["compute_s"] += float(compute.sum())
        self.busy["wait_s"] += float(wait.sum())
        self.busy["comm_s"] += float(comm.sum())

    def _event(self, t: int, elapsed: float, event: str, **fields) -> None:
        self.emit({"type": "event", "event": event, "iteration": t, "elapsed": elapsed, **fields})

    # -- barrier protocols ----------------------------------------------------------------
    def _barrier(self) -> float:
        cfg, cost, srv = self.cfg, self.cost, self.servers
        lat, link, total = cost.latency, cost.link, srv.total
        ranks = list(range(cfg.workers))
        start = np.full(len(ranks), self._first_exchange())
        ex_wait, ex_comm = np.zeros(len(ranks)), start.copy()
        added = self.scenario.added_servers()
        psld = (Psld(srv.sizes.astype(int).tolist(), cfg.psld_epsilon, cfg.psld_max_servers, seed=cfg.seed,
                     horizon=cfg.psld_horizon, interval=cfg.psld_interval)
                if cfg.placement == "psld" else None)
        joining: dict[int, int] = dict(added)  # server rank -> iteration it joins
        psld_added: set[int] = set()
        barrier_at: dict[int, float] = {}
        free: dict[int, float] = {}  # server rank -> when it has answered the last pull
        prev = 0.0
        for t in range(self.iterations):
            barrier_at[t] = prev
            # membership, due at this barrier
            for ev in self.scenario.membership:
                if ev.iteration != t:
                    continue
                if isinstance(ev, WorkerLeave) and ev.worker in ranks:
                    i = ranks.index(ev.worker)
                    ranks.pop(i)
                    start, ex_wait, ex_comm = (np.delete(a, i) for a in (start, ex_wait, ex_comm))
                    self._event(t, prev, "worker_left", worker=ev.worker)
                elif isinstance(ev, WorkerJoin):
                    for _ in range(ev.count):
                        new = max(ranks + [len(self.factors.static) - 1]) + 1
                        ranks.append(new)
                        first = self._first_exchange()
                        start = np.append(start, prev + first)
                        ex_wait, ex_comm = np.append(ex_wait, 0.0), np.append(ex_comm, first)
                        self._event(t, prev, "worker_joined", worker=new)
                    self.cost.grow(max(ranks) + 1)
                    self.factors.grow(max(ranks) + 1)
            if set(self.planner.workers) != set(ranks):
                self.planner.set_workers(ranks)
            # servers, due at this barrier (coordinator/server_manager.py ServerManager.at_barrier)
            srv.update(prev, t)
            pause = self._server_actions(t, prev, joining, psld, psld_added, barrier_at)
            if self.probe_s:  # a probe holds the plans of t: the workers start that much later
                start, barrier_at[t] = start + self.probe_s, barrier_at[t] + self.probe_s
            # the iteration
            sizes = self.planner.sizes()
            r = np.array(ranks)
            x = np.array([sizes[w] for w in ranks], dtype=float)
            f = self.factors.at(prev, t)[r]
            if cost.cores:  # an emulation host: the steps share its cores from when each starts
                work = cost.work(r, x, self.rng, t)
                c = cost.host_compute(start, work, f)
                cpu = cost.cpu_work(work, f) / np.maximum(c, 1e-300)
            else:
                c = cost.compute(r, x, f, self.rng, t)
                cpu = cost.cpu(f)
            table_wait = np.maximum(0.0, pause - c) if pause else None
            end = start + c + (table_wait if table_wait is not None else 0.0)
            used, loads, per_byte = srv.used()
            serve = loads * per_byte  # seconds per push, and per pull, on each server
            arrive = end + lat + total * link
            order = np.argsort(arrive, kind="stable")
            a = arrive[order]
            k = np.arange(len(a), dtype=float)
            # FIFO per server, behind the pulls it still answers (free): departure of the
            # k-th push = (k + 1)·s + max(free, max over m ≤ k of a_m − m·s)
            busy_until = np.array([free.get(r, 0.0) for r in used.tolist()])
            done = (k + 1) * serve[:, None] + np.maximum(
                busy_until[:, None], np.maximum.accumulate(a[None, :] - k * serve[:, None], axis=1))
            update = done[:, -1]
            free = dict(zip(used.tolist(), (update + len(a) * serve).tolist()))
            ack, weights, held = np.empty_like(a), np.empty_like(a), np.empty_like(a)
            ack[order] = done.max(axis=0) + lat
            weights[order] = (update[:, None] + (k + 1) * serve[:, None]).max(axis=0) + lat + total * link
            held[order] = np.maximum(0.0, (update[:, None] - a[None, :]).max(axis=0))
            barrier = ack.max() + lat  # the coordinator has every report
            nxt = np.maximum(barrier + lat, weights)
            span = nxt - end
            wait = np.minimum(span, np.maximum(held, barrier - (ack + lat)))
            srv.charge(used, 2 * len(a) * serve, 2 * len(a) * loads)
            self._account(x, c, ex_wait, ex_comm)
            self.histogram[0] += len(a) * len(used)
            rec = {"type": "iteration", "iteration": t, "elapsed": barrier, "workers": ranks[:],
                   "batch": x.astype(int).tolist(), "loss": None,
                   "samples_per_s": x.sum() / (barrier - prev) if barrier > prev else None,
                   "staleness_mean": 0.0, "staleness_max": 0, "compute_s": c.tolist(),
                   "wait_s": ex_wait.tolist(), "comm_s": ex_comm.tolist(), "cpu": cpu.tolist(),
                   "mem": [0.0] * len(ranks), "version": [t] * len(ranks)}
            if table_wait is not None:
                rec["table_wait_s"] = table_wait.tolist()
            if cfg.protocol == "lbbsp":
                self.planner.observe({w: {"samples": int(x[i]), "compute_s": float(c[i]),
                                          "comm_s": float(ex_comm[i]), "cpu": float(cpu[i]),
                                          "mem": 0.0} for i, w in enumerate(ranks)})
                rec["predictor_mape"] = self.planner.mape()
                rec["predicted_speed"] = [self.planner.predict(w) for w in ranks]
            self.emit(rec)
            ex_wait, ex_comm, start, prev = wait, span - wait, nxt, barrier
        return prev

    def _server_actions(self, t: int, now: float, joining: dict[int, int], psld: Psld | None,
                        psld_added: set[int], barrier_at: dict[int, float]) -> float:
        """Server joins, scenario events and PSLD's decision at the barrier of t, carried
        out as the runtime does; returns the migration pause (workers compute meanwhile)."""
        cfg, srv = self.cfg, self.servers
        actions: list = []
        for rank, at in sorted(joining.items()):
            if at <= t:
                del joining[rank]
                srv.live.append(rank)
                srv.update(now, t)
                srv.version += 1
                self._event(t, now, "server_added", server=rank, pause_s=0.0, table_version=srv.version)
        for ev in self.scenario.server_events:
            if ev.iteration == t and isinstance(ev, ServerRemove):
                actions.append(RemoveServer(ev.server))
            elif ev.iteration == t and isinstance(ev, BlockMove):
                actions.append(MoveBlock(ev.block, None, ev.to))
        interval, self.probe_s = cfg.psld_interval, 0.0
        if t > 0 and t % interval == 0:
            since = barrier_at.get(t - interval)
            iteration_s = (now - since) / interval if since is not None else None
            rec, thr = srv.measure(t, now, iteration_s)
            self.emit(rec)
            if psld is not None and not actions and iteration_s:
                probe = psld.probe_targets(srv.owner.tolist(), sorted(srv.live), thr, srv.share, srv.upper)
                probed, self.probe_s = srv.probe(probe, thr) if probe else (None, 0.0)
                actions = psld.decide(srv.owner.tolist(), sorted(srv.live), thr, iteration_s, psld_added,
                                      share=srv.share, reach=srv.reach, upper=srv.upper, left=self.iterations - t, probed=probed)
        pause, paid = 0.0, set()  # (source, destination) of the migrations in this run of moves
        run: dict[int, dict] = {}  # this run's moves by destination: one block_moved each, as the runtime's

        def flush() -> None:
            for dst, m in run.items():
                self._event(t, now, "block_moved", blocks=sorted(m["blocks"]), **{"from": sorted(m["from"])}, to=dst,
                            bytes=m["bytes"], pause_s=m["pause_s"], table_version=m["version"])
            run.clear()

        for action in actions:
            refused = self._refusal(action)
            if (not isinstance(action, MoveBlock) or refused
                    or any(action.block in m["blocks"] for m in run.values())):
                flush()  # a run of moves ends, as coordinator/server_manager.py `_grouped` ends one
                paid = set()  # the next run's migrations pay their round trips anew
            if refused:
                self._event(t, now, "server_action_refused", action=_as_list(action), reason=refused)
            elif isinstance(action, AddServer):
                rank = max(list(srv.live) + list(joining) + [cfg.servers - 1]) + 1
                joining[rank] = t + 1
                psld_added.add(rank)
                self._event(t, now, "server_starting", server=rank)
            elif isinstance(action, MoveBlock):
                src = int(srv.owner[action.block])
                if src == action.dst:
                    continue
                nbytes, took = srv.move(action.block, action.dst, round_trip=(src, action.dst) not in paid)
                paid.add((src, action.dst))
                srv.version += 1
                pause += took
                m = run.setdefault(action.dst, {"blocks": [], "from": set(), "bytes": 0, "pause_s": 0.0})
                m["blocks"].append(action.block)
                m["from"].add(src)
                m.update(bytes=m["bytes"] + nbytes, pause_s=m["pause_s"] + took, version=srv.version)
            else:  # RemoveServer
                plan = rehome(srv.sizes.astype(int).tolist(), srv.owner.tolist(), action.server, srv.live,
                              {r: 1.0 / max(p, 1e-300) for r, p in srv.per_byte.items()})
                moved, took = 0, 0.0
                for block, dst in plan.items():
                    nbytes, dt = srv.move(block, dst)
                    moved, took = moved + nbytes, took + dt
                srv.live.remove(action.server)
                srv.version += 1
                pause += took
                self._event(t, now, "server_removed", server=action.server, bytes=moved, pause_s=took,
                            table_version=srv.version)
        flush()
        if pause and psld is not None:
            psld.charge(pause)
        if actions:
            srv.update(now, t)  # the loads moved: the servers' burst shares with them
        return pause

    def _refusal(self, action) -> str:
        live = self.servers.live
        if isinstance(action, MoveBlock):
            if not 0 <= action.block < len(self.servers.sizes):
                return f"no block {action.block}"
            if action.dst not in live:
                return f"server {action.dst} is not running"
        if isinstance(action, RemoveServer):
            if action.server not in live:
                return f"server {action.server} is not running"
            if len(live) == 1:
                return f"server {action.server} is the last one running"
        return ""

    # -- asp, softsync, ssp ---------------------------------------------------------------
    def _stream(self) -> float:
        cfg, cost, srv, policy = self.cfg, self.cost, self.servers, self.policy
        lat, link, total = cost.latency, cost.link, self.servers.total
        n, X = cfg.workers, cfg.global_batch
        end_pos = self.iterations * X
        mu = np.array(equal_split(X, n), dtype=float)
        sync = _Sync(policy, n)
        used, loads, per_byte = srv.used()
        serve = loads * per_byte
        free = np.zeros(len(used))
        cap = int(end_pos // mu.min()) + n + 1  # pushes at most
        table = np.zeros((cap, len(COLUMNS)))  # one row per push, filled in place
        # per-worker state as plain lists (faster than numpy scalars in the event loop)
        pushes, version, slice_of = [0] * n, [0] * n, [0] * n
        size_of, comp, fac, cpu_of = [0.0] * n, [0.0] * n, [1.0] * n, [1.0] * n
        ex_wait, ex_comm = [0.0] * n, [self._first_exchange()] * n
        plan_at, registered, ended = [0.0] * n, [0.0] * n, [0.0] * n  # plan in; pull at servers; compute done
        blocked: list[tuple[int, int]] = []  # (pull's min version, worker): held by pull_ready
        heap: list[tuple[float, int, int, int]] = []  # (time, FINISH or START, worker, stamp)
        cursor, row, last, t_now, active = 0, 0, 0.0, -1, n
        over_link = lat + total * link
        host = HostCores(cost, n) if cost.cores else None
        work_of = [0.0] * n

        def reschedule(now: float) -> None:
            nxt = host.schedule(now)
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], FINISH, nxt[1], host.stamp))

        def begin(w: int, at: float) -> None:
            """Worker w has its plan and weights at `at`: take a slice and compute."""
            nonlocal cursor, t_now, active
            if cursor >= end_pos:
                active -= 1
                sync.members(active, retired=[w])
                if host:
                    host.block()  # done: from this event on (not from its plan's arrival)
                return
            it = cursor // X
            if it != t_now and self.scenario.server_trace is not None:  # servers may change speed
                t_now = it
                srv.update(at, it)
                serve[:] = loads * np.array([srv.per_byte[r] for r in used])
            size = min(mu[w], end_pos - cursor)
            slice_of[w], size_of[w] = cursor, size
            cursor += int(size)
            self.factors.advance(at, it)
            fac[w] = float(self.factors.static[w] * self.factors.trace[w])
            work = cost.work_one(w, size, self.rng, it)
            if host:  # its wall time depends on who computes meanwhile: known when it ends
                work_of[w] = work
                heapq.heappush(heap, (at, START, w, 0))
            else:
                comp[w], cpu_of[w] = work * cost.stretch(fac[w]), cost.cpu(fac[w])
                heapq.heappush(heap, (at + comp[w], FINISH, w, 0))

        def serve_pull(w: int, now: float) -> None:
            """The servers answer w's pull (after what they hold) from `now`; w computes again
            once it has the weights and its plan."""
            nonlocal free
            free = np.maximum(free, now) + serve
            version[w] = sync.published()
            nxt = max(plan_at[w], float(free.max()) + over_link)
            span = nxt - ended[w]
            ex_wait[w] = min(span, now - registered[w])  # how long pull_ready held it back
            ex_comm[w] = span - ex_wait[w]
            begin(w, nxt)

        for w in range(n):
            begin(w, ex_comm[w])
        while heap:
            end, kind, w, stamp = heapq.heappop(heap)
            if host:
                if kind == START:
                    host.start(w, end, work_of[w], fac[w])
                    reschedule(end)
                    continue
                if stamp != host.stamp:
                    continue  # predicted before the cores were shared out anew
                comp[w], cpu_of[w] = host.finish(w, end)
            arrive = end + over_link
            free = np.maximum(free, arrive) + serve  # the push, on every server
            sync.accept(w, version[w], int(size_of[w]))
            while (u := sync.next_update()) is not None:
                sync.on_applied(u)
            sigmas = sync.take_staleness(w)
            report = float(free.max()) + 2 * lat  # the ack, then the report to the coordinator
            pushes[w] += 1
            table[row] = (slice_of[w], w, size_of[w], comp[w], ex_wait[w], ex_comm[w], cpu_of[w],
                          version[w], sum(sigmas), len(sigmas), max(sigmas, default=0), report)
            row += 1
            last = max(last, report)
            ended[w], registered[w], plan_at[w] = end, arrive, report + lat
            heapq.heappush(blocked, (policy.pull_version(pushes[w], slice_of[w] // X), w))
            if host:
                host.block()  # held back until its pull is ready: not runnable (from its step's end)
            while blocked and sync.pull_ready(blocked[0][0]):  # this pull, or ones the push released
                _, v = heapq.heappop(blocked)
                if host:
                    host.release()
                serve_pull(v, arrive)
            if host:
                reschedule(end)
        tail = sync.flush()
        if tail is not None:
            sync.on_applied(tail)
        self.histogram.update({s: k * len(used) for s, k in sync.histogram.items()})
        self._stream_records({k: table[:row, i] for i, k in enumerate(COLUMNS)}, X)
        return last

    def _stream_records(self, c: dict[str, np.ndarray], X: int) -> None:
        """One iteration record per X positions of the stream: the pushes whose slices
        start in it, in worker order, written when the last of them reported."""
        it = (c["start"] // X).astype(int)
        order = np.lexsort((c["worker"], it))
        bounds = np.flatnonzero(np.diff(it[order])) + 1
        prev = 0.0
        for idx in np.split(order, bounds):
            t = int(it[idx[0]])
            batch, comp, wait, comm = (c[k][idx] for k in ("batch", "compute", "wait", "comm"))
            self._account(batch, comp, wait, comm)
            n_sig = c["sig_n"][idx].sum()
            elapsed = float(c["report"][idx].max())
            self.emit({"type": "iteration", "iteration": t, "elapsed": elapsed,
                       "workers": c["worker"][idx].astype(int).tolist(), "batch": batch.astype(int).tolist(),
                       "loss": None, "samples_per_s": batch.sum() / (elapsed - prev) if elapsed > prev else None,
                       "staleness_mean": float(c["sig_sum"][idx].sum() / n_sig) if n_sig else None,
                       "staleness_max": int(c["sig_max"][idx][c["sig_n"][idx] > 0].max()) if n_sig else None,
                       "compute_s": comp.tolist(), "wait_s": wait.tolist(), "comm_s": comm.tolist(),
                       "cpu": c["cpu"][idx].tolist(), "mem": [0.0] * len(idx),
                       "version": c["version"][idx].astype(int).tolist()})
            prev = max(prev, elapsed)


def _as_list(action) -> list:
    if isinstance(action, MoveBlock):
        return ["move", action.block, action.src, action.dst]
    if isinstance(action, RemoveServer):
        return ["remove", action.server]
    return ["add"]


__all__ = ["Simulation", "WorkerFactors", "Servers"]
