"""User workloads through real jobs: the language model, the regression and a loss of
(sum, count) with counts that vary from sample to sample, each equal to
`train_reference` bit for bit under BSP on 4 workers and under LB-BSP with a slow
worker; a dataset read lazily from shards on disk; a sample failing mid-run; a target
that stops the job."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import equipoise
from equipoise.coordinator.rpc import JobError

from .helpers import assert_equals_reference, cli, records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"
LM = str(EXAMPLES / "fortunes_lm.py")
REG = str(EXAMPLES / "diabetes.py")
SHARDS = str(EXAMPLES / "shards.py")
HAS_FORTUNES = Path("/usr/share/games/fortunes").is_dir()
needs_fortunes = pytest.mark.skipif(not HAS_FORTUNES, reason="Debian's fortunes package is not installed")

BASE = dict(workers=4, servers=2, eval_every=0, checkpoint_every=0, progress=False, timeout=60.0)
WORKLOADS = {
    # next-byte prediction on windows of real text: a mean over equal token counts
    "lm": dict(dataset=f"{LM}:blocks", model=f"{LM}:gpt_tiny", loss=f"{LM}:next_byte_loss",
               metrics=f"{LM}:metrics", optimizer="adam", lr=0.003, global_batch=32, iterations=6,
               block_size=4000),
    # one fortune per sample, padded: (Σ loss over real tokens, their count) differs per sample
    "tokens": dict(dataset=f"{LM}:fortunes", model=f"{LM}:gpt_tiny", loss=f"{LM}:token_loss",
                   collate=f"{LM}:pad_collate", metrics=f"{LM}:metrics", optimizer="sgd", lr=0.5,
                   momentum=0.9, global_batch=32, iterations=6, block_size=4000),
    # a tabular regression with an MSE loss
    "regression": dict(dataset=f"{REG}:diabetes", model=f"{REG}:mlp", loss=f"{REG}:mse",
                       metrics=f"{REG}:metrics", lr=0.05, momentum=0.9, global_batch=32, iterations=10,
                       block_size=300),
}
PROTOCOLS = {"bsp": dict(protocol="bsp"),
             "lbbsp": dict(protocol="lbbsp", slowdown=[1, 1, 2, 4], predictor="last", hysteresis=0.0)}


# Each workload once: the token-count-weighted loss and the regression under LB-BSP's
# changing splits, the language model under BSP.
@pytest.mark.parametrize("workload, protocol", [("lm", "bsp"), ("tokens", "lbbsp"), ("regression", "lbbsp")])
def test_a_user_workload_equals_single_process_sgd(tmp_path, workload, protocol):
    """The argument of helpers.assert_equals_reference holds for any step: the worker and
    the reference call the same `Workload.loss_of` on the same samples (same shapes,
    threads and per-slice seed) and the servers combine with the same weights cᵢ/Σc;
    so the runs are equal bit for bit. Under LB-BSP the splits change while it runs
    (checked: not every iteration has the same split), and with `token_loss` the counts
    differ between workers, so a weighting by samples instead of tokens would fail."""
    if workload != "regression" and not HAS_FORTUNES:
        pytest.skip("Debian's fortunes package is not installed")
    cfg = dict(BASE, **WORKLOADS[workload], **PROTOCOLS[protocol])
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["iterations"] == cfg["iterations"]
    assert_equals_reference(cfg, tmp_path / "run")
    its = records(tmp_path / "run", "iteration")
    assert all(len(r["data_s"]) == 4 and min(r["data_s"]) >= 0 for r in its)
    if protocol == "lbbsp":
        assert len({tuple(r["batch"]) for r in its}) > 1, "the split never changed"
    final = records(tmp_path / "run", "eval")[-1]
    names = {"lm": {"loss", "bits_per_byte"}, "tokens": {"loss", "bits_per_byte"}, "regression": {"mse", "mae"}}
    assert summary["final_metrics"] == {k: final[f"test_{k}"] for k in names[workload]}


def test_a_dataset_read_lazily_from_shards_on_disk(tmp_path):
    """4,000 records in 4 shard files, read item by item on 2 loader threads per worker:
    the job equals the reference (the loader changes when samples are read, not which)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("shards_example", SHARDS)
    shards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shards)
    shards.write_shards(tmp_path / "data", 4000, per_shard=1000, eval_samples=500)
    cfg = dict(BASE, dataset=f"{SHARDS}:shards", data_dir=str(tmp_path / "data"), model=f"{SHARDS}:linear",
               global_batch=64, iterations=15, lr=0.1, loader_workers=2)
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert_equals_reference(cfg, tmp_path / "run")
    assert summary["final_accuracy"] is not None and 0 <= summary["final_accuracy"] <= 1


