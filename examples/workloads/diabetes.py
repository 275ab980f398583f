"""A tabular regression: scikit-learn's bundled diabetes data (442 patients, 10 features,
a disease-progression score a year later), an MLP and a mean-squared-error loss.

Features and target are standardised with the training split's mean and deviation;
`metrics` reports the validation MSE (standardised units), the MAE in the score's own
units, and R² is 1 − test_mse (the target's variance is 1 on the training split).

    equipoise train examples/workloads/diabetes.toml
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

EVAL = 88  # the last 88 samples (20%) of a seeded permutation evaluate
SPLIT_SEED = 0


def _arrays():
    """The raw features and targets `sklearn.datasets.load_diabetes(scaled=False)` returns,
    read from the CSV files scikit-learn ships (importing scikit-learn itself takes longer
    than the rest of a worker's start), in a seeded order."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ImportError("the diabetes example needs scikit-learn (pip install scikit-learn)")
    folder = Path(spec.origin).parent / "datasets" / "data"
    x = torch.as_tensor(np.loadtxt(folder / "diabetes_data_raw.csv.gz"), dtype=torch.float32)
    y = torch.as_tensor(np.loadtxt(folder / "diabetes_target.csv.gz"), dtype=torch.float32)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    return x[order], y[order]


def diabetes():
    x, y = _arrays()
    xt, yt = x[:-EVAL], y[:-EVAL]
    mx, sx, my, sy = xt.mean(0), xt.std(0), yt.mean(), yt.std()
    norm = lambda a, b: TensorDataset((a - mx) / sx, ((b - my) / sy).unsqueeze(1))  # noqa: E731
    train, test = norm(xt, yt), norm(x[-EVAL:], y[-EVAL:])
    train.target_std = test.target_std = float(sy)
    return {"train": train, "eval": test}


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


TARGET_STD = 76.17  # the score's deviation on the training split (diabetes(): target_std)


def metrics(model: nn.Module, batch) -> dict:
    x, y = batch
    out = model(x)
    n = len(y)
    return {"mse": (F.mse_loss(out, y, reduction="sum"), n),
            "mae": ((out - y).abs().sum() * TARGET_STD, n)}
