"""PSLD's decisions without sockets: exploit a measured slow server, judge trials by the
measured iteration time (keep or undo), remember idle servers' rates, explore."""

from equipoise.runtime.psld import PsldController
from equipoise.runtime.coord_servers import parse_control

import pytest


SIZES = [400, 400, 100, 100, 100, 100]


def test_exploit_moves_load_off_the_slow_server_and_keeps_an_improvement():
    c = PsldController(SIZES, epsilon=0.0)
    table = [0, 1, 2, 3, 0, 1]
    rates = {0: 25.0, 1: 100.0, 2: 100.0, 3: 100.0}  # server 0 four times slower
    actions = c.decide(table, [0, 1, 2, 3], rates, iteration_s=1.0)
    assert actions and all(a[0] == "move" and a[2] == 0 for a in actions)
    for _, block, src, dst in actions:
        table[block] = dst
    assert c.decide(table, [0, 1, 2, 3], rates, iteration_s=0.5) == []  # judged: kept
    assert c.log[-1]["kept"] is True


def test_a_trial_that_does_not_help_is_undone():
    c = PsldController(SIZES, epsilon=0.0)
    table = [0, 1, 2, 3, 0, 1]
    actions = c.decide(table, [0, 1, 2, 3], {0: 25.0, 1: 100.0, 2: 100.0, 3: 100.0}, iteration_s=1.0)
    undo = c.decide(table, [0, 1, 2, 3], {}, iteration_s=1.0)  # no faster
    assert undo == [("move", a[1], a[3], a[2]) for a in reversed(actions)]


def test_an_idle_server_keeps_its_measured_rate():
    c = PsldController(SIZES, epsilon=0.0)
    c.decide([0, 1, 2, 3, 0, 1], [0, 1, 2, 3], {0: 25.0, 1: 100.0, 2: 100.0, 3: 100.0}, 1.0)
    c.trial = None
    # server 0 now holds nothing and was not measured: it must not look fast again
    table = [1, 2, 3, 1, 2, 3]
    actions = c.decide(table, [0, 1, 2, 3], {1: 100.0, 2: 100.0, 3: 100.0}, 0.5)
    assert not any(a[0] == "move" and a[3] == 0 and SIZES[a[1]] == 400 for a in actions)


def test_exploration_adds_a_server_when_allowed_and_removes_it_if_unused():
    c = PsldController(SIZES, epsilon=1.0, max_servers=5, seed=3)
    seen = set()
    for _ in range(20):
        c.trial = None
        seen |= {a[0] for a in c.decide([0, 1, 2, 3, 0, 1], [0, 1, 2, 3], {r: 100.0 for r in range(4)}, 1.0)}
    assert "add" in seen
    c.trial, c.undone = None, {4}
    assert c.decide([0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4], {}, 1.0, added={4}) == [("remove", 4)]


@pytest.mark.parametrize("line, action", [('{"action": "add_server"}', ("add",)),
                                          ('{"action": "remove_server", "server": 2}', ("remove", 2)),
                                          ('{"action": "move", "block": 3, "to": 1}', ("move", 3, None, 1))])
def test_control_requests_parse(line, action):
    assert parse_control(line) == action


@pytest.mark.parametrize("line", ["nope", "[1]", '{"action": "explode"}', '{"action": "move", "block": -1, "to": 0}',
                                  '{"action": "remove_server", "server": true}'])
def test_bad_control_requests_are_refused_with_a_reason(line):
    with pytest.raises(ValueError):
        parse_control(line)


def test_an_undone_trial_is_not_retried_at_once():
    c = PsldController(SIZES, epsilon=0.0, tabu_decisions=2)
    table, live = [0, 1, 2, 3, 0, 1], [0, 1, 2, 3]
    rates = {0: 25.0, 1: 100.0, 2: 100.0, 3: 100.0}
    first = c.decide(table, live, rates, 1.0)
    assert first and c.decide(table, live, rates, 1.0)  # judged: no gain, undone
    assert c.decide(table, live, rates, 1.0) == []      # the same plan is not tried again now
    assert c.decide(table, live, rates, 1.0) == first   # ... but it is later
