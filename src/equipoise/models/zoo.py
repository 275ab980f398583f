"""The built-in architectures.

``mlp``, ``mlp-deep`` and ``cnn`` have no normalisation or dropout layers: their output is a
pure function of the parameters and the input, so distributed BSP can be checked
against single-process SGD exactly.

``resnet20`` is ResNet-20 for CIFAR-sized inputs (He et al., "Deep Residual
Learning for Image Recognition", 2016, section 4.2): a 3x3 conv with 16 filters,
then 3 stages of 3 basic blocks with 16, 32 and 64 channels (stages 2 and 3 start
with stride 2), global average pooling and a linear classifier. Shortcuts are
option A (parameter-free: spatial subsampling plus zero-padded channels), as in
the paper. It has BatchNorm, so its training-mode output depends on the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MLP_HIDDEN = 256
DEEP_MLP_HIDDEN = (512, 512, 512)
CNN_CHANNELS = (32, 64)
CNN_HIDDEN = 128
MIN_SIDE = 4
STAGE_CHANNELS = (16, 32, 64)
BLOCKS_PER_STAGE = 3


def build_mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Flatten -> Linear(C*H*W, 256) -> ReLU -> Linear(256, num_classes)."""
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(channels * height * width, MLP_HIDDEN),
        nn.ReLU(),
        nn.Linear(MLP_HIDDEN, num_classes),
    )


def build_mlp_deep(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Flatten -> three Linear(·, 512) + ReLU -> Linear(512, num_classes): for 1x28x28,
    0.40 M + 0.26 M + 0.26 M parameters in its first three layers, so its weight is
    spread over several large tensors (unlike ``cnn``, whose first fully connected layer
    holds most of it)."""
    channels, height, width = input_shape
    layers: list[nn.Module] = [nn.Flatten()]
    width_in = channels * height * width
    for hidden in DEEP_MLP_HIDDEN:
        layers += [nn.Linear(width_in, hidden), nn.ReLU()]
        width_in = hidden
    layers.append(nn.Linear(width_in, num_classes))
    return nn.Sequential(*layers)


def build_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Two 3x3 conv (padding 1) + ReLU + 2x2 max-pool stages, then a 128-unit
    hidden layer: for 1x28x28 the flattened feature map is 64x7x7. Works for any
    H, W >= 4 (pooling floors odd sides); no BatchNorm, no dropout."""
    channels, height, width = input_shape
    if min(height, width) < MIN_SIDE:
        raise ValueError(f"cnn needs H, W >= {MIN_SIDE}, got {height}x{width}")
    first, second = CNN_CHANNELS
    flat = second * (height // 2 // 2) * (width // 2 // 2)
    return nn.Sequential(
        nn.Conv2d(channels, first, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(first, second, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, CNN_HIDDEN),
        nn.ReLU(),
        nn.Linear(CNN_HIDDEN, num_classes),
    )


class PadShortcut(nn.Module):
    """Option-A shortcut: take every ``stride``-th pixel and zero-pad the channel
    dimension from ``in_channels`` up to ``out_channels`` (split evenly)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = out_channels - in_channels
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, *self.pad))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = PadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20 (0.27 M parameters for 10 classes) for ``(C, H, W)`` inputs;
    designed for 32x32 and works for any H, W >= 4 (e.g. 28x28)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        width = STAGE_CHANNELS[0]
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks = []
        for stage, channels in enumerate(STAGE_CHANNELS):
            for index in range(BLOCKS_PER_STAGE):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(width, channels, stride))
                width = channels
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.pool(self.blocks(out))
        return self.fc(torch.flatten(out, 1))


def build_resnet20(input_shape: tuple[int, int, int], num_classes: int) -> ResNet20:
    """ResNet-20 for ``input_shape`` = (C, H, W) with H, W >= 4."""
    channels, height, width = input_shape
    if min(height, width) < MIN_SIDE:
        raise ValueError(f"resnet20 needs H, W >= {MIN_SIDE}, got {height}x{width}")
    return ResNet20(channels, num_classes)
