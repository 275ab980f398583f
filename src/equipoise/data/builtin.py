"""Datasets that need no files: scikit-learn's bundled digits, and a synthetic
learnable classification problem generated from a seed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from equipoise.data.dataset import DataError, Dataset

DIGITS_TRAIN = 1500
DIGITS_SPLIT_SEED = 0
SYNTHETIC_CLASSES = 10
SYNTHETIC_SIGNAL = 0.6  # std of the class-mean images
SYNTHETIC_NOISE = 0.8  # std of the per-sample Gaussian noise


def load_digits_dataset() -> Dataset:
    """scikit-learn's 8x8 digits (1797 images, values 0..16) as ``(1, 8, 8)``
    float32 images: a fixed split (seed 0 permutation, first 1500 train, 297 test)
    independent of any caller seed, normalised with the training split's mean/std."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise DataError(
            "digits: scikit-learn is not installed: `pip install scikit-learn` to use it"
        ) from exc
    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    generator = torch.Generator().manual_seed(DIGITS_SPLIT_SEED)
    order = torch.randperm(x.shape[0], generator=generator)
    train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    scaled = x[train].double() / 16.0
    return Dataset(
        name="digits",
        num_classes=10,
        input_shape=(1, 8, 8),
        train_x=x[train].contiguous(),
        train_y=y[train].contiguous(),
        test_x=x[test].contiguous(),
        test_y=y[test].contiguous(),
        mean=(float(scaled.mean()),),
        std=(float(scaled.std()),),
        pixel_scale=1.0 / 16.0,
    )


def _class_means(shape: tuple[int, int, int], generator: torch.Generator) -> torch.Tensor:
    """One smooth random image per class: coarse Gaussian noise upsampled
    bilinearly, so the signal has spatial structure a CNN can exploit."""
    channels, height, width = shape
    coarse = (max(1, height // 4), max(1, width // 4))
    means = torch.randn(SYNTHETIC_CLASSES, channels, *coarse, generator=generator)
    means = F.interpolate(means, size=(height, width), mode="bilinear", align_corners=False)
    return means * (SYNTHETIC_SIGNAL / means.std().clamp_min(1e-6))


def _samples(means: torch.Tensor, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, SYNTHETIC_CLASSES, (count,), generator=generator)
    noise = torch.randn(count, *means.shape[1:], generator=generator)
    return (means[labels] + SYNTHETIC_NOISE * noise).contiguous(), labels


def load_synthetic(seed: int, num_train: int, num_test: int, shape: tuple[int, int, int]) -> Dataset:
    """A learnable 10-class problem: each sample is its class's mean image plus
    Gaussian noise. Entirely determined by ``seed``, the counts and ``shape``;
    images are float32, roughly zero-mean unit-variance (normalisation is identity)."""
    shape = tuple(int(v) for v in shape)
    if len(shape) != 3 or min(shape) <= 0:
        raise DataError(f"synthetic: shape must be three positive ints (C, H, W), got {shape}")
    if num_train <= 0 or num_test <= 0:
        raise DataError(f"synthetic: sample counts must be positive, got train={num_train} test={num_test}")
    generator = torch.Generator().manual_seed(seed % 2**64)
    means = _class_means(shape, generator)
    train_x, train_y = _samples(means, num_train, generator)
    test_x, test_y = _samples(means, num_test, generator)
    return Dataset(
        name="synthetic",
        num_classes=SYNTHETIC_CLASSES,
        input_shape=shape,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        mean=(0.0,) * shape[0],
        std=(1.0,) * shape[0],
        pixel_scale=1.0,
    )
