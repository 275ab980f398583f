"""PSLD's probe of a light server's rate (``Psld.probe_targets``, ``measure.probe_bytes``
and ``probed_rates``): which servers are probed and when, what a probe's times say, and
a move made or not on them. The numbers are the single-block case under SSP on 919 MB/s
links as measured: the CNN's first layer (block 0) alone on the 4x-slower server 0."""

import math

import pytest

from equipoise.clock import VirtualClock
from equipoise.policy.measure import (PROBE_BYTES, PROBE_S, PROBE_TRAIN, ProbeTrain, probe_bytes, probed_rates,
                                      train_spacing)
from equipoise.policy.psld import MoveBlock, Psld
from equipoise.wire.bandwidth import TokenBucket

SIZES = [1605632, 73728, 5120, 1152]
LIVE = [0, 1, 2, 3]
# bytes/s as measured over an interval: the light servers' rates are their few bytes
# over times that are mostly the exchanges' fixed cost (extrapolations)
RATES = {0: 300e6, 1: 80e6, 2: 6e6, 3: 1.5e6}
UPPER = {0: 300e6, 1: 200e6, 2: 25e6, 3: 8e6}  # below server 0's: no relief either
SHARE, ITERATION_S = 0.4, 0.055


def test_a_probe_is_as_large_as_the_block_within_what_the_slow_server_takes_in_5_ms():
    assert probe_bytes(1605632, 300e6) == 1_500_000  # 5 ms at 300 MB/s, under the block
    assert probe_bytes(1605632, 1e9) == 1605632  # the block, under 5 ms
    assert probe_bytes(100, 1e9) == PROBE_BYTES[0] and probe_bytes(10**9, float("inf")) == PROBE_BYTES[1]


def test_probed_rates_are_scaled_to_the_slow_servers_measured_rate_within_a_factor_of_2():
    # 1.5 MB: server 0 took 10.5 ms, server 1 2.5 ms, 0.5 ms of each a round trip without bytes
    seconds = {0: 0.0105, 1: 0.0025}
    # raw 150 and 750 MB/s; server 0 measured 300 under its load: scale 2
    assert probed_rates(seconds, 1_500_000, 0.0005, {0: 300e6}, 0) == {1: pytest.approx(1.5e9)}
    assert probed_rates(seconds, 1_500_000, 0.0005, {0: 900e6}, 0) == {1: pytest.approx(1.5e9)}  # at most 2
    assert probed_rates(seconds, 1_500_000, 0.0005, {}, 0) == {1: pytest.approx(750e6)}  # unscaled
    # at most half of a time is the round trip: 1 ms less 0.5 ms, not less 0.9 ms
    assert probed_rates({1: 0.001}, 1000, 0.0009, {}, 0) == {1: pytest.approx(1000 / 0.0005)}


def replies(rate: float, nbytes: int, train: int = 6) -> list[float]:
    """When a server behind an idle emulated link (its bucket full: 5 ms of ``rate``)
    answers each of ``train`` probes of ``nbytes`` sent back to back: it handles one at
    a time, each taking the delay the bucket sets."""
    clock = VirtualClock()
    bucket = TokenBucket(rate, clock=clock)
    out = []
    for _ in range(train):
        clock.sleep(bucket.delay(nbytes))
        out.append(clock.now())
    return out


def test_a_train_of_probes_times_the_links_sustained_rate_not_its_burst():
    """A probe is 5 ms at the slowest server's rate, the size of the burst an idle link of
    that rate lets through: the first probe takes no time (timed alone, it made a 55 MB/s
    server look several times faster). The last three spacings of a train of six are the
    sustained time per probe, for a light server as fast as the slowest or up to 3x
    faster (its burst three probes); one faster still is overrated, never underrated."""
    slow = 55e6
    n = probe_bytes(1605632, slow)
    assert n == pytest.approx(slow * PROBE_S)
    assert replies(slow, n)[0] == 0.0
    for rate in (slow / 2, slow, 2 * slow, 3 * slow):
        assert train_spacing(replies(rate, n), 3) == pytest.approx(n / rate, rel=1e-9)
    assert train_spacing(replies(5 * slow, n), 3) <= n / (5 * slow)
    assert train_spacing([1.0, 1.004, 1.009, 1.030, 1.035, 1.040], 3) == pytest.approx(0.005)  # one stretched, dropped
    assert math.isnan(train_spacing([1.0], 3))


