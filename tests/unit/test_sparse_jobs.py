"""Sparse tables in whole jobs (threads, in-memory transport) against their oracle:
single-process training of the same model with torch's own sparse embedding and
optimizers (SGD, Adagrad, SparseAdam for the tables; SGD, Adagrad, Adam for the dense
parameter), the same seed, global batch and sample order.

Not bit for bit, and why: torch's sparse gradient of a table holds one entry per
occurrence of an id in the global batch, which its optimizers sum (coalesce); a worker
sums its own slice's occurrences (embedding's backward), scales them by its share of the
global batch, and the server sums the workers'. The same numbers are added in another
order and rounded at other points: each element of a step differs by a few units in the
last place of the sum it is part of, at most k·ε of the sum of its terms' magnitudes,
k the occurrences of its id in the global batch. Over T steps such differences add up
(the model's gradients are smooth in the weights: a difference does not grow in a few
steps), so the weights differ by at most T·k·ε times the distance they moved; and each
step's w − Δ, with Δ differing in its last places, may round to the neighbouring float:
at most one unit in the last place of w, ε·|w|, a step, T·ε·|w| over the run. Adam's
step divides by the root of the gradient's square: a rounding difference scales with
the gradient's own size, unless a sum cancels to about zero (then Adam's step is about
the learning rate either way); the ratings here make no such sum.
"""

import json

import pytest
import torch

from equipoise.config import Config
from equipoise.coordinator.rpc import JobError
from equipoise.data import SliceSampler
from equipoise.launch.threads import run_threads
from equipoise.models import build_model
from equipoise.protocol.checkpoint import load_checkpoint
from equipoise.sparse.tables import sparse_tables
from equipoise.workload import load_workload

pytestmark = pytest.mark.timeout(180)
W = "examples/workloads/movielens.py"
EPS = torch.finfo(torch.float32).eps
D = "examples/workloads/dlrm.py"


def job(**kw):
    base = dict(dataset=f"{W}:synthetic", model=f"{W}:mf", loss=f"{W}:mse", metrics=f"{W}:metrics",
                model_args={"n_users": 300, "n_items": 500, "dim": 8}, global_batch=64, workers=1, servers=2,
                iterations=20, eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=512,
                optimizer="sgd", lr=0.05, momentum=0.0)
    return Config.from_dict({**base, **kw})


def oracle(cfg, data):
    """(initial, final) state_dict of single-process training with torch's sparse step,
    and k per parameter: the most times one of its rows took part in one global batch
    (a table: the most occurrences of one id, counted as its module looks them up; a
    dense parameter: every sample)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.model_args)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    tables = sparse_tables(model)
    sparse = [model.get_parameter(n) for n in tables]
    dense = [p for n, p in model.named_parameters() if n not in tables]
    make = {"sgd": lambda ps, s: torch.optim.SGD(ps, lr=cfg.lr, momentum=cfg.momentum),
            "adagrad": lambda ps, s: torch.optim.Adagrad(ps, lr=cfg.lr),
            "adam": lambda ps, s: (torch.optim.SparseAdam if s else torch.optim.Adam)(ps, lr=cfg.lr)}[cfg.optimizer]
    steps = [make(sparse, True), make(dense, False)]
    X, sampler = cfg.global_batch, SliceSampler(len(data), cfg.global_batch, cfg.seed)
    k = {n: 1 for n in tables} | {n: X for n, _ in model.named_parameters() if n not in tables}

    def count(name):
        def hook(module, args):
            k[name] = max(k[name], int(torch.unique(args[0], return_counts=True)[1].max()))
        return hook
    for n, t in tables.items():
        model.get_submodule(t.module).register_forward_pre_hook(count(n))
    for t in range(cfg.iterations):
        batch = data.fetch(data.train, sampler.positions(t * X, X))
        model.zero_grad()
        data.loss_of(model, batch, X).objective.backward()
        for opt in steps:
            opt.step()
    return start, model.state_dict(), k


def assert_near_oracle(cfg, run_dir, data):
    start, want, k = oracle(cfg, data)
    got = torch.load(run_dir / "model.pt", weights_only=True)
    assert set(got) == set(want)
    for name in want:
        moved = float((want[name] - start[name]).abs().max())
        bound = cfg.iterations * EPS * (k[name] * moved + float(want[name].abs().max()))
        diff = float((got[name] - want[name]).abs().max())
        assert diff <= bound, f"{name}: {diff:.3g} from the oracle, more than {bound:.3g} (moved {moved:.3g})"
        assert moved > 0  # the table was trained


@pytest.fixture(scope="module")
def data():
    return load_workload(job())


@pytest.mark.parametrize("ahead", [False, True])
def test_one_worker_trains_the_tables_as_torch_does(tmp_path, ahead):
    """Also with `sparse_ids`: a step's rows of every table fetched in one request."""
    cfg = job(sparse_ids=f"{W}:sparse_ids" if ahead else "")
    summary = run_threads(cfg, tmp_path, load_workload(cfg))
    assert summary["samples"] == cfg.iterations * cfg.global_batch
    assert summary["wire_bytes_per_iteration"]["pull"] < sum(t["bytes"] for t in summary["sparse_tables"].values())
    assert_near_oracle(cfg, tmp_path, load_workload(cfg))


