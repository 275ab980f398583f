"""PSLD's measurements of the servers over one interval of ``psld_interval`` iterations,
taken at a barrier: each server's rate, its upper rate, the part of the iteration a
placement could cut, the noise of the interval's mean and the bytes each block carried
(the pure functions of ``policy.measure``, on the servers' ``stats`` and the workers'
exchange times), and the "servers" record of metrics.jsonl that shows them."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..policy.measure import (block_traffic, fixed_cost, hold_cost, interval_noise, server_rates, server_reach,
                              server_share)
from ..wire import Message


@dataclass
class Interval:
    throughput: dict[int, float]  # bytes/s per server (``server_rates``)
    upper: dict[int, float]  # with the whole fixed cost off, at most 0.9 of the time
    traffic: dict[int, float]  # bytes each block's exchanges carried (``block_traffic``)
    share: float  # the part of the interval's wall time its slowest server took (``server_share``)
    reach: float  # the part its slowest server's bytes took (``server_reach``)
    noise: float  # the relative standard error of the interval's mean iteration time
    judged_s: float | None  # the mean iteration time PSLD judges: wall time less the holds' cost (None: the first)
    record: dict  # the "servers" record's fields, but its type, time and elapsed


def measure_interval(pool, barrier_at: dict[int, float], t: int, interval: int, exchange_s: dict[int, float],
                     workers: int, held: Collection[int] = ()) -> Interval:
    """Ask every server of `pool` for its stats at the barrier of iteration `t` (`barrier_at`:
    when each recent barrier was reached; `held`: the barriers at which the coordinator
    held the workers; `exchange_s`: the workers' exchange seconds with each server since
    the last measurement, summed over `workers`)."""
    stats = pool.broadcast(Message("stats_req", {}), "stats")
    since = barrier_at.get(t - interval)
    # Wall time per iteration from barrier to barrier, any worker pause for migrations
    # included; PSLD judges it less what the coordinator's holds (a snapshot; the
    # measurement, decision and any probe at each decision barrier) cost the workers:
    # the held iteration's excess over the interval's others (``hold_cost``). A hold's
    # wall time is not its cost (workers still pulling the next weights from a slow
    # server hide it), and a cost counted in some intervals and not others made them
    # alternate (docs/psld.md).
    span = range(t - interval + 1, t + 1)
    durations = {i: barrier_at[i] - barrier_at[i - 1] for i in span if i in barrier_at and i - 1 in barrier_at}
    cost = hold_cost(durations, {i + 1 for i in held} & set(durations))
    for i, c in cost.items():
        durations[i] -= c
    hold_s = sum(cost.values())
    wall_s = (barrier_at[t] - since) / interval if since is not None else None
    judged_s = wall_s - hold_s / interval if wall_s is not None else None
    noise = interval_noise(list(durations.values()))
    # A server's time is the larger of its busy time (handling bytes, an emulated
    # slowdown included) and the mean time a worker spent in exchanges with it: a slow
    # link or a loaded host, which the kernel imposes and the server does not see.
    exchange = {r: exchange_s.get(r, 0.0) / max(1, workers) for r in stats}
    seconds = {r: max(m.fields["busy_s"], exchange[r]) for r, m in stats.items()}
    # What no byte causes: a worker's exchanges with a server (a push and a pull an
    # iteration), each at what one carrying almost nothing takes (policy.measure.fixed_cost)
    nbytes = {r: m.fields["bytes"] for r, m in stats.items()}
    fixed_s = fixed_cost(nbytes, seconds, 2 * interval, workers, pool.round_trip_s)
    throughput = server_rates(nbytes, seconds, fixed_s)
    share = server_share(seconds, interval, wall_s)  # PSLD weighs a cut by these two
    reach = server_reach(seconds, fixed_s, interval, wall_s)
    traffic = block_traffic(m.fields.get("block_bytes") for m in stats.values())
    ranks = sorted(stats)
    record = {
        "servers": ranks, "load_bytes": [stats[r].fields["load_bytes"] for r in ranks],
        **{k: [stats[r].fields.get(k, 0) for r in ranks] for k in ("blocks", "busy_s", "bytes", "rows", "gather_s")},
        "exchange_s": [exchange[r] for r in ranks],
        "busy_share": [stats[r].fields["busy_s"] / (interval * wall_s) if wall_s else None for r in ranks],
        "throughput_mbps": [throughput.get(r, 0.0) / 1e6 for r in ranks], "fixed_s": fixed_s,
        "share": share, "reach": reach, "noise": noise, "block_bytes": sorted(traffic.items()),
        "iteration_s": wall_s, "hold_s": hold_s, "table_version": pool.version}
    return Interval(throughput, server_rates(nbytes, seconds, fixed_s, most=0.9), traffic, share, reach, noise,
                    judged_s, record)