class _At:
    """A clock that reads what it is set to (one server's handling, in a train below)."""
    t = 0.0

    def now(self) -> float:
        return self.t


def windowed(rates: dict[int, float], nbytes: int) -> tuple[ProbeTrain, float]:
    """A probe of ``nbytes`` to servers behind idle emulated links (``rates``, the first
    the slowest-looking server), sent as ``ProbeTrain`` says: each server handles its
    probes one at a time, each taking the delay its bucket sets. The train, and when its
    last reply came."""
    clocks = {r: _At() for r in rates}
    buckets = {r: TokenBucket(v, clock=clocks[r]) for r, v in rates.items()}
    free = dict.fromkeys(rates, 0.0)

    def handle(r: int, sent: float) -> float:
        clocks[r].t = max(free[r], sent)
        free[r] = clocks[r].t + buckets[r].delay(nbytes)
        return free[r]

    plan = ProbeTrain(list(rates), PROBE_TRAIN[0], PROBE_TRAIN[2])
    return plan, plan.run(handle)


def test_a_windowed_train_times_a_light_server_as_fast_or_faster_as_a_whole_train_does():
    """Three probes in flight at most (a light server's first alone): a light server as
    fast as the slowest or up to 3x faster gets the whole train, and the last three
    spacings are its sustained time per probe, as when the six went back to back."""
    slow = 55e6
    n = probe_bytes(1605632, slow)
    for rate in (slow, 2 * slow, 3 * slow):
        plan, _ = windowed({0: slow, 1: rate}, n)
        assert plan.sent == {0: 6, 1: 6}
        assert plan.seconds(0.0, 3)[1] == pytest.approx(n / rate, rel=1e-9)
        assert plan.seconds(0.0, 3)[0] == pytest.approx(n / slow, rel=1e-9)


def test_a_light_server_slower_than_the_first_gets_one_probe_and_is_rated_below_it():
    """A light server 5x slower than the slowest-looking one (the truly slow server, with
    a small block): sent whole, its train took 6 of its probes, 5x the first's train.
    Its first reply comes after the first server's second: it gets no more, the train
    ends with the first server's six, and it is rated by its one probe's time (its burst
    counted: above its own rate, below the first's, so never a move's destination).
    Up to 2x slower, its first reply comes before the first's second, and it is timed
    by a train of its own (the last spacings: its own rate)."""
    slow = 55e6
    n = probe_bytes(1605632, slow)
    light = slow / 5
    plan, end = windowed({0: slow, 1: light}, n)
    assert plan.sent == {0: 6, 1: 1} and plan.cut == {1}
    assert end == pytest.approx((6 * n - slow * PROBE_S) / slow, rel=1e-9)  # the first's train, its burst off
    assert end < 0.2 * (6 * n - light * PROBE_S) / light  # the whole train the light server took
    rates = probed_rates(plan.seconds(0.0, 3), n, 0.0, {0: slow}, 0)
    assert light < rates[1] < slow
    for k in (1.25, 1.5, 1.9):
        plan, _ = windowed({0: slow, 1: slow / k}, n)
        assert not plan.cut and len(plan.times[1]) >= 3
        assert probed_rates(plan.seconds(0.0, 3), n, 0.0, {0: slow}, 0)[1] == pytest.approx(slow / k, rel=1e-9)
    one = ProbeTrain([0, 1], 6, 3)  # with no reply at all, a server is not rated
    one.start()
    one.replied(1, 0.04)
    assert one.seconds(0.0, 3)[1] == 0.04 and math.isnan(one.seconds(0.0, 3)[0])