def test_an_id_outside_its_table_mid_run_names_the_worker_the_iteration_and_the_id(tmp_path, data):
    cfg = job(model_args={"n_users": 300, "n_items": 60, "dim": 8})  # the data's items go up to 499
    with pytest.raises(JobError, match=r"worker 0: iteration 0: table item: id \d+ outside \[0, 60\)"):
        run_threads(cfg, tmp_path, data)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,momentum", [("sgd", 0.9), ("adagrad", 0.0), ("adam", 0.0)])
def test_four_workers_under_bsp_train_the_tables_as_one_process_does(tmp_path, data, optimizer, momentum):
    cfg = job(workers=4, servers=3, optimizer=optimizer, momentum=momentum, lr=0.02)
    run_threads(cfg, tmp_path, data)
    assert_near_oracle(cfg, tmp_path, data)


@pytest.mark.parametrize("protocol", ["bsp", "lbbsp"])
def test_a_worker_given_no_samples_changes_no_update(tmp_path, data, protocol):
    """A split that gives worker 0 nothing (LB-BSP does so with min_batch 0 to a worker
    whose fixed cost alone outlasts the others' step): it pushes zeros that weigh
    nothing, and the tables and the dense parameters train as on one process."""
    cfg = job(workers=4, servers=2, protocol=protocol, batch_split=[0, 30, 20, 14], momentum=0.9)
    summary = run_threads(cfg, tmp_path, data)
    assert summary["samples"] == cfg.iterations * cfg.global_batch
    batches = [json.loads(line)["batch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
               if json.loads(line).get("type") == "iteration"]
    assert batches and all(b == [0, 30, 20, 14] for b in batches)
    assert_near_oracle(cfg, tmp_path, data)


@pytest.mark.slow
def test_lbbsp_with_unequal_workers_trains_the_tables_as_one_process_does(tmp_path, data):
    cfg = job(workers=4, servers=2, protocol="lbbsp", slowdown=[1.0, 1.0, 2.0, 4.0], optimizer="adam", lr=0.02)
    summary = run_threads(cfg, tmp_path, data)
    assert summary["samples"] == cfg.iterations * cfg.global_batch
    assert_near_oracle(cfg, tmp_path, data)


@pytest.mark.slow
def test_a_job_with_tables_resumes_bit_for_bit(tmp_path, data):
    whole = job(workers=2, optimizer="adam", iterations=12, checkpoint_every=6)
    for d in ("whole", "half"):
        (tmp_path / d).mkdir()
    run_threads(whole, tmp_path / "whole", data)
    half = job(workers=2, optimizer="adam", iterations=6, checkpoint_every=6)
    run_threads(half, tmp_path / "half", data)
    run_threads(whole, tmp_path / "half", data, resume=load_checkpoint(tmp_path / "half"))
    a = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "half" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)  # SparseAdam's moments and step count came back too


