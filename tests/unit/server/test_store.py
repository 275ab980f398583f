"""The parameter store, without transport: weighting, refusals, optimizer state, schedule."""

import pytest
import torch

from equipoise.policy.placement import Block, greedy_placement, make_blocks
from equipoise.policy.sync import ASP, BSP, make_sync_policy
from equipoise.server.store import OptimizerSpec, ParameterStore, Push, PushError


def spec(name="sgd", **kw):
    base = dict(name=name, lr=0.1, momentum=0.9, weight_decay=0.0, schedule="constant", total=10,
                step_size=5, gamma=0.5, global_batch=8)
    base.update(kw)
    return OptimizerSpec(**base)


def store(policy=BSP(), optimizer="sgd", **kw):
    blocks = [Block(0, "w", 0, 3), Block(1, "w", 3, 5), Block(2, "bn", 0, 2, kind="buffer")]
    values = {0: torch.zeros(3), 1: torch.ones(2), 2: torch.zeros(2)}
    return ParameterStore(blocks, values, spec(optimizer, **kw), policy)


def push(worker, samples, g, version=0):
    return Push(worker, version, samples, {0: torch.full((3,), g), 1: torch.full((2,), g),
                                           2: torch.full((2,), g)})


def test_weighted_by_samples_and_buffers_averaged():
    s = store(momentum=0.0)
    s.apply([push(1, 6, 2.0), push(0, 2, 10.0)])
    # g = 2/8·10 + 6/8·2 = 4; w = 0 − 0.1·4
    assert torch.allclose(s.values[0], torch.full((3,), -0.4))
    assert torch.allclose(s.values[2], torch.full((2,), 4.0))  # buffer: weighted mean of values
    assert s.version == 1 and s.samples == 8


def test_apply_order_does_not_matter():
    a, b = store(), store()
    a.apply([push(0, 3, 1.5), push(1, 5, -2.0)])
    b.apply([push(1, 5, -2.0), push(0, 3, 1.5)])
    assert all(torch.equal(a.values[k], b.values[k]) for k in a.values)


def test_rejects_wrong_blocks_shapes_and_nan():
    s = store()
    with pytest.raises(PushError, match="worker 3"):
        s.check(Push(3, 0, 4, {0: torch.zeros(3)}))
    with pytest.raises(PushError, match="shape"):
        s.check(Push(3, 0, 4, {0: torch.zeros(4), 1: torch.zeros(2), 2: torch.zeros(2)}))
    with pytest.raises(PushError, match="non-finite"):
        s.check(push(3, 4, float("nan")))


