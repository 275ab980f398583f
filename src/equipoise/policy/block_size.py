"""How large a parameter block is when the configuration leaves it to the model
(`block_size = 0`): a pure function of the model's tensors and the servers' count, so
that a resumed job cuts the same blocks.

An exchange that streams its blocks (backward_push, forward_pull, eager_update)
overlaps all but about two parts' link time (the first up, the last down): 1/8 of a
server's share cut in AUTO_PARTS = 16. A part also costs the server a fixed quarter of
a millisecond or so besides checking and updating its bytes (bench_wire's streamed
profile): about 5% of a 64 KiB part's link time at 100 Mbit/s (AUTO_MIN float32), but
half of it at 1 Gbit/s, so these sizes are for slow links. AUTO_MAX is the default
block size: larger blocks only lengthen the pipeline's fill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

AUTO_PARTS: Final = 16
AUTO_MIN: Final = 16_384
AUTO_MAX: Final = 262_144


def auto_block_size(tensors: Sequence[tuple[str, int, str, int]], servers: int) -> int:
    """The block size `block_size = 0` stands for: each of `servers` servers' share of
    `tensors` (name, numel, kind, itemsize) in AUTO_PARTS blocks, clamped to
    [AUTO_MIN, AUTO_MAX] elements — the floor lowered to a server's whole share where
    that is smaller (a small model on many servers: every server still gets blocks)."""
    if servers < 1:
        raise ValueError(f"servers = {servers} must be ≥ 1")
    total = sum(numel for _, numel, _, _ in tensors)
    floor = max(1, min(AUTO_MIN, math.ceil(total / servers)))
    return min(AUTO_MAX, max(floor, math.ceil(total / (AUTO_PARTS * servers))))


def resolve_block_size(block_size: int, tensors: Sequence[tuple[str, int, str, int]], servers: int) -> int:
    """`block_size` as configured: 0 (auto) becomes `auto_block_size`."""
    return auto_block_size(tensors, servers) if block_size == 0 else block_size
