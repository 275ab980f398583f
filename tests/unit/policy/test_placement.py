"""Tests for the placement policies, planning helpers and rehoming in
equipoise.policy.placement.

Every framework rule is recomputed here from its definition, independently of the code.
"""
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equipoise.policy.block_size import AUTO_MAX, AUTO_MIN, AUTO_PARTS, auto_block_size
from equipoise.policy.placement import (
    BYTEPS_PARTITION_BYTES,
    MXNET_BIGARRAY_BOUND,
    ORACLE_EXACT_LIMIT,
    PLACEMENTS,
    Block,
    Move,
    byteps_server,
    djb2,
    exploit_moves,
    greedy_placement,
    lpt_time_placement,
    make_blocks,
    mxnet_server,
    oracle_placement,
    place_byteps,
    place_mxnet,
    placement_blocks,
    predicted_time,
    rehome,
    server_loads,
)

SETTINGS = settings(max_examples=60, deadline=None)


# ----------------------------------------------------------------------------- helpers

def ref_djb2(text):
    h = 5381
    for c in text:
        h = (h * 33 + ord(c)) % 2**64
    return h


def ref_blocks(tensor_parts, block_size):
    """Expected (name, start, stop, kind, itemsize, server) rows: each tensor's parts
    (start, stop, server), each cut into pieces of at most block_size elements."""
    rows = []
    for (name, numel, kind, itemsize), parts in tensor_parts:
        if numel == 0:
            rows.append((name, 0, 0, kind, itemsize, parts[0][2]))
            continue
        for lo, hi, server in parts:
            for a in range(lo, hi, block_size):
                rows.append((name, a, min(hi, a + block_size), kind, itemsize, server))
    return rows


def as_rows(blocks, owner):
    assert [b.key for b in blocks] == list(range(len(blocks)))
    return [(b.name, b.start, b.stop, b.kind, b.itemsize, s) for b, s in zip(blocks, owner)]


def time_of(sizes, owner, rates):
    return predicted_time(server_loads(sizes, owner, len(rates)), rates)


def brute_force(sizes, rates):
    return min(time_of(sizes, a, rates)
               for a in itertools.product(range(len(rates)), repeat=len(sizes)))


@st.composite
def tensor_lists(draw, max_numel=60):
    n = draw(st.integers(0, 8))
    return [(f"layer{i}.w", draw(st.integers(0, max_numel)),
             draw(st.sampled_from(["param", "buffer"])), draw(st.sampled_from([1, 2, 4, 8])))
            for i in range(n)]


rates_st = st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=1, max_size=4)


# ----------------------------------------------------------------------------- hashes

def test_djb2_known_values():
    assert djb2("") == 5381
    assert djb2("a") == 177670
    assert djb2("ab") == 177670 * 33 + ord("b")
    long = "conv1.weight_" * 40                 # long enough to wrap 64 bits
    assert djb2(long) == ref_djb2(long) < 2**64


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40))
@SETTINGS
def test_djb2_matches_reference_on_ascii(text):
    assert djb2(text) == ref_djb2(text)


def test_server_rules():
    assert mxnet_server(3, 4) == (3 * 9973) % 4
    assert [mxnet_server(k, 5) for k in range(6)] == [k * 9973 % 5 for k in range(6)]
    assert byteps_server("fc.weight", 2, 7) == ref_djb2("fc.weight_2") % 7


# ----------------------------------------------------------------------------- framework policies

def test_policy_names_and_unknown_policy():
    assert list(PLACEMENTS) == ["round_robin", "mxnet", "byteps", "greedy", "psld", "oracle"]
    with pytest.raises(ValueError,
                       match=r"'ring'.*round_robin.*mxnet.*byteps.*greedy.*psld.*oracle"):
        placement_blocks("ring", [("w", 4, "param", 4)], 2, 10)


