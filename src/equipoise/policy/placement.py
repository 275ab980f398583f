"""Parameter blocks and their placement on servers (pure functions).

A block is a contiguous range of one flattened tensor of the model. Elementwise
optimizers (SGD with momentum and weight decay, Adam) give the same result whether they
step a whole tensor or its blocks, so cutting tensors changes nothing numerically.

Placement policies (``PLACEMENTS``, ``placement_blocks``) turn tensors, given as
(name, numel, kind, itemsize) in creation order, and optionally the servers' relative
throughputs, into blocks and the server of each:

* ``round_robin``: TensorFlow 1.x -- whole tensors to servers round-robin.
* ``mxnet``: MXNet kvstore default -- tensors under 1,000,000 elements whole to server
  (key * 9973) mod S, larger ones split evenly over all S servers.
* ``byteps``: BytePS -- 4,096,000-byte chunks, each to server djb2(chunk key) mod S.
* ``greedy``: longest-processing-time first by bytes (``greedy_placement``).
* ``psld``: the initial placement of PSLD (Chen et al., "Elastic Parameter Server Load
  Distribution in Deep Learning Clusters", ACM SoCC 2020) -- ``greedy``; its decisions
  to adapt it are in ``equipoise.policy.psld``.
* ``oracle``: the best static placement given the true throughputs
  (``oracle_placement``).

Only ``oracle`` uses the throughputs. Every policy returns blocks exactly as
``make_blocks`` would lay them out (keys 0..n-1 in tensor order, ranges contiguous
within a tensor); a policy only cuts tensors more finely where its framework splits
them, so that each block lives on one server.

``rehome`` chooses new servers for the blocks of a server leaving the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Final, Iterable, Mapping, NamedTuple, Sequence

from .block_size import resolve_block_size

__all__ = [
    "Block", "make_blocks", "greedy_placement",
    "TensorSpec", "PlacementFn", "PLACEMENTS", "placement_blocks",
    "place_round_robin", "place_mxnet", "place_byteps", "place_greedy", "place_psld",
    "place_oracle", "djb2", "mxnet_server", "byteps_server",
    "MXNET_BIGARRAY_BOUND", "MXNET_KEY_MULTIPLIER", "BYTEPS_PARTITION_BYTES",
    "Move", "server_loads", "predicted_time", "exploit_moves", "lpt_time_placement",
    "oracle_placement", "ORACLE_EXACT_LIMIT", "rehome",
]


@dataclass(frozen=True)
class Block:
    key: int
    name: str          # the model parameter or buffer it belongs to
    start: int         # element range [start, stop) of the flattened tensor
    stop: int
    kind: str = "param"  # "param" (stepped by the optimizer), "buffer" (averaged) or "rows" (a sparse table's)
    itemsize: int = 4
    width: int = 1     # elements per row: a "rows" block holds whole rows of its table

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def rows(self) -> int:
        """Rows of a "rows" block (elements of any other)."""
        return self.numel // self.width

    def to_list(self) -> list:
        row = [self.key, self.name, self.start, self.stop, self.kind, self.itemsize]
        return row if self.width == 1 else [*row, self.width]

    @classmethod
    def from_list(cls, row: Sequence) -> "Block":
        key, name, start, stop, kind, itemsize, *rest = row
        width = int(rest[0]) if rest else 1
        if (len(rest) > 1 or width < 1 or not 0 <= int(key) < 1 << 31
                or (kind == "rows" and (int(start) % width or int(stop) % width))):
            raise ValueError(f"block {key}: {list(row)[:8]} is not [key, name, start, stop, kind, itemsize(, width)] "
                             f"with whole rows")
        return cls(int(key), str(name), int(start), int(stop), str(kind), int(itemsize), width)


def make_blocks(tensors: Sequence[tuple[str, int, str, int]], block_size: int) -> list[Block]:
    """Cut tensors, given as (name, numel, kind, itemsize) in creation order, into blocks of
    at most `block_size` elements; keys count up from 0 in that order."""
    if block_size < 1:
        raise ValueError(f"block_size = {block_size} must be ≥ 1")
    blocks: list[Block] = []
    for name, numel, kind, itemsize in tensors:
        for start in range(0, max(numel, 1), block_size):
            stop = min(numel, start + block_size)
            blocks.append(Block(len(blocks), name, start, stop, kind, itemsize))
    return blocks


def greedy_placement(sizes: Sequence[int], servers: int) -> list[int]:
    """Longest-processing-time greedy by bytes: largest block first, onto the least loaded
    server (ties to the lowest index). Returns the server of each block."""
    _check_servers(servers)
    owner = [0] * len(sizes)
    for i, j in _lpt(sizes, range(len(sizes)), [0] * servers, [1] * servers):
        owner[i] = j
    return owner


def _lpt(sizes: Sequence[int], items: Iterable[int], loads: list[int],
         rates: Sequence[float]) -> Iterable[tuple[int, int]]:
    """Longest processing time first by time: ``items`` (indices into ``sizes``) largest
    first, ties by index, each onto the server j whose finishing time
    (loads[j] + size) / rates[j] is smallest (lowest j on ties). Yields (item, server)
    and adds each item to ``loads``."""
    servers = range(len(loads))
    for i in sorted(items, key=lambda i: (-sizes[i], i)):
        j = min(servers, key=lambda j: ((loads[j] + sizes[i]) / rates[j], j))
        loads[j] += sizes[i]
        yield i, j


# --------------------------------------------------------------------------------------
# Framework placement policies: tensors -> (blocks, owner)
# --------------------------------------------------------------------------------------

TensorSpec = tuple[str, int, str, int]
"""(name, numel, kind, itemsize) of one tensor, as given to ``make_blocks``."""

PlacementFn = Callable[[Sequence[TensorSpec], int, int, Sequence[float] | None],
                       tuple[list[Block], list[int]]]
"""(tensors, servers, block_size, rates) -> (blocks, owner): ``owner[k]`` serves
``blocks[k]``; ``rates[j]`` is server j's relative throughput (None: all equal)."""

