"""The global sample order shared by every worker of a job."""

from __future__ import annotations

from collections import OrderedDict

import torch

SEED_STRIDE = 1_000_003
CACHED_EPOCHS = 4


def _check_non_negative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")


class SliceSampler:
    """The global sample order: a seeded permutation of range(n) per epoch
    (torch.Generator seeded with seed*1_000_003 + epoch), concatenated into one
    endless stream. Iteration t of a job with global batch X covers stream
    positions [t*X, (t+1)*X); a worker's slice is a contiguous sub-range of that.
    Because slices are contiguous ranges of one stream, any split of the global
    batch among workers covers exactly the samples single-process SGD with batch
    X would use.

    The permutations of the few most recently used epochs are cached, so calling
    ``slice`` every iteration costs one index copy, not a ``randperm``.
    """

    def __init__(self, n: int, global_batch: int, seed: int) -> None:
        if n <= 0:
            raise ValueError(f"n (dataset size) must be positive, got {n}")
        if global_batch <= 0:
            raise ValueError(f"global_batch must be positive, got {global_batch}")
        _check_non_negative(seed=seed)
        self.n = int(n)
        self.global_batch = int(global_batch)
        self.seed = int(seed)
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()

    def __repr__(self) -> str:
        return f"SliceSampler(n={self.n}, global_batch={self.global_batch}, seed={self.seed})"

    def permutation(self, epoch: int) -> torch.Tensor:
        """The int64 permutation of range(n) that epoch ``epoch`` visits (cached;
        do not modify the returned tensor)."""
        _check_non_negative(epoch=epoch)
        perm = self._cache.get(epoch)
        if perm is None:
            generator = torch.Generator().manual_seed((self.seed * SEED_STRIDE + epoch) % 2**64)
            perm = torch.randperm(self.n, generator=generator, dtype=torch.int64)
            self._cache[epoch] = perm
            while len(self._cache) > CACHED_EPOCHS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(epoch)
        return perm

    def epoch_of(self, position: int) -> int:
        """The epoch that stream position ``position`` falls in."""
        _check_non_negative(position=position)
        return position // self.n

    def positions(self, start: int, size: int) -> torch.Tensor:
        """Sample indices (int64, a fresh tensor) at stream positions
        [start, start+size); the range may cross one or more epoch boundaries."""
        _check_non_negative(start=start, size=size)
        parts = []
        position, stop = start, start + size
        while position < stop:
            epoch, offset = divmod(position, self.n)
            take = min(stop - position, self.n - offset)
            parts.append(self.permutation(epoch)[offset : offset + take])
            position += take
        if not parts:
            return torch.empty(0, dtype=torch.int64)
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    def slice(self, iteration: int, offset: int, size: int) -> torch.Tensor:
        """Indices of the ``size`` samples starting ``offset`` into iteration
        ``iteration``'s global batch; ValueError if any argument is negative or the
        slice runs past the global batch (offset + size > global_batch)."""
        _check_non_negative(iteration=iteration, offset=offset, size=size)
        if offset + size > self.global_batch:
            raise ValueError(
                f"slice [{offset}, {offset + size}) exceeds global batch {self.global_batch}"
            )
        return self.positions(iteration * self.global_batch + offset, size)

    def batch(self, iteration: int) -> torch.Tensor:
        """Indices of iteration ``iteration``'s whole global batch."""
        return self.slice(iteration, 0, self.global_batch)