@pytest.mark.parametrize("policy", list(PLACEMENTS))
def test_block_size_zero_cuts_each_servers_share_in_16_blocks_within_bounds(policy):
    """block_size = 0: ceil(total / (16 · servers)) elements, clamped to [16,384, 262,144];
    every policy then cuts as with that number given."""
    assert (AUTO_PARTS, AUTO_MIN, AUTO_MAX) == (16, 16_384, 262_144)
    mid = [("conv", 40_000, "param", 4), ("fc", 4_000_000, "param", 4), ("bn", 64, "buffer", 4)]
    total = 40_000 + 4_000_000 + 64
    for servers in (1, 2, 3):
        size = auto_block_size(mid, servers)
        assert size == math.ceil(total / (16 * servers)) and AUTO_MIN < size < AUTO_MAX
        blocks, _ = placement_blocks(policy, mid, servers, 0)
        assert (blocks, _) == placement_blocks(policy, mid, servers, size)
        if policy in ("greedy", "psld", "oracle"):  # cut only by block_size: 16 blocks a server at least
            assert len(blocks) >= 16 * servers and max(b.numel for b in blocks) == size
    assert auto_block_size([("w", 100_000, "param", 4)], 2) == AUTO_MIN  # a small model: no smaller parts
    # ... but every server gets blocks: at most one server's whole share (the digits MLP on 8 servers)
    assert auto_block_size([("w", 19_210, "param", 4)], 8) == 2402
    blocks, owner = placement_blocks("greedy", [("w", 19_210, "param", 4)], 8, 0)
    assert len(blocks) == 8 and set(owner) == set(range(8))
    assert auto_block_size([("w", 10**8, "param", 4)], 2) == AUTO_MAX  # a large one: the default


@pytest.mark.parametrize("policy", list(PLACEMENTS))
def test_bad_arguments(policy):
    with pytest.raises(ValueError):
        placement_blocks(policy, [("w", 4, "param", 4)], 0, 10)
    with pytest.raises(ValueError):
        placement_blocks(policy, [("w", 4, "param", 4)], 2, -1)  # 0 is auto_block_size
    with pytest.raises(ValueError, match="3 rates for 2 servers"):
        placement_blocks(policy, [("w", 4, "param", 4)], 2, 10, [1.0, 1.0, 1.0])


@pytest.mark.parametrize("policy", sorted(PLACEMENTS))
@given(tensors=tensor_lists(), servers=st.integers(1, 5), block_size=st.integers(1, 25))
@SETTINGS
def test_blocks_cover_every_tensor_exactly_once(policy, tensors, servers, block_size):
    blocks, owner = placement_blocks(policy, tensors, servers, block_size)
    assert len(owner) == len(blocks)
    assert [b.key for b in blocks] == list(range(len(blocks)))
    assert all(0 <= s < servers for s in owner)
    assert all(b.numel <= block_size for b in blocks)
    at = 0
    for name, numel, kind, itemsize in tensors:
        mine = []
        while at < len(blocks) and blocks[at].name == name:
            mine.append(blocks[at])
            at += 1
        assert mine, f"{name} has no block"
        assert mine[0].start == 0 and mine[-1].stop == numel
        assert all(a.stop == b.start for a, b in zip(mine, mine[1:]))
        assert all(b.numel > 0 for b in mine) or numel == 0
        assert {(b.kind, b.itemsize) for b in mine} == {(kind, itemsize)}
    assert at == len(blocks)


@given(tensors=tensor_lists(), servers=st.integers(1, 5), block_size=st.integers(1, 25))
@SETTINGS
def test_round_robin_whole_tensors_in_creation_order(tensors, servers, block_size):
    blocks, owner = placement_blocks("round_robin", tensors, servers, block_size)
    assert blocks == make_blocks(tensors, block_size)
    expected = ref_blocks([(t, [(0, t[1], i % servers)]) for i, t in enumerate(tensors)],
                          block_size)
    assert as_rows(blocks, owner) == expected


def mxnet_parts(index, tensor, servers, bound):
    numel = tensor[1]
    if numel < bound or numel == 0:
        return [(0, numel, (index * 9973) % servers)]
    cuts = [math.floor(numel * i / servers + 0.5) for i in range(servers + 1)]
    return [(cuts[i], cuts[i + 1], i) for i in range(servers) if cuts[i + 1] > cuts[i]]


