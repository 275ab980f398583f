"""Data for benchmarks/gpu_check.py that needs nothing on the GPU machine: CIFAR-sized
images (3×32×32) labelled by a fixed random teacher (a linear map; learnable, so the
accuracy is a sanity check, not a result), generated from a seed in every process alike."""

from __future__ import annotations

import torch

TRAIN, TEST, CLASSES = 8192, 1024, 10


class Images(torch.utils.data.Dataset):
    input_shape = (3, 32, 32)
    num_classes = CLASSES

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        teacher = torch.randn(3 * 32 * 32, CLASSES, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x.flatten(1) @ teacher).argmax(1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def images(data_dir: str | None = None):
    """(train, test) of the synthetic images."""
    return Images(TRAIN, 0), Images(TEST, 1)