BROKEN = '''
import torch
from torch.utils.data import TensorDataset

class FailsAt(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(256, 1, 4, 4, generator=g), torch.randint(0, 10, (256,), generator=g)
        self.input_shape, self.num_classes = (1, 4, 4), 10
    def __len__(self):
        return 256
    def __getitem__(self, i):
        if i == 77:
            raise ValueError("corrupt record")
        return self.x[i], self.y[i]

def provide():
    return FailsAt()
'''


def test_a_sample_failing_mid_run_names_the_worker_and_index(tmp_path):
    """Index 77 is not among the two samples the driver tries (0 and 1), so the job
    starts, and the worker whose slice holds it fails the job (a JobError: CLI exit 1,
    as test_faults checks for a failed job)."""
    (tmp_path / "broken.py").write_text(BROKEN)
    cfg = dict(BASE, dataset=f"{tmp_path / 'broken.py'}:provide", model="mlp", global_batch=32,
               iterations=30, workers=2, servers=1)
    with pytest.raises(JobError, match=r"worker \d.*item 77 raised ValueError: corrupt record"):
        equipoise.train(cfg, out=tmp_path / "run")


HANGS = BROKEN.replace('raise ValueError("corrupt record")', 'time.sleep(3600)  # a read that never returns').replace(
    "import torch\n", "import time\nimport torch\n", 1)


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_a_worker_stuck_in_getitem_is_named_with_the_sample(tmp_path, protocol):
    """Index 77 never returns. The worker that reads it still beats (its heartbeat is a
    thread of its own), and its beats say it is inside the dataset's __getitem__ with
    sample 77: after stuck_s the job fails naming the worker, the call and the sample,
    under a barrier and without one (where no server or barrier would notice), long
    before `timeout`; the stuck process is stopped with the job."""
    (tmp_path / "hangs.py").write_text(HANGS)
    cfg = dict(BASE, dataset=f"{tmp_path / 'hangs.py'}:provide", model="mlp", global_batch=32,
               iterations=30, workers=2, servers=1, protocol=protocol, heartbeat_s=0.5, stuck_s=3.0,
               timeout=200.0)
    with pytest.raises(JobError, match=r"worker\d .*is stuck in the dataset's __getitem__ \(sample 77, "
                                       r"iteration \d+\) for \d+ s \(stuck_s = 3\)"):
        equipoise.train(cfg, out=tmp_path / "run")