def test_plain_sgd_steps_exactly_as_torch_optim_sgd():
    """Without momentum and weight decay the store does SGD's arithmetic itself: bit for
    bit what torch.optim.SGD.step gives, with a schedule and σ-modulated learning rates."""
    fast, ref = (store(policy=make_sync_policy("asp", lr_modulation="mean"), momentum=0.0, schedule="step",
                       step_size=1) for _ in range(2))
    ref._plain_sgd = False
    assert fast._plain_sgd
    for i, g in enumerate([0.3, -1.7, 2.9, 1e-3]):
        for s in (fast, ref):
            s.apply([push(i % 2, 3, g), push(1 - i % 2, 5, -g / 3)], staleness=[1 + i % 3, 2])
    assert all(torch.equal(fast.values[k], ref.values[k]) for k in ref.values)
    assert fast.optim_state() == ref.optim_state() == {}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_lent_values_keep_their_version_and_updates_match_an_unlent_store(optimizer):
    """A reply's tensors (lent until its send is done) keep the version they were taken at
    through later updates, a version lent twice is one snapshot, a buffer is reused once
    its readers are done, and the numbers equal those of a store that never lent."""
    lent, plain = store(optimizer=optimizer), store(optimizer=optimizer)
    sends = {"first": False, "second": False}
    first = dict(lent.values)
    lent.lend(list(first.values()), lambda: sends["first"])
    lent.lend(list(first.values()), lambda: sends["second"])
    expected = {k: v.clone() for k, v in first.items()}
    for s in (lent, plain):
        s.apply([push(0, 8, 1.0)])
    assert all(torch.equal(first[k], expected[k]) for k in first)  # untouched while read
    assert all(lent.values[k] is not first[k] for k in first)       # moved to another buffer
    second = dict(lent.values)
    sends["first"] = sends["second"] = True                         # both sends done
    for s in (lent, plain):
        s.apply([push(0, 8, 0.5)])
    assert all(lent.values[k] is second[k] for k in second)         # unlent: stepped in place
    lent.lend(list(second.values()), lambda: False)
    for s in (lent, plain):
        s.apply([push(0, 8, -2.0)])
    assert all(lent.values[k] is first[k] for k in first)           # the retired buffer, reused
    assert all(torch.equal(lent.values[k], plain.values[k]) for k in plain.values)
    assert all(torch.equal(a, b) for a, b in zip(lent.optim_state().values(), plain.optim_state().values()))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_state_round_trips(optimizer):
    a = store(optimizer=optimizer)
    a.apply([push(0, 8, 1.0)])
    b = ParameterStore(list(a.blocks.values()), a.values, a.spec, a.policy, version=a.version,
                       samples=a.samples, optim_state=a.optim_state())
    for s in (a, b):
        s.apply([push(0, 8, 0.5, version=1)])
    assert all(torch.equal(a.values[k], b.values[k]) for k in a.values)


def test_step_schedule_uses_sample_progress():
    s = store(momentum=0.0, schedule="step", step_size=1, gamma=0.5)
    s.apply([push(0, 8, 1.0)])
    s.apply([push(0, 8, 1.0, version=1)])
    # lr 0.1 for the first global batch, 0.05 for the second
    assert torch.allclose(s.values[0], torch.full((3,), -0.15))


def test_sync_policies():
    assert BSP().group_size(4) == 4 and ASP().group_size(4) == 1
    assert not BSP().pull_ready(3, 2) and BSP().pull_ready(3, 3) and ASP().pull_ready(9, 0)
    assert make_sync_policy("lbbsp").barrier()
    with pytest.raises(ValueError, match="protocol"):
        make_sync_policy("nope")


