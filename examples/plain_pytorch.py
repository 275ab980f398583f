"""Fashion-MNIST with a small CNN in plain PyTorch: one process, one training loop.

    python examples/plain_pytorch.py

examples/equipoise_pytorch.py is this script adapted to equipoise; every line it
changes is marked `# equipoise:`. The data are the IDX files of the Debian package
`dataset-fashion-mnist` (torchvision is not needed).
"""

import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530
BATCH, LR, MOMENTUM, EPOCHS = 128, 0.05, 0.9, 1


class Net(nn.Module):
    """Two 3x3 conv + ReLU + 2x2 max-pool stages, then a 128-unit hidden layer."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def make_model() -> nn.Module:
    return Net()


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format): magic, one big-endian size per dimension, bytes."""
    data = gzip.open(path, "rb").read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = "train" if split == "train" else "t10k"
    x = torch.from_numpy(read_idx(DATA / f"{prefix}-images-idx3-ubyte.gz").copy())
    y = torch.from_numpy(read_idx(DATA / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    return ((x.float() / 255 - MEAN) / STD).unsqueeze(1), y


def datasets() -> tuple[TensorDataset, TensorDataset]:
    """The training and test sets as map-style Datasets of (image, label)."""
    return TensorDataset(*load("train")), TensorDataset(*load("test"))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """One training step's loss: the mean cross-entropy over the batch."""
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(model: nn.Module) -> float:
    model.eval()
    x, y = load("test")
    correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in zip(x.split(1000), y.split(1000)))
    return correct / len(y)


def main() -> None:
    torch.manual_seed(0)
    model = make_model()
    train, _ = datasets()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model.train()
    for epoch in range(EPOCHS):
        for batch in DataLoader(train, batch_size=BATCH, shuffle=True):
            optimizer.zero_grad()
            loss_fn(model, batch).backward()
            optimizer.step()
    print(f"test accuracy: {evaluate(model):.4f}")


if __name__ == "__main__":
    main()
