"""Warm standbys for the Ray launcher (ray_cluster.py): a lost role's replacement takes a
process that has already imported torch and equipoise, as the local launcher's children
come from its template (launch/warm.py).

Ray gives every actor a process of its own and ends it with the actor, so a replacement
is a fresh process that imports torch (about 1.6 s of CPU) before it can register. A
job that replaces lost workers (`may_replace`) keeps one standby actor on each node its
roles run on: an actor of no resources (it reserves nothing: the role it becomes runs on the
reservation of the placement-group bundle it is given, which the lost role held) whose
first call imports what a role needs. A role started on a node with a standby ready
adopts it (its log is renamed for the role) and a new standby starts warming there.
Where no standby is ready on the node the role must run on (still importing, or the node
lost: its bundle is then re-placed by Ray elsewhere), the role starts in a fresh actor as
before. A role whose bundle asks for a GPU never adopts one: a process given no GPU by
Ray sees all of its node's. ``EQUIPOISE_WARM=0`` turns standbys off, as it turns the
template off. RUN_DIR/standbys.json lists the ready ones by node.

Measured (bench_startup.py ``ray-replace``): a killed worker's replacement from the kill
to its first iteration, cold against warm."""

from __future__ import annotations

import logging
import os

from ..config import Config
from .ray_actor import actor_class

log = logging.getLogger("equipoise.ray")


def may_replace(cfg: Config) -> bool:
    """Whether `cfg` asks for replacements of lost workers (`worker_restarts`). Only
    then: a standby per node for every job would cost each node an idle process
    holding torch. (In such a job a server replaced after a rollback takes a standby
    too; a server that fails over to its backup, `replication`, starts nothing.)"""
    return cfg.worker_restarts > 0


class Standbys:
    """One warm actor per node, once asked for (`keep`); `take` hands one over."""

    def __init__(self, ray, enabled: bool):
        self.ray = ray
        self.enabled = enabled and os.environ.get("EQUIPOISE_WARM", "1") != "0"
        self.warming: dict[str, tuple[object, object]] = {}  # node -> (actor, ref of its warm())
        self.ready: dict[str, tuple[object, dict]] = {}  # node -> (actor, where)
        self.changed = False  # a standby became ready since the launcher last wrote nodes

    def keep(self, node: str) -> None:
        """Start a standby on `node` unless one is there or warming."""
        if not self.enabled or node in self.ready or node in self.warming:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = actor_class().options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote("standby")
        self.warming[node] = (actor, actor.warm.remote())

    def poll(self) -> None:
        """Move the standbys that finished warming to `ready` (`changed` if any did)."""
        if not self.warming:
            return
        refs = {ref: node for node, (_, ref) in self.warming.items()}
        done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in done:
            node = refs[ref]
            actor, _ = self.warming.pop(node)
            try:
                self.ready[node] = (actor, self.ray.get(ref, timeout=1))
            except Exception as exc:  # its node lost, or the import failed: none there for now
                log.warning("the standby on node %s did not start: %s", node[:12],
                            (str(exc).splitlines() or [type(exc).__name__])[0][:160])
                self._kill(actor)
        self.changed |= any(refs[ref] in self.ready for ref in done)

    def take(self, node: str) -> tuple[object, dict] | None:
        """The ready standby on `node` and where it runs (None if there is none); a new
        one starts warming there. One that died meanwhile (its node lost, and Ray not
        yet aware) fails its adoption: the launcher then starts a fresh actor."""
        self.poll()
        got = self.ready.pop(node, None)
        if got is not None:
            self.changed = True
            self.keep(node)
        return got

    def nodes(self) -> dict[str, dict]:
        """The ready standbys by node id (RUN_DIR/standbys.json)."""
        return {node: where for node, (_, where) in self.ready.items()}

    def stop(self) -> None:
        actors = [actor for actor, _ in [*self.warming.values(), *self.ready.values()]]
        if actors:  # their logs off their nodes first (a standby has written none of a role's)
            self.ray.wait([a.discard.remote() for a in actors], num_returns=len(actors), timeout=2)
        for actor in actors:
            self._kill(actor)
        self.warming.clear()
        self.ready.clear()

    def _kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:
            pass  # already gone