def test_blocks_and_greedy_placement():
    blocks = make_blocks([("a", 10, "param", 4), ("b", 3, "param", 4)], block_size=4)
    assert [(b.name, b.start, b.stop) for b in blocks] == [("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 3)]
    assert greedy_placement([10, 1, 9, 2], 2) == [0, 0, 1, 1]  # 10→0, 9→1, 2→1, 1→0


@pytest.mark.parametrize("optimizer,kw", [("sgd", {}), ("sgd", {"momentum": 0.0}), ("adam", {"weight_decay": 0.01})])
def test_a_block_updated_ahead_is_bit_equal_to_the_whole_update(optimizer, kw):
    """eager_update: blocks whose update was computed ahead (speculate) take it at the
    update; over three versions (optimizer state carried), every value and state equals
    the store that updated whole, bit for bit. A block speculated from a gradient the
    group does not hold in the end (a tensor replaced) is computed again."""
    gen = torch.Generator().manual_seed(0)
    whole, ahead = store(optimizer=optimizer, **kw), store(optimizer=optimizer, **kw)

    def pushes(v):
        return [Push(w, v, n, {k: torch.randn(t.shape, generator=gen) for k, t in whole.values.items()}, start)
                for w, n, start in ((1, 5, 3), (0, 3, 0))]

    for v in range(3):
        group = pushes(v)
        ahead.speculate(group, [1, 2])  # the last block and the buffer: as backward makes them first
        assert set(ahead.early) == {1, 2} and torch.equal(ahead.values[1], whole.values[1])  # nothing changed yet
        if v == 2:  # the group's gradient of block 1 is not the one it was speculated from
            group[0].tensors[1] = group[0].tensors[1].clone()
        whole.apply([Push(p.worker, p.version, p.samples, dict(p.tensors), p.start) for p in group])
        ahead.apply(group)
        assert ahead.committed == ({2} if v == 2 else {1, 2}) and ahead.early == {}
        for k in whole.values:
            assert torch.equal(whole.values[k], ahead.values[k]), (v, k)
        assert whole.optim_state().keys() == ahead.optim_state().keys()
        for name, t in whole.optim_state().items():
            assert torch.equal(t, ahead.optim_state()[name]), (v, name)


def test_an_update_computed_ahead_reuses_a_replaced_tensor_only_once_nothing_reads_it():
    """A block's tensor replaced by a committed speculation is kept and computed into by
    a later one, but not while a reply still reads it (`lend`); the values are those of
    fresh memory."""
    s, fresh = store(momentum=0.0), store(momentum=0.0)
    first, one, two = s.values[0], push(0, 4, 1.0), push(0, 4, 2.0)
    s.speculate([one], [0])
    s.apply([one])
    assert s.committed == {0} and s.values[0] is not first
    reading = [True]
    s.lend([first], lambda: not reading[0])
    s.speculate([two], [0])
    assert s.early[0].value is not first  # still read: fresh memory
    s.early = {}
    reading[0] = False
    s.speculate([two], [0])
    assert s.early[0].value is first  # read no more: reused
    s.apply([two])
    for p in (push(0, 4, 1.0), push(0, 4, 2.0)):
        fresh.apply([p])
    assert s.committed == {0} and torch.equal(s.values[0], fresh.values[0])


def test_a_speculation_of_another_group_or_version_is_not_taken():
    s = store()
    a, b = push(0, 4, 1.0), push(1, 4, 2.0)
    s.speculate([a, b], [0])
    s.apply([a, push(1, 2, 2.0)])  # the other worker's samples differ: its weight does
    assert s.committed == set()
    s.speculate([a, b], [0])
    s.apply([a, b], [0, 0])
    assert s.committed == {0}
    s.speculate([a, b], [0])
    s.generation += 1  # an update in between
    s.apply([a, b])
    assert s.committed == set()


@pytest.mark.parametrize("momentum,decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.0, 1e-3)])
def test_the_stores_sgd_steps_as_torch_optim_sgd_bit_for_bit(momentum, decay):
    """store.SGD against torch.optim.SGD over five steps: lr and momentum changed between
    steps as the store's policies change them (a step at momentum 0 leaves the buffer
    untouched), and a parameter without a gradient in one step is not stepped."""
    from equipoise.server.optimizers import SGD

    gen = torch.Generator().manual_seed(1)
    ours = [torch.nn.Parameter(torch.randn(257, generator=gen), requires_grad=False) for _ in range(2)]
    theirs = [torch.nn.Parameter(p.detach().clone(), requires_grad=False) for p in ours]
    a, b = SGD(ours, lr=0.1, momentum=momentum, weight_decay=decay), \
        torch.optim.SGD(theirs, lr=0.1, momentum=momentum, weight_decay=decay)
    for step, (lr, mu) in enumerate([(0.1, momentum), (0.05, momentum), (0.05, 0.0), (0.2, momentum), (0.1, momentum)]):
        for opt in (a, b):
            opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"] = lr, mu
        for p, q in zip(ours, theirs):
            g = torch.randn(257, generator=gen)
            p.grad, q.grad = (None, None) if step == 1 and p is ours[1] else (g.clone(), g.clone())
        a.step()
        b.step()
        for p, q in zip(ours, theirs):
            assert torch.equal(p, q), step
            mine, torch_s = a.state.get(p, {}).get("momentum_buffer"), b.state.get(q, {}).get("momentum_buffer")
            assert (mine is None) == (torch_s is None) and (mine is None or torch.equal(mine, torch_s)), step


@pytest.mark.parametrize("field,value", [("lr", -0.1), ("lr", float("nan")), ("momentum", True), ("weight_decay", "x")])
def test_the_stores_sgd_refuses_settings_torch_would_not_step_with(field, value):
    """An init whose optimizer settings are not finite numbers ≥ 0 is refused (a server
    never re-initialises from a corrupt message), naming the setting."""
    from equipoise.server.optimizers import SGD

    with pytest.raises(ValueError, match=f"optimizer sgd: {field} = "):
        SGD([torch.nn.Parameter(torch.zeros(2))], **{"lr": 0.1, field: value})


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_clipping_over_two_stores_equals_clip_grad_norm_on_one(optimizer):
    """The model cut over two servers: each combines its blocks' gradients and reports
    their norms; the global norm of them all (global_norm) clips both, bit for bit what
    torch.nn.utils.clip_grad_norm_ does to the whole model's gradient on one process."""
    from equipoise.server.store import global_norm

    gen = torch.Generator().manual_seed(5)
    sizes = [7, 40000, 3]  # one block large enough for a reduction to be cut among threads
    values = [torch.randn(n, generator=gen) for n in sizes]
    grads = [[torch.randn(n, generator=gen) * 3 for n in sizes] for _ in range(2)]
    clip = 2.0
    ref = [torch.nn.Parameter(v.clone()) for v in values]
    opt = (torch.optim.SGD(ref, lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.AdamW(ref, lr=0.1, weight_decay=0.1))
    for p, a, b in zip(ref, *grads):
        p.grad = torch.mul(a, 3 / 8).add_(b, alpha=5 / 8)
    total = torch.nn.utils.clip_grad_norm_(ref, clip)
    opt.step()
    assert total > 10 * clip  # the clipping is active

    owner = [0, 1, 0]
    stores = []
    for rank in (0, 1):
        keys = [k for k in range(3) if owner[k] == rank]
        blocks = [Block(k, f"w{k}", 0, sizes[k]) for k in keys]
        stores.append(ParameterStore(blocks, {k: values[k].clone() for k in keys},
                                     spec(optimizer, lr=0.1, weight_decay=0.0 if optimizer == "sgd" else 0.1,
                                          clip=clip), BSP()))
    prepared, norms = [], {}
    for s in stores:
        group = [Push(w, 0, n, {k: grads[w][k] for k in s.blocks}) for w, n in ((0, 3), (1, 5))]
        prepared.append(s.prepare(group))
        norms.update(s.grad_norms(prepared[-1], s.blocks))
    assert global_norm(norms) == float(total)
    for s, p in zip(stores, prepared):
        s.finish(p, global_norm(norms))
    for k in range(3):
        assert torch.equal(stores[owner[k]].values[k], ref[k].detach()), k


def test_the_servers_sparse_adam_is_torch_s_bit_for_bit():
    """server/optimizers.py SparseAdam against torch.optim.SparseAdam: five steps of
    sparse gradients with repeated and untouched rows (an empty one too), the learning
    rate changed between steps; the same numbers exactly."""
    from equipoise.server.optimizers import SparseAdam

    g = torch.Generator().manual_seed(0)
    ours, theirs = (torch.nn.Parameter(torch.randn(12, 3, generator=torch.Generator().manual_seed(1)))
                    for _ in range(2))
    a, b = SparseAdam([ours], lr=0.01), torch.optim.SparseAdam([theirs], lr=0.01)
    for step, n in enumerate((5, 7, 0, 9, 4)):
        rows = torch.randint(0, 12, (n,), generator=g)
        values = torch.randn(n, 3, generator=g)
        for p in (ours, theirs):
            p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (12, 3))
        for opt in (a, b):
            opt.param_groups[0]["lr"] = 0.01 * (step + 1)
            opt.step()
        assert torch.equal(ours, theirs), step
    assert torch.equal(a.state[ours]["exp_avg_sq"], b.state[theirs]["exp_avg_sq"])
    assert a.state[ours]["step"] == b.state[theirs]["step"] == 5


def test_the_servers_sparse_adagrad_is_torch_s_bit_for_bit():
    """server/optimizers.py SparseAdagrad against torch.optim.Adagrad on sparse
    gradients: eight steps with repeated and untouched rows (an empty one too), the
    learning rate changed between steps, two parameters one of which misses a step; the
    same numbers exactly, the state ("step", "sum") too."""
    from equipoise.server.optimizers import SparseAdagrad

    g = torch.Generator().manual_seed(0)
    ours, theirs = ([torch.nn.Parameter(torch.randn(40, 3, generator=torch.Generator().manual_seed(s)))
                     for s in (1, 2)] for _ in range(2))
    a, b = SparseAdagrad(ours, lr=0.05), torch.optim.Adagrad(theirs, lr=0.05)
    for step, n in enumerate((5, 60, 0, 9, 4, 33, 7, 12)):
        rows = torch.randint(0, 40, (n,), generator=g)
        values = torch.randn(n, 3, generator=g) * 3
        for p in (ours[0], theirs[0]):
            p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (40, 3))
        for p in (ours[1], theirs[1]):
            p.grad = None if step == 3 else torch.sparse_coo_tensor(rows.unsqueeze(0) % 40, -values, (40, 3))
        for opt in (a, b):
            opt.param_groups[0]["lr"] = 0.05 * (step + 1)
            opt.step()
        assert all(torch.equal(x, y) for x, y in zip(ours, theirs)), step
    for x, y in zip(ours, theirs):
        assert a.state[x].keys() == b.state[y].keys() == {"step", "sum"}
        assert all(torch.equal(a.state[x][k], b.state[y][k]) and a.state[x][k].dtype == b.state[y][k].dtype
                   for k in ("step", "sum"))


def table_store():
    """A dense block and a table's shard of 3 rows × 4 (plain SGD)."""
    blocks = [Block(0, "w", 0, 3), Block(1, "t", 0, 12, "rows", 4, 4)]
    return ParameterStore(blocks, {0: torch.zeros(3), 1: torch.arange(12.0)}, spec(momentum=0.0), BSP())


def rows_push():
    return Push(0, 0, 8, {0: torch.ones(3), 1: torch.ones(4)}, rows={1: torch.tensor([2])})


def test_a_lent_shard_is_waited_for_not_copied(monkeypatch):
    """A snapshot's `state` reply lends every block, a table's shards whole. The update
    that follows copies the dense block (it is small) but waits for the shard's send to be
    done and steps it in place: a copy would keep a second table on the server. A send
    that is not done within ROWS_LOAN_WAIT_S leaves the shard copied, as a dense block.
    (No timing is asserted: the wait ends when the send is done, whenever that is.)"""
    import threading

    import equipoise.server.store as store_module

    s, done = table_store(), threading.Event()
    lent = dict(s.values)
    s.lend([lent[0]], lambda: False)  # the dense block's send: not done
    s.lend([lent[1]], done.is_set)    # the shard's: done 50 ms on
    threading.Timer(0.05, done.set).start()
    s.apply([rows_push()])
    assert s.values[1] is lent[1] and s.values[0] is not lent[0]
    assert torch.equal(s.values[1], torch.tensor([*range(8), 7.9, 8.9, 9.9, 10.9]))
    assert not s._retired.get(1)
    monkeypatch.setattr(store_module, "ROWS_LOAN_WAIT_S", 0.01)
    shard = s.values[1]
    s.lend([shard], lambda: False)  # never done
    s.apply([rows_push()])
    assert s.values[1] is not shard and torch.equal(shard[8:], torch.tensor([7.9, 8.9, 9.9, 10.9]))