MXNET_BIGARRAY_BOUND: Final = 1_000_000   # MXNET_KVSTORE_BIGARRAY_BOUND default
MXNET_KEY_MULTIPLIER: Final = 9973        # kvstore_dist.h EncodeDefaultKey
BYTEPS_PARTITION_BYTES: Final = 4_096_000  # BYTEPS_PARTITION_BYTES default
_DJB2_SEED: Final = 5381
_U64: Final = (1 << 64) - 1


def djb2(key: str) -> int:
    """djb2 string hash as BytePS computes it: h = 5381; h = h * 33 + c over the UTF-8
    bytes (the characters, for ASCII keys), wrapped to 64 bits like a ``uint64_t``."""
    h = _DJB2_SEED
    for c in key.encode("utf-8"):
        h = (h * 33 + c) & _U64
    return h


def mxnet_server(key: int, servers: int) -> int:
    """Server of a small (whole) MXNet array with integer ``key``: (key * 9973) mod S."""
    _check_servers(servers)
    return (key * MXNET_KEY_MULTIPLIER) % servers


def byteps_server(name: str, chunk: int, servers: int) -> int:
    """Server of chunk ``chunk`` of tensor ``name``: djb2(f"{name}_{chunk}") mod S.

    BytePS hashes the decimal string of its declared integer key (tensor id and
    partition index); ours hashes the tensor name and chunk index instead, which needs
    no key registry and is stable across runs.  The rule is BytePS's, the servers a
    given tensor's chunks land on are not."""
    _check_servers(servers)
    return djb2(f"{name}_{chunk}") % servers


def _check_servers(servers: int) -> None:
    if servers < 1:
        raise ValueError(f"servers = {servers} must be ≥ 1")


def _build(tensors: Sequence[TensorSpec], block_size: int,
           parts: Callable[[int, str, int, int], Sequence[tuple[int, int, int]]],
           ) -> tuple[list[Block], list[int]]:
    """Cut each tensor into the (start, stop, server) parts that ``parts(index, name,
    numel, itemsize)`` names (contiguous, covering [0, numel)), and each part into
    blocks of at most ``block_size`` elements on that part's server."""
    if block_size < 1:
        raise ValueError(f"block_size = {block_size} must be ≥ 1")
    blocks: list[Block] = []
    owner: list[int] = []
    for index, (name, numel, kind, itemsize) in enumerate(tensors):
        if numel < 0 or itemsize < 1:
            raise ValueError(f"tensor {name!r}: numel = {numel} must be ≥ 0 and "
                             f"itemsize = {itemsize} ≥ 1")
        for lo, hi, server in parts(index, name, numel, itemsize):
            # an empty tensor still gets one empty block, as in make_blocks
            for start in range(lo, max(hi, lo + 1), block_size):
                blocks.append(Block(len(blocks), name, start, min(hi, start + block_size),
                                    kind, itemsize))
                owner.append(server)
    return blocks, owner