def test_mxnet_small_array_goes_whole_to_hashed_server():
    tensors = [(f"t{i}", 10, "param", 4) for i in range(4)]
    blocks, owner = placement_blocks("mxnet", tensors, 4, 100)
    assert len(blocks) == 4 and owner[3] == (3 * 9973) % 4
    assert owner == [(i * 9973) % 4 for i in range(4)]


def test_mxnet_big_array_split_evenly_over_all_servers():
    tensors = [("emb", 2_500_000, "param", 4), ("bias", 10, "param", 4)]
    blocks, owner = placement_blocks("mxnet", tensors, 4, 10**7)
    assert [(b.start, b.stop) for b in blocks[:4]] == [(i * 625_000, (i + 1) * 625_000)
                                                      for i in range(4)]
    assert owner == [0, 1, 2, 3, (1 * 9973) % 4]
    # parts larger than block_size are cut further, still on their part's server
    blocks, owner = placement_blocks("mxnet", tensors, 4, 300_000)
    assert [b.numel for b in blocks[:3]] == [300_000, 300_000, 25_000]
    assert owner[:12] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_mxnet_bound_is_one_million_elements():
    below = [("a", MXNET_BIGARRAY_BOUND - 1, "param", 4)]
    at = [("a", MXNET_BIGARRAY_BOUND, "param", 4)]
    assert placement_blocks("mxnet", below, 3, 10**7)[1] == [0]
    blocks, owner = placement_blocks("mxnet", at, 3, 10**7)
    assert owner == [0, 1, 2]
    assert [b.numel for b in blocks] == [333_333, 333_334, 333_333]   # round(n * i / 3)


@given(tensors=tensor_lists(), servers=st.integers(1, 5), block_size=st.integers(1, 25),
       bound=st.integers(1, 40))
@SETTINGS
def test_mxnet_matches_reference(tensors, servers, block_size, bound):
    blocks, owner = place_mxnet(tensors, servers, block_size, bigarray_bound=bound)
    expected = ref_blocks([(t, mxnet_parts(i, t, servers, bound)) for i, t in enumerate(tensors)],
                          block_size)
    assert as_rows(blocks, owner) == expected


