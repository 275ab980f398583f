"""CIFAR-10, read from the *binary* distribution (never the pickled python one).

Each ``.bin`` file is a sequence of 3073-byte records: one label byte (0..9)
followed by 3072 pixel bytes, a 32x32 image in CHW order (R plane, G, B).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from equipoise.data.dataset import DataError, Dataset, one_line

RECORD_BYTES = 1 + 3 * 32 * 32
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
SUBDIR = "cifar-10-batches-bin"
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def resolve_cifar_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """The directory holding the ``.bin`` files: ``data_dir`` itself or its
    ``cifar-10-batches-bin/`` subdirectory. DataError if unset or not found."""
    if data_dir is None:
        raise DataError(
            "cifar10: no data directory set: pass data_dir (the folder holding "
            "data_batch_1.bin .. test_batch.bin of the CIFAR-10 binary version)"
        )
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"{root}: CIFAR-10 data directory does not exist")
    for candidate in (root, root / SUBDIR):
        if (candidate / TRAIN_FILES[0]).is_file():
            return candidate
    raise DataError(f"{root / TRAIN_FILES[0]}: file not found (nor in {SUBDIR}/)")


def read_cifar_file(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``(N, 3, 32, 32)`` uint8 and labels ``(N,)`` int64 from one ``.bin``
    file; DataError if missing, unreadable, not whole records, or labels >= 10."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {one_line(exc)}") from exc
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise DataError(
            f"{path}: size {raw.size} bytes is not a positive multiple of the "
            f"{RECORD_BYTES}-byte CIFAR-10 record"
        )
    records = raw.reshape(-1, RECORD_BYTES)
    labels = records[:, 0]
    if int(labels.max()) >= 10:
        bad = int(np.argmax(labels >= 10))
        raise DataError(f"{path}: record {bad} has label {labels[bad]}, expected 0..9")
    images = np.ascontiguousarray(records[:, 1:]).reshape(-1, 3, 32, 32)
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def read_cifar_files(directory: Path, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The records of ``names`` in ``directory``, concatenated in that order."""
    parts = []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        parts.append(read_cifar_file(path))
    if len(parts) == 1:
        return parts[0]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def load_cifar10(data_dir: str | os.PathLike[str] | None) -> Dataset:
    """CIFAR-10 (50000 train / 10000 test for the real files) from the binary
    version in ``data_dir``, normalised per channel with the standard mean/std."""
    directory = resolve_cifar_dir(data_dir)
    train_x, train_y = read_cifar_files(directory, TRAIN_FILES)
    test_x, test_y = read_cifar_files(directory, (TEST_FILE,))
    return Dataset(
        name="cifar10",
        num_classes=10,
        input_shape=(3, 32, 32),
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        mean=MEAN,
        std=STD,
        pixel_scale=1.0 / 255.0,
    )
