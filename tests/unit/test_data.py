"""Unit tests for equipoise.data: IDX and CIFAR-10 binary loaders on files the
tests write, the built-in datasets, and the SliceSampler stream contract."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from equipoise.data import DATASETS, DEFAULT_DIRS, DataError, Dataset, SliceSampler, load_dataset

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_STEMS = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_file(path: Path, data: bytes, compress: bool) -> Path:
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def write_idx_set(directory: Path, n_train: int = 12, n_test: int = 5, side: int = 6, compress: bool = True) -> dict:
    """Write a complete random IDX dataset; return the arrays and the file paths."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, count in (("train", n_train), ("test", n_test)):
        arrays[(split, "images")] = rng.integers(0, 256, (count, side, side), dtype=np.uint8)
        arrays[(split, "labels")] = rng.integers(0, 10, count, dtype=np.uint8)
    paths = {}
    for key, array in arrays.items():
        magic = 0x803 if key[1] == "images" else 0x801
        paths[key] = write_file(directory / IDX_STEMS[key], idx_bytes(array, magic), compress)
    return {"arrays": arrays, "paths": paths}


# ---------------------------------------------------------------- IDX


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "raw"])
def test_idx_round_trip(tmp_path: Path, compress: bool) -> None:
    written = write_idx_set(tmp_path, compress=compress)
    ds = load_dataset("mnist", str(tmp_path))
    arrays = written["arrays"]
    assert (len(ds), ds.num_test, ds.input_shape, ds.num_classes) == (12, 5, (1, 6, 6), 10)
    assert ds.train_x.dtype == torch.uint8
    assert np.array_equal(ds.train_x[:, 0].numpy(), arrays[("train", "images")])
    assert np.array_equal(ds.test_y.numpy(), arrays[("test", "labels")])
    x, y = ds.train_batch(torch.tensor([3, 0]))
    assert x.dtype == torch.float32 and x.shape == (2, 1, 6, 6) and y.dtype == torch.int64
    expected = (arrays[("train", "images")][3] / 255.0 - 0.1307) / 0.3081
    assert np.allclose(x[0, 0].numpy(), expected, atol=1e-5)
    assert y.tolist() == arrays[("train", "labels")][[3, 0]].tolist()


def test_idx_prefers_gz_and_accepts_mixed(tmp_path: Path) -> None:
    write_idx_set(tmp_path, compress=False)
    # A gz train-images file with different content takes precedence over the raw one.
    gz_images = np.full((12, 6, 6), 7, dtype=np.uint8)
    write_file(tmp_path / IDX_STEMS[("train", "images")], idx_bytes(gz_images, 0x803), True)
    ds = load_dataset("fashion-mnist", tmp_path)
    assert int(ds.train_x.max()) == 7 and ds.mean == (0.2860,)


def test_test_batches_cover_test_set_in_order(tmp_path: Path) -> None:
    written = write_idx_set(tmp_path, n_test=7)
    ds = load_dataset("mnist", tmp_path)
    batches = list(ds.test_batches(batch_size=3))
    assert [len(y) for _, y in batches] == [3, 3, 1]
    assert torch.cat([y for _, y in batches]).tolist() == written["arrays"][("test", "labels")].tolist()
    with pytest.raises(ValueError):
        next(ds.test_batches(0))


def corrupt(path: Path, mutate) -> None:
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(mutate(data)))


@pytest.mark.parametrize(
    ("key", "mutate", "fragment"),
    [
        (("train", "images"), lambda d: b"\x00\x00\x08\x04" + d[4:], "magic"),
        (("test", "labels"), lambda d: b"\x00\x00\x08\x03" + d[4:], "magic"),
        (("train", "images"), lambda d: d[:-10], "truncated"),
        (("train", "images"), lambda d: d[:10], "truncated"),
        (("train", "labels"), lambda d: d + b"\x00", "trailing"),
        (("train", "labels"), lambda d: d[:8] + b"\x0c" + d[9:], "label 12"),
    ],
    ids=["bad-magic-images", "bad-magic-labels", "truncated", "truncated-header", "trailing", "label-range"],
)
def test_idx_corrupt_files_raise(tmp_path: Path, key, mutate, fragment: str) -> None:
    paths = write_idx_set(tmp_path)["paths"]
    corrupt(paths[key], mutate)
    with pytest.raises(DataError, match=fragment) as info:
        load_dataset("mnist", tmp_path)
    message = str(info.value)
    assert str(paths[key]) in message and "\n" not in message


