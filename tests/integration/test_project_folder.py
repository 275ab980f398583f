"""A user's project as a script sees it: a training script, a module with the dataset,
model and loss, and a neighbour module that one imports; run from another directory,
through the Python API and through file specs on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(240)

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
