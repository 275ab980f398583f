"""Test-set evaluation of a set of block values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, data, batch_size: int = 1000, limit: int = 0) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of `model` over the test set (its first `limit`
    samples if limit > 0)."""
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in data.test_batches(batch_size):
        if limit and count >= limit:
            break
        if limit:
            x, y = x[:limit - count], y[:limit - count]
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").item()
        correct += int((out.argmax(1) == y).sum())
        count += len(y)
    return loss / max(count, 1), correct / max(count, 1)