def test_idx_count_mismatch(tmp_path: Path) -> None:
    paths = write_idx_set(tmp_path)["paths"]
    labels = np.zeros(11, dtype=np.uint8)
    paths[("train", "labels")].write_bytes(gzip.compress(idx_bytes(labels, 0x801)))
    with pytest.raises(DataError, match="11 labels but") as info:
        load_dataset("mnist", tmp_path)
    assert str(paths[("train", "labels")]) in str(info.value)


def test_idx_truncated_gzip_stream(tmp_path: Path) -> None:
    paths = write_idx_set(tmp_path)["paths"]
    path = paths[("test", "images")]
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DataError, match="cannot read") as info:
        load_dataset("mnist", tmp_path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_idx_missing_file_and_directory(tmp_path: Path) -> None:
    paths = write_idx_set(tmp_path)["paths"]
    paths[("test", "labels")].unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path) in str(info.value)
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist") as info:
        load_dataset("fashion-mnist", missing)
    assert str(missing) in str(info.value)


# ---------------------------------------------------------------- CIFAR-10


def cifar_records(count: int, seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count, dtype=np.uint8)
    images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
    records = np.concatenate([labels[:, None], images.reshape(count, -1)], axis=1)
    return records.tobytes(), labels, images


def write_cifar(directory: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    for seed, name in enumerate(names):
        data, labels, images = cifar_records(2 + seed % 2, seed)
        (directory / name).write_bytes(data)
        written[name] = (labels, images)
    return written


@pytest.mark.parametrize("subdir", [False, True], ids=["flat", "batches-bin-subdir"])
def test_cifar_binary(tmp_path: Path, subdir: bool) -> None:
    written = write_cifar(tmp_path / "cifar-10-batches-bin" if subdir else tmp_path)
    ds = load_dataset("cifar10", tmp_path)
    train_names = [f"data_batch_{i}.bin" for i in range(1, 6)]
    assert (len(ds), ds.num_test, ds.input_shape) == (12, 3, (3, 32, 32))
    assert ds.train_y.tolist() == np.concatenate([written[n][0] for n in train_names]).tolist()
    assert np.array_equal(ds.test_x.numpy(), written["test_batch.bin"][1])
    x, _ = ds.train_batch(torch.tensor([0]))
    raw = written["data_batch_1.bin"][1][0].astype(np.float64) / 255.0
    expected = (raw[2] - 0.4465) / 0.2616  # blue channel
    assert np.allclose(x[0, 2].numpy(), expected, atol=1e-5)


def test_cifar_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data_dir"):
        load_dataset("cifar10")
    with pytest.raises(DataError, match="data_batch_1.bin"):
        load_dataset("cifar10", tmp_path)
    write_cifar(tmp_path)
    bad = tmp_path / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(DataError, match="multiple of the 3073-byte") as info:
        load_dataset("cifar10", tmp_path)
    assert str(bad) in str(info.value)
    data, _, _ = cifar_records(2, 0)
    bad.write_bytes(data[:3073] + b"\x0a" + data[3074:])
    with pytest.raises(DataError, match="record 1 has label 10") as info:
        load_dataset("cifar10", tmp_path)
    assert str(bad) in str(info.value)
    (tmp_path / "test_batch.bin").unlink()
    bad.write_bytes(data)
    with pytest.raises(DataError, match="test_batch.bin: file not found"):
        load_dataset("cifar10", tmp_path)


# ---------------------------------------------------------------- built-in sets


def test_digits_split_and_shapes() -> None:
    pytest.importorskip("sklearn")
    ds = load_dataset("digits", seed=5)
    assert (len(ds), ds.num_test, ds.input_shape, ds.num_classes) == (1500, 297, (1, 8, 8), 10)
    assert ds.train_x.dtype == torch.float32
    x, y = ds.train_batch(torch.arange(len(ds)))
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3
    assert set(y.tolist()) == set(range(10))
    again = load_dataset("digits", seed=0)  # the split ignores the seed
    assert torch.equal(again.test_x, ds.test_x) and torch.equal(again.train_y, ds.train_y)


def test_synthetic_is_deterministic_and_shaped() -> None:
    kwargs = {"synthetic_train": 64, "synthetic_test": 16, "synthetic_shape": (3, 10, 12)}
    first = load_dataset("synthetic", seed=3, **kwargs)
    second = load_dataset("synthetic", seed=3, **kwargs)
    other = load_dataset("synthetic", seed=4, **kwargs)
    assert (len(first), first.num_test, first.input_shape, first.num_classes) == (64, 16, (3, 10, 12), 10)
    assert torch.equal(first.train_x, second.train_x) and torch.equal(first.test_y, second.test_y)
    assert not torch.equal(first.train_x, other.train_x)
    x, y = first.train_batch(torch.arange(64))
    assert x.shape == (64, 3, 10, 12) and y.dtype == torch.int64
    with pytest.raises(DataError):
        load_dataset("synthetic", synthetic_train=0)


def test_synthetic_is_learnable() -> None:
    """Nearest class centroid (estimated from the training set) is far above chance."""
    ds = load_dataset("synthetic", synthetic_train=2048, synthetic_test=512)
    x, y = ds.train_batch(torch.arange(len(ds)))
    centroids = torch.stack([x[y == c].mean(0).flatten() for c in range(10)])
    tx, ty = next(ds.test_batches(ds.num_test))
    predicted = torch.cdist(tx.flatten(1), centroids).argmin(1)
    assert (predicted == ty).float().mean() > 0.5


def test_test_batches_do_not_alias_float_storage() -> None:
    ds = load_dataset("synthetic", synthetic_train=8, synthetic_test=8, synthetic_shape=(1, 4, 4))
    before = ds.test_x.clone()
    for x, _ in ds.test_batches(4):
        x.add_(1.0)
    assert torch.equal(ds.test_x, before)


def test_unknown_dataset() -> None:
    with pytest.raises(DataError, match="imagenet") as info:
        load_dataset("imagenet")
    assert all(name in str(info.value) for name in DATASETS)
    assert issubclass(DataError, ValueError)
    assert DEFAULT_DIRS["cifar10"] is None


def test_dataset_rejects_inconsistent_tensors() -> None:
    x = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
    y = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(DataError):
        Dataset("bad", 10, (1, 2, 2), x, y, x, y)


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason="Fashion-MNIST is not installed")
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion-mnist")
    assert (len(ds), ds.num_test, ds.input_shape, ds.num_classes) == (60000, 10000, (1, 28, 28), 10)
    assert ds.train_x.dtype == torch.uint8 and ds.train_x.shape == (60000, 1, 28, 28)
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    x, y = ds.train_batch(torch.arange(0, 60000, 7))
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02


