"""The coordinator's duties towards its servers (PSLD, PAPERS.md §3): initial placement,
emulated server stragglers, measurements, and block moves and server additions and
removals at barriers — from `server_events`, from run_dir/control.jsonl (`equipoise ctl`)
and from PSLD's decisions. A mixin of `Coordinator`, which owns the state it uses."""

from __future__ import annotations

import json
import logging
import time

from ..policy.placement import Block, greedy_placement, make_blocks, oracle_placement, placement_blocks
from ..wire import Message

log = logging.getLogger("equipoise.coordinator")


class ServerDuties:
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

    def _straggler(self, rank: int, elapsed: float, t: int) -> dict:
        """Server `rank`'s emulated slowdown now (static factor or trace) and link cap."""
        cfg = self.cfg
        factor = cfg.server_slowdown[rank] if rank < len(cfg.server_slowdown) else 1.0
        if cfg.server_trace:
            trace = self._server_trace()
            if trace.rows and any(row[1] == rank for row in trace.rows):  # else the static factor holds
                factor = trace.factor(rank, elapsed if trace.unit == "time" else t)
        out = {"factor": factor, "rate_mbps": cfg.server_rate}
        if rank < len(cfg.server_bandwidth):
            out["bandwidth_mbps"] = cfg.server_bandwidth[rank]
        return out

    def _server_trace(self):
        if not hasattr(self, "_trace"):
            from ..scenario import Trace
            self._trace = Trace.from_csv(self.cfg.server_trace, column="server")
        return self._trace

    def _servers_at_barrier(self, t: int) -> list[tuple]:
        """At the barrier of iteration t (every server at version t, nothing pending or
        in flight): update emulated server slowdowns, measure the servers every
        `psld_interval` iterations, and return the block moves and server additions and
        removals due — from `server_events`, run_dir/control.jsonl and PSLD — which
        `_carry_out` performs once the plans of t are out."""
        if self.servers_done_at == t:
            return []  # a barrier re-entered after workers joined
        self.servers_done_at = t
        cfg = self.cfg
        self._barrier_at[t] = time.perf_counter()
        for old in [k for k in self._barrier_at if k < t - cfg.psld_interval]:
            del self._barrier_at[old]
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
            self._event("server_starting", t, server=self._start_server())
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
        reply = self.pool.request(r, Message("ping", {}), "pong")
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
                    raise _job_error("this launcher cannot add servers while training runs")
                self._planned[self._start_server()] = ev["iteration"]

    def _start_server(self) -> int:
        """Start the process of the next server rank; it registers with a hello later."""
        rank = max([len(self.pool.conns) - 1, *self._spawning]) + 1
        self._spawning[rank] = time.monotonic()
        self.spawn_server(rank)
        return rank

    def _await_server(self, rank: int) -> str:
        if rank not in self._hellos:
            self._await(f"new server {rank} to register", lambda m: m.fields.get("role") == "server"
                        and m.fields.get("rank") == rank)
        del self._spawning[rank]
        return self._hellos.pop(rank)

    def _arrived_servers(self, t: int) -> list[tuple]:
        """Servers started earlier that have registered since: join them now (PSLD's
        then get blocks by its next decision). A server that never registers fails
        the job after `timeout`."""
        out = []
        for rank, started in sorted(self._spawning.items()):
            if rank in self._planned:
                continue
            if rank in self._hellos:
                out.append(("join", rank, self._hellos.pop(rank)))
                del self._spawning[rank]
            elif time.monotonic() - started > self.cfg.timeout:
                raise _job_error(f"new server {rank} did not register within {self.cfg.timeout:.0f} s")
        return out

    def retire_server_process(self, rank: int) -> None:
        if self.retire_server is not None:
            self.retire_server(rank)


def parse_control(line: str) -> tuple:
    """One control.jsonl request as a server action: {"action": "add_server"},
    {"action": "remove_server", "server": R} or {"action": "move", "block": K, "to": R}."""
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


def _job_error(message: str) -> Exception:
    from .coordinator import JobError  # the coordinator module imports this one

    return JobError(message)