def byteps_parts(tensor, servers, partition_bytes):
    name, numel, _, itemsize = tensor
    chunk = max(1, partition_bytes // itemsize)
    starts = list(range(0, numel, chunk)) or [0]
    return [(lo, min(numel, lo + chunk), ref_djb2(f"{name}_{c}") % servers)
            for c, lo in enumerate(starts)]


def test_byteps_chunks_of_4096000_bytes():
    tensors = [("fc.weight", 2_500_000, "param", 4), ("fc.half", 2_500_000, "param", 2)]
    blocks, owner = placement_blocks("byteps", tensors, 5, 10**7)
    assert BYTEPS_PARTITION_BYTES == 4_096_000
    assert [b.numel for b in blocks] == [1_024_000, 1_024_000, 452_000, 2_048_000, 452_000]
    assert all(b.nbytes <= 4_096_000 for b in blocks)
    names = ["fc.weight_0", "fc.weight_1", "fc.weight_2", "fc.half_0", "fc.half_1"]
    assert owner == [ref_djb2(k) % 5 for k in names]
    # chunks larger than block_size are cut further, on their chunk's server
    blocks, owner = placement_blocks("byteps", tensors[:1], 5, 500_000)
    assert [b.numel for b in blocks] == [500_000, 500_000, 24_000] * 2 + [452_000]
    assert owner == [ref_djb2(f"fc.weight_{c}") % 5 for c in (0, 0, 0, 1, 1, 1, 2)]


@given(tensors=tensor_lists(), servers=st.integers(1, 5), block_size=st.integers(1, 25),
       partition_bytes=st.integers(1, 80))
@SETTINGS
def test_byteps_matches_reference(tensors, servers, block_size, partition_bytes):
    blocks, owner = place_byteps(tensors, servers, block_size, partition_bytes=partition_bytes)
    expected = ref_blocks([(t, byteps_parts(t, servers, partition_bytes)) for t in tensors],
                          block_size)
    assert as_rows(blocks, owner) == expected


@pytest.mark.parametrize("policy", ["greedy", "psld"])
@given(tensors=tensor_lists(), servers=st.integers(1, 5), block_size=st.integers(1, 25))
@SETTINGS
def test_greedy_and_psld_start_are_lpt_by_bytes(policy, tensors, servers, block_size):
    blocks, owner = placement_blocks(policy, tensors, servers, block_size)
    assert blocks == make_blocks(tensors, block_size)
    assert owner == greedy_placement([b.nbytes for b in blocks], servers)


def test_existing_helpers_unchanged():
    blocks = make_blocks([("a", 10, "param", 4), ("b", 3, "param", 4)], block_size=4)
    assert [(b.key, b.name, b.start, b.stop) for b in blocks] == [
        (0, "a", 0, 4), (1, "a", 4, 8), (2, "a", 8, 10), (3, "b", 0, 3)]
    assert greedy_placement([10, 1, 9, 2], 2) == [0, 0, 1, 1]
    assert Block.from_list(blocks[1].to_list()) == blocks[1]


def old_place(policy, tensors, servers, block_size, server_slowdown=()):
    """The runtime's placement before the registry held the oracle (coord_servers._place)."""
    if policy == "oracle":
        blocks = make_blocks(tensors, block_size)
        rates = [1.0 / f for f in (server_slowdown or [1.0] * servers)]
        return blocks, oracle_placement([b.nbytes for b in blocks], rates)
    if policy in ("greedy", "psld"):
        blocks = make_blocks(tensors, block_size)
        return blocks, greedy_placement([b.nbytes for b in blocks], servers)
    return placement_blocks(policy, tensors, servers, block_size)


@pytest.mark.parametrize("policy", list(PLACEMENTS))
@given(tensors=tensor_lists(max_numel=30), servers=st.integers(1, 4), block_size=st.integers(4, 25),
       slow=st.lists(st.sampled_from([1.0, 1.5, 2.0, 4.0]), min_size=4, max_size=4),
       slowed=st.booleans())
@SETTINGS
def test_registry_equals_the_runtime_special_cases(policy, tensors, servers, block_size, slow,
                                                   slowed):
    server_slowdown = tuple(slow[:servers]) if slowed else ()
    rates = [1.0 / f for f in server_slowdown] if slowed else None
    assert (placement_blocks(policy, tensors, servers, block_size, rates)
            == old_place(policy, tensors, servers, block_size, server_slowdown))


def test_oracle_policy_uses_the_rates():
    tensors = [("w", 8, "param", 1)]                     # 8 blocks of 1 byte
    blocks, owner = placement_blocks("oracle", tensors, 2, 1, [3.0, 1.0])
    assert len(blocks) == 8 and owner.count(0) == 6      # 6/3 = 2/1: both finish at 2
    assert placement_blocks("oracle", tensors, 2, 1)[1].count(0) == 4  # None: equal rates


def test_greedy_beats_whole_tensor_policies_on_a_lopsided_model():
    # one big embedding and many small layers: whole-tensor placement is stuck with it
    tensors = [("emb", 400_000, "param", 4)] + [(f"l{i}", 20_000, "param", 4) for i in range(12)]
    rates = [1.0] * 4
    times = {}
    for policy in PLACEMENTS:
        blocks, owner = placement_blocks(policy, tensors, 4, 50_000, rates)
        times[policy] = time_of([b.nbytes for b in blocks], owner, rates)
    assert times["greedy"] == times["psld"] == times["oracle"] == 4 * 640_000 / 4  # balanced
    assert times["greedy"] < times["round_robin"]
    assert times["greedy"] <= times["mxnet"] and times["greedy"] <= times["byteps"]


# ----------------------------------------------------------------------------- PSLD planning

def test_predicted_time():
    assert predicted_time([10, 20], [1.0, 4.0]) == 10.0
    assert predicted_time([0, 0], [1.0, 2.0]) == 0.0
    assert server_loads([5, 3, 2], [1, 0, 1], 3) == [3, 7, 0]
    with pytest.raises(ValueError):
        predicted_time([1, 2], [1.0])
    with pytest.raises(ValueError):
        predicted_time([1], [0.0])
    with pytest.raises(ValueError):
        server_loads([1], [2], 2)


@given(sizes=st.lists(st.integers(0, 50), max_size=7), rates=rates_st)
@settings(max_examples=80, deadline=None)
def test_oracle_is_optimal(sizes, rates):
    owner = oracle_placement(sizes, rates)
    assert len(owner) == len(sizes) and all(0 <= j < len(rates) for j in owner)
    best = brute_force(sizes, rates)
    assert time_of(sizes, owner, rates) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_oracle_optimal_where_lpt_is_not():
    sizes, rates = [3, 3, 2, 2, 2], [1.0, 1.0]
    assert time_of(sizes, lpt_time_placement(sizes, rates), rates) == 7
    assert time_of(sizes, oracle_placement(sizes, rates), rates) == 6


@given(sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=12), rates=rates_st,
       seed=st.integers(0, 1000))
