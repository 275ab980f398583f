"""The training step, user datasets, the input pipeline and their bad-input errors
(in process: no job is started)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from equipoise.api import check_workload
from equipoise.config import Config, ConfigError
from equipoise.data import DataError, SliceSampler
from equipoise.data.loader import Loader
from equipoise.models import build_model
from equipoise.workload import SampleError, StepError, Workload, load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"

USER = '''
import torch
from torch import nn

class Squares(torch.utils.data.Dataset):
    def __init__(self, n=40):
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(float(i * i))}

def provider(seed=0):
    return Squares(), Squares(10)

def empty():
    return Squares(0)

class Broken(Squares):
    def __getitem__(self, i):
        raise KeyError("no such record")

def broken():
    return Broken()

def model():
    return nn.Linear(3, 1)

def loss(model, batch):
    return ((model(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean()

def vector_loss(model, batch):
    return (model(batch["x"]).squeeze(1) - batch["y"]) ** 2

def three(model, batch):
    return loss(model, batch), 1, 2

def bad_count(model, batch):
    return loss(model, batch), "many"

def detached(model, batch):
    return loss(model, batch).detach()

def bad_collate(items):
    raise RuntimeError("cannot stack")

def bad_metrics(model, batch):
    return {"mse": "low"}

def metrics(model, batch):
    return {"mse": loss(model, batch), "n": (len(batch["y"]), 1)}
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "user.py"
    path.write_text(USER)
    return str(path)


def config(user: str, **keys) -> Config:
    base = dict(dataset=f"{user}:provider", model=f"{user}:model", loss=f"{user}:loss", workers=2,
                global_batch=8, progress=False)
    return Config.from_dict({**base, **{k: (f"{user}:{v}" if isinstance(v, str) and k != "target"
                                            and ":" not in v else v) for k, v in keys.items()}})


def test_a_user_dataset_of_dicts_is_collated_and_its_loss_is_a_mean(user):
    work = load_workload(config(user))
    batch = work.fetch(work.train, torch.tensor([3, 1]))
    assert batch["x"].shape == (2, 3) and batch["y"].tolist() == [9.0, 1.0]
    model = torch.nn.Linear(3, 1)
    step = work.loss_of(model, batch, 2)
    assert step.count == 2.0 and step.value == pytest.approx(float(step.objective.detach()))
    assert work.num_eval == 10 and work.input_shape is None


def test_sum_count_losses_are_averaged_over_their_count():
    work = Workload([torch.ones(2)] * 4, loss=lambda m, b: ((m(b) ** 2).sum(), 5))
    model = torch.nn.Linear(2, 1)
    batch = torch.ones(4, 2)
    step = work.loss_of(model, batch, 4)
    assert step.count == 5.0
    assert torch.equal(step.objective, (model(batch) ** 2).sum() / 5.0)
    zero = Workload([torch.ones(2)] * 4, loss=lambda m, b: ((m(b) ** 2).sum(), 0)).loss_of(model, batch, 4)
    assert zero.count == 0.0 and zero.value == 0.0  # no units: no gradient, not a NaN


def test_metrics_reduce_sums_and_counts_and_batch_means(user):
    work = load_workload(config(user, metrics="metrics"))
    model = torch.nn.Linear(3, 1)
    got = work.evaluate(model, batch_size=3)
    with torch.no_grad():
        x = torch.arange(10.0).unsqueeze(1).expand(10, 3)
        y = torch.arange(10.0) ** 2
        want = float(((model(x).squeeze(1) - y) ** 2).mean())
    # mse is a batch mean weighted by batch size (3, 3, 3, 1): the mean over all 10 samples.
    assert got["mse"] == pytest.approx(want, rel=1e-6)
    assert got["n"] == 10 / 4  # Σ len(batch) / Σ 1 over the 4 batches


def test_default_metrics_of_a_user_loss_are_its_loss(user):
    work = load_workload(config(user))
    assert set(work.evaluate(torch.nn.Linear(3, 1))) == {"loss"}


@pytest.mark.parametrize("keys, error, words", [
    ({"dataset": "nowhere_module_xyz:fn"}, DataError, "cannot import"),
    ({"dataset": "empty"}, DataError, "is empty"),
    ({"dataset": "broken"}, DataError, "item 0 raised KeyError"),
    ({"loss": "vector_loss"}, StepError, "shape (2,)"),
    ({"loss": "three"}, StepError, "3 items"),
    ({"loss": "bad_count"}, StepError, "count = 'many'"),
    ({"loss": "detached"}, StepError, "does not depend"),
    ({"collate": "bad_collate"}, StepError, "collate"),
    ({"metrics": "bad_metrics"}, StepError, "mse = 'low'"),
    ({"target": {"metric": "accuracy", "above": 0.5}}, ConfigError, "not one of the evaluation's test_loss"),
], ids=["import", "empty", "first-item", "non-scalar", "tuple", "count", "no-grad", "collate", "metric",
        "target"])
def test_bad_user_code_is_one_line_naming_it_before_any_process(user, keys, error, words):
    with pytest.raises(error) as info:
        check_workload(config(user, **keys))
    message = str(info.value)
    assert words in message and "\n" not in message
    spec = keys.get("dataset") or keys.get("loss") or keys.get("collate") or keys.get("metrics")
    if isinstance(spec, str):
        assert spec.split(":")[-1] in message


def test_a_dataset_instance_is_refused_in_the_api(user):
    from equipoise.api import resolve_config
    with pytest.raises(ConfigError, match="pass its class or a function"):
        resolve_config({"dataset": [1, 2, 3]})


def test_config_tables_map_onto_flat_keys_and_conflicts_are_refused():
    cfg = Config.from_dict({"data": {"dataset": "digits", "loader_workers": 2, "model": "mlp"},
                            "servers": {"count": 3, "placement": "round_robin"},
                            "ray": {"strategy": "PACK"}, "sim": {"noise": 0.1},
                            "eval": {"every": 5, "target": {"metric": "accuracy", "above": 0.5}}})
    assert (cfg.dataset, cfg.loader_workers, cfg.model, cfg.servers, cfg.placement, cfg.ray_strategy,
            cfg.sim_noise, cfg.eval_every) == ("digits", 2, "mlp", 3, "round_robin", "PACK", 0.1, 5)
    assert cfg.target == {"metric": "test_accuracy", "above": 0.5}
    with pytest.raises(ConfigError, match="given twice"):
        Config.from_dict({"data": {"dataset": "digits"}, "dataset": "mnist"})
    with pytest.raises(ConfigError, match=r"unknown key 'colour' in \[data\]"):
        Config.from_dict({"data": {"colour": 1}})
    with pytest.raises(ConfigError, match="stop_at_target = true needs a target"):
        Config.from_dict({"stop_at_target": True})
    with pytest.raises(ConfigError, match="target = "):
        Config.from_dict({"target": {"metric": "loss", "below": 1, "above": 2}})


class Slow(torch.utils.data.Dataset):
    """Items that cost `delay` seconds each (a file read, emulated by a sleep: it releases
    the GIL as I/O does), recording which threads read them."""

    def __init__(self, n: int, delay: float):
        self.n, self.delay, self.threads = n, delay, set()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        return torch.tensor([float(i)])


@pytest.mark.parametrize("threads", [0, 1, 3])
def test_the_loader_gives_the_slices_batch_prefetched_or_not(threads):
    data = Slow(50, 0.0)
    work = Workload(data)
    sampler = SliceSampler(50, 10, seed=4)
    loader = Loader(work, sampler, threads)
    try:
        loader.prefetch(20, 7)  # a good guess
        assert torch.equal(loader.get(20, 7), work.fetch(data, sampler.positions(20, 7)))
        loader.prefetch(30, 7)  # a wrong guess: dropped, the asked slice read instead
        assert torch.equal(loader.get(33, 9), work.fetch(data, sampler.positions(33, 9)))
        assert loader.get(45, 10).shape == (10, 1)  # across an epoch boundary
    finally:
        loader.close()
    assert len(data.threads) >= min(threads, 2) or threads == 0


def test_a_failing_item_names_the_dataset_and_index(user):
    work = load_workload(config(user, dataset="broken"))
    with pytest.raises(SampleError, match=r"broken.*item 5 raised KeyError: 'no such record'"):
        work.fetch(work.train, torch.tensor([5]))


def test_the_regression_example_builds_and_its_metrics_are_numbers():
    cfg = Config.from_dict({"dataset": f"{EXAMPLES}/diabetes.py:diabetes", "model": f"{EXAMPLES}/diabetes.py:mlp",
                            "loss": f"{EXAMPLES}/diabetes.py:mse", "metrics": f"{EXAMPLES}/diabetes.py:metrics"})
    work = check_workload(cfg)
    assert (len(work), work.num_eval) == (354, 88)
    got = work.evaluate(build_model(cfg.model, None, None))
    assert set(got) == {"mse", "mae"} and all(v > 0 for v in got.values())


def test_overrides_win_over_a_files_tables_and_relative_scripts_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text('[data]\ndataset = "digits"\nmodel = "my.py:make"\n\n'
                                       '[servers]\ncount = 2\nplacement = "round_robin"\n')
    cfg = Config.load(tmp_path / "job.toml", {"dataset": "mnist", "servers": 3})
    assert (cfg.dataset, cfg.servers, cfg.placement) == ("mnist", 3, "round_robin")
    assert cfg.model == f"{tmp_path / 'my.py'}:make"  # so config.toml works from any folder


RAISING = '''
import torch
from torch.utils.data import TensorDataset

def provide():
    return TensorDataset(torch.zeros(8, 3), torch.zeros(8))

def model():
    return torch.nn.Linear(4, 1)   # the data have 3 features: the forward fails

def loss(model, batch):
    x, y = batch
    return ((model(x).squeeze(1) - y) ** 2).mean()
'''


def test_an_exception_in_the_users_step_is_one_line_naming_it(tmp_path):
    (tmp_path / "r.py").write_text(RAISING)
    cfg = Config.from_dict({"dataset": f"{tmp_path}/r.py:provide", "model": f"{tmp_path}/r.py:model",
                            "loss": f"{tmp_path}/r.py:loss", "workers": 2, "global_batch": 4})
    with pytest.raises(StepError, match=r"loss '.*r\.py:loss' raised RuntimeError on a batch of two samples: ") as info:
        check_workload(cfg)
    assert "\n" not in str(info.value)


def test_a_collate_a_get_batch_dataset_would_ignore_is_refused():
    cfg = Config.from_dict({"dataset": "digits", "model": "mlp",
                            "collate": "torch.utils.data:default_collate"})
    with pytest.raises(ConfigError, match="would not be used"):
        check_workload(cfg)


def test_the_provider_sees_the_same_rng_in_every_process(user, tmp_path):
    """A provider drawing from torch's global generator builds the same data whatever the
    process did before (it is called under the job's seed), and leaves the caller's RNG."""
    (tmp_path / "rand.py").write_text("import torch\nfrom torch.utils.data import TensorDataset\n"
                                      "def provide():\n    return TensorDataset(torch.randn(6, 2))\n")
    cfg = Config.from_dict({"dataset": f"{tmp_path}/rand.py:provide", "model": f"{user}:model",
                            "workers": 2, "global_batch": 4, "seed": 7})
    torch.manual_seed(1)
    a = load_workload(cfg).train.tensors[0]
    after = torch.rand(1)
    torch.manual_seed(2)
    b = load_workload(cfg).train.tensors[0]
    torch.manual_seed(1)
    assert torch.equal(a, b) and torch.equal(torch.rand(1), after)


def test_an_evaluation_materialises_one_eval_batch_of_outputs_at_a_time(tmp_path):
    """A language model's evaluation: log-probabilities of batch × sequence × vocabulary.
    The metrics are reduced batch by batch, so the largest output any step of it builds
    is one `eval_batch` of them, whatever the evaluation set's size (the config's
    eval_batch reaching the snapshot's evaluation: below)."""
    seq, vocab, n = 7, 50, 45
    sizes: list[int] = []

    def metrics(model, batch):
        logp = torch.log_softmax(model(batch.float()).unsqueeze(1).expand(-1, seq, -1), dim=-1)
        sizes.append(logp.numel())
        return {"nll": (-logp.mean() * len(batch), len(batch))}

    model = torch.nn.Linear(3, vocab)
    work = Workload([torch.ones(3)] * 8, [torch.ones(3)] * n, metrics=metrics)
    whole = work.evaluate(model, batch_size=n)["nll"]
    sizes.clear()
    batched = work.evaluate(model, batch_size=10)["nll"]
    assert max(sizes) == 10 * seq * vocab and len(sizes) == 5  # 10, 10, 10, 10, 5
    assert batched == pytest.approx(whole, rel=1e-6)  # the same mean, reduced over (sum, count)


def test_eval_batch_reaches_the_snapshots_evaluation(tmp_path):
    from equipoise.config import Config
    from equipoise.coordinator.snapshots import SnapshotSettings

    assert Config.from_dict({"eval_batch": 64}).slice(SnapshotSettings).eval_batch == 64
    with pytest.raises(Exception, match="eval_batch = 0 must be ≥ 1"):
        Config.from_dict({"eval_batch": 0})


SETTINGS = '''
import torch
from torch import nn

class Squares(torch.utils.data.Dataset):
    def __init__(self, n, scale):
        self.n, self.scale = n, scale
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(self.scale * float(i * i))}

def provider(size, scale=1.0, seed=0):
    return Squares(size, scale), Squares(4, scale)

def model(hidden, depth=1):
    layers = [nn.Linear(3, hidden)] + [nn.Linear(hidden, hidden) for _ in range(depth - 1)]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))

def loss(model, batch, weight):
    return weight * ((model(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean()
'''


def test_settings_reach_the_users_model_dataset_and_loss(tmp_path):
    """model_args, data_args and loss_args: keywords of the spec's function, as a recipe's
    flags are (one function, not one per variant), recorded in the run's config."""
    from equipoise.models import build_model

    path = tmp_path / "recipe.py"
    path.write_text(SETTINGS)
    cfg = Config.from_dict(dict(dataset=f"{path}:provider", model=f"{path}:model", loss=f"{path}:loss",
                                workers=2, global_batch=8, data_args={"size": 12, "scale": 2.0},
                                model_args={"hidden": 5, "depth": 2}, loss_args={"weight": 0.5}))
    work = load_workload(cfg)
    assert len(work.train) == 12 and float(work.train[3]["y"]) == 18.0
    model = build_model(cfg.model, None, None, cfg.model_args)
    assert [m.out_features for m in model if isinstance(m, torch.nn.Linear)] == [5, 5, 1]
    batch = work.fetch(work.train, torch.arange(4))
    full = work.loss_of(model, batch, 4).value
    mse = ((model(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean().item()
    assert full == pytest.approx(0.5 * mse, rel=1e-6)
    from equipoise.config import to_toml
    assert 'model_args = {hidden = 5, depth = 2}' in to_toml(cfg.to_dict())


@pytest.mark.parametrize("keys, match", [
    (dict(model_args={"hidden": 5}), "model_args is for a model of the user's own"),
    (dict(data_args={"n": 5}), "data_args is for a dataset of the user's own"),
    (dict(loss_args={"w": 1}), "loss_args is for a loss of the user's own"),
    (dict(model="m.py:f", model_args={"1x": 5}), "model_args: '1x' is not a keyword name"),
    (dict(model="m.py:f", model_args=[5]), "model_args = \\[5\\] should be a table of keywords"),
    (dict(model="m.py:f", model_args={"x": float("nan")}), "model_args.x = nan is not a number"),
])
def test_settings_for_built_in_code_or_of_other_shapes_are_refused(keys, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(keys)


def test_a_plain_stack_of_torchs_layers_is_evaluated_frozen_with_the_same_metrics():
    """The built-in CNN (an nn.Sequential of torch's layers) under the default metrics is
    traced and frozen for evaluation: 50 samples in batches of 16 (the last one of 2, a
    shape the trace did not see) give the eager model's accuracy exactly and its loss to
    float32 rounding (a fused convolution sums in another order: a few ulps of each of 50
    terms of order 1, far below 1e-5 relative). A module of the user's inside, a model
    that is not a Sequential, or an input that is not a float tensor is run as it is."""
    from equipoise.workload import inference_module
    torch.manual_seed(0)
    x, y = torch.randn(50, 1, 28, 28), torch.randint(0, 10, (50,))
    work = Workload([(x[i], y[i]) for i in range(40)], [(x[i], y[i]) for i in range(50)])
    model = build_model("cnn", (1, 28, 28), 10)
    frozen = inference_module(model, x[:16])
    assert isinstance(frozen, torch.jit.ScriptModule)
    ran = []
    metrics = work.batch_metrics
    work.batch_metrics = lambda m, b, n: ran.append(type(m)) or metrics(m, b, n)
    got = work.evaluate(model, batch_size=16)
    assert len(ran) == 4 and all(issubclass(t, torch.jit.ScriptModule) for t in ran)
    with torch.no_grad():
        out = model(x)
    top2 = out.topk(2, dim=1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3  # no near tie for a rounding to flip
    assert got["accuracy"] == int((out.argmax(1) == y).sum()) / 50
    assert got["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-5)

    class Mine(torch.nn.Module):
        def forward(self, t):
            return t if t.shape[0] > 1 else -t  # a branch a trace would bake in

    assert inference_module(torch.nn.Sequential(torch.nn.Flatten(), Mine()), x[:16]) is None
    assert inference_module(torch.nn.Linear(3, 1), torch.ones(2, 3)) is None
    assert inference_module(torch.nn.Sequential(torch.nn.Embedding(5, 2)), torch.tensor([1, 2])) is None
