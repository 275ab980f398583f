"""Under a barrier the plans of an iteration go out before the servers are measured and
PSLD decides (coordinator/pacings.py ``BarrierCoordinator._advance_barrier``): the
workers compute while the coordinator measures, probes and decides. Where PSLD may move
blocks the plans tell the workers to ask for the table before pushing, and the table
they then get is of this iteration even when nothing moved."""

from types import SimpleNamespace

import pytest

from equipoise.coordinator.pacings import BarrierCoordinator
from equipoise.policy.actions import MoveBlock


class Servers:
    def __init__(self, psld: bool, measuring: bool, due=(), decided=()):
        self.psld = object() if psld else None
        self._measuring, self._due, self._decided = measuring, list(due), list(decided)
        self.calls: list = []

    def reached(self, t):
        pass

    def due(self, t):
        self.calls.append(("due", t))
        return list(self._due)

    def measuring(self, t):
        return self._measuring

    def decision(self, t, decide=True):
        self.calls.append(("decision", t, decide))
        return list(self._decided) if decide else []

    def carry_out(self, t, actions):
        self.calls.append(("carry_out", t, list(actions)))

    def replicate(self):
        self.calls.append(("replicate",))


class Stub(BarrierCoordinator):
    def __init__(self, servers: Servers):
        self.servers, self.iteration, self.total, self.clip_due = servers, 10, 100, None
        self.cfg = SimpleNamespace(global_batch=32, clip_grad_norm=0.0, replication=0)
        self.planner = SimpleNamespace(sizes=lambda: {0: 16, 1: 16}, slices=lambda sizes: {0: (0, 16), 1: (16, 16)})
        self.assign = SimpleNamespace(begin=lambda t, slices: None)

    def _snapshot(self, t, version, cursor):
        pass

    def _membership(self, t):
        return False

    def _end_iteration(self, t):
        pass

    def _reply_plan(self, worker, t, start, size, version, await_table=False):
        self.servers.calls.append(("plan", worker, await_table))


@pytest.mark.parametrize("decided", [[], [MoveBlock(3, 0, 1)]])
def test_psld_decides_after_the_plans_and_the_workers_ask_for_the_table(decided):
    servers = Servers(psld=True, measuring=True, decided=decided)
    Stub(servers)._advance_barrier()
    assert servers.calls == [("due", 10), ("plan", 0, True), ("plan", 1, True), ("decision", 10, True),
                             ("carry_out", 10, decided)]  # carried out even if empty: the table is of t


def test_without_psld_the_servers_are_measured_after_the_plans_and_nobody_waits_for_a_table():
    servers = Servers(psld=False, measuring=True)
    Stub(servers)._advance_barrier()
    assert servers.calls == [("due", 10), ("plan", 0, False), ("plan", 1, False), ("decision", 10, True)]


def test_actions_due_are_carried_out_and_psld_only_measures_beside_them():
    move = MoveBlock(5, 1, 0)
    servers = Servers(psld=True, measuring=True, due=[move], decided=[MoveBlock(3, 0, 1)])
    Stub(servers)._advance_barrier()
    assert servers.calls == [("due", 10), ("plan", 0, True), ("plan", 1, True), ("decision", 10, False),
                             ("carry_out", 10, [move])]


def test_between_decisions_nothing_is_measured_and_nobody_waits():
    servers = Servers(psld=True, measuring=False)
    Stub(servers)._advance_barrier()
    assert servers.calls == [("due", 10), ("plan", 0, False), ("plan", 1, False)]
