"""What PSLD measures of the servers, from their ``stats`` and the workers' exchanges:
each server's throughput (``server_rates``, less the exchanges' fixed cost,
``fixed_cost``), the part of the iteration a placement could cut (``server_share``),
the noise of an interval's mean (``interval_noise``) and the bytes each block carried
(``block_traffic``). Pure functions: the runtime (coordinator/server_manager.py) and
the simulator (sim/state.py) call the same ones; ``policy.psld.Psld`` decides on them.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence

__all__ = ["PROBE_BYTES", "PROBE_TRAIN", "ProbeTrain", "SMALL_EXCHANGE_BYTES", "block_traffic", "fixed_cost",
           "hold_cost", "interval_noise", "probe_bytes",
           "probed_rates", "train_spacing", "server_rates", "server_reach", "server_share"]


# An exchange carrying at most this many bytes is timed as its fixed cost: 16 KB take
# 0.33 ms on a 50 MB/s link, 1.3 ms on a 100 Mbit/s one, against the 2-4 ms an exchange
# costs on one machine (a round trip, two processes' handling and scheduling).
SMALL_EXCHANGE_BYTES = 16 * 1024


def fixed_cost(nbytes: Mapping[int, float], seconds: Mapping[int, float], exchanges: int, workers: int,
               round_trip: float) -> float:
    """The seconds of one interval that no byte causes, the same for every server: each
    of a worker's ``exchanges`` with a server costs at least what an exchange carrying
    almost nothing costs. Measured on the servers whose exchanges carry at most
    SMALL_EXCHANGE_BYTES (``nbytes[j]`` over ``workers`` × ``exchanges``; ``seconds[j]``
    a worker's time with server j over the interval), the least of them; without such a
    server, ``round_trip`` (the least round trip of a message without bytes, which misses
    a worker's own handling: a lower bound)."""
    n = max(1, int(exchanges))
    small = [float(seconds[r]) / n for r, b in nbytes.items()
             if r in seconds and seconds[r] > 0 and b <= SMALL_EXCHANGE_BYTES * n * max(1, workers)]
    each = min(small) if small else (round_trip if math.isfinite(round_trip) else 0.0)
    return n * max(0.0, each)


def interval_noise(durations: Sequence[float]) -> float:
    """The relative standard error of an interval's mean iteration time, from the
    ``durations`` of its iterations: σ / sqrt(n) / mean, σ estimated robustly as 1.4826 ×
    the median absolute deviation (the standard deviation, for normal noise); 0 for
    fewer than two.

    Robust because an interval's one long iteration is seldom noise: a snapshot every
    `snapshot_every` iterations, or a move's pause, lands in the same iteration of every
    interval of its phase, and the intervals a trial compares are of one phase (two
    intervals apart). Counted as spread, one snapshot among five iterations raised the bar
    to about 40% and kept PSLD from every trial after it (the dynamic preset's settled
    time went from 0.91 to 1.19 times the oracle's)."""
    d = [float(x) for x in durations if math.isfinite(x) and x >= 0]
    if len(d) < 2 or sum(d) <= 0:
        return 0.0
    middle = statistics.median(d)
    sigma = 1.4826 * statistics.median(abs(x - middle) for x in d)
    return sigma / math.sqrt(len(d)) / statistics.fmean(d)


def hold_cost(durations: Mapping[int, float], held: Collection[int]) -> dict[int, float]:
    """What the coordinator's holds cost the workers, per held iteration: for each
    iteration i in ``held`` (the coordinator held the workers at its start: a snapshot;
    a measurement, with PSLD's decision and any probe) whose duration ``durations[i]``
    is known, its excess over the median of the interval's iterations not held; nothing
    without such iterations to compare with.

    Not a hold's wall time: at a barrier the workers are still pulling the next
    iteration's weights, and a hold that waits behind those pulls costs them nothing (a
    snapshot's 134 ms beside the dynamic preset's 0.27 s iterations, all of equal
    length). Nor nothing: a snapshot of 100 MB of sparse tables held the workers about
    40 ms beside 65 ms iterations. A hold every other interval, counted in its interval,
    made consecutive intervals alternate by 12% for no placement's doing, and the keep
    bar built from their differences rose above a 16% gain (docs/psld.md)."""
    free = [float(d) for i, d in durations.items() if i not in held and math.isfinite(d) and d >= 0]
    if not free:
        return {}
    typical = statistics.median(free)
    return {i: max(0.0, float(durations[i]) - typical) for i in held
            if i in durations and math.isfinite(durations[i])}


def server_share(seconds: Mapping[int, float], interval: int, iteration_s: float | None) -> float:
    """The part of an interval's wall time (``interval`` iterations of ``iteration_s``)
    that a placement could cut: what its slowest server took (``seconds``) beyond the
    median of the others' times, at most 1; 1 when the wall time is unknown.

    Beyond the others' median, because a placement only moves bytes between servers:
    time every server takes alike (the exchanges' fixed cost on a fast link, a worker
    waiting on the link rather than on any server) stays wherever blocks go. On a case
    where a 5.6x-slower server held only small blocks on 700 MB/s links, every server's
    exchanges took about the same 9-11 ms an iteration; counted whole, the slowest
    server's 10 ms made half of a 20 ms iteration look movable, and PSLD moved blocks
    back and forth for nothing (0.71x greedy). With one server the whole time counts."""
    if not iteration_s:
        return 1.0
    times = sorted(seconds.values())
    if not times:
        return 0.0
    movable = times[-1] - (statistics.median(times[:-1]) if len(times) > 1 else 0.0)
    return min(1.0, max(0.0, movable) / (interval * iteration_s))


def server_reach(seconds: Mapping[int, float], fixed_s: float, interval: int, iteration_s: float | None) -> float:
    """The part of an interval's wall time that its slowest server's bytes took: its time
    (``seconds``) less the fixed cost as ``server_rates`` takes it off (``fixed_s``, at most
    half), over ``interval`` iterations of ``iteration_s``; 1 when the wall time is unknown.

    PSLD's rates are bytes over exactly this time, so a plan cutting the slowest server's
    predicted time by a part c cuts the interval by c times this — as far as the others'
    times let it (``server_share``, the cap). Weighed as c times the share alone, a cut of
    12% of a server taking 82% of the iteration, 24% beyond the others, counted 2.9% (under
    a 3% bar) and the dynamic preset settled 1.18x the oracle in some runs and 1.04x in
    others."""
    if not iteration_s:
        return 1.0
    times = [float(s) for s in seconds.values() if math.isfinite(s)]
    if not times:
        return 0.0
    return min(1.0, max(0.0, byte_time(max(times), fixed_s)) / (interval * iteration_s))


def server_rates(nbytes: Mapping[int, float], seconds: Mapping[int, float],
                 fixed_s: float = 0.0, most: float = 0.5) -> dict[int, float]:
    """Each server's throughput r_j for PSLD: ``nbytes[j]`` bytes handled in
    ``seconds[j]`` (its busy time or the workers' exchange time with it, the larger) over
    one interval, less ``fixed_s`` (``fixed_cost``), the part of that time no byte
    causes, but never more than ``most`` of it (half; PSLD's upper rates take 0.9).

    Counted as bytes, the fixed cost makes a lightly loaded server look slow: with the
    CNN's first layer alone on a 4x-slower server (58 MB/s measured), a server holding
    73 KB measured 45-68 MB/s, 5.5 ms per iteration of which its bytes explained about
    one, so moving the layer there never looked worth a trial (it ran at 260 MB/s once
    it did). Taking at most half of a server's time keeps an error in ``fixed_s`` from
    making a server look more than twice as fast as its time says. Servers that handled
    nothing, or took no time, get no rate."""
    timed = {r: float(s) for r, s in seconds.items() if s > 0 and nbytes.get(r, 0) > 0}
    return {r: nbytes[r] / byte_time(s, fixed_s, most) for r, s in timed.items()}


def byte_time(seconds: float, fixed_s: float, most: float = 0.5) -> float:
    """A server's time less the fixed cost ``fixed_s`` (none if not finite), but never
    less than ``1 - most`` of it: what ``server_rates`` divides its bytes by."""
    fixed = max(0.0, float(fixed_s)) if math.isfinite(fixed_s) else 0.0
    return seconds - min(fixed, seconds * most)


# A probe's bytes (``probe_bytes``): what the slowest server handles in PROBE_S, within
# these bounds (64 KB: 1 ms on a 64 MB/s link; 4 MB: 4 ms on a 1 GB/s one).
PROBE_S = 0.005
PROBE_BYTES = (64 * 1024, 4 * 1024 * 1024)
# A probe is a train of PROBE_TRAIN[0], at most PROBE_TRAIN[2] in flight to a server at once
# (``ProbeTrain``), timed by the spacing of the last PROBE_TRAIN[1] replies
# (``train_spacing``; coordinator/pool.py, sim/state.py).
PROBE_TRAIN = (6, 3, 3)


def probe_bytes(largest: int, rate: float) -> int:
    """The bytes of a probe for servers whose slowest holds a largest block of ``largest``
    bytes and measured ``rate`` bytes/s: what a move of that block would carry, but no more
    than that server handles in PROBE_S, within PROBE_BYTES. A server several times slower
    than that (one holding only small blocks) takes as many times PROBE_S: a probe of the
    whole 1.6 MB block took 0.15 s a round on a 10 MB/s server in the simulator, more
    than the move it could prompt would gain back in a 60-iteration job."""
    low, high = PROBE_BYTES
    cap = rate * PROBE_S if math.isfinite(rate) and rate > 0 else high
    return int(min(high, max(low, min(int(largest), cap))))


class ProbeTrain:
    """Which probes a train sends and when (``ServerPool.probe``, the simulator's ``probe``).
    The first server (the slowest-looking one) gets ``train`` probes, at most ``window``
    in flight (each reply lets one more go). Another (a light server) gets one probe
    first: if its reply comes after the first server's second, it is slower than the
    first server — all PSLD asks of it — and gets no more; otherwise it gets its own
    ``train``, ``window`` in flight. None is sent once the first server's train is in.

    Sent back to back whole, a light server 5x slower than the slowest-looking one (the
    truly slow server, holding a small block) took 5x that server's train with the
    workers held: 160 ms in a 7-server BSP case, its run 3.5% behind greedy's with no
    move made. Cut after one probe it is rated by that probe's time, no faster than the
    first server's second reply says the first server is: never a move's destination."""

    def __init__(self, ranks: Sequence[int], train: int = 6, window: int = 3):
        self.ranks, self.train, self.window = list(ranks), max(2, int(train)), max(1, int(window))
        self.sent = {r: 0 for r in self.ranks}
        self.times: dict[int, list[float]] = {r: [] for r in self.ranks}
        self.cut: set[int] = set()

    def start(self) -> list[int]:
        """The probes to send first (a rank once for each)."""
        self.sent = {r: 1 for r in self.ranks}
        self.sent[self.ranks[0]] = min(self.window, self.train)
        return [r for r in self.ranks for _ in range(self.sent[r])]

    def replied(self, rank: int, at: float) -> list[int]:
        """Server ``rank`` answered a probe at time ``at``: the probes to send now."""
        first = self.ranks[0]
        self.times[rank].append(float(at))
        if rank != first and len(self.times[rank]) == 1 and len(self.times[first]) >= 2:
            self.cut.add(rank)
        if len(self.times[first]) >= self.train or rank in self.cut:  # the first's train is in, or cut
            return []
        more = min(self.window - (self.sent[rank] - len(self.times[rank])), self.train - self.sent[rank])
        self.sent[rank] += max(0, more)
        return [rank] * max(0, more)

    def pending(self) -> list[int]:
        """The servers with a probe still unanswered."""
        return [r for r in self.ranks if len(self.times[r]) < self.sent[r]]

    def run(self, handle: Callable[[int, float], float]) -> float:
        """Drive the train on modelled servers (the simulator, tests): ``handle(rank,
        sent)`` is when the reply to a probe sent to ``rank`` at time ``sent`` is read
        (a server handling its probes one at a time keeps that order itself). When the
        last reply was read; the replies' times are in ``times``."""
        due: list[tuple[float, int]] = []
        for r in self.start():
            heapq.heappush(due, (handle(r, 0.0), r))
        end = 0.0
        while due:
            end, r = heapq.heappop(due)
            for again in self.replied(r, end):
                heapq.heappush(due, (handle(again, end), again))
        return end

    def seconds(self, start: float, timed: int) -> dict[int, float]:
        """Each server's seconds per probe: ``train_spacing`` of its replies, or, with one
        reply, the time from ``start`` to it (burst and round trip counted); nan with none."""
        return {r: train_spacing(t, timed) if len(t) >= 2 else (t[0] - start if t else math.nan)
                for r, t in self.times.items()}


def train_spacing(times: Sequence[float], timed: int) -> float:
    """The seconds a server takes per probe, from the times its replies to a train of
    probes sent back to back were read: the median of the last ``timed`` spacings (the
    probes before them cross whatever burst an idle link lets through; the median drops
    one spacing the host's scheduler stretched); nan with fewer than two times."""
    t = [float(x) for x in times]
    gaps = [b - a for a, b in zip(t, t[1:])][-max(1, int(timed)):]
    return statistics.median(gaps) if gaps else math.nan


def probed_rates(seconds: Mapping[int, float], nbytes: int, round_trip: float,
                 measured: Mapping[int, float], reference: int) -> dict[int, float]:
    """The rates of probed servers: ``nbytes`` over each one's probe time
    (``seconds[j]``) less ``round_trip`` (what a message without bytes takes; at most
    half of the time, as ``server_rates`` takes off), scaled so that the ``reference``
    server's probed rate equals its ``measured`` one (the slowest server, measured under
    its load; the scale within 1/2-2, 1 without both). A probe's bytes cross the link and
    the server's handling as a push's do, but none of an exchange's other costs: scaled,
    a probed rate is in the units of the measured ones that it stands beside."""
    rt = float(round_trip) if math.isfinite(round_trip) and round_trip > 0 else 0.0
    raw = {r: nbytes / (s - min(rt, s / 2)) for r, s in seconds.items() if math.isfinite(s) and s > 0 and nbytes > 0}
    scale = 1.0
    if reference in raw and measured.get(reference, 0) > 0:
        scale = min(2.0, max(0.5, measured[reference] / raw[reference]))
    return {r: v * scale for r, v in raw.items() if r != reference}


def block_traffic(reports) -> dict[int, float]:
    """The bytes each block's exchanges carried, summed over the servers' ``stats``
    reports (each a list of [block, bytes] pairs, or None from a server that sent
    none); a pair that is not two non-negative numbers is skipped."""
    out: dict[int, float] = {}
    for pairs in reports:
        for pair in pairs if isinstance(pairs, list) else ():
            if (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], int)
                    and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool) and pair[1] >= 0):
                out[pair[0]] = out.get(pair[0], 0.0) + float(pair[1])
    return out
