"""Loading a dataset by name."""

from __future__ import annotations

import os

from equipoise.data.builtin import load_digits_dataset, load_synthetic
from equipoise.data.cifar import load_cifar10
from equipoise.data.dataset import DataError, Dataset
from equipoise.data.idx import load_idx_dataset

DATASETS = ("fashion-mnist", "mnist", "digits", "cifar10", "synthetic")
DEFAULT_DIRS: dict[str, str | None] = {
    "fashion-mnist": "/usr/share/datasets/fashion-mnist",
    "mnist": "/usr/share/datasets/mnist",
    "cifar10": None,
}


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    synthetic_train: int = 8192,
    synthetic_test: int = 2048,
    synthetic_shape: tuple[int, int, int] = (1, 28, 28),
) -> Dataset:
    """Load dataset ``name`` (one of DATASETS) into memory.

    ``data_dir`` overrides DEFAULT_DIRS for the file-backed datasets (required
    for cifar10) and is ignored by ``digits`` and ``synthetic``. ``seed`` and the
    ``synthetic_*`` arguments only affect ``synthetic``; every other dataset is
    the same whatever the seed. Any problem raises DataError with a one-line
    message naming the dataset, path or setting at fault.
    """
    if name in ("fashion-mnist", "mnist"):
        directory = data_dir if data_dir is not None else DEFAULT_DIRS[name]
        return load_idx_dataset(name, directory)
    if name == "cifar10":
        return load_cifar10(data_dir if data_dir is not None else DEFAULT_DIRS["cifar10"])
    if name == "digits":
        return load_digits_dataset()
    if name == "synthetic":
        return load_synthetic(seed, synthetic_train, synthetic_test, synthetic_shape)
    raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