def test_the_slow_server_and_the_fastest_looking_light_one_are_probed_once_an_episode():
    c = Psld(SIZES, epsilon=0.0)
    assert c.probe_targets(LIVE, LIVE, RATES, 0.01, UPPER) == []  # the servers' time is not what stands out
    assert c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER) == [0, 1]
    assert c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER) == []  # probed for server 0 already
    # a light server measured under a trial's load is not probed; with none left, nothing is
    c = Psld(SIZES, epsilon=0.0)
    c.loaded = {r: (1e6, 1, 5) for r in (1, 2, 3)}
    assert c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER) == []


def test_a_light_server_probed_fast_takes_the_layer_and_one_probed_slow_does_not():
    """On the rates measured nothing pays and the upper rates predict no relief; the probe
    says server 1 handles 1.2 GB/s, and the layer moves there. Probed at 290 MB/s (no
    faster than server 0), it stays, and no relief is tried on server 1's upper rate."""
    assert Psld(SIZES, epsilon=0.0).decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=UPPER) == []
    c = Psld(SIZES, epsilon=0.0)
    assert c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER) == [0, 1]
    actions = c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=UPPER, probed={1: 1.2e9})
    assert MoveBlock(0, 0, 1) in actions
    c = Psld(SIZES, epsilon=0.0)
    c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER)
    optimistic = {**UPPER, 1: 1.5e9}  # a relief on this would move the layer
    assert c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=optimistic, probed={1: 290e6}) == []
    assert c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=optimistic) == []  # the probe still holds


def test_a_probe_no_longer_holds_once_the_rates_it_was_taken_beside_have_moved():
    """Server 1 probed no faster than server 0; then server 0's measured rate falls by
    over 1.5x (a slowdown arriving): the probe is dropped, and the relief its upper rate
    predicts is tried. No probe is taken while a trial is in flight."""
    c = Psld(SIZES, epsilon=0.0)
    c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER)
    optimistic = {**UPPER, 1: 1.5e9}
    assert c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=optimistic, probed={1: 290e6}) == []
    slowed = {**RATES, 0: 150e6}
    assert MoveBlock(0, 0, 1) in c.decide(LIVE, LIVE, slowed, 0.09, share=SHARE, upper=optimistic)
    assert c.trial is not None and c.probe_targets(LIVE, LIVE, slowed, SHARE, optimistic) == []


def test_a_light_servers_own_measured_rate_moving_does_not_drop_the_probe():
    """A light server's measured rate is the extrapolation the probe stands in for: its
    moving by over 1.5x (80 then 130 MB/s, server 0's unchanged) keeps the probe, and no
    relief is tried on its upper rate."""
    c = Psld(SIZES, epsilon=0.0)
    c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER)
    optimistic = {**UPPER, 1: 1.5e9}
    assert c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=optimistic, probed={1: 290e6}) == []
    noisy = {**RATES, 1: 130e6}
    assert c.decide(LIVE, LIVE, noisy, ITERATION_S, share=SHARE, upper=optimistic) == []
    assert c.probed == {1: 290e6}


def test_a_probed_rate_stands_as_a_ratio_to_the_slowest_servers_measured_rate():
    """Server 1 probed 3% faster than server 0 (310 beside 300 MB/s): no move pays. At the
    next decision server 0 reads 250 MB/s (its measured rate moves by that much from one
    interval to the next at one placement, within the 1.5x that drops the probe): server
    1 stands at 3% faster still, 258 MB/s, not 310, and the layer stays."""
    c = Psld(SIZES, epsilon=0.0)
    c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER)
    assert c.decide(LIVE, LIVE, RATES, ITERATION_S, share=SHARE, upper=UPPER, probed={1: 310e6}) == []
    noisy = {**RATES, 0: 250e6}
    assert c.decide(LIVE, LIVE, noisy, ITERATION_S, share=SHARE, upper=UPPER) == []
    assert c.probed == {1: 310e6}
    # faster by what a move pays for, it takes the layer at any reading of server 0's
    c = Psld(SIZES, epsilon=0.0)
    c.probe_targets(LIVE, LIVE, RATES, SHARE, UPPER)
    assert MoveBlock(0, 0, 1) in c.decide(LIVE, LIVE, noisy, ITERATION_S, share=SHARE, upper=UPPER, probed={1: 1.2e9})
