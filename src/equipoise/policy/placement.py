"""Parameter blocks and their placement on servers (pure functions).

A block is a contiguous range of one flattened tensor of the model. Elementwise
optimizers (SGD with momentum and weight decay, Adam) give the same result whether they
step a whole tensor or its blocks, so cutting tensors changes nothing numerically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Block:
    key: int
    name: str          # the model parameter or buffer it belongs to
    start: int         # element range [start, stop) of the flattened tensor
    stop: int
    kind: str = "param"  # "param" (stepped by the optimizer) or "buffer" (averaged)
    itemsize: int = 4

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def to_list(self) -> list:
        return [self.key, self.name, self.start, self.stop, self.kind, self.itemsize]

    @classmethod
    def from_list(cls, row: Sequence) -> "Block":
        key, name, start, stop, kind, itemsize = row
        return cls(int(key), str(name), int(start), int(stop), str(kind), int(itemsize))


def make_blocks(tensors: Sequence[tuple[str, int, str, int]], block_size: int) -> list[Block]:
    """Cut tensors, given as (name, numel, kind, itemsize) in creation order, into blocks of
    at most `block_size` elements; keys count up from 0 in that order."""
    if block_size < 1:
        raise ValueError(f"block_size = {block_size} must be ≥ 1")
    blocks: list[Block] = []
    for name, numel, kind, itemsize in tensors:
        for start in range(0, max(numel, 1), block_size):
            stop = min(numel, start + block_size)
            blocks.append(Block(len(blocks), name, start, stop, kind, itemsize))
    return blocks


def greedy_placement(sizes: Sequence[int], servers: int) -> list[int]:
    """Longest-processing-time greedy by bytes: largest block first, onto the least loaded
    server (ties to the lowest index). Returns the server of each block."""
    if servers < 1:
        raise ValueError(f"servers = {servers} must be ≥ 1")
    load = [0] * servers
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = min(range(servers), key=lambda j: (load[j], j))
        owner[i] = j
        load[j] += sizes[i]
    return owner