# ---------------------------------------------------------------- SliceSampler


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 50),
    global_batch=st.integers(1, 40),
    seed=st.integers(0, 2**40),
    iteration=st.integers(0, 30),
    cuts=st.lists(st.floats(0, 1), max_size=6),
)
def test_any_split_of_the_global_batch_concatenates_to_batch(n, global_batch, seed, iteration, cuts) -> None:
    sampler = SliceSampler(n, global_batch, seed)
    bounds = sorted({0, global_batch, *(int(c * global_batch) for c in cuts)})
    slices = [sampler.slice(iteration, a, b - a) for a, b in zip(bounds, bounds[1:])]
    assert torch.equal(torch.cat(slices), sampler.batch(iteration))
    fresh = SliceSampler(n, global_batch, seed)  # no hidden state: a new sampler agrees
    assert torch.equal(fresh.batch(iteration), sampler.batch(iteration))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 1000), epochs=st.integers(1, 4))
def test_each_epoch_is_a_permutation(n, seed, epochs) -> None:
    sampler = SliceSampler(n, 7, seed)
    stream = sampler.positions(0, n * epochs)
    for epoch in range(epochs):
        chunk = stream[epoch * n : (epoch + 1) * n]
        assert sorted(chunk.tolist()) == list(range(n))
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        assert torch.equal(chunk, torch.randperm(n, generator=generator))