def dlrm_job(**kw):
    """The DLRM-style example, small: 4 tables of 2,000 rows, Zipf ids (exponent 1.1)."""
    base = dict(dataset=f"{D}:clicks", model=f"{D}:dlrm", loss=f"{D}:bce", metrics=f"{D}:metrics",
                sparse_ids=f"{D}:sparse_ids", data_args={"rows": 2000, "tables": 4, "train": 4096, "eval": 256},
                model_args={"rows": 2000, "tables": 4, "dim": 8}, global_batch=128, workers=1, servers=2,
                iterations=12, eval_every=0, checkpoint_every=0, progress=False, timeout=30.0, block_size=2048,
                optimizer="adagrad", lr=0.05, momentum=0.0)
    return Config.from_dict({**base, **kw})


def test_the_dlrm_example_on_one_worker_trains_as_torch_does(tmp_path):
    cfg = dlrm_job()
    summary = run_threads(cfg, tmp_path, load_workload(cfg))
    assert set(summary["sparse_tables"]) == {f"tables.{t}.weight" for t in range(4)}
    assert_near_oracle(cfg, tmp_path, load_workload(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("protocol,slowdown,optimizer", [("bsp", None, "sgd"), ("lbbsp", [1.0, 1.0, 2.0, 4.0], "adam")])
def test_the_dlrm_example_on_four_workers_trains_as_one_process_does(tmp_path, protocol, slowdown, optimizer):
    cfg = dlrm_job(workers=4, servers=3, protocol=protocol, optimizer=optimizer, lr=0.02,
                   **({"slowdown": slowdown} if slowdown else {}))
    summary = run_threads(cfg, tmp_path, load_workload(cfg))
    assert summary["samples"] == cfg.iterations * cfg.global_batch
    assert_near_oracle(cfg, tmp_path, load_workload(cfg))


@pytest.mark.parametrize("protocol", ["bsp", "lbbsp"])
def test_shards_moved_while_the_job_runs_keep_every_update(tmp_path, protocol):
    """A table's shards move between servers at barriers as dense blocks do, with their
    optimizer state (Adagrad's sums): the job ends where one process does. The moves are
    the scenario's, so that they happen in every run, at iterations 4 and 8."""
    from equipoise.protocol.blocks import model_tensors, table_widths
    from equipoise.sparse.tables import place_with_tables

    cfg = dlrm_job(workers=2, servers=3, protocol=protocol, iterations=12)
    data = load_workload(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, cfg.model_args)
    blocks, owner = place_with_tables(cfg.placement, model_tensors(model), cfg.servers, cfg.block_size,
                                      widths=table_widths(model))
    shards = [b.key for b in blocks if b.kind == "rows"]
    first, last = shards[0], shards[-1]
    events = [{"iteration": 4, "move": first, "to": (owner[first] + 1) % 3},
              {"iteration": 8, "move": last, "to": (owner[last] + 1) % 3},
              {"iteration": 8, "move": first, "to": owner[first]}]
    cfg = dlrm_job(workers=2, servers=3, protocol=protocol, iterations=12, server_events=events)
    run_threads(cfg, tmp_path, data)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    moved = [r for r in map(json.loads, lines) if r.get("event") == "block_moved"]
    assert sorted(b for r in moved for b in r["blocks"]) == sorted([first, last, first])
    assert_near_oracle(cfg, tmp_path, data)


def test_one_asp_worker_trains_the_tables_as_torch_does(tmp_path):
    """Without a barrier a worker's rows are the servers' latest (not of its dense
    weights' version); with one worker they are the same, and ASP at its BSP settings is
    the single-process run."""
    cfg = dlrm_job(protocol="asp", workers=1)
    run_threads(cfg, tmp_path, load_workload(cfg))
    assert_near_oracle(cfg, tmp_path, load_workload(cfg))


@pytest.mark.parametrize("protocol,extra", [("asp", {}), ("softsync", {}), ("ssp", {"staleness_bound": 1})])
def test_tables_train_under_the_stream_protocols_with_every_gradient_applied_once(tmp_path, protocol, extra):
    """Three workers, no barrier: every gradient of the dense blocks applied once (a
    table's shard is owed only the gradients of the batches that touched its rows), and
    the job learns (the log loss falls below a constant guess's, ln 2)."""
    cfg = dlrm_job(workers=3, servers=3, protocol=protocol, iterations=14, **extra)
    summary = run_threads(cfg, tmp_path, load_workload(cfg))
    g = summary["gradients"]  # every gradient owed (one per plan: 128 samples an iteration in
    assert g["owed"] >= 14 * 3 and g["owed"] == g["applied_min"] == g["applied_max"]  # 3 or 4 slices)
    assert summary["samples"] == 14 * 128
    assert summary["final_metrics"]["logloss"] < 0.6931
    if protocol == "ssp":
        assert summary["staleness_max"] <= 1


@pytest.mark.parametrize("protocol", ["asp", "ssp"])
def test_shards_moved_without_a_barrier_lose_no_gradient(tmp_path, protocol):
    """Shards handed over while workers run: a rows request that reaches the old owner
    is answered with the new owner's address and asked again there; gradients that reach
    the old owner are forwarded with their rows; no dense gradient is lost or applied
    twice."""
    events = [{"iteration": 3, "move": 9, "to": 2}, {"iteration": 6, "move": 10, "to": 1},  # shards
              {"iteration": 9, "move": 9, "to": 1}]  # (blocks 8-39 are the tables', 9 on server 1, 10 on 0)
    cfg = dlrm_job(workers=3, servers=3, protocol=protocol, iterations=14, server_events=events,
                   **({"staleness_bound": 1} if protocol == "ssp" else {}))
    summary = run_threads(cfg, tmp_path, load_workload(cfg))
    assert summary["status"] == "completed" and summary["lost_updates"] == 0
    g = summary["gradients"]
    assert g["owed"] >= 14 * 3 and g["owed"] == g["applied_min"] == g["applied_max"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    moved = [r for r in map(json.loads, lines) if r.get("event") == "block_moved"]
    assert sorted(b for r in moved for b in r["blocks"]) == [9, 9, 10]


@pytest.mark.parametrize("protocol", ["bsp", "lbbsp"])
def test_under_a_barrier_the_next_steps_rows_are_asked_for_beside_the_pull(tmp_path, protocol):
    """With `sparse_ids`, a worker asks for its next slice's rows as soon as it has sent
    its exchange (worker/rows.py RowsAhead): where its slice is the one it expected (the
    split as in the iteration before), the step finds them asked for before its forward
    began, every "rows" event of the timeline sent at a negative time (the timeline's
    times are from the step's forward start). Where LB-BSP changed the split the rows
    are fetched by the step. The job still ends where one process does (the rows are of
    the version the pull brings)."""
    cfg = dlrm_job(workers=2, servers=2, protocol=protocol, iterations=8,
                   **({"slowdown": [1.0, 4.0]} if protocol == "lbbsp" else {}))  # LB-BSP: the split changes
    data = load_workload(cfg)
    run_threads(cfg, tmp_path, data)
    its = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
           if r.get("type") == "iteration"]
    same = [r for r, before in zip(its[1:], its) if r["batch"] == before["batch"]]
    assert len(same) == cfg.iterations - 1 if protocol == "bsp" else 1 <= len(same) < cfg.iterations - 1
    rows = [[e for e in timeline if e[0] == "rows"] for r in same for timeline in r["timeline"]]
    assert all(rows) and all(e[2] < 0 for events in rows for e in events), rows
    assert_near_oracle(cfg, tmp_path, data)