@SETTINGS
def test_oracle_never_worse_than_greedy_or_round_robin(sizes, rates, seed):
    servers = len(rates)
    oracle = time_of(sizes, oracle_placement(sizes, rates), rates)
    lpt_time = time_of(sizes, lpt_time_placement(sizes, rates), rates)
    greedy = time_of(sizes, greedy_placement(sizes, servers), rates)
    round_robin = time_of(sizes, [i % servers for i in range(len(sizes))], rates)
    rng = random.Random(seed)
    anything = time_of(sizes, [rng.randrange(servers) for _ in sizes], rates)
    assert oracle <= min(lpt_time, greedy, round_robin, anything) * (1 + 1e-12)


def test_oracle_falls_back_to_lpt_by_time_above_the_limit():
    rng = random.Random(3)
    sizes = [rng.randint(1, 1000) for _ in range(ORACLE_EXACT_LIMIT + 1)]
    rates = [0.5, 1.0, 2.0]
    assert oracle_placement(sizes, rates) == lpt_time_placement(sizes, rates)
    assert oracle_placement(sizes[:6], rates, exact_limit=3) == lpt_time_placement(sizes[:6], rates)


def test_lpt_by_time_rule():
    # 8 -> server 1 (8/2 < 8/1); 4 -> 0 (4/1 < 12/2); 4 -> 1 (12/2=6 < 8/1); 2 -> 0 (6 < 7)
    assert lpt_time_placement([4, 8, 2, 4], [1.0, 2.0]) == [0, 1, 0, 1]


@given(sizes=st.lists(st.integers(0, 100), max_size=20), rates=rates_st,
       seed=st.integers(0, 1000), max_moves=st.one_of(st.none(), st.integers(0, 5)))
@SETTINGS
def test_exploit_moves_never_increase_predicted_time(sizes, rates, seed, max_moves):
    servers = len(rates)
    rng = random.Random(seed)
    owner = [rng.randrange(servers) for _ in sizes]
    before = list(owner)
    moves, new_owner = exploit_moves(sizes, owner, rates, max_moves=max_moves)
    assert owner == before                               # input left alone
    assert max_moves is None or len(moves) <= max_moves
    replay, last = list(owner), time_of(sizes, owner, rates)
    for move in moves:
        assert isinstance(move, Move) and move.src != move.dst
        assert replay[move.block] == move.src
        replay[move.block] = move.dst
        now = time_of(sizes, replay, rates)
        assert now < last                                # each move strictly helps
        last = now
    assert replay == new_owner
    if max_moves is None or len(moves) < max_moves:      # stopped: no single move helps
        current = time_of(sizes, new_owner, rates)
        times = [load / r for load, r in zip(server_loads(sizes, new_owner, servers), rates)]
        slowest = times.index(max(times))
        for i, j in enumerate(new_owner):
            if j != slowest:
                continue
            for dst in range(servers):
                trial = list(new_owner)
                trial[i] = dst
                assert time_of(sizes, trial, rates) >= current


