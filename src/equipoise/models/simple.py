"""Small models without normalisation or dropout layers: their output is a pure
function of the parameters and the input, so distributed BSP can be checked
against single-process SGD exactly."""

from __future__ import annotations

from torch import nn

MLP_HIDDEN = 256
CNN_CHANNELS = (32, 64)
CNN_HIDDEN = 128
CNN_MIN_SIDE = 4


def build_mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Flatten -> Linear(C*H*W, 256) -> ReLU -> Linear(256, num_classes)."""
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(channels * height * width, MLP_HIDDEN),
        nn.ReLU(),
        nn.Linear(MLP_HIDDEN, num_classes),
    )


def build_cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Two 3x3 conv (padding 1) + ReLU + 2x2 max-pool stages, then a 128-unit
    hidden layer: for 1x28x28 the flattened feature map is 64x7x7. Works for any
    H, W >= 4 (pooling floors odd sides); no BatchNorm, no dropout."""
    channels, height, width = input_shape
    if min(height, width) < CNN_MIN_SIDE:
        raise ValueError(f"cnn needs H, W >= {CNN_MIN_SIDE}, got {height}x{width}")
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
