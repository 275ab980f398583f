"""PSLD's decisions and user server requests as typed actions (pure: no sockets).

PSLD: Chen et al., "Elastic Parameter Server Load Distribution in Deep Learning
Clusters", ACM SoCC 2020.

Every few iterations the runtime measures each live server -- bytes handled over busy
seconds, its effective throughput r_j -- and the mean iteration time, and asks
``Psld.decide`` what to do. ``Psld`` either judges the trial it started last time (keep
it if the measured iteration time improved by more than ``threshold`` and the noise,
else undo it: its migration's pause is spent either way, and undoing pays another), or
starts a new trial. A trial is judged on the interval after the one its moves were made
in, which measures neither placement: its mean holds the moves' pause, and the servers'
rates measured over it mix in the old placement's last exchanges (a worker reports an
iteration's exchange times with its next plan request). New trials:

* exploit: the descending-best-fit moves (``exploit_moves``) that cut the predicted
  maximum server time max_j L_j / r_j, if the cut, as a part of the iteration (of the
  slowest server's time, at most its time beyond the others'), exceeds ``threshold`` and
  are not a plan undone within the last ``tabu_decisions`` decisions; of them, only the
  prefix whose gain over ``horizon`` iterations (or the job's iterations left, if fewer)
  repays its predicted pause (``_paying``);
* relief, where exploiting finds nothing: the plan the upper rates predict (the whole
  measured fixed cost off) for the light servers, whose measured rates are
  extrapolations (under half the slowest server's bytes; not for a block going back to
  a server a kept trial took it off), once an episode (``_decide``);
* a light server's probed rate in its extrapolation's place: ``probe_targets`` names,
  once an episode, the slowest server and the light one a plan would load; the runtime
  probes them (``measure.probed_rates``), and the probe holds while the slowest server's
  measured rate stands (no relief meanwhile: the probe answered it), as a ratio to it;
* explore (probability ``epsilon``, drawn before exploiting): add a server
  (probability 1/2 while fewer than ``max_servers`` run), else move a random block of
  the slowest server to a random other server; not with fewer than ``horizon``
  iterations left in the job. When exploiting finds nothing worth a
  trial the placement stays as it is: a settled placement is not disturbed every other
  interval by a random move (and its undo), only now and then.

Trials that keep failing back off: after k trials in a row undone while relieving the
same server, none is started for 2^k decisions (at most ``max_hold``; a kept trial, or
another slowest server, a slowdown that moved, ends that), nor while the undone trials'
moves, there and back, have cost over 3% of the training so far (``FAILED_SHARE``):
where no placement beats the one in force, each trial costs its pauses and an interval
at a worse placement.

The destinations of an undone trial are rated, for ``memory`` decisions, as they
measured under its load (a light server's rate is an extrapolation: without this the
trial is retried once its destination looks fast again). An undone plan is tabu in any
order of its moves.

An unprobed light server (under half the slowest server's bytes) is rated no faster than
the fastest other server measured under load: its few bytes pass in its link's burst.
After a trial was kept, a plan that returns one of its blocks to the server it left,
where that server would hold over twice the bytes it was measured with, is predicted with
that server at half its measured rate (``server_rates`` takes off at most half of a
server's time: half is what its time says without that); a trial kept by the host's
noise (two equal servers swapping the largest block) was otherwise reversed at the next
decision, the reversal kept or undone by noise in turn.

The noise a gain must exceed is the larger of two estimates: the standard error of the
interval means compared (from the spread of their iterations, ``interval_noise``), and
the spread of the differences between consecutive interval means while the placement
stood still (1.4826 × their median absolute value, once three are known). The first
misses noise that holds for seconds: under two busy workers consecutive means of one
placement differed by 10-20% while the iterations within each said 2-4%.

Adding a server is not judged by itself: the new server holds nothing until a later
exploit moves blocks onto it (an unmeasured server counts as fast as the best), and that
move is the trial; one empty again after its trial was undone is removed.

The actions are typed in ``policy.actions`` (a user's request too: ``parse_control``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from .actions import AddServer, MoveBlock, RemoveServer, ServerAction, parse_control
from .measure import block_traffic, fixed_cost, interval_noise, server_rates, server_share
from .placement import exploit_moves, predicted_time, server_loads

__all__ = ["MoveBlock", "AddServer", "RemoveServer", "ServerAction", "Psld", "block_traffic", "fixed_cost",
           "parse_control", "server_rates", "server_share", "interval_noise", "NOISE_Z"]

# The bytes a block's move carries per byte of its value: the value and one slot of
# optimizer state (SGD's momentum, Adagrad's sum; Adam's two moments are corrected for by
# the measured pauses, ``Psld.pause_scale``).
PAUSE_COPIES = 2
PAUSE_SCALE_MAX = 4.0  # a measured pause corrects the prediction by at most this factor either way
# Undone trials cost at most this share of the training: the least gain a kept trial shows
# (``threshold``'s default), so where no placement beats the one in force PSLD runs within it.
FAILED_SHARE = 0.03

# A measured gain (the difference of two interval means) is believed beyond this many of
# its standard errors: one-sided, a trial without effect is kept 5 times in 100.
NOISE_Z = 1.645


@dataclass
class _Trial:
    actions: list[MoveBlock]
    undo: list[MoveBlock]
    before_s: float
    noise: float = 0.0  # relative standard error of before_s
    relieve: int | None = None  # the server whose time it was to cut
    pause_s: float = 0.0  # measured (``Psld.charge``)
    settle: int = 1  # intervals still to pass before it is judged (the moves' own: skipped)
    relief: bool = False  # a relief (``Psld._decide``): planned on the upper rates
    raw_pause: float = 0.0  # its pause as predicted before scaling (``Psld._paying``)


class Psld:
    """PSLD's controller over the block sizes ``sizes`` (bytes, by block key)."""

    def __init__(self, sizes: Sequence[int], epsilon: float = 0.1, max_servers: int = 0,
                 threshold: float = 0.03, horizon: int = 50, tabu_decisions: int = 6,
                 memory: int = 20, seed: int = 0, z: float = NOISE_Z, max_hold: int = 8,
                 measured: Set[int] = frozenset(), interval: int = 10) -> None:
        self.sizes = list(sizes)  # what each block weighs in a plan (``_weigh``)
        self.nbytes = list(sizes)
        self.measured = frozenset(k for k in measured if 0 <= k < len(self.sizes))  # weighed by traffic
        self.epsilon = epsilon
        self.max_servers = max_servers
        self.threshold = threshold
        self.horizon = horizon            # iterations a migration's pause is amortised over
        self._horizon = horizon           # this decision's: ``horizon``, capped by the iterations left
        self._reach = 1.0                 # this decision's ``reach``
        self.tabu_decisions, self.z = tabu_decisions, z
        # Back-off (module docstring): `failures` in a row relieving `held_for`, `hold`
        # decisions left; `wasted` by undone trials against `trained`, the seconds of the
        # intervals decided on (`interval` iterations of their mean each).
        self.max_hold, self.interval = max_hold, interval  # iterations a decision's interval
        self.failures, self.hold, self.held_for, self.wasted, self.trained = 0, 0, None, 0.0, 0.0
        self.rng, self.trial = random.Random(seed), None  # the trial started, not yet judged
        self.log: list[dict] = []         # one record per judged trial
        self.undone: set[int] = set()     # destinations of undone moves
        self.known: dict[int, float] = {}  # last measured bytes/s of each server
        # the rate of each destination of an undone trial, measured under its load:
        # (bytes/s, bytes held, decisions left); trusted over a lighter load's extrapolation
        self.loaded: dict[int, tuple[float, int, int]] = {}
        self.memory = memory  # decisions a heavier load's measurement is trusted
        self.tabu: dict[frozenset[MoveBlock], int] = {}  # undone plan (in any order) -> decisions left
        self.left: set[tuple[int, int]] = set()  # (block, a server a kept trial took it off)
        self.steady: list[float] = []  # relative differences of consecutive means, placement unchanged
        self._previous: tuple[tuple[int, ...], float] | None = None  # the last decision's table and mean
        self._quiet = 0  # decisions in a row with no moves made and no trial in flight
        self.relieved: int | None = None  # the slowest server when a relief trial was last undone
        self.pause_scale = 1.0  # a trial's measured pause over its predicted (``_paying``)
        # light servers' probed rates, while the slowest server (its measured rate then) is the one probed for
        self.probed, self._probe_basis, self._probed_for, self._probe_age = {}, {}, None, 0

    def decide(self, table: Sequence[int], live: Sequence[int],
               throughput: Mapping[int, float], iteration_s: float,
               added: Set[int] = frozenset(), share: float = 1.0, reach: float | None = None,
               noise: float = 0.0, upper: Mapping[int, float] | None = None,
               traffic: Mapping[int, float] | None = None, left: int | None = None,
               probed: Mapping[int, float] | None = None) -> list[ServerAction]:
        """The actions to carry out now. ``table[k]`` is the server rank of block k,
        ``live`` the ranks running, ``throughput`` their measured bytes/s (missing for a
        server that handled nothing), ``iteration_s`` the mean iteration time since the
        last decision, ``added`` the servers PSLD started, ``share`` the part of the
        iteration time the slowest server took beyond the others (1: all of it), ``reach``
        the part its bytes took (``server_reach``; None: ``share``): a cut of the predicted
        server time is worth a trial only if that much of ``reach``, at most ``share``,
        exceeds ``threshold`` of the iteration time (where the workers' compute decides,
        moves only cost pauses). ``noise`` is the relative standard error of ``iteration_s``
        (``interval_noise``; 0: exact): a cut or a gain must exceed ``z`` standard errors
        of the difference it is judged by, as well as ``threshold``. ``upper`` is each
        server's rate with the whole fixed cost taken off (``server_rates``, ``most``
        0.9): where it is given, a plan these rates predict is tried once when
        ``throughput`` predicts none (a relief). ``traffic`` is the bytes each block's
        exchanges carried over the interval (``block_traffic``): the blocks ``measured``
        (a sparse table's shards) weigh what they carried (``_weigh``). ``left`` is the
        iterations the job has still to run (None: unknown, unbounded): a plan's pause
        is amortised over at most those (a move that cannot repay its pause before the
        job ends is not made), and no random move is explored with fewer than ``horizon``
        left (what it would teach has no iterations left to be used in). ``probed`` is the
        rates a probe measured for the servers ``probe_targets`` named: a light server's
        probed rate stands in for its extrapolation while it stays light."""
        self._horizon = self.horizon if left is None else max(1, min(self.horizon, int(left)))
        noise = noise if math.isfinite(noise) and noise > 0 else 0.0
        self._weigh(traffic or {})
        self._observe(table, iteration_s)
        self.trained += iteration_s * self.interval if math.isfinite(iteration_s) and iteration_s > 0 else 0.0
        self._probe_age += 1
        if probed:
            self.probed = {int(r): float(v) for r, v in probed.items() if math.isfinite(v) and v > 0}
            self._probe_basis = {r: throughput[r] for r in (self._probed_for,) if r in throughput}
        share = min(1.0, share) if math.isfinite(share) and share >= 0 else 1.0  # 0: nothing stands out
        self._reach = share if reach is None or not math.isfinite(reach) or reach < 0 else min(1.0, reach)
        actions = self._decide(table, live, throughput, iteration_s, added, share, noise, upper or {})
        self._previous = (tuple(table), iteration_s)
        self._quiet = 0 if actions or self.trial is not None else self._quiet + 1
        return actions

    def _weigh(self, traffic: Mapping[int, float]) -> None:
        """Weigh each ``measured`` block by the bytes its exchanges carried, in the units
        of the others' sizes: a dense block carries its size at every exchange, so the
        dense blocks' traffic over their sizes is the number of exchanges, and a shard's
        traffic over that number is what it weighs. (With tables only, the shards'
        traffic is scaled to their total size.) A table's shard carries only the rows
        its batch touched: a shard of Zipf-distributed ids holding the hottest rows
        carries many times what a cold one of the same size does, and it is what it
        carries that loads its server."""
        if not self.measured or not traffic:
            return
        load = {k: float(v) for k, v in traffic.items() if 0 <= k < len(self.sizes) and math.isfinite(v) and v >= 0}
        dense = [k for k in range(len(self.sizes)) if k not in self.measured]
        carried = sum(load.get(k, 0.0) for k in dense)
        if dense and carried > 0:
            scale = sum(self.nbytes[k] for k in dense) / carried
        else:
            carried = sum(load.get(k, 0.0) for k in self.measured)
            if carried <= 0:
                return
            scale = sum(self.nbytes[k] for k in self.measured) / carried
        for k in self.measured:
            self.sizes[k] = load.get(k, 0.0) * scale

    def steady_noise(self) -> float:
        """The standard deviation of the relative difference between two consecutive
        interval means at one placement (0 until three are known: the median of two is
        their mean, and one of them may be a step, a slowdown arriving, not noise)."""
        if len(self.steady) < 3:
            return 0.0
        return 1.4826 * statistics.median(self.steady)

    def _observe(self, table: Sequence[int], iteration_s: float) -> None:
        """Add this interval's mean to the steady differences if it and the previous one
        ran wholly at one placement (two quiet decisions: the interval after moves holds
        their pause)."""
        prev = self._previous
        if (self._quiet >= 2 and prev is not None and prev[0] == tuple(table) and prev[1] > 0
                and math.isfinite(iteration_s) and iteration_s > 0):
            self.steady = (self.steady + [abs(iteration_s / prev[1] - 1.0)])[-8:]

    def _decide(self, table: Sequence[int], live: Sequence[int], throughput: Mapping[int, float],
                iteration_s: float, added: Set[int], share: float, noise: float,
                upper: Mapping[int, float]) -> list[ServerAction]:
        if self.trial is not None and self.trial.settle > 0:
            self.trial.settle -= 1  # the interval the moves were made in: it measures neither placement
            return []
        trial, self.trial = self.trial, None
        keep = True
        if trial is not None:
            gain = (trial.before_s - iteration_s) / trial.before_s  # its pause is spent: an undo pays another
            keep = gain > max(self.threshold, self.z * math.hypot(trial.noise, noise), self.z * self.steady_noise())
        self._remember(table, live, throughput, set() if keep else {a.dst for a in trial.actions})
        if trial is not None:
            self.log.append({"judged": trial.actions, "before_s": trial.before_s,
                             "after_s": iteration_s, "kept": keep})
            if trial.raw_pause > 0 and trial.pause_s > 0:  # what the prediction missed by, for the next
                # (bounded: one trial's per-move round trips, which no byte causes, must not stop all others)
                self.pause_scale = min(PAUSE_SCALE_MAX, max(1 / PAUSE_SCALE_MAX, trial.pause_s / trial.raw_pause))
            if not keep:  # its moves' pause, and the undo's (taken as much again)
                self.wasted += 2 * trial.pause_s
            if not keep and trial.relief:  # no back-off: one relief per episode
                self.relieved = trial.relieve
            elif not keep:
                self.failures += 1
                self.hold, self.held_for = min(2 ** self.failures, self.max_hold), trial.relieve
            if not keep:
                self.undone |= {a.dst for a in trial.actions}
                if not trial.relief:  # a relief is not retried anyway; exploit may plan it on measured rates
                    self.tabu[frozenset(trial.actions)] = self.tabu_decisions  # do not retry at once
                return list(trial.undo)
            self.failures = self.hold = 0
            self.relieved = None
            self.left |= {(a.block, a.src) for a in trial.actions}
            return []
        self.tabu = {k: n - 1 for k, n in self.tabu.items() if n > 1}
        empty = [r for r in live if r in added and r in self.undone and r not in table]
        if empty:
            self.undone -= set(empty)
            return [RemoveServer(r) for r in empty]
        rates = self._rates(live, throughput)
        speeds = [rates[r] for r in live]
        index = {r: i for i, r in enumerate(live)}
        owner = [index[s] for s in table]
        loads = server_loads(self.sizes, owner, len(live))
        slowest = live[max(range(len(live)), key=lambda i: (loads[i] / speeds[i], -i))]
        # Probed for another slowest server, or its measured rate has changed since by over
        # 1.5x (a slowdown that moved): the probes no longer tell the speeds in force. Only
        # the slowest server's rate is watched: a light server's measured rate is the noisy
        # extrapolation the probe stands in for (55 then 87 MB/s in one case: watched, it
        # dropped the probe, and a relief on the upper rate moved a layer that came back).
        # A slowdown that lands on the probed light server alone shows at the next probe.
        if slowest != self._probed_for or any(not 1 / 1.5 <= throughput.get(r, v) / v <= 1.5
                                              for r, v in self._probe_basis.items() if v > 0):
            self.probed, self._probe_basis = {}, {}
        # A light server's probed rate, not its extrapolation, as a ratio to the slowest
        # server's: the probe timed both side by side, and the slowest server's measured
        # rate moves from interval to interval by more than the ratio is sure of (one
        # case: 491-775 MB/s at one placement; a light server probed at 601 beside 594
        # looked 19% faster once it read 505, and a layer was swapped and swapped back).
        basis, now_rate = self._probe_basis.get(slowest, 0.0), throughput.get(slowest, 0.0)
        drift = now_rate / basis if basis > 0 and now_rate > 0 else 1.0
        # An unprobed light server no faster than the others under load (the dynamic preset's
        # server 0 read 136-168 MB/s on a 50 MB/s link beside loaded ones at 64: plans hung on it)
        light = [r != slowest and 2 * loads[i] < loads[index[slowest]] for i, r in enumerate(live)]
        cap, capped = max((v for i, v in enumerate(speeds) if not light[i] and live[i] != slowest), default=math.inf), {}
        for i, r in enumerate(live):
            if light[i] and r in self.probed and r not in self.loaded:
                speeds[i] = self.probed[r] * drift
            elif light[i] and speeds[i] > cap:
                capped[i], speeds[i] = speeds[i], cap
        if slowest != self.held_for:
            self.failures, self.hold, self.held_for = 0, 0, None
        if slowest != self.relieved:  # another server is the slowest: a new episode
            self.relieved = None
        if self.hold > 0 or self.wasted > FAILED_SHARE * self.trained:  # trials kept failing: wait
            self.hold = max(0, self.hold - 1)
            return []
        if self.rng.random() < self.epsilon and self._horizon >= self.horizon:  # (drawn anyway: one sequence)
            return self._explore(table, live, rates, iteration_s, noise)
        moves, new_owner = exploit_moves(self.sizes, owner, speeds)
        after = server_loads(self.sizes, new_owner, len(live))
        # a kept trial's blocks going back to a server that would hold over twice what it was measured with
        back = {m.dst for m in moves if (m.block, live[m.dst]) in self.left and after[m.dst] > 2 * loads[m.dst]}
        if back:  # rated at its time's own word (the fixed cost left in: half, at most), planned anew
            speeds = [min(capped.get(i, v) / 2, v) if i in back else v for i, v in enumerate(speeds)]
            moves, new_owner = exploit_moves(self.sizes, owner, speeds)
            after = server_loads(self.sizes, new_owner, len(live))
        # what its judgment could confirm
        bar = max(self.threshold, self.z * math.sqrt(2) * noise, self.z * self.steady_noise())
        plan, raw = self._paying(moves, live, speeds, loads, share, iteration_s, bar)
        if plan and frozenset(plan) not in self.tabu:
            self._start(plan, iteration_s, noise, slowest)
        elif slowest != self.relieved and upper and not self.failures and not self.probed:
            # A relief: the plan the upper rates predict (each server's rate with the whole
            # measured fixed cost off, at most 0.9 of its time), once an episode. The rates
            # take off at most half, so a light destination is rated at what its time says
            # with half the fixed cost left in: on the single-block case under SSP, with the
            # fixed cost at 11-14 ms an iteration under load, the light servers rated 38-66
            # MB/s against the slow server's 62 and no move looked worth it (1.3x was there).
            # Undone, its destination is rated as measured under load (``loaded``); it is
            # neither tabu nor backs off, and none is tried again until a trial is kept or
            # another server is the slowest (``relieved``), nor while trials are failing.
            # Only a light server (under half the slowest's bytes) is an extrapolation: one
            # holding as much has been measured under comparable load (the half of
            # ``_remember``), and its upper rate is the difference of two near-equal
            # times. On three full-speed servers holding 1.6, 1.0 and 1.0 MB of a deep
            # MLP (353 MB/s links, SSP), the 1.0 MB ones rated 617 and 583 MB/s measured
            # against 1,553 and 1,198 upper, and a relief swapped the largest block onto
            # one of them and back, episode after episode (0.86x greedy).
            light = loads[index[slowest]] / 2
            fast = [v if r in self.loaded or loads[i] >= light else max(v, upper.get(r, v))
                    for i, (r, v) in enumerate(zip(live, speeds))]
            relief = exploit_moves(self.sizes, owner, fast)[0]
            # A block going back to a server a kept trial took it off: that server was
            # measured under the block, its upper rate is no extrapolation (on a 55 MB/s
            # link, a relief kept by the host's noise was followed by one moving the block
            # back, kept or undone by noise in turn: PSLD at 0.97-0.99x greedy).
            back = {m.dst for m in relief if (m.block, live[m.dst]) in self.left}
            if back:
                fast = [speeds[i] if i in back else v for i, v in enumerate(fast)]
                relief = exploit_moves(self.sizes, owner, fast)[0]
            plan, raw = self._paying(relief, live, fast, loads, share, iteration_s, bar, pause_speeds=speeds)
            if plan and frozenset(plan) not in self.tabu:
                self._start(plan, iteration_s, noise, slowest)
                self.trial.relief = True
        if self.trial is None:
            return []  # nothing worth a trial (or the best plan was just undone): keep the placement
        self.trial.raw_pause = raw
        return list(self.trial.actions)

    def _paying(self, moves: list, live: Sequence[int], speeds: list[float], loads: list[int], share: float,
                iteration_s: float, bar: float, pause_speeds: list[float] | None = None) -> tuple[list[MoveBlock], float]:
        """The prefix of ``moves`` (descending best fit's order) that pays best, and its
        raw predicted pause. A prefix pays if its predicted gain — the cut of the predicted
        server time, as a part of the iteration (of ``reach``, at most ``share``), less ``bar`` — over
        ``horizon`` iterations of ``iteration_s`` exceeds its predicted pause (spent
        whether the trial is kept or not). ([], 0) if none does.

        The pause is each block's bytes and its optimizer state (PAUSE_COPIES) through its
        server's rate and the fastest rate (the destination's link, which a light
        server's rate understates), scaled by what the last trial's pause measured
        against this prediction (``pause_scale``). Without it, a plan of 20 shards of
        1.3 MB off a server behind a 2.5 MB/s link (a 10 s pause) was started for a cut of
        30 ms an iteration, undone for its pause, and started again: PSLD at 0.14x the
        hash placement."""
        now = predicted_time(loads, speeds)
        if not moves or now <= 0:
            return [], 0.0
        link = pause_speeds or speeds  # the measured rates (a relief plans on the upper ones)
        fastest, place, best, best_net, raw, costs = max(link), list(loads), 0, 0.0, 0.0, []
        for m in moves:
            place[m.src] -= self.sizes[m.block]
            place[m.dst] += self.sizes[m.block]
            raw += PAUSE_COPIES * self.nbytes[m.block] * (1 / link[m.src] + 1 / fastest)
            costs.append(raw)
            part = min((now - predicted_time(place, speeds)) / now * self._reach, share) - bar
            net = part * iteration_s * self._horizon - raw * self.pause_scale
            if part > 0 and net > best_net:
                best, best_net = len(costs), net
        return [MoveBlock(m.block, live[m.src], live[m.dst]) for m in moves[:best]], (costs[best - 1] if best else 0.0)

    def probe_targets(self, table: Sequence[int], live: Sequence[int], throughput: Mapping[int, float],
                      share: float, upper: Mapping[int, float] | None = None) -> list[int]:
        """The servers to probe before this decision: the runtime sends each a probe of
        known bytes (``measure.probe_bytes``) and passes the rates it measured to
        ``decide`` as ``probed``. Named when no trial is in flight, the slowest server's
        time stands out (``share`` above ``threshold``) and it was not probed for in the
        last ``memory`` decisions: it (to scale the probe to what its exchanges measure) and the light
        server (under half its bytes, not measured under load: neither an undone trial's
        destination nor a server a kept trial emptied) that looks the
        fastest by its ``upper`` rate, the one a plan would move its load to; [] otherwise.

        A light server's rate is an extrapolation: its time is mostly the exchanges'
        fixed cost, its rate the difference of near-equal times. With the CNN's first
        layer alone on a 4x-slower server behind 919 MB/s links (SSP, 6 servers), the
        light servers' upper rates drew 77-443 MB/s from interval to interval against
        the slow server's 266-350: whether the layer was moved within 60 iterations
        depended on the draw (no move in 3 of 5 runs, the oracle 1.2x greedy); moved, it
        ran at 817-1,556 MB/s. One server is probed, not all: each costs the time its
        probe takes, with the workers held, and a server slower than the slowest one
        (holding only small blocks) takes several times that."""
        if not math.isfinite(share) or share < self.threshold or len(live) < 2 or self.trial is not None:
            return []
        rates = self._rates(live, throughput)
        loads = {r: 0.0 for r in live}
        for k, s in enumerate(table):
            if s in loads:
                loads[s] += self.sizes[k]
        slowest = max(live, key=lambda r: (loads[r] / max(rates[r], 1e-300), -r))
        if slowest == self._probed_for and self._probe_age <= self.memory:
            return []
        emptied = {src for _, src in self.left}  # measured under the load a kept trial took off them
        light = [r for r in live if r != slowest and 2 * loads[r] < loads[slowest] and r not in self.loaded
                 and r not in emptied]
        if not light:
            return []
        self._probed_for, self._probe_age = slowest, 0
        return [slowest, max(light, key=lambda r: (max(rates[r], (upper or {}).get(r, 0.0)), -r))]

    def charge(self, pause_s: float) -> None:
        """Add ``pause_s``, the pause the current trial's migration cost, to the trial
        (what later pauses are predicted by, and, undone, what failing trials spent)."""
        if self.trial is not None and math.isfinite(pause_s) and pause_s > 0:
            self.trial.pause_s += pause_s

    def _explore(self, table: Sequence[int], live: Sequence[int], rates: dict[int, float],
                 iteration_s: float, noise: float) -> list[ServerAction]:
        if self.max_servers and len(live) < self.max_servers and self.rng.random() < 0.5:
            return [AddServer()]
        loads = {r: 0 for r in live}
        for k, s in enumerate(table):
            loads[s] += self.sizes[k]
        slowest = max(live, key=lambda r: loads[r] / rates[r])
        blocks = [k for k, s in enumerate(table) if s == slowest]
        others = [r for r in live if r != slowest]
        if not blocks or not others:
            return []
        move = MoveBlock(self.rng.choice(blocks), slowest, self.rng.choice(others))
        return self._start([move], iteration_s, noise, slowest)

    def _start(self, actions: list[MoveBlock], iteration_s: float, noise: float,
               relieve: int | None) -> list[ServerAction]:
        undo = [MoveBlock(a.block, a.dst, a.src) for a in reversed(actions)]
        self.trial = _Trial(actions, undo, iteration_s, noise, relieve=relieve)
        return list(actions)

    def _remember(self, table: Sequence[int], live: Sequence[int], throughput: Mapping[int, float],
                  loaded: Set[int] = frozenset()) -> None:
        """Keep this interval's rates (``table`` the placement they were measured on):
        the last one of each server; for the servers ``loaded`` (an undone trial's
        destinations, measured under its load) also that one, trusted for ``memory``
        decisions unless a measurement under at least half that load replaces it."""
        held = {r: 0 for r in live}
        for k, s in enumerate(table):
            if s in held:
                held[s] += self.sizes[k]
        self.loaded = {r: (v, b, n - 1) for r, (v, b, n) in self.loaded.items() if n > 1 and r in held}
        for r in live:
            rate = throughput.get(r, 0)
            if rate > 0:
                self.known[r] = rate
                if held[r] > 0 and (r in loaded or (r in self.loaded and 2 * held[r] >= self.loaded[r][1])):
                    self.loaded[r] = (rate, held[r], self.memory)

    def _rates(self, live: Sequence[int], throughput: Mapping[int, float]) -> dict[int, float]:
        """The rates a plan is predicted with: for an undone trial's destination, the
        rate it measured under the trial's load (for ``memory`` decisions), else a
        server's last measured one (a server idle this interval keeps it); one never
        measured (new) is assumed as fast as the best.

        A lightly loaded server's rate is an extrapolation (its time is mostly the
        exchanges' fixed cost). A trial that moved load onto it and was undone measured
        it under load: that stands in for the extrapolation, so the trial is not
        retried because the server looks fast again when light. Only an
        undone trial's destinations: a server loaded in the normal course (the slow
        one before PSLD emptied it) may have changed speed since (a slowdown that
        moved), and its light measurements are what shows it."""
        fallback = max((self.known[r] for r in live if r in self.known), default=1.0)
        return {r: self.loaded[r][0] if r in self.loaded else self.known.get(r, fallback) for r in live}
