"""MNIST-style IDX files (MNIST, Fashion-MNIST), gzip-compressed or raw.

Format (big-endian): a 4-byte magic ``0x00000803`` (uint8, 3 dims) for images or
``0x00000801`` (uint8, 1 dim) for labels, one 4-byte size per dimension, then the
uint8 payload. Every file is validated completely before it is used.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from equipoise.data.dataset import DataError, Dataset, one_line

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
SPLIT_PREFIX = {"train": "train", "test": "t10k"}
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}
INSTALL_HINTS = {"fashion-mnist": " (install it with `apt-get install dataset-fashion-mnist`)"}


def find_idx_file(data_dir: Path, stem: str, hint: str = "") -> Path:
    """``data_dir/stem.gz`` or ``data_dir/stem``, whichever exists (gz preferred);
    DataError naming the missing path otherwise."""
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: dataset directory does not exist{hint}")
    for candidate in (data_dir / f"{stem}.gz", data_dir / stem):
        if candidate.is_file():
            return candidate
    raise DataError(f"{data_dir / stem}: file not found (nor {stem}.gz){hint}")


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped if its name ends in ``.gz``; any read or
    decompression failure becomes a DataError naming the path. A gzip file's content is
    kept decompressed in the cache folder (``cache_folder``) and read from there next
    time: every process of a job reads the data set, and gunzipping Fashion-MNIST took
    each about 0.3 s."""
    try:
        if path.suffix == ".gz":
            return _gunzipped(path)
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {one_line(exc)}") from exc


def cache_folder() -> Path:
    """Where decompressed data files are kept: ``$EQUIPOISE_CACHE``, else
    ``$XDG_CACHE_HOME/equipoise``, else ``~/.cache/equipoise``."""
    if os.environ.get("EQUIPOISE_CACHE"):
        return Path(os.environ["EQUIPOISE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "equipoise"


def _gunzipped(path: Path) -> bytes:
    """``path`` gunzipped, from the cache when a copy of it is there: named by the file's
    absolute path, size and modification time, and used only if its length is the one the
    gzip trailer records (ISIZE: the content's length mod 2^32). Otherwise decompressed
    and written there (atomically; a folder that cannot be written is skipped)."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:20]
    cached = cache_folder() / "data" / f"{key}-{path.name[:-3]}"
    with path.open("rb") as handle:
        handle.seek(-4, os.SEEK_END)
        isize = int.from_bytes(handle.read(4), "little")
    try:
        if cached.stat().st_size % (1 << 32) == isize:
            return cached.read_bytes()
    except OSError:
        pass
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    except OSError:
        pass
    return data


def parse_idx(path: Path, data: bytes, magic: int, ndim: int) -> np.ndarray:
    """Validate the header and exact length of IDX ``data`` read from ``path`` and
    return its payload as a uint8 array of the declared shape (a view of ``data``)."""
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{path}: truncated header ({len(data)} bytes, need {header_len})")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise DataError(f"{path}: bad magic number 0x{found:08x}, expected 0x{magic:08x}")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if min(dims) <= 0:
        raise DataError(f"{path}: bad dimensions {dims}")
    expected = header_len + int(np.prod(dims))
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes"
        raise DataError(f"{path}: {what}: {len(data)} bytes, header {dims} implies {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=header_len).reshape(dims)


def load_idx_split(data_dir: Path, split: str, num_classes: int, hint: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``(N, 1, H, W)`` uint8 and labels ``(N,)`` int64 of one split
    (``"train"`` or ``"test"``), with counts and label range checked."""
    prefix = SPLIT_PREFIX[split]
    image_path = find_idx_file(data_dir, f"{prefix}-images-idx3-ubyte", hint)
    label_path = find_idx_file(data_dir, f"{prefix}-labels-idx1-ubyte", hint)
    images = parse_idx(image_path, read_bytes(image_path), IMAGES_MAGIC, 3)
    labels = parse_idx(label_path, read_bytes(label_path), LABELS_MAGIC, 1)
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{label_path}: {labels.shape[0]} labels but {image_path} holds {images.shape[0]} images"
        )
    top = int(labels.max())
    if top >= num_classes:
        raise DataError(f"{label_path}: label {top} out of range [0, {num_classes})")
    x = torch.from_numpy(images.copy()).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def load_idx_dataset(name: str, data_dir: str | os.PathLike[str]) -> Dataset:
    """The IDX dataset ``name`` (a key of NORMALISATION) from ``data_dir``:
    10 classes, normalised with the dataset's standard mean/std."""
    directory = Path(data_dir)
    hint = INSTALL_HINTS.get(name, "")
    train_x, train_y = load_idx_split(directory, "train", 10, hint)
    test_x, test_y = load_idx_split(directory, "test", 10, hint)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(
            f"{directory}: train images are {tuple(train_x.shape[2:])} but test images are "
            f"{tuple(test_x.shape[2:])}"
        )
    mean, std = NORMALISATION[name]
    return Dataset(
        name=name,
        num_classes=10,
        input_shape=tuple(train_x.shape[1:]),
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        mean=(mean,),
        std=(std,),
        pixel_scale=1.0 / 255.0,
    )
