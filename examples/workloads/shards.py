"""A dataset read lazily from files on disk: fixed-size records in shard files, each item
read with one positioned read (`os.pread`) when a worker asks for it. Nothing is held in
memory but the open files, so a dataset far larger than memory trains with a bounded
footprint (the page cache holds what the kernel likes; it is not the process's memory).

Each shard ``shard-00000.bin`` holds records of ``FEATURES`` float32 features followed by
one int64 label; ``meta.json`` gives the shard sizes. `write_shards` makes a learnable
synthetic set (the label is the argmax of a fixed linear map of the features).

    python examples/workloads/shards.py DIR SAMPLES     # write DIR
    equipoise train --set dataset=examples/workloads/shards.py:shards --set data_dir=DIR \\
        --set model=examples/workloads/shards.py:linear ...
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn

FEATURES = 64
CLASSES = 10
RECORD = FEATURES * 4 + 8  # bytes per record


def write_shards(directory: str | os.PathLike, samples: int, per_shard: int = 100_000, seed: int = 0,
                 eval_samples: int = 1000) -> Path:
    """Write `samples` training records (and `eval_samples` evaluation records) in shards."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    meta = {}
    for split, n in (("train", samples), ("eval", eval_samples)):
        sizes = []
        for k, start in enumerate(range(0, n, per_shard)):
            m = min(per_shard, n - start)
            x = rng.standard_normal((m, FEATURES)).astype(np.float32)
            y = (x @ w).argmax(1).astype(np.int64)
            rec = np.empty((m, RECORD), dtype=np.uint8)
            rec[:, : FEATURES * 4] = x.view(np.uint8).reshape(m, -1)
            rec[:, FEATURES * 4:] = y.view(np.uint8).reshape(m, -1)
            rec.tofile(root / f"{split}-{k:05d}.bin")
            sizes.append(m)
        meta[split] = sizes
    (root / "meta.json").write_text(json.dumps(meta))
    return root


class Shards(torch.utils.data.Dataset):
    """The records of one split, read on demand; item i is (features float32, label int64)."""

    def __init__(self, directory: str | os.PathLike, split: str = "train"):
        self.root, self.split = Path(directory), split
        self.sizes = json.loads((self.root / "meta.json").read_text())[split]
        self.starts = np.cumsum([0] + self.sizes)
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()  # loader threads open shards concurrently

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            with self._lock:
                fd = self._fds.get(shard)
                if fd is None:
                    fd = self._fds[shard] = os.open(self.root / f"{self.split}-{shard:05d}.bin", os.O_RDONLY)
        return fd  # os.pread is safe from several threads: it moves no shared file offset

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range [0, {len(self)})")
        shard = int(np.searchsorted(self.starts, i, side="right")) - 1
        raw = os.pread(self._fd(shard), RECORD, int(i - self.starts[shard]) * RECORD)
        if len(raw) != RECORD:
            raise OSError(f"{self.split}-{shard:05d}.bin: short read at record {i - self.starts[shard]}")
        x = torch.frombuffer(bytearray(raw[: FEATURES * 4]), dtype=torch.float32)
        y = torch.frombuffer(bytearray(raw[FEATURES * 4:]), dtype=torch.int64)[0]
        return x, y

    def __getstate__(self):  # open files (and the lock) do not travel
        return {k: v for k, v in self.__dict__.items() if k not in ("_fds", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _fds={}, _lock=threading.Lock())


def shards(data_dir: str):
    if not data_dir:
        raise ValueError("set data_dir to the folder write_shards made")
    return {"train": Shards(data_dir, "train"), "eval": Shards(data_dir, "eval")}


def linear() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


if __name__ == "__main__":
    write_shards(sys.argv[1], int(sys.argv[2]))
