"""The in-memory dataset container shared by every loader, and the data error type.

Images are stored compactly -- ``uint8`` for real image datasets, ``float32`` for
the synthetic and digits sets -- and are scaled and normalised per batch, so a
loaded dataset costs what its raw pixels cost and not four times that.
"""

from __future__ import annotations

from collections.abc import Iterator
import warnings
from dataclasses import dataclass, field

import torch


class DataError(ValueError):
    """A dataset could not be loaded. The message is one line naming the file or
    setting and what is wrong with it."""


def one_line(text: object) -> str:
    """``str(text)`` with line breaks collapsed, for embedding in one-line messages."""
    return " ".join(str(text).split())


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset held in memory, with a fixed train/test split.

    ``train_x``/``test_x`` are ``(N, C, H, W)`` tensors of raw pixel values
    (``uint8`` or ``float32``); ``train_y``/``test_y`` are ``int64`` labels in
    ``[0, num_classes)``. A batch is returned as
    ``(x * pixel_scale - mean[c]) / std[c]`` in ``float32``, computed the same way
    for every caller so that any process extracting the same indices gets
    bit-identical inputs.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]
    train_x: torch.Tensor = field(repr=False)
    train_y: torch.Tensor = field(repr=False)
    test_x: torch.Tensor = field(repr=False)
    test_y: torch.Tensor = field(repr=False)
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    pixel_scale: float = 1.0
    _shift: torch.Tensor = field(init=False, repr=False)
    _scale: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Check shapes and dtypes agree; precompute the normalisation constants."""
        self._check()
        channels = self.input_shape[0]
        mean = torch.tensor(self.mean, dtype=torch.float64).reshape(1, channels, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float64).reshape(1, channels, 1, 1)
        object.__setattr__(self, "_scale", (self.pixel_scale / std).float())
        object.__setattr__(self, "_shift", (-mean / std).float())

    def _check(self) -> None:
        shape = tuple(self.input_shape)
        if len(shape) != 3 or min(shape) <= 0:
            raise DataError(f"dataset {self.name!r}: bad input_shape {shape}")
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if tuple(x.shape[1:]) != shape or x.shape[0] != y.shape[0] or y.dim() != 1:
                raise DataError(
                    f"dataset {self.name!r}: {split} images {tuple(x.shape)} and labels "
                    f"{tuple(y.shape)} do not match input_shape {shape}"
                )
            if x.dtype not in (torch.uint8, torch.float32) or y.dtype != torch.int64:
                raise DataError(f"dataset {self.name!r}: {split} dtypes {x.dtype}/{y.dtype} unsupported")
        if len(self.mean) != shape[0] or len(self.std) != shape[0]:
            raise DataError(f"dataset {self.name!r}: mean/std need {shape[0]} channel values")

    _ARRAYS = ("train_x", "train_y", "test_x", "test_y")

    def to_arrays(self) -> dict:
        """The dataset as numpy arrays and plain values (no copy), for a launcher to place
        in shared memory once per machine; :meth:`from_arrays` reads it back."""
        out = {k: getattr(self, k).numpy() for k in self._ARRAYS}
        return {**out, "name": self.name, "num_classes": self.num_classes, "input_shape": list(self.input_shape),
                "mean": list(self.mean), "std": list(self.std), "pixel_scale": self.pixel_scale}

    @classmethod
    def from_arrays(cls, d: dict) -> "Dataset":
        """A Dataset over the arrays of :meth:`to_arrays`, sharing their memory (read-only
        arrays stay read-only: nothing here writes to the images or labels)."""
        with warnings.catch_warnings():  # torch warns that a read-only array stays read-only
            warnings.simplefilter("ignore", UserWarning)
            arrays = {k: torch.from_numpy(d[k]) for k in cls._ARRAYS}
        return cls(name=d["name"], num_classes=int(d["num_classes"]), input_shape=tuple(d["input_shape"]),
                   mean=tuple(d["mean"]), std=tuple(d["std"]), pixel_scale=float(d["pixel_scale"]), **arrays)

    def __len__(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test samples."""
        return int(self.test_x.shape[0])

    def _normalise(self, raw: torch.Tensor) -> torch.Tensor:
        # Out of place: ``raw`` may be a view of the stored float32 images.
        return torch.addcmul(self._shift, raw.to(torch.float32), self._scale)

    def train_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training samples at indices ``idx`` (1-D int64): ``x`` float32 ``(B, C, H, W)``
        normalised, ``y`` int64 ``(B,)``. Out-of-range indices raise IndexError."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        return self._normalise(self.train_x[idx]), self.train_y[idx]

    def split(self, which: str) -> "ArraySplit":
        """The training (``"train"``) or test (``"test"``) split as a map-style dataset."""
        return ArraySplit(self, which)

    def test_batches(self, batch_size: int = 1000) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The whole test set in order, as normalised ``(x, y)`` batches of at most
        ``batch_size`` samples (the last one may be smaller)."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        for start in range(0, self.num_test, batch_size):
            stop = start + batch_size
            yield self._normalise(self.test_x[start:stop]), self.test_y[start:stop]


class ArraySplit(torch.utils.data.Dataset):
    """One split of a built-in :class:`Dataset` as a map-style torch Dataset: item i is
    ``(x, y)``, x normalised float32 ``(C, H, W)``, y an int64 scalar. ``get_batch(idx)``
    returns the collated batch at once (one gather and one normalisation instead of a
    Python call per sample): the loader uses it wherever a dataset has one, and any
    user dataset may define it too. It gives bit-identical values to collating the
    items one by one (the normalisation is elementwise)."""

    def __init__(self, data: Dataset, which: str):
        if which not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {which!r}")
        self.data, self.which = data, which
        self.x, self.y = (data.train_x, data.train_y) if which == "train" else (data.test_x, data.test_y)
        self.input_shape, self.num_classes = tuple(data.input_shape), data.num_classes

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(torch.tensor([int(i)]))
        return x[0], y[0]

    def get_batch(self, idx) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(idx, dtype=torch.int64)
        return self.data._normalise(self.x[idx]), self.y[idx]

    def __repr__(self) -> str:
        return f"{self.data.name}[{self.which}]"
