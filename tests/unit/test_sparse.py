"""Sparse tables in pieces (no job): the hashed row order, blocks of whole rows, a
worker's RemoteTable against torch's own sparse embedding, the server's checks of rows,
and the configurations refused."""

import pytest
import torch
from torch import nn

from equipoise.config import Config
from equipoise.policy.placement import Block
from equipoise.protocol.blocks import model_blocks, read_values, write_values
from equipoise.sparse.checks import tables_refusal
from equipoise.sparse.remote import IdError, RemoteTables
from equipoise.sparse.step import check_rows, rows_within, sparse_sum, table_push_ok
from equipoise.sparse.tables import (SHARDS_PER_SERVER, TableError, place_with_tables, row_order, sparse_tables, stored_positions,
                                     table_blocks)
from equipoise.wire.names import pack_parts, unpack_parts

pytestmark = pytest.mark.timeout(60)


class Net(nn.Module):
    def __init__(self, bag=False, padding_idx=None, max_norm=None):
        super().__init__()
        self.emb = (nn.EmbeddingBag(37, 4, mode="sum", sparse=True, padding_idx=padding_idx) if bag else
                    nn.Embedding(37, 4, sparse=True, padding_idx=padding_idx, max_norm=max_norm))
        self.dense = nn.Embedding(5, 2)  # not sparse: an ordinary parameter
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        e = self.emb(x)
        return self.out(e if e.dim() == 2 else e.sum(1)).sum()


@pytest.mark.parametrize("rows", [1, 2, 7, 36, 37, 1000, 1 << 20])
def test_the_stored_order_is_a_bijection(rows):
    ids = torch.arange(rows)
    pos = stored_positions(ids, rows)
    assert torch.equal(torch.sort(pos).values, ids)
    a, _ = row_order(rows)
    assert rows <= 2 or a > 1