def place_round_robin(tensors: Sequence[TensorSpec], servers: int, block_size: int,
                      rates: Sequence[float] | None = None) -> tuple[list[Block], list[int]]:
    """TensorFlow 1.x: tensor i (creation order) whole on server i mod S."""
    _check_servers(servers)
    return _build(tensors, block_size,
                  lambda i, name, numel, size: [(0, numel, i % servers)])


def place_mxnet(tensors: Sequence[TensorSpec], servers: int, block_size: int,
                rates: Sequence[float] | None = None, *,
                bigarray_bound: int = MXNET_BIGARRAY_BOUND) -> tuple[list[Block], list[int]]:
    """MXNet kvstore: key = index in ``tensors`` (buffers included).  Tensors with fewer
    than ``bigarray_bound`` elements go whole to ``mxnet_server(key, S)``; larger ones
    are split into S parts with boundaries round(numel * i / S), part i on server i."""
    _check_servers(servers)

    def parts(key: int, name: str, numel: int, size: int) -> list[tuple[int, int, int]]:
        if numel < bigarray_bound or numel == 0:
            return [(0, numel, mxnet_server(key, servers))]
        # round half up of numel * i / S, in exact integer arithmetic
        bounds = [(2 * numel * i + servers) // (2 * servers) for i in range(servers + 1)]
        return [(bounds[i], bounds[i + 1], i) for i in range(servers)
                if bounds[i + 1] > bounds[i]]
    return _build(tensors, block_size, parts)


def place_byteps(tensors: Sequence[TensorSpec], servers: int, block_size: int,
                 rates: Sequence[float] | None = None, *,
                 partition_bytes: int = BYTEPS_PARTITION_BYTES) -> tuple[list[Block], list[int]]:
    """BytePS: each tensor cut into chunks of ``partition_bytes`` (``partition_bytes //
    itemsize`` elements, at least 1); chunk c on ``byteps_server(name, c, S)``."""
    _check_servers(servers)

    def parts(index: int, name: str, numel: int, size: int) -> list[tuple[int, int, int]]:
        chunk = max(1, partition_bytes // size)
        return [(lo, min(numel, lo + chunk), byteps_server(name, c, servers))
                for c, lo in enumerate(range(0, max(numel, 1), chunk))]
    return _build(tensors, block_size, parts)


def place_greedy(tensors: Sequence[TensorSpec], servers: int, block_size: int,
                 rates: Sequence[float] | None = None) -> tuple[list[Block], list[int]]:
    """``make_blocks`` cutting, then ``greedy_placement`` (LPT by bytes)."""
    blocks = make_blocks(tensors, block_size)
    return blocks, greedy_placement([b.nbytes for b in blocks], servers)


def place_psld(tensors: Sequence[TensorSpec], servers: int, block_size: int,
               rates: Sequence[float] | None = None) -> tuple[list[Block], list[int]]:
    """PSLD's initial placement: ``greedy``; ``equipoise.policy.psld`` then adapts it."""
    return place_greedy(tensors, servers, block_size)


def place_oracle(tensors: Sequence[TensorSpec], servers: int, block_size: int,
                 rates: Sequence[float] | None = None) -> tuple[list[Block], list[int]]:
    """``make_blocks`` cutting, then ``oracle_placement`` for ``rates`` (all 1.0 if None)."""
    _check_servers(servers)
    blocks = make_blocks(tensors, block_size)
    return blocks, oracle_placement([b.nbytes for b in blocks],
                                    [1.0] * servers if rates is None else rates)


PLACEMENTS: Final[dict[str, PlacementFn]] = {
    "round_robin": place_round_robin,
    "mxnet": place_mxnet,
    "byteps": place_byteps,
    "greedy": place_greedy,
    "psld": place_psld,
    "oracle": place_oracle,
}


def placement_blocks(policy: str, tensors: Sequence[TensorSpec], servers: int,
                     block_size: int, rates: Sequence[float] | None = None,
                     ) -> tuple[list[Block], list[int]]:
    """Blocks and their servers under ``policy`` (a key of ``PLACEMENTS``); ``rates``,
    one per server, are the servers' relative throughputs (None: all equal), which only
    ``oracle`` uses. ``block_size`` 0: ``auto_block_size``."""
    try:
        fn = PLACEMENTS[policy]
    except KeyError:
        raise ValueError(f"unknown placement policy {policy!r}; "
                         f"choices: {', '.join(PLACEMENTS)}") from None
    if rates is not None and len(rates) != servers:
        raise ValueError(f"{len(rates)} rates for {servers} servers")
    return fn(tensors, servers, resolve_block_size(block_size, tensors, servers), rates)


# --------------------------------------------------------------------------------------
# Planning by time: predicted time, exploitation moves, the oracle, rehoming
# --------------------------------------------------------------------------------------

class Move(NamedTuple):
    """One step of ``exploit_moves``: block ``block`` (its index in the owner list, i.e.
    its key for blocks from ``placement_blocks``) from server index ``src`` to ``dst``
    (indices into the throughput list, not server ranks)."""
    block: int
    src: int
    dst: int


def _check_rates(throughput: Sequence[float]) -> None:
    if not throughput:
        raise ValueError("throughput must name at least one server")
    for j, r in enumerate(throughput):
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"throughput[{j}] = {r!r} must be finite > 0")


def server_loads(sizes: Sequence[int], owner: Sequence[int], servers: int) -> list[int]:
    """Bytes on each server when block i (``sizes[i]`` bytes) is on ``owner[i]``."""
    if len(sizes) != len(owner):
        raise ValueError(f"{len(sizes)} sizes but {len(owner)} owners")
    loads = [0] * servers
    for s, j in zip(sizes, owner):
        if not 0 <= j < servers:
            raise ValueError(f"owner {j} outside 0..{servers - 1}")
        loads[j] += s
    return loads


def predicted_time(loads_bytes: Sequence[float], throughput: Sequence[float]) -> float:
    """PSLD's predicted iteration time: max_j L_j / r_j (bytes over bytes per unit time)."""
    if len(loads_bytes) != len(throughput):
        raise ValueError(f"{len(loads_bytes)} loads but {len(throughput)} throughputs")
    _check_rates(throughput)
    return max(load / r for load, r in zip(loads_bytes, throughput))


def exploit_moves(sizes: Sequence[int], owner: Sequence[int], throughput: Sequence[float],
                  max_moves: int | None = None) -> tuple[list[Move], list[int]]:
    """Descending best fit: take the slowest server (largest L_j / r_j, lowest index on
    ties); over its blocks, largest first, find the destination minimising the new
    predicted time (then the destination's own new time, then its index) and make the
    first move that strictly lowers the predicted time.  Stop when no block of the
    slowest server helps or after ``max_moves`` moves.

    Returns the moves in order and the new owner list; the input is not changed."""
    _check_rates(throughput)
    if max_moves is not None and max_moves < 0:
        raise ValueError(f"max_moves = {max_moves} must be ≥ 0 or None")
    servers = len(throughput)
    new_owner = list(owner)
    loads = server_loads(sizes, new_owner, servers)
    moves: list[Move] = []
    while max_moves is None or len(moves) < max_moves:
        times = [loads[j] / throughput[j] for j in range(servers)]
        top = sorted(range(servers), key=lambda j: (-times[j], j))[:3]
        src, current = top[0], times[top[0]]
        move = None
        mine = sorted((i for i, j in enumerate(new_owner) if j == src),
                      key=lambda i: (-sizes[i], i))
        for i in mine:
            s = sizes[i]
            if s <= 0:
                break                 # the rest are empty too: moving them cannot help
            left = (loads[src] - s) / throughput[src]
            best = (current, math.inf)
            for dst in range(servers):
                if dst == src:
                    continue
                others = next((times[k] for k in top if k != src and k != dst), 0.0)
                arrive = (loads[dst] + s) / throughput[dst]
                t = (max(others, left, arrive), arrive)
                if t[0] < current and t < best:
                    best, move = t, Move(i, src, dst)
            if move is not None:
                break
        if move is None:
            break
        loads[move.src] -= sizes[move.block]
        loads[move.dst] += sizes[move.block]
        new_owner[move.block] = move.dst
        moves.append(move)
    return moves, new_owner


def lpt_time_placement(sizes: Sequence[int], throughput: Sequence[float]) -> list[int]:
    """LPT by time: largest block first, onto the server whose finishing time
    (L_j + size) / r_j is smallest (lowest index on ties)."""
    _check_rates(throughput)
    owner = [0] * len(sizes)
    for i, j in _lpt(sizes, range(len(sizes)), [0] * len(throughput), throughput):
        owner[i] = j
    return owner


ORACLE_EXACT_LIMIT: Final = 16


def oracle_placement(sizes: Sequence[int], throughput: Sequence[float],
                     exact_limit: int = ORACLE_EXACT_LIMIT) -> list[int]:
    """Best static placement given the true server throughputs.

    Exact (minimum predicted time) for at most ``exact_limit`` blocks, by depth-first
    branch and bound from the LPT-by-time solution; ``lpt_time_placement`` above it.
    The search is exponential in the worst case, hence the limit: at 16 blocks it takes
    milliseconds for equal-size blocks, up to a few seconds for random sizes on
    servers of unequal speeds."""
    _check_rates(throughput)
    if len(sizes) > exact_limit:
        return lpt_time_placement(sizes, throughput)
    return _branch_and_bound(sizes, throughput)


def _branch_and_bound(sizes: Sequence[int], rates: Sequence[float]) -> list[int]:
    """Minimum of max_j L_j / r_j over all assignments of the blocks to the servers.

    Blocks go largest first, each onto servers in order of their new finishing time.
    A branch is cut when it cannot beat the best so far: servers that cannot take even
    the smallest remaining block below it are closed, and the remaining bytes, poured
    as a fluid into the open servers, must still fit below it.  Symmetries cut: of
    servers alike in rate and load only the first is tried, and blocks of equal size
    take non-decreasing server indices."""
    servers = len(rates)
    best_owner = lpt_time_placement(sizes, rates)
    best = predicted_time(server_loads(sizes, best_owner, servers), rates)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    if not order:
        return best_owner
    smallest = sizes[order[-1]]
    remaining = [0] * (len(order) + 1)   # bytes still to place from position k on
    for k in range(len(order) - 1, -1, -1):
        remaining[k] = remaining[k + 1] + sizes[order[k]]
    loads = [0] * servers
    owner = [0] * len(sizes)
    floor = max(_fill_level(loads, rates, remaining[0], range(servers)),
                sizes[order[0]] / max(rates))        # no placement can beat this

    def search(k: int, current: float, first: int) -> None:
        nonlocal best, best_owner
        if k == len(order):
            if current < best:
                best, best_owner = current, list(owner)
            return
        if current >= best:
            return                                  # best improved since this branched
        i, s = order[k], sizes[order[k]]
        open_ = [j for j in range(servers) if (loads[j] + smallest) / rates[j] < best]
        if not open_ or _fill_level(loads, rates, remaining[k], open_) >= best:
            return
        seen: set[tuple[float, int]] = set()
        options = []
        for j in open_:
            if j < first or (rates[j], loads[j]) in seen:
                continue
            seen.add((rates[j], loads[j]))
            t = (loads[j] + s) / rates[j]
            if t < best:
                options.append((t, j))
        for t, j in sorted(options):
            if t >= best or best <= floor:
                break
            loads[j] += s
            owner[i] = j
            nxt = k + 1
            search(nxt, max(current, t),
                   j if nxt < len(order) and sizes[order[nxt]] == s else 0)
            loads[j] -= s

    if best > floor:
        search(0, 0.0, 0)
    return best_owner


def _fill_level(loads: Sequence[int], rates: Sequence[float], extra: int,
                servers: Iterable[int]) -> float:
    """Lowest time T at which ``servers``, loaded with ``loads``, could absorb ``extra``
    more bytes if bytes were divisible: sum_j max(0, T r_j - L_j) = extra."""
    rate = base = 0.0
    for j in sorted(servers, key=lambda j: loads[j] / rates[j]):
        if rate > 0 and (base + extra) / rate <= loads[j] / rates[j]:
            break
        rate += rates[j]
        base += loads[j]
    return (base + extra) / rate if rate > 0 else math.inf


def rehome(sizes: Sequence[int], owner: Sequence[int], leaving: int, live: Sequence[int],
           rates: Mapping[int, float] | None = None) -> dict[int, int]:
    """New servers for the blocks of server ``leaving`` when it leaves the job.

    Block k (``sizes[k]`` bytes) is on server rank ``owner[k]``; ``live`` are the ranks
    running, ``leaving`` among them; ``rates`` the servers' measured throughputs (a
    missing or zero rate counts as 1.0). The leaving server's blocks go largest first
    (ties by key) to the other live server that would finish soonest, (load + size) /
    rate, ties to the lowest rank (``lpt_time_placement``'s rule, starting from the
    current loads). Returns {block key: new server rank}."""
    if leaving not in live:
        raise ValueError(f"server {leaving} is not running (running: {list(live)})")
    others = sorted(r for r in live if r != leaving)
    if not others:
        raise ValueError(f"server {leaving} is the last one running")
    index = {r: j for j, r in enumerate(others)}
    loads = [0] * len(others)
    for k, r in enumerate(owner):
        if r in index:
            loads[index[r]] += sizes[k]
    speed = [(rates or {}).get(r) or 1.0 for r in others]
    mine = [k for k, r in enumerate(owner) if r == leaving]
    return {k: others[j] for k, j in _lpt(sizes, mine, loads, speed)}