def test_bad_user_code_exits_2_from_the_cli_before_any_process(tmp_path):
    done = cli("train", "--quiet", "--out", str(tmp_path / "run"), "--set", f"dataset={REG}:diabetes",
               "--set", f"model={REG}:mlp", "--set", f"loss={REG}:no_such_loss")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no_such_loss" in done.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_a_target_is_timed_and_stops_the_job(tmp_path):
    """The regression's validation MSE starts near 1 (a standardised target) and is 0.70
    at iteration 10 here. A BSP job is the reference's arithmetic, so that value is not a
    matter of timing or load; the bound 0.8 leaves room for another machine's rounding.
    With stop_at_target the job ends at the barrier after the evaluation that met it,
    long before its 1,000 iterations."""
    cfg = {**BASE, **WORKLOADS["regression"], "iterations": 1000, "eval_every": 10,
           "target": {"metric": "mse", "below": 0.8}, "stop_at_target": True}
    summary = equipoise.train(cfg, out=tmp_path / "run")
    hit = summary["time_to_target"]
    assert hit["metric"] == "test_mse" and hit["value"] < 0.8 and hit["elapsed"] > 0
    assert summary["iterations"] < 1000 and summary["iterations"] >= hit["iteration"]
    events = [r["event"] for r in records(tmp_path / "run", "event")]
    assert "target" in events and "stop_at_target" in events
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["time_to_target"] == hit


MOVIES = str(EXAMPLES / "movielens.py")
needs_recbole = pytest.mark.skipif(importlib.util.find_spec("recbole") is None,
                                   reason="pip install --no-deps recbole==1.2.1 (MovieLens-100k)")
MF = dict(dataset=f"{MOVIES}:movielens", model=f"{MOVIES}:mf", loss=f"{MOVIES}:mse", metrics=f"{MOVIES}:metrics")


@needs_recbole
def test_movielens_trains_its_sparse_tables_on_the_servers(tmp_path):
    """The example's real data (100,000 ratings of 1,682 movies by 943 users, a tenth held
    out) and its four sparse tables in processes: the rows a worker pulls are its batch's
    (the wire carries a sliver of the tables), and the held-out error falls."""
    import sys

    sys.path.insert(0, str(EXAMPLES))
    try:
        import movielens
    finally:
        sys.path.remove(str(EXAMPLES))
    data = movielens.movielens()
    assert (len(data["train"]), len(data["eval"])) == (90_000, 10_000)
    assert (data["train"].n_users, data["train"].n_items) == (943, 1682)
    cfg = dict(BASE, **MF, workers=2, optimizer="adam", lr=0.005, momentum=0.0, global_batch=256, iterations=60,
               eval_every=30)
    summary = equipoise.train(cfg, out=tmp_path / "run")
    evals = [r["test_mse"] for r in records(tmp_path / "run", "eval")]
    assert summary["samples"] == 60 * 256 and evals[-1] < evals[0], evals


def test_the_dlrm_example_learns_with_its_tables_on_the_servers(tmp_path, monkeypatch):
    """The DLRM-style example as shipped (examples/workloads/dlrm.toml: 8 tables of 10⁵
    rows, Zipf ids, 4 workers, 4 servers), shorter: every table's rows on the servers
    (the workers' pulls a sliver of them), and the held-out log loss falls from the
    untrained model's (about ln 2)."""
    monkeypatch.chdir(EXAMPLES.parents[1])  # the TOML names its code from the repository's root
    summary = equipoise.train(str(EXAMPLES / "dlrm.toml"), out=tmp_path / "run", iterations=40, eval_every=20,
                              progress=False, data_args={"eval": 2048})
    tables = summary["sparse_tables"]
    assert len(tables) == 8 and all(t["rows"] == 100_000 for t in tables.values())
    assert summary["wire_bytes_per_iteration"]["pull"] < 0.05 * sum(t["bytes"] for t in tables.values())
    evals = [r["test_logloss"] for r in records(tmp_path / "run", "eval")]
    assert len(evals) >= 2 and evals[-1] < evals[0], evals


def test_a_job_whose_sparse_tables_cannot_run_as_configured_exits_2_in_one_line(tmp_path):
    done = cli("train", "--quiet", "--out", str(tmp_path / "run"), "--set", f"dataset={MOVIES}:synthetic",
               "--set", f"model={MOVIES}:mf", "--set", f"loss={MOVIES}:mse", "--set", "clip_grad_norm=1.0",
               "--set", "model_args={n_users = 300, n_items = 500}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "clip_grad_norm is not supported with sparse tables" in done.stderr