def test_exploit_moves_reaches_oracle_with_one_server_slowed_4x():
    sizes, rates = [1000] * 16, [0.25, 1.0, 1.0, 1.0]
    start = greedy_placement(sizes, 4)                   # 4 blocks each: 16000 on server 0
    assert time_of(sizes, start, rates) == 16_000
    moves, owner = exploit_moves(sizes, start, rates)
    assert all(m.src == 0 for m in moves) and len(moves) == 3
    oracle = time_of(sizes, oracle_placement(sizes, rates), rates)
    assert oracle == 5000
    assert time_of(sizes, owner, rates) == oracle
    assert exploit_moves(sizes, owner, rates) == ([], owner)   # a fixed point
    assert exploit_moves(sizes, start, rates, max_moves=1)[0] == moves[:1]


def test_exploit_moves_does_nothing_on_one_server_or_balanced():
    assert exploit_moves([5, 6], [0, 0], [1.0]) == ([], [0, 0])
    assert exploit_moves([5, 5], [0, 1], [1.0, 1.0]) == ([], [0, 1])
    with pytest.raises(ValueError):
        exploit_moves([5], [0], [1.0, -1.0])


# ----------------------------------------------------------------------------- rehome

def test_rehome_hand_worked():
    # blocks 0..5 of sizes 6, 4, 4, 3, 5, 2; server 1 leaves; servers 0, 2, 3 stay
    sizes = [6, 4, 4, 3, 5, 2]
    owner = [1, 0, 1, 2, 1, 1]
    rates = {0: 2.0, 1: 9.0, 3: 0.0}                      # 2 missing, 3 zero: both 1.0
    # loads 0: 4, 2: 3, 3: 0.  Leaving blocks largest first: 0 (6), 4 (5), 2 (4), 5 (2).
    # 0 (6): finish 0: 10/2 = 5, 2: 9, 3: 6 -> 0 (load 10)
    # 4 (5): 0: 15/2 = 7.5, 2: 8, 3: 5 -> 3 (load 5)
    # 2 (4): 0: 14/2 = 7, 2: 7, 3: 9 -> tie 7, lowest rank 0 (load 14)
    # 5 (2): 0: 8, 2: 5, 3: 7 -> 2
    got = rehome(sizes, owner, 1, [0, 1, 2, 3], rates)
    assert got == {0: 0, 4: 3, 2: 0, 5: 2} and list(got) == [0, 4, 2, 5]


def brute_rehome(sizes, owner, leaving, live, rates):
    """ServerPool.remove's loop as it was written in runtime/elastic.py."""
    others = [r for r in live if r != leaving]
    rates = {r: (rates or {}).get(r) or 1.0 for r in others}
    loads = {r: sum(s for s, o in zip(sizes, owner) if o == r) for r in others}
    plan = {}
    for k in sorted((k for k in range(len(sizes)) if owner[k] == leaving), key=lambda k: -sizes[k]):
        dst = min(others, key=lambda r: ((loads[r] + sizes[k]) / rates[r], r))
        loads[dst] += sizes[k]
        plan[k] = dst
    return plan


@given(sizes=st.lists(st.integers(0, 20), max_size=12), live=st.sets(st.integers(0, 5), min_size=2),
       seed=st.integers(0, 1000))
@SETTINGS
def test_rehome_matches_the_runtime_rule(sizes, live, seed):
    rng = random.Random(seed)
    live = sorted(live)
    owner = [rng.choice(live) for _ in sizes]
    leaving = rng.choice(live)
    rates = {r: rng.choice([0.0, 0.5, 1.0, 2.0]) for r in live if rng.random() < 0.7}
    got = rehome(sizes, owner, leaving, live, rates)
    assert list(got.items()) == list(brute_rehome(sizes, owner, leaving, live, rates).items())
    assert leaving not in got.values()


def test_rehome_refuses_a_server_not_running_or_the_last():
    with pytest.raises(ValueError, match="server 4 is not running"):
        rehome([1], [0], 4, [0, 1])
    with pytest.raises(ValueError, match="server 0 is the last one running"):
        rehome([1], [0], 0, [0])
