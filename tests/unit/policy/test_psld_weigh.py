"""How PSLD weighs a plan against what it measured (equipoise.policy.psld,
equipoise.policy.measure): a cut of the slowest server's predicted time counts as that
part of the time its bytes took (``reach``), at most its time beyond the others'
(``share``); an unprobed light server's rate counts as no faster than the fastest other
server measured under load."""

import math

import pytest

from equipoise.policy.measure import server_reach, server_share
from equipoise.policy.psld import Psld


@pytest.fixture(autouse=True)
def _pause_free(monkeypatch):
    """Toy sizes and rates: a plan's predicted pause is left out (as in test_psld.py)."""
    monkeypatch.setattr("equipoise.policy.psld.PAUSE_COPIES", 0)


def test_reach_is_the_slowest_servers_time_less_the_fixed_cost_over_the_wall_time():
    # 5 iterations of 0.1 s; the slowest server took 0.45 s of which 0.05 s no byte caused
    assert server_reach({0: 0.45, 1: 0.3, 2: 0.2}, 0.05, 5, 0.1) == pytest.approx(0.8)
    # the fixed cost comes off as server_rates takes it: at most half of the time
    assert server_reach({0: 0.3}, 1.0, 5, 0.1) == pytest.approx(0.3)
    assert server_reach({0: 0.9}, 0.0, 1, 0.1) == 1.0  # at most all of it
    assert server_reach({0: 0.2}, 0.0, 5, None) == 1.0  # wall time unknown
    assert server_reach({}, 0.0, 5, 0.1) == 0.0
    assert server_reach({0: 0.45, 1: 0.3}, math.nan, 5, 0.1) == pytest.approx(0.9)


# Three servers of equal rate; server 0 holds 500 bytes, the others 400: moving one 50-byte
# block cuts the predicted server time by 10% (500 -> 450).
SIZES, TABLE, LIVE = [400, 400, 400, 50, 50], [0, 1, 2, 0, 0], [0, 1, 2]
EQUAL = {0: 100.0, 1: 100.0, 2: 100.0}


def test_a_cut_counts_as_that_part_of_the_servers_time_not_of_its_excess():
    # The server's bytes take 80% of the iteration, 20% beyond the others: a 10% cut of
    # its time is 8% of the iteration (over the 3% bar). Weighed as 10% of the 20% (2%,
    # the weighing without reach) it looked not worth a trial.
    moved = Psld(SIZES, epsilon=0.0).decide(TABLE, LIVE, EQUAL, 1.0, share=0.2, reach=0.8)
    assert len(moved) == 1 and moved[0].src == 0 and moved[0].block in (3, 4)
    assert Psld(SIZES, epsilon=0.0).decide(TABLE, LIVE, EQUAL, 1.0, share=0.2) == []


def test_a_share_of_zero_is_nothing_to_cut():
    # The slowest server takes no longer than the others' median (``server_share`` of equal
    # times is 0): whatever the rates predict, no trial. (A share of 0 was read as 1: all
    # of the iteration movable.) Unknown is not zero: a share that is not a number counts whole.
    assert server_share({0: 0.3, 1: 0.3, 2: 0.3}, 5, 0.1) == 0.0
    assert Psld(SIZES, epsilon=0.0).decide(TABLE, LIVE, EQUAL, 1.0, share=0.0, reach=0.8) == []
    assert len(Psld(SIZES, epsilon=0.0).decide(TABLE, LIVE, EQUAL, 1.0, share=math.nan, reach=0.8)) == 1


def test_a_cut_counts_no_more_than_the_slowest_servers_time_beyond_the_others():
    # Every server's exchanges take about as long (share 2%): the 8% the cut is worth on the
    # slowest server's time alone is capped at 2%, under the bar. No move.
    assert Psld(SIZES, epsilon=0.0).decide(TABLE, LIVE, EQUAL, 1.0, share=0.02, reach=0.8) == []


def test_a_light_server_reading_faster_than_the_loaded_ones_counts_as_fast_as_they_are():
    # Server 3 (4x slower) holds four 100-byte blocks; 1 and 2 hold two each at 100 B/s;
    # server 0 holds 10 bytes and reads 400 B/s (its bytes passed in its link's burst).
    # Taken at its word, the plan gives it all four of the slow server's blocks (410 bytes,
    # 1 s beside the others' 2 s); counted at 100 B/s, it gets two (210 bytes, the least
    # loaded) and 1 and 2 one each (300 bytes).
    sizes = [100] * 8 + [10]
    table, live = [3, 3, 3, 3, 1, 1, 2, 2, 0], [0, 1, 2, 3]
    rates = {0: 400.0, 1: 100.0, 2: 100.0, 3: 25.0}
    moves = Psld(sizes, epsilon=0.0).decide(table, live, rates, 1.0)
    to = [m.dst for m in moves]
    assert moves and all(m.src == 3 for m in moves)
    assert sorted(to) == [0, 0, 1, 2], moves


def test_a_probed_light_server_keeps_its_probed_rate():
    # The probe timed server 0 beside the slowest at 400 B/s: no cap, the plan trusts it.
    sizes = [100] * 8 + [10]
    table, live = [3, 3, 3, 3, 1, 1, 2, 2, 0], [0, 1, 2, 3]
    rates = {0: 400.0, 1: 100.0, 2: 100.0, 3: 25.0}
    c = Psld(sizes, epsilon=0.0)
    c._probed_for = 3
    moves = c.decide(table, live, rates, 1.0, probed={0: 400.0})
    assert [m.dst for m in moves].count(0) == 4, moves


def test_share_and_reach_from_one_measurement():
    # the share is beyond the others' median, the reach the whole time less the fixed cost
    seconds = {0: 0.45, 1: 0.3, 2: 0.2}
    assert server_share(seconds, 5, 0.1) == pytest.approx(0.4)  # (0.45 - 0.25) / 0.5
    assert server_reach(seconds, 0.05, 5, 0.1) == pytest.approx(0.8)
