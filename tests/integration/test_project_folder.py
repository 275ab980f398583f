"""A user's project as a script sees it: a training script, a module with the dataset,
model and loss, and a neighbour module that one imports; run from another directory,
through the Python API and through file specs on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HELPER = """
import torch

def squares(n):
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 3) / n
    return torch.utils.data.TensorDataset(x, (x ** 2).sum(1))
"""

WLM = """
import torch
from torch import nn

from helper import squares   # a neighbour, as pytorch/examples' main.py imports data and model


def datasets(size=64):
    return squares(size), squares(16)


def model(hidden=4):
    return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def loss(model, batch):
    x, y = batch
    return ((model(x).squeeze(1) - y) ** 2).mean()
"""

TRAIN = """
import json, sys
import equipoise
import wlm

if __name__ == "__main__":
    summary = equipoise.train(dataset=wlm.datasets, model=wlm.model, loss=wlm.loss, workers=2, servers=1,
                              global_batch=16, iterations=3, eval_every=0, checkpoint_every=0, progress=False,
                              timeout=60.0, model_args={"hidden": 6}, out=sys.argv[1])
    print(json.dumps({"iterations": summary["iterations"]}))
"""


@pytest.fixture
def project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    for name, text in (("helper.py", HELPER), ("wlm.py", WLM), ("train.py", TRAIN)):
        (proj / name).write_text(textwrap.dedent(text))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return proj, elsewhere


def test_a_script_passing_its_neighbours_functions_trains_from_another_directory(project):
    """The workers cannot import `wlm` by name (its folder is the script's, not theirs):
    the API records the functions by their file, whose folder then comes first on
    sys.path in every process, so `from helper import squares` works there too."""
    proj, elsewhere = project
    run = elsewhere / "run"
    done = subprocess.run([sys.executable, str(proj / "train.py"), str(run)], cwd=elsewhere,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"iterations": 3}
    config = (run / "config.toml").read_text()
    assert f'dataset = "{proj / "wlm.py"}:datasets"' in config and "model_args = {hidden = 6}" in config


def test_file_specs_import_their_neighbours_from_another_directory(project):
    proj, elsewhere = project
    spec = proj / "wlm.py"
    done = subprocess.run([sys.executable, "-m", "equipoise.cli", "train", "--out", str(elsewhere / "run"),
                           "--set", f"dataset={spec}:datasets", "--set", f"model={spec}:model",
                           "--set", f"loss={spec}:loss", "--set", "data_args={size=48}", "--set", "workers=2",
                           "--set", "servers=1", "--set", "global_batch=16", "--set", "iterations=3",
                           "--set", "eval_every=0", "--set", "checkpoint_every=0", "--set", "progress=false"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((elsewhere / "run" / "summary.json").read_text())["iterations"] == 3


def test_a_spec_the_workers_could_not_import_fails_before_start(project, monkeypatch):
    """A spec by module name that this process imports only through its own sys.path
    (the project's folder added by hand, as a notebook or a launcher script might) is
    tried in a child set up as the workers are: one line naming the spec, no run."""
    import equipoise
    from equipoise.config import ConfigError

    proj, elsewhere = project
    monkeypatch.chdir(elsewhere)
    monkeypatch.syspath_prepend(str(proj))
    with pytest.raises(ConfigError) as exc:
        equipoise.train(dataset="wlm:datasets", model="wlm:model", loss="wlm:loss", workers=2, servers=1,
                        global_batch=16, iterations=3, eval_every=0, progress=False, out=elsewhere / "run")
    message = str(exc.value)
    assert "\n" not in message and "'wlm:model'" in message and "cannot import 'wlm'" in message, message
    assert not (elsewhere / "run").exists()


PKG_TRAIN = """
import json, sys
import equipoise
from wlmpkg.models import model
import wlm

if __name__ == "__main__":
    summary = equipoise.train(dataset=wlm.datasets, model=model, loss=wlm.loss, workers=2, servers=1,
                              global_batch=16, iterations=3, eval_every=0, checkpoint_every=0, progress=False,
                              timeout=60.0, out=sys.argv[1])
    print(json.dumps({"iterations": summary["iterations"]}))
"""


def test_a_package_next_to_the_script_trains_from_another_directory(project):
    """The model in a package of the project (`wlmpkg/models.py`, which imports its
    sibling relatively): recorded by its file, imported in every process as the
    package's module, its root's folder on sys.path."""
    proj, elsewhere = project
    pkg = proj / "wlmpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("from torch import nn\n\ndef head(hidden):\n    return nn.Linear(hidden, 1)\n")
    (pkg / "models.py").write_text(textwrap.dedent("""
        from torch import nn
        from .layers import head

        def model(hidden=5):
            return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), head(hidden))
        """))
    (proj / "train_pkg.py").write_text(textwrap.dedent(PKG_TRAIN))
    run = elsewhere / "run"
    done = subprocess.run([sys.executable, str(proj / "train_pkg.py"), str(run)], cwd=elsewhere,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"iterations": 3}
    assert f'model = "{pkg / "models.py"}:model"' in (run / "config.toml").read_text()