def test_epoch_boundary_crossing() -> None:
    sampler = SliceSampler(10, 4, seed=1)
    assert [sampler.epoch_of(p) for p in (0, 9, 10, 25)] == [0, 0, 1, 2]
    stream = torch.cat([sampler.permutation(e) for e in range(3)])
    assert torch.equal(sampler.batch(2), stream[8:12])  # crosses epoch 0 -> 1
    assert torch.equal(sampler.slice(2, 1, 2), stream[9:11])
    assert torch.equal(sampler.positions(5, 22), stream[5:27])  # spans three epochs
    assert not torch.equal(sampler.permutation(0), sampler.permutation(1))
    assert sampler.positions(3, 0).numel() == 0


def test_slice_arguments_are_checked() -> None:
    sampler = SliceSampler(10, 4, seed=0)
    for args in [(0, 3, 2), (-1, 0, 1), (0, -1, 1), (0, 0, -1), (0, 0, 5)]:
        with pytest.raises(ValueError):
            sampler.slice(*args)
    for bad in [(0, 4, 0), (10, 0, 0), (10, 4, -1)]:
        with pytest.raises(ValueError):
            SliceSampler(*bad)


def test_returned_indices_are_private_copies() -> None:
    sampler = SliceSampler(10, 10, seed=0)
    first = sampler.batch(0)
    first.zero_()
    assert sorted(sampler.batch(0).tolist()) == list(range(10))


def test_digits_read_from_the_csv_equal_scikit_learns():
    from sklearn.datasets import load_digits

    from equipoise.data.load import _digits_arrays

    data, target = _digits_arrays()
    bunch = load_digits()
    assert (data == bunch.data).all() and (target == bunch.target).all() and data.shape == (1797, 64)


def test_arrays_round_trip_shares_memory_and_gives_the_same_batches() -> None:
    """What the Ray launcher ships once per node: the same batches, no copy of the
    images, and read-only arrays (as Ray's object store hands them out) are accepted."""
    from equipoise.data import Dataset, load_dataset

    data = load_dataset("digits")
    arrays = data.to_arrays()
    for k in ("train_x", "train_y", "test_x", "test_y"):
        arrays[k] = arrays[k].copy()
        arrays[k].flags.writeable = False
    back = Dataset.from_arrays(arrays)
    assert back.train_x.data_ptr() == arrays["train_x"].__array_interface__["data"][0]
    idx = torch.arange(0, len(data), 7)
    for a, b in zip(data.train_batch(idx), back.train_batch(idx)):
        assert torch.equal(a, b)
    assert (back.name, back.input_shape, back.num_test) == (data.name, data.input_shape, data.num_test)


def test_a_gzip_file_is_read_from_its_decompressed_copy_next_time(tmp_path: Path, monkeypatch) -> None:
    """The first read gunzips and keeps the content in the cache folder; the next reads
    it from there (gzip is not called), a copy whose length is not the gzip trailer's is
    not used, and a cache folder that cannot be written changes nothing but the time."""
    from equipoise.data import idx

    monkeypatch.setenv("EQUIPOISE_CACHE", str(tmp_path / "cache"))
    path = write_file(tmp_path / "x.gz", idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4), 0x803), True)
    first = idx.read_bytes(path)
    [copy] = (tmp_path / "cache" / "data").iterdir()
    assert copy.read_bytes() == first

    def no_gzip(*args, **kwargs):
        raise AssertionError("gunzipped again")

    monkeypatch.setattr(idx.gzip, "open", no_gzip)
    assert idx.read_bytes(path) == first
    copy.write_bytes(first[:-1])  # a copy cut short: not the trailer's length
    monkeypatch.undo()
    monkeypatch.setenv("EQUIPOISE_CACHE", str(tmp_path / "cache"))
    assert idx.read_bytes(path) == first and copy.read_bytes() == first  # gunzipped and written again
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv("EQUIPOISE_CACHE", str(tmp_path / "file"))  # not a folder: nothing is kept
    assert idx.read_bytes(path) == first
