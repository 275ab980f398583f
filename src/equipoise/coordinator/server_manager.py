"""The coordinator's server manager: placement, emulated server stragglers,
measurements, and block moves and server additions and removals — at barriers under BSP
and LB-BSP, at the stream's iteration boundaries under asp, softsync and ssp (there the
servers hand blocks over while workers run: coordinator/pool.py).

Moves and membership changes come from three sources — the scenario's server events,
run_dir/control.jsonl (`equipoise ctl`) and PSLD's decisions (policy/psld.py) — as the
same typed actions, carried out here while the workers compute (PSLD: Chen et al.,
"Elastic Parameter Server Load Distribution in Deep Learning Clusters", SoCC 2020).
The manager owns its state; the coordinator hands it a transport, a way to await
replies and hellos, the slice of the configuration it reads and the scenario.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..policy.placement import Block
from ..sparse.tables import place_with_tables
from .measurement import measure_interval
from ..policy.psld import AddServer, MoveBlock, Psld, RemoveServer, ServerAction
from ..scenario import BlockMove, Scenario, ServerRemove
from ..wire import Message, PeerTimeout, Transport, names
from .arrivals import Arrivals, JoinServer
from .control import ControlFile
from .pool import ServerPool
from .rpc import JobError, Peers, Rpc
from ..protocol.optimizer import global_norm
from .snapshots import State

log = logging.getLogger("equipoise.coordinator")


@dataclass(frozen=True)
class ServerSettings:
    """The configuration the server manager reads."""

    servers: int
    placement: str
    block_size: int
    server_slowdown: tuple[float, ...]
    server_speeds: tuple[float, ...]
    psld_interval: int
    psld_epsilon: float
    psld_max_servers: int
    psld_horizon: int
    seed: int
    timeout: float


Action = ServerAction | JoinServer


class ServerManager:
    def __init__(self, settings: ServerSettings, scenario: Scenario, transport: Transport, rpc: Rpc,
                 peers: Peers, *, init_fields: dict, control_path: Path,
                 event: Callable[..., None], record: Callable[[dict], None], elapsed: Callable[[], float],
                 await_hello: Callable[[str, Callable[[Message], bool]], bytes], epoch: Callable[[], int], total=0):
        """`init_fields` are the protocol and optimizer fields of every server's init;
        `event(name, t, **fields)` and `record(dict)` write metrics.jsonl; `elapsed()`
        is the training time so far; `await_hello(what, wanted)` waits at a barrier for a
        hello `wanted` accepts; `epoch()` is the coordinator's rollbacks so far (its
        recovery's), told to every server initialised; `total`: the job's iterations (0: unknown)."""
        self.settings, self.scenario, self.transport, self.rpc, self.peers = settings, scenario, transport, rpc, peers
        self.init_fields, self.total = init_fields, total
        self._event, self._record, self._elapsed, self._await_hello = event, record, elapsed, await_hello
        self.epoch = epoch
        self.pool: ServerPool | None = None
        self.psld: Psld | None = None
        self.workers = 0  # active workers, for the init of a joining server
        self.ranks: list[int] | None = None  # their ranks, once some were lost (SSP's clocks)
        self.done_at: int | None = None  # the barrier whose server work is done
        self.table_at = 0  # the iteration the last table change took effect
        self._barrier_at: dict[int, float] = {}
        self._reached: int | None = None  # the barrier stamped last (`reached`)
        self._held: set[int] = set()  # barriers at which the coordinator held the workers (`note_hold`)
        self.control = ControlFile(control_path)  # the user's requests (`equipoise ctl`)
        self._straggle_sent: dict[int, dict] = {}
        self._added: set[int] = set()  # servers added while training ran
        self.arrivals = Arrivals(peers, await_hello, settings.timeout)  # servers started while training runs
        self._rates, self._upper, self._traffic = {}, {}, {}  # bytes/s per server, upper; bytes per block
        self.share = self.reach = 1.0  # the part of the last interval's wall time its slowest server took (its bytes)
        self.noise = 0.0  # the relative standard error of the last interval's mean iteration time
        self.backup_of: dict[int, int] = {}  # replication = 1: primary rank -> backup rank
        self._exchange_s: dict[int, float] = {}  # workers' exchange seconds with each server since `_measure`
        self.barrier = True  # whether changes happen at barriers (else while workers run)

    # -- start --------------------------------------------------------------------------
    def place(self, tensors, widths: dict[str, int] | None = None) -> tuple[list[Block], list[int]]:
        """Blocks and their servers by the `placement` policy (the oracle knows the
        servers' throughputs: `server_speeds`, else 1/factor of the emulated slowdowns);
        sparse tables (`widths`: elements per row) in blocks of whole rows after them."""
        s = self.settings
        rates = list(s.server_speeds) or [1.0 / f for f in (s.server_slowdown or [1.0] * s.servers)]
        blocks, table = place_with_tables(s.placement, tensors, s.servers, s.block_size, rates, widths)
        if s.block_size == 0:
            log.info("block_size = 0 (auto): %d blocks of at most %d elements", len(blocks),
                     max((b.numel for b in blocks), default=0))
        return blocks, table

    def start(self, addresses: list[str], blocks: list[Block], table: list[int], values: dict, optim: dict,
              version: int, samples: int, workers: int) -> None:
        """Connect to the servers, give each its blocks, and wait until all are ready."""
        self.workers = workers
        self.pool = ServerPool(self.transport.connect, self.rpc.expect, addresses, table, blocks,
                               on_removed=lambda r: self.peers.retired("server", r))
        for s in self.pool.live():
            mine = [b for b in blocks if table[b.key] == s]
            self.pool.conns[s].send(self._init(s, mine, values, optim, version, samples))
        for s in self.pool.live():
            self.rpc.expect(self.pool.conns[s], "ready", f"server {s}")
        if self.settings.placement == "psld":
            s = self.settings
            self.psld = Psld([b.nbytes for b in blocks], epsilon=s.psld_epsilon, max_servers=s.psld_max_servers,
                             seed=s.seed, measured={b.key for b in blocks if b.kind == "rows"}, horizon=s.psld_horizon,
                             interval=s.psld_interval)

    def _init(self, rank: int, mine: list[Block], values, optim, version: int, samples: int,
              gradients: dict[int, int] | None = None) -> Message:
        keys = [b.key for b in mine]
        tensors = names.pack(values={k: values[k] for k in keys}, states=names.states_for(optim, keys))
        extra = {"ranks": list(self.ranks)} if self.ranks is not None else {}
        return Message("init", {**self.init_fields, "blocks": [b.to_list() for b in mine], "version": version,
                                "samples": samples, "workers": self.workers, "epoch": self.epoch(),
                                "block_gradients": [[k, int((gradients or {}).get(k, 0))] for k in keys],
                                **extra,
                                "straggler": self.scenario.server_straggle(rank, 0.0, 0)}, tensors)

    def restore(self, addresses: dict[int, str], table: list[int], values: dict, optim: dict,
                version: int, samples: int, gradients: dict[int, int] | None = None, *,
                active: list[int]) -> None:
        """Every server starts again from a snapshot, in the rollback epoch `epoch()`, counting the
        workers `active`: the replacements at `addresses` (rank → address) and the
        survivors alike get their blocks of `table` with the snapshot's values and
        optimizer state, and `gradients`, the gradients applied to each block by then (by
        block key). Replies to requests a loss interrupted are skipped while waiting for
        the servers to be ready."""
        self.active(active)
        pool = self.pool
        for rank, address in addresses.items():
            pool.conns[rank].close()
            pool.addresses[rank], pool.conns[rank] = address, self.transport.connect(address)
        live = pool.serving()
        # A server removed since the snapshot (an elastic removal) holds nothing now.
        table = [r if r in live else live[key % len(live)] for key, r in enumerate(table)]
        pool.table, pool.version = table, pool.version + 1
        self._straggle_sent = {}  # a replacement starts unslowed: send the current factors again
        for s in pool.live():
            mine = [b for b in pool.blocks if table[b.key] == s]
            pool.conns[s].send(self._init(s, mine, values, optim, version, samples, gradients))
        for s in pool.live():
            deadline = self.rpc.deadline()
            while True:
                self.rpc.tick(deadline, f"waiting for server {s} to take the snapshot")
                try:
                    reply = pool.conns[s].recv(timeout=0.2)
                except PeerTimeout:
                    continue
                if reply.type == "error":
                    raise JobError(f"server {s} refused the snapshot: {reply.fields.get('message')}")
                if reply.type == "ready":
                    break

    # -- replication = 1 ------------------------------------------------------------------
    def replicate(self) -> None:
        """Each live server's backup is the next live server (a ring); each forwards its
        current version to its backup at once."""
        live = self.pool.live()
        self.backup_of = {r: live[(i + 1) % len(live)] for i, r in enumerate(live)} if len(live) > 1 else {}
        for r in live:
            backup = self.pool.addresses[self.backup_of[r]] if r in self.backup_of else ""
            self.pool.request(r, Message("replicate", {"backup": backup}), "ack")

    def read_back(self, lost: int, version: int) -> State | None:
        """Every block's values and optimizer state at `version`: the survivors' own, the
        lost server's from its backup; None if one of them no longer holds that version."""
        for r in self.pool.live():  # late replies to requests the loss interrupted
            while True:
                try:
                    self.pool.conns[r].recv(timeout=0.05)
                except PeerTimeout:
                    break
        values, optim, samples = {}, {}, []
        for r in self.pool.live():
            if r not in self.pool.table:
                continue  # holds no blocks: nothing to read back
            holder = r if r != lost else self.backup_of.get(lost)
            if holder is None:
                return None
            try:
                reply = self.pool.request(holder, Message("replica_req", {"primary": r, "version": version}),
                                          "state")
            except JobError as exc:
                if "refused" not in str(exc):
                    raise
                return None
            values.update(names.values_of(reply.tensors))
            optim.update(names.states_of(reply.tensors))
            samples.append(int(reply.fields["samples"]))
        return State(values, optim, version, min(samples))

    def promote(self, lost: int) -> list[int]:
        """The lost server's backup takes its blocks: the new table (the pool forgets the
        lost server)."""
        backup, pool = self.backup_of[lost], self.pool
        pool.conns[lost].close()
        pool.conns[lost], pool.addresses[lost] = None, ""
        return [backup if r == lost else r for r in pool.table]

    def start_planned(self) -> None:
        """Servers the scenario adds at iteration N start with the job, so the join at
        N costs an initialisation, not a process start."""
        for rank, at in self.scenario.added_servers().items():  # ranks from `servers` on
            self.arrivals.start(rank, joins_at=at)

    # -- plumbing for the coordinator -------------------------------------------------------
    @property
    def table(self) -> list[int]:
        return self.pool.table

    @property
    def version(self) -> int:
        return self.pool.version

    @property
    def addresses(self) -> list[str]:
        return self.pool.addresses

    def stop(self, reason: str) -> dict[int, Message]:
        """Stop every server at the job's end; their acks. Each is marked retired first:
        one that exits before the others have acked is no failure."""
        for r in self.live():
            self.peers.retired("server", r)
        return self.broadcast(Message("stop", {"reason": reason}), "ack")

    def broadcast(self, msg: Message, kind: str) -> dict[int, Message]:
        return self.pool.broadcast(msg, kind)

    def clip(self, version: int) -> float:
        """clip_grad_norm under a barrier: the update from `version` is complete on every
        server; gather the gradient norm of every block, take the global norm as
        `clip_grad_norm_` does (store.global_norm), send every server the norm to clip
        by, and return it (before clipping). A malformed reply is a JobError naming
        the server."""
        parts = self.pool.broadcast(Message("norm_req", {"version": version}), "norm")
        norms: dict[int, float] = {}
        for r, reply in sorted(parts.items()):
            try:
                for key, value in reply.fields["norms"]:
                    norms[int(key)] = float(value)
            except (TypeError, ValueError) as exc:
                raise JobError(f"server {r}: malformed gradient norms for version {version}: {exc}") from None
        norm = global_norm(norms)
        self.pool.broadcast(Message("clip", {"version": version, "norm": norm}), "ack")
        return norm

    def observe_exchange(self, server_s: dict[int, float]) -> None:
        """A worker's seconds in exchanges with each server since its last report."""
        for r, sec in server_s.items():
            self._exchange_s[r] = self._exchange_s.get(r, 0.0) + sec

    # -- what recovery asks of the servers -------------------------------------------------
    def active(self, ranks: list[int]) -> None:
        """The workers whose pushes count from now on, by rank (SSP keeps their clocks; a
        server initialised from now on is told them)."""
        self.workers, self.ranks = len(ranks), list(ranks)

    def lose_worker(self, worker: int, active: list[int], drop: bool) -> dict[int, Message]:
        """Every server forgets `worker` (its pending pushes dropped if `drop`); the
        replies say what each had applied (`at`, `applied`)."""
        self.active(active)
        return self.broadcast(Message("lose", {"worker": worker, "workers": len(active), "drop": drop}), "ack")

    def expect(self, ranks, version: int, pushes) -> None:
        """Servers `ranks`' update from `version` waits for `pushes(rank)` pushes (None:
        one per active worker)."""
        for rank in ranks:
            self.pool.request(rank, Message("expect", {"version": version, "pushes": pushes(rank)}), "ack")

    def live(self) -> list[int]:
        """Ranks of the servers running now."""
        return self.pool.live()

    def members(self, workers: int, retired: list[int] = ()) -> None:
        """Tell every server how many workers are active (and which stopped)."""
        self.workers = workers
        fields = {"workers": max(1, workers)}
        if retired:
            fields["retired"] = list(retired)
        self.pool.broadcast(Message("members", fields), "ack")

    def table_reply(self) -> Message:
        return Message("table", {"table": self.pool.table, "servers": self.pool.addresses,
                                 "version": self.table_at})

    def note_hello(self, msg: Message) -> bool:
        return self.arrivals.note_hello(msg)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    # -- at barriers ----------------------------------------------------------------------
    def at_barrier(self, t: int) -> list[Action]:
        """At the barrier of iteration t (every server at version t, nothing pending or
        in flight): update emulated server slowdowns, measure the servers every
        `psld_interval` iterations, and return the actions due, which `carry_out`
        performs once the plans of t are out."""
        if self.done_at == t:
            return []  # a barrier re-entered after workers joined
        self.done_at = t
        interval = self.settings.psld_interval
        self.reached(t)
        self._barrier_at = {k: v for k, v in self._barrier_at.items() if k >= t - interval}
        self._held = {k for k in self._held if k >= t - interval}
        self._update_stragglers(t)
        actions: list[Action] = self.arrivals.joining(t)
        for ev in self.scenario.server_events:
            if ev.iteration == t and isinstance(ev, ServerRemove):
                actions.append(RemoveServer(ev.server))
            elif ev.iteration == t and isinstance(ev, BlockMove):
                actions.append(MoveBlock(ev.block, None, ev.to))
        actions += self.control.actions(
            lambda line, reason: self._event("control_refused", t, line=line[:200], reason=reason))
        actions += self.arrivals.arrived()
        if t > 0 and t % interval == 0:
            self.note_hold(t)  # measuring and deciding here hold the workers, a probe too
            throughput, iteration_s = self._measure(t)
            if self.psld is not None and not actions and iteration_s:
                probe = self.psld.probe_targets(self.pool.table, self.pool.serving(), throughput, self.share, self._upper)
                probed = self.pool.probe(probe, throughput) if probe else None
                if probed:
                    self._event("servers_probed", t, servers=probe, mbps={r: v / 1e6 for r, v in probed.items()})
                actions = self.psld.decide(self.pool.table, self.pool.serving(), throughput, iteration_s,
                                           set(self._added), share=self.share, reach=self.reach, noise=self.noise, upper=self._upper,
                                           traffic=self._traffic, left=self.total and self.total - t or None,
                                           probed=probed)
        return actions

    def _update_stragglers(self, t: int) -> None:
        """Send each server its emulated slowdown when the scenario changed it."""
        if not self.scenario.server_trace:
            return
        for r in self.pool.live():
            now = self.scenario.server_straggle(r, self._elapsed(), t)
            if self._straggle_sent.get(r) != now:
                self._straggle_sent[r] = now
                self.pool.request(r, Message("straggle", now), "ack")

    def carry_out(self, t: int, actions: list[Action]) -> None:
        """Perform server actions while the workers compute iteration t on the weights
        they already pulled; each asks for the resulting table (`table_req`) before its
        first push, so a worker waits only if the moves outlast its compute."""
        pause = 0.0
        for action in self._grouped(actions):
            try:
                pause += self._perform(t, action)
            except (ValueError, KeyError) as exc:  # a bad request is refused, training goes on
                log.warning("server action %s refused: %s", action, exc)
                self._event("server_action_refused", t, action=_as_list(action), reason=str(exc))
        self.table_at = t
        if pause and self.psld is not None:
            self.psld.charge(pause)

    def _grouped(self, actions: list[Action]) -> list:
        """`actions` with each run of moves to one server carried out as one migration
        (a list of blocks; the source hands them over in one message): each migration
        costs a round trip and a rebuild of both servers' stores whatever it carries, so
        a plan of five 16 KB blocks took five pauses of 2-7 ms against iterations of
        16 ms. A move the pool would refuse (no such block, its server not running) stays
        on its own, refused alone; one of a block already in the run starts a new run."""
        out: list = []
        run: dict[int, list[int]] = {}
        for action in actions:
            ok = isinstance(action, MoveBlock) and self.pool.refusal([action.block], action.dst) is None
            if not ok or any(action.block in ks for ks in run.values()):
                out += [(ks, dst) for dst, ks in run.items()]
                run = {}
            if ok:
                run.setdefault(action.dst, []).append(action.block)
            else:
                out.append(action)
        return out + [(ks, dst) for dst, ks in run.items()]

    def _perform(self, t: int, action) -> float:
        pool = self.pool
        if isinstance(action, (tuple, MoveBlock)):  # blocks to one server (`_grouped`), or a move it left alone
            done = pool.move(*(action if isinstance(action, tuple) else ([action.block], action.dst)))
            if done["blocks"]:
                self._event("block_moved", t, **done, table_version=pool.version)
            return done["pause_s"]
        if isinstance(action, AddServer):  # start the process now; it joins once registered
            self._event("server_starting", t, server=self.arrivals.start_next(self.pool.next_rank()))
            return 0.0
        if isinstance(action, JoinServer):
            version, samples = self._progress()
            done = pool.add(action.server, action.address, self._init(action.server, [], {}, {}, version, samples))
            self._added.add(action.server)
            self._event("server_added", t, **done, table_version=pool.version)
            return done["pause_s"]
        if isinstance(action, RemoveServer):
            if self.barrier:
                done = pool.remove(action.server, self._rates)
            else:  # it forwards what still reaches it until no worker routes by a table naming it
                done = pool.drain(action.server, self._rates)
            self._event("server_removed", t, **done, table_version=pool.version)
            return done["pause_s"]
        raise ValueError(f"unknown server action {action!r}")

    def retire(self, t: int, clear: int) -> None:
        """Stop the servers emptied for removal that no worker reaches any more: every
        worker routes by table `clear` or a later one, with no older exchange in flight."""
        for rank, left_at in sorted(self.pool.leaving.items()):
            if left_at <= clear:
                self.pool.retire(rank)
                self._event("server_retired", t, server=rank)

    def _progress(self) -> tuple[int, int]:
        """(version, samples) every server holds at this barrier."""
        r = self.pool.table[0]  # a server that holds blocks, so is at the current version
        reply = self.pool.request(r, Message("ping", {}), "pong")
        return int(reply.fields["version"]), int(reply.fields["samples"])

    def reached(self, t: int) -> None:
        """Every worker reached iteration t's barrier (or the stream passed it): the end
        of one of PSLD's iterations, stamped before the coordinator's own work there (a
        snapshot), which `measure_interval` counts in the interval after it. The same
        barrier again (re-entered after workers joined, or `at_barrier` after the
        snapshot) keeps its first stamp; one reached anew after a rollback is stamped anew."""
        if t != self._reached:
            self._barrier_at[t], self._reached = time.perf_counter(), t
            self._held = {k for k in self._held if k < t}  # after a rollback: holds of the lost timeline

    def note_hold(self, t: int) -> None:
        """The coordinator held the workers at barrier t (a snapshot; a measurement, with
        PSLD's decision and any probe): PSLD judges the interval holding the iteration
        after it less what the hold cost them (``policy.measure.hold_cost``)."""
        self._held.add(t)

    def _measure(self, t: int) -> tuple[dict[int, float], float | None]:
        """Each server's busy seconds, bytes and load since the last measurement, and the
        mean iteration time (``measure_interval``) — written as a "servers" record."""
        m = measure_interval(self.pool, self._barrier_at, t, self.settings.psld_interval, self._exchange_s,
                             self.workers, self._held)
        self._exchange_s = {}
        self.share, self.reach, self.noise = m.share, m.reach, m.noise
        self._rates, self._upper, self._traffic = m.throughput, m.upper, m.traffic
        self._record({"type": "servers", "iteration": t, "time": time.time(), "elapsed": self._elapsed(), **m.record})
        return m.throughput, m.judged_s


def _as_list(action: Action) -> list:
    """An action as metrics.jsonl records it: ["move", block, src, dst] (a migration of
    several: ["move", [blocks], None, dst]), ["add"],
    ["remove", server] or ["join", server, address]."""
    if isinstance(action, MoveBlock):
        return ["move", action.block, action.src, action.dst]
    if isinstance(action, tuple):  # blocks to one server (`_grouped`)
        return ["move", list(action[0]), None, action[1]]
    if isinstance(action, RemoveServer):
        return ["remove", action.server]
    if isinstance(action, JoinServer):
        return ["join", action.server, action.address]
    return ["add"]


__all__ = ["ServerManager", "ServerSettings", "JoinServer"]