def test_tables_cut_into_whole_rows_and_back():
    torch.manual_seed(0)
    model = Net()
    assert list(sparse_tables(model)) == ["emb.weight"]
    blocks = model_blocks(model, block_size=10)
    rows = [b for b in blocks if b.kind == "rows"]
    assert [b.numel for b in rows] == [8] * 18 + [4] and all(b.width == 4 and b.start % 4 == 0 for b in rows)
    assert rows[0].key == len(blocks) - len(rows)  # after the dense blocks
    assert Block.from_list(rows[0].to_list()) == rows[0]
    values = {k: v.clone() for k, v in read_values(model, blocks).items()}
    # every row exactly once, in the hashed order
    stacked = torch.cat([values[b.key].view(-1, 4) for b in rows])
    order = torch.argsort(stored_positions(torch.arange(37), 37))
    assert torch.equal(stacked, model.emb.weight.detach()[order])
    fresh = Net()
    write_values(fresh, blocks, values)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_table_blocks_are_placed_by_size_after_the_dense_ones():
    tensors = [("w", 100, "param", 4), ("t", 4 * 37, "rows", 4)]
    blocks, owner = place_with_tables("mxnet", tensors, 3, 40, widths={"t": 4})
    # 37 rows, blocks under 40 elements (10 rows) and at least SHARDS_PER_SERVER × 3 of them
    per = min(10, -(-37 // (SHARDS_PER_SERVER * 3)))
    shards = [b for b in blocks if b.kind == "rows"]
    assert [b.kind for b in blocks[:3]] == ["param"] * 3 and len(shards) == -(-37 // per) >= SHARDS_PER_SERVER * 3 - 1
    assert [b.rows for b in shards[:-1]] == [per] * (len(shards) - 1) and sum(b.rows for b in shards) == 37
    loads = [sum(b.nbytes for b, j in zip(blocks, owner) if j == s) for s in range(3)]
    # server 0 holds the dense 400 bytes, more than a third of all: the 592 of the table go
    # to the other two, by size, within one shard of each other
    assert owner[:3] == [0, 0, 0] and 0 not in owner[3:] and abs(loads[1] - loads[2]) <= per * 16
    assert table_blocks([("t", 12, "rows", 4)], {"t": 4}, 3)[0].numel == 4  # a block smaller than a row: one row
    # greedy does not know the servers' speeds, the oracle does; round_robin hashes shards
    slow = [1.0, 1.0, 0.25]
    assert place_with_tables("greedy", tensors, 3, 40, slow, {"t": 4}) == place_with_tables("greedy", tensors, 3, 40,
                                                                                           widths={"t": 4})
    _, oracle = place_with_tables("oracle", tensors, 3, 40, slow, {"t": 4})
    assert oracle[3:].count(2) < min(oracle[3:].count(0), oracle[3:].count(1))
    _, hashed = place_with_tables("round_robin", tensors, 3, 40, slow, {"t": 4})
    assert hashed[3:] == [i % 3 for i in range(len(shards))]


def remote(model, blocks, values):
    """`model`'s tables replaced by RemoteTables fetching from `values` (stored order)."""
    asked = []

    def fetch(version, wanted):
        asked.append({k: v.tolist() for k, v in wanted.items()})
        return {k: values[k].view(-1, 4)[rows] for k, rows in wanted.items()}
    return RemoteTables.install(model, blocks, fetch), asked


@pytest.mark.parametrize("bag,padding_idx", [(False, None), (False, 3), (True, None), (True, 3)])
def test_a_remote_table_gives_torch_s_sparse_gradient(bag, padding_idx):
    """The same forward and the same gradient as torch's own sparse embedding, on the
    rows the batch touched only (a repeated id's gradients summed; the padding row's left
    out, as torch leaves it out)."""
    torch.manual_seed(0)
    model = Net(bag, padding_idx)
    blocks = model_blocks(model, block_size=10)
    values = {k: v.clone() for k, v in read_values(model, blocks).items()}
    x = torch.tensor([[3, 5, 5, 36], [0, 3, 9, 5]])
    model(x).backward()
    want = model.emb.weight.grad.coalesce()
    twin = Net(bag, padding_idx)
    twin.load_state_dict(model.state_dict())
    tables, asked = remote(twin, blocks, values)
    assert not any(n.startswith("emb.") for n, _ in twin.named_parameters())  # the worker holds no table
    out = twin(x)
    assert torch.allclose(out, model(x))
    assert sum(len(r) for r in asked[0].values()) == 5  # each distinct id once
    out.backward()
    grads, rows = tables.gradients()
    got = torch.zeros(37, 4)
    inverse = torch.argsort(stored_positions(torch.arange(37), 37))
    assert set(rows) == set(grads) and set(rows) <= {b.key for b in blocks if b.kind == "rows"}  # the blocks touched
    for b in (b for b in blocks if b.key in rows):
        ids = inverse[b.start // 4 + rows[b.key]]
        got[ids] += grads[b.key].view(-1, 4)
    dense_want = want.to_dense()
    assert torch.allclose(got, dense_want, atol=1e-6)
    touched = {int(i) for i in want.indices()[0]}
    assert {int(i) for b in blocks if b.key in rows for i in inverse[b.start // 4 + rows[b.key]]} == touched
    assert all(len(r) for r in rows.values())  # only the blocks touched: none empty


def test_an_id_outside_its_table_is_named():
    torch.manual_seed(0)
    model = Net()
    blocks = model_blocks(model, block_size=10)
    tables, _ = remote(model, blocks, {k: v.clone() for k, v in read_values(model, blocks).items()})
    with pytest.raises(IdError, match=r"table emb: id 37 outside \[0, 37\)"):
        model(torch.tensor([[1, 37]]))
    with pytest.raises(IdError, match="id -1"):
        model(torch.tensor([[-1, 2]]))


def test_max_norm_is_refused_naming_the_module():
    with pytest.raises(TableError, match=r"emb: Embedding\(max_norm=1.0\)"):
        sparse_tables(Net(max_norm=1.0))


def test_rows_are_checked_and_summed_as_dense_gradients_are():
    b = Block(0, "t", 0, 12, "rows", 4, 4)
    check_rows(b, torch.tensor([0, 2]), "test")
    for bad, match in ((torch.tensor([3]), "rows \\[0, 3\\); asked for 3"), (torch.tensor([-1]), "asked for -1"),
                       (torch.tensor([0.0]), "int64")):
        with pytest.raises(ValueError, match=match):
            check_rows(b, bad, "test")
    g = sparse_sum([torch.tensor([0, 2]), torch.tensor([2])], [torch.ones(8), torch.full((4,), 2.0)], [0.25, 0.75],
                   (3, 4))
    assert torch.equal(g.to_dense(), torch.tensor([[0.25] * 4, [0.0] * 4, [1.75] * 4]))


def test_a_pushs_table_blocks_checked_at_once_pass_and_fail_as_block_by_block():
    """`rows_within` and `table_push_ok` check every table block of a request or a push
    in a few operations; each bad case the block-by-block checks refuse is refused by
    them too (and then named block by block), wherever among the blocks it is."""
    blocks = [Block(0, "t", 0, 12, "rows", 4, 4), Block(1, "t", 12, 20, "rows", 4, 4)]  # 3 rows, 2 rows
    rows, grads, dtypes = [torch.tensor([0, 2]), torch.tensor([1])], [torch.ones(8), torch.ones(4)], [torch.float32] * 2
    assert rows_within(blocks, rows) and table_push_ok(blocks, rows, grads, dtypes)
    assert rows_within([], []) and table_push_ok([], [], [], [])
    assert rows_within(blocks, [torch.zeros(0, dtype=torch.int64)] * 2)
    for i in (0, 1):
        for bad in (torch.tensor([blocks[i].rows]), torch.tensor([-1]), torch.tensor([0.0]), torch.zeros(1, 1).long()):
            r = list(rows)
            r[i] = bad
            assert not rows_within(blocks, r)
            with pytest.raises(ValueError):
                check_rows(blocks[i], bad, "test")
        for bad_rows, bad_grad in ((None, grads[i]), (rows[i], torch.ones(3)), (rows[i], torch.ones(1, len(grads[i]))),
                                   (rows[i], grads[i].double()), (rows[i], torch.full_like(grads[i], float("nan"))),
                                   (rows[i], torch.full_like(grads[i], float("inf")))):
            r, g = list(rows), list(grads)
            r[i], g[i] = bad_rows, bad_grad
            assert not table_push_ok(blocks, r, g, dtypes)


def test_a_push_with_a_bad_table_block_is_refused_naming_it():
    from equipoise.server.store import OptimizerSpec, ParameterStore, Push, PushError
    from equipoise.policy.sync import make_sync_policy

    blocks = [Block(0, "t", 0, 12, "rows", 4, 4), Block(1, "t", 12, 20, "rows", 4, 4)]
    store = ParameterStore(blocks, {0: torch.zeros(12), 1: torch.zeros(8)},
                           OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1),
                           make_sync_policy("bsp"))
    good = Push(0, 0, 4, {0: torch.ones(8), 1: torch.ones(4)}, rows={0: torch.tensor([0, 2]), 1: torch.tensor([1])})
    store.check(good)
    for grads, rows, match in (({1: torch.ones(4)}, {1: torch.tensor([2])}, "block 1 has rows \\[0, 2\\); asked for 2"),
                               ({1: torch.ones(4)}, {1: torch.tensor([-1])}, "asked for -1"),
                               ({1: torch.full((4,), float("nan"))}, {}, "block 1 holds a non-finite"),
                               ({1: torch.ones(8)}, {}, "block 1 has \\(8,\\)"),
                               ({}, {1: None}, "block 1 of table t comes without its rows")):
        bad = Push(0, 0, 4, {**good.tensors, **grads}, rows={**good.rows, **rows})
        bad.rows = {k: v for k, v in bad.rows.items() if v is not None}
        with pytest.raises(PushError, match=match):
            store.check(bad)


def cfg(**kw):
    base = dict(dataset="digits", model="mlp", workers=2, servers=2, iterations=2, progress=False)
    return Config.from_dict({**base, **kw})


@pytest.mark.parametrize("kw,match", [
    ({"backward_push": True}, "backward_push = True"),
    ({"optimizer": "adamw"}, "adamw has no sparse step"),
    ({"weight_decay": 0.01}, "weight_decay = 0.01"),
    ({"clip_grad_norm": 1.0}, "clip_grad_norm"),
    ({"device": "cuda"}, "run on CPU workers so far, not cuda"),
])
def test_settings_sparse_tables_cannot_run_with_are_refused_in_one_line(kw, match):
    tables = sparse_tables(Net())
    assert tables_refusal(cfg(), tables) is None and tables_refusal(cfg(**kw), {}) is None
    line = tables_refusal(cfg(**kw), tables)
    assert match in line and "(emb)" in line and "\n" not in line


def test_rows_fetched_ahead_serve_the_forward_in_one_request():
    """`prefetch` (the user's sparse_ids) asks for every table's rows at once; the forward
    then asks for nothing, and the gradient is the same as a forward that fetched."""
    torch.manual_seed(0)
    model = Net()
    blocks = model_blocks(model, block_size=10)
    values = {k: v.clone() for k, v in read_values(model, blocks).items()}
    x = torch.tensor([[3, 5, 5, 36], [0, 3, 9, 5]])
    twins = []
    for ahead in (False, True):
        twin = Net()
        twin.load_state_dict(model.state_dict())
        tables, asked = remote(twin, blocks, values)
        if ahead:
            tables.prefetch({"emb": x}, lambda version, wanted: {k: values[k].view(-1, 4)[r] for k, r in wanted.items()})
        twin(x).backward()
        twins.append((tables.gradients(), len(asked)))
    (grads, rows), fetched = twins[0]
    (grads_ahead, rows_ahead), fetched_ahead = twins[1]
    assert (fetched, fetched_ahead) == (1, 0)
    assert all(torch.equal(grads[k], grads_ahead[k]) and torch.equal(rows[k], rows_ahead[k]) for k in grads)
    with pytest.raises(IdError, match="sparse_ids names \\['nope'\\]"):
        tables.prefetch({"nope": x}, lambda version, wanted: {})


def test_a_tied_or_shared_table_and_a_bare_table_are_refused():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4, sparse=True)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight  # weight tying, as language models do

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Embedding(10, 4, sparse=True)
            self.b = self.a

    for model, match in ((Tied(), "emb: a sparse table shared with out.weight"),
                         (Twice(), "a: a sparse table shared with b"),
                         (nn.Embedding(10, 4, sparse=True), "the model itself is a sparse table")):
        with pytest.raises(TableError, match=match):
            sparse_tables(model)


def test_an_embedding_bag_with_offsets_and_the_last_offset_included_gives_torch_s_gradient():
    torch.manual_seed(0)

    class Bags(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.EmbeddingBag(37, 4, mode="mean", sparse=True, include_last_offset=True)

        def forward(self, x, offsets, weights=None):
            return self.emb(x, offsets, weights)

    model = Bags()
    blocks = model_blocks(model, block_size=10)
    values = {k: v.clone() for k, v in read_values(model, blocks).items()}
    x, offsets = torch.tensor([3, 5, 5, 36, 0, 9]), torch.tensor([0, 2, 5, 6])
    want = model(x, offsets)
    want.square().sum().backward()
    twin = Bags()
    tables, _ = remote(twin, blocks, values)
    got = twin(x, offsets)
    assert got.shape == want.shape == (3, 4) and torch.allclose(got, want)
    got.square().sum().backward()
    grads, rows = tables.gradients()
    dense = torch.zeros(37, 4)
    inverse = torch.argsort(stored_positions(torch.arange(37), 37))
    for b in (b for b in blocks if b.key in rows):
        dense[inverse[b.start // 4 + rows[b.key]]] += grads[b.key].view(-1, 4)
    assert torch.allclose(dense, model.emb.weight.grad.to_dense(), atol=1e-6)


def test_a_server_refuses_a_rows_request_larger_than_the_block():
    """A worker asks for distinct rows, at most a block's: a request for more (repeats)
    is refused before anything is held or built, and the server goes on."""
    from equipoise.server.core import Server
    from equipoise.server.store import OptimizerSpec
    from equipoise.wire import InMemoryTransport, Message

    transport = InMemoryTransport()
    server = Server(0, transport, "nowhere")
    sent = []
    server.listener.send = lambda peer, msg: sent.append(msg) or (lambda: True)
    spec = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()
    server.handle(b"c", Message("init", {"blocks": [[0, "t", 0, 12, "rows", 4, 4]], "optimizer": spec, "version": 0,
                                         "samples": 0, "protocol": "bsp", "workers": 1}, {"b0": torch.zeros(12)}))
    ask = lambda rows: Message("rows_req", {"worker": 0, "min_version": 0}, pack_parts("I", {0: rows}))
    server.handle(b"w", ask(torch.zeros(4, dtype=torch.int64)))
    assert sent[-1].type == "error" and "4 rows of block 0, which has 3" in sent[-1].fields["message"]
    server.handle(b"w", ask(torch.tensor([2, 0])))
    assert sent[-1].type == "rows" and unpack_parts(sent[-1].tensors, "R")[0].shape == (8,) and not server.done
    for row, words in ((3, "block 0 has rows [0, 3); asked for 3"), (-1, "asked for -1")):  # outside the block
        server.handle(b"w", ask(torch.tensor([0, row])))
        assert sent[-1].type == "error" and words in sent[-1].fields["message"] and not server.done
    # a malformed index: refused in one line naming the tensor; the server goes on
    for bad, words in (({"I0": torch.tensor([2, 0])}, "without its index"),
                       ({"I0": torch.tensor([2, 0]), "I0#": torch.tensor([[0, 3]])}, "counts 3 elements of 2"),
                       ({"I0": torch.tensor([2, 0]), "I0#": torch.tensor([[-1, 2]])}, "negative"),
                       ({"I0": torch.tensor([2, 0]), "I0#": torch.tensor([0, 2])}, "int64 [n, 2]"),
                       ({"I0": torch.tensor([2, 0]), "I0#": torch.tensor([[0, 1], [0, 1]])}, "block 0 twice")):
        server.handle(b"w", Message("rows_req", {"worker": 0, "min_version": 0}, bad))
        assert sent[-1].type == "error" and "tensor I0" in sent[-1].fields["message"], bad
        assert words in sent[-1].fields["message"] and not server.done
    server.handle(b"w", ask(torch.tensor([1])))
    assert sent[-1].type == "rows"
    # a block not held here: refused, unless asked ahead (moved at a barrier since): then missing
    other = pack_parts("I", {5: torch.tensor([0])})
    server.handle(b"w", Message("rows_req", {"worker": 0, "min_version": 0}, other))
    assert sent[-1].type == "error" and "block 5 is not a table's block held here" in sent[-1].fields["message"]
    server.handle(b"w", Message("rows_req", {"worker": 0, "min_version": 0, "ahead": True},
                                pack_parts("I", {5: torch.tensor([0]), 0: torch.tensor([1])})))
    assert sent[-1].type == "rows" and sent[-1].fields["missing"] == [5] and not server.done


def test_many_blocks_pack_into_one_tensor_per_dtype_and_back():
    parts = {3: torch.arange(4), 7: torch.ones(2, 3), 9: torch.tensor([5]), 11: torch.zeros(0)}
    packed = pack_parts("G", parts)
    assert set(packed) == {"G0", "G0#", "G1", "G1#"}  # int64 and float32
    back = unpack_parts(packed, "G")
    assert set(back) == set(parts) and all(torch.equal(back[k], parts[k].reshape(-1)) for k in parts)
    assert pack_parts("G", {}) == {} and unpack_parts({}, "G") == {}


def test_a_workers_tables_are_never_held_and_other_threads_build_as_usual():
    """Under untouched_tables a sparse table's weight is on "meta" (no memory, its
    initialisation a no-op, the user's own nn.init call included); dense modules, a
    non-sparse Embedding, another thread's model and any model built after are as usual."""
    import threading

    from equipoise.sparse.tables import untouched_tables

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(10 ** 9, 64, sparse=True, padding_idx=0)  # 256 GB if written
            nn.init.uniform_(self.table.weight, -0.1, 0.1)
            self.bag = nn.EmbeddingBag(10 ** 9, 8, sparse=True)
            self.dense = nn.Embedding(10, 3)
            self.linear = nn.Linear(3, 1)

    other, own = {}, nn.Embedding.__dict__["__init__"]
    with untouched_tables():
        assert nn.Embedding.__dict__["__init__"] is not own
        model = Model()
        thread = threading.Thread(target=lambda: other.update(e=nn.Embedding(4, 2, sparse=True)))
        thread.start()
        thread.join(30)
    assert model.table.weight.is_meta and model.bag.weight.is_meta
    assert not model.dense.weight.is_meta and not model.linear.weight.is_meta
    assert not other["e"].weight.is_meta  # another thread's model: as usual
    assert set(sparse_tables(model)) == {"table.weight", "bag.weight"}  # read from the shapes
    assert not nn.Embedding(4, 2, sparse=True).weight.is_meta  # after it: as usual
    assert nn.Embedding.__dict__["__init__"] is own  # put back


def test_a_server_books_the_bytes_each_block_carried():
    """PSLD weighs a table's shards by what they carried: a rows reply books its rows'
    bytes to the table's block, a push its gradient rows and their ids, a pull's reply
    the dense blocks it carries (tables are left out of it); the stats report them by
    block, and the total is the server's bytes."""
    from equipoise.server.core import Server
    from equipoise.server.store import OptimizerSpec
    from equipoise.wire import InMemoryTransport, Message

    server = Server(0, InMemoryTransport(), "nowhere")
    sent = []
    server.listener.send = lambda peer, msg: sent.append(msg) or (lambda: True)
    spec = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 1).to_dict()
    server.handle(b"c", Message("init", {"blocks": [[0, "w", 0, 6, "param", 4], [1, "t", 0, 12, "rows", 4, 4]],
                                         "optimizer": spec, "version": 0, "samples": 0, "protocol": "bsp",
                                         "workers": 1}, {"b0": torch.zeros(6), "b1": torch.zeros(12)}))
    server.handle(b"w", Message("rows_req", {"worker": 0, "min_version": 0}, pack_parts("I", {1: torch.tensor([2, 0])})))
    assert sent[-1].type == "rows"  # 2 rows × 4 float32: 32 B
    server.handle(b"w", Message("push", {"worker": 0, "version": 0, "samples": 1},
                                {"g0": torch.ones(6), **pack_parts("G", {1: torch.ones(8)}),
                                 **pack_parts("I", {1: torch.tensor([2, 0])})}))
    assert sent[-1].type == "ack"  # 24 B dense, 32 B of rows and 16 B of their ids
    server.handle(b"w", Message("pull", {"worker": 0, "min_version": 1}))
    assert sent[-1].type == "params" and set(sent[-1].tensors) == {"b0"}  # 24 B
    server.handle(b"c", Message("stats_req", {}))
    stats = sent[-1].fields
    assert stats["block_bytes"] == [(0, 48), (1, 80)] and stats["bytes"] == 128
    server.handle(b"c", Message("stats_req", {}))
    assert sent[-1].fields["block_bytes"] == [] and sent[-1].fields["bytes"] == 0  # since the last request
