"""A worker's input pipeline: the next slice's samples load while this one computes.

`Loader.get(start, size)` returns the collated batch at stream positions
[start, start+size) of the global sample order and records how long the worker waited
for it (`data_s`). With ``loader_workers = k > 0``, `prefetch(start, size)` reads a
slice's samples on k threads in the background (each thread a contiguous chunk; a
dataset with ``get_batch`` is read whole, on one of them), so a slow ``__getitem__``
(decoding files, reading disk) hides behind the step. Under a barrier the worker
prefetches the slice it expects next (its offset in the next iteration is usually the
same) as soon as it has this one; it also prefetches the slice a plan names when the plan
arrives, which under the protocols without a barrier is just before the step needs it,
so there the read overlaps only the rest of the exchange. A guess that was wrong is
dropped and the slice is read then. What is held is the pending slice's samples, and
those of a dropped guess still being read: at most about two slices.

Threads, not processes: a ``__getitem__`` that holds the GIL (pure Python work) does not
overlap compute; one that waits on files or calls into C code that releases the GIL
(numpy, torch, most decoders) does.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from .sampler import SliceSampler


class Loader:
    def __init__(self, work, sampler: SliceSampler, threads: int = 0, timeout: float = 120.0):
        self.work, self.sampler, self.threads, self.timeout = work, sampler, int(threads), timeout
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="loader") if self.threads else None
        self._pending: tuple[int, int, list[Future]] | None = None
        self.data_s = 0.0  # the last `get`'s wait
        self._whole = hasattr(work.train, "get_batch")  # read as one batch, not item by item

    def prefetch(self, start: int, size: int) -> None:
        """Start reading [start, start+size) in the background (no-op without threads,
        or if that slice is already pending)."""
        if self._pool is None or size <= 0:
            return
        if self._pending is not None and self._pending[:2] == (start, size):
            return
        self._drop()
        idx = self.sampler.positions(start, size)
        train = self.work.train
        if self._whole:
            futures = [self._pool.submit(self.work.fetch, train, idx)]
        else:
            chunks = torch.tensor_split(idx, min(self.threads, len(idx)))
            futures = [self._pool.submit(self.work.items, train, c) for c in chunks]
        self._pending = (start, size, futures)

    def get(self, start: int, size: int):
        """The batch at [start, start+size): the prefetched one if it is that slice,
        else read now (on the loader threads, if any)."""
        t0 = time.perf_counter()
        if self._pending is not None and self._pending[:2] != (start, size):
            self._drop()  # a wrong guess
        if self._pending is None:
            self.prefetch(start, size)  # on the loader threads, if any
        if self._pending is not None:
            futures = self._pending[2]
            self._pending = None
            deadline = t0 + self.timeout
            try:
                parts = [f.result(timeout=max(0.0, deadline - time.perf_counter())) for f in futures]
            except FutureTimeout:
                raise TimeoutError(f"reading samples [{start}, {start + size}) of the stream took more than "
                                   f"{self.timeout:g} s") from None
            batch = parts[0] if self._whole else self.work.collate_items([item for part in parts for item in part])
        else:
            batch = self.work.fetch(self.work.train, self.sampler.positions(start, size))
        self.data_s = time.perf_counter() - t0
        return batch

    def _drop(self) -> None:
        if self._pending is not None:
            for f in self._pending[2]:
                f.cancel()
            self._pending = None

    def close(self) -> None:
        """Stop: nothing more is read; a read under way is not waited for."""
        self._drop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["Loader"]
