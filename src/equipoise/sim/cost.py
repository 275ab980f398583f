"""The simulator's cost model.

Every time the simulator charges comes from here:

* a worker's step on x samples: (a + b·x) × (1 + (f − 1)·``sim_cpu_share``) × a lognormal
  noise factor exp(N(0, ``sim_noise``²)); a, b per worker, f its scenario factor
  (``slowdown`` × ``trace``). A slowdown stretches only the share of a step that is the
  worker's own CPU work, as the runtime's emulation does (runtime/stretch.py: time spent
  waiting for a core another process of this machine holds is not multiplied); on
  machines of their own the share is 1 and the step takes f·(a + b·x);
* a message: ``sim_latency_s`` one way, plus bytes / ``sim_link_mbps`` on the worker's
  link for a push (the gradients) and for a pull (the weights);
* a server handling B bytes (receiving and applying a push, or sending a pull):
  B × (1 / ``sim_server_mbps`` + 1 / its ``server_bandwidth`` cap + (f − 1) / ``server_rate``),
  f its scenario factor — the last two terms are exactly what a real server is charged
  for its emulated cap and slowdown (runtime/server.py), so a server that is f× slower
  in a real run is f× slower here.

calibrate.py fits these keys to a real run (docs/simulate.md, Calibration).
"""

from __future__ import annotations

import numpy as np

from ..config import Config

MB = 1e6
# Input shape, classes and training samples of each dataset, as load_dataset returns them
# (a unit test checks digits): the simulator needs the model's tensors and the epoch
# length, not the data.
SHAPES = {"fashion-mnist": ((1, 28, 28), 10, 60000), "mnist": ((1, 28, 28), 10, 60000),
          "digits": ((1, 8, 8), 10, 1500), "cifar10": ((3, 32, 32), 10, 50000),
          "synthetic": ((1, 28, 28), 10, 8192)}


def model_tensors_of(cfg: Config) -> list[tuple[str, int, str, int]]:
    """(name, numel, kind, itemsize) of the configured model, as the runtime cuts blocks."""
    from ..models import build_model
    from ..runtime.blocks import model_tensors

    shape, classes, _ = SHAPES[cfg.dataset]
    return model_tensors(build_model(cfg.model, shape, classes))


def state_copies(cfg: Config) -> int:
    """Copies of a block a migration moves: values plus the optimizer's state."""
    return 3 if cfg.optimizer == "adam" else 2 if cfg.momentum > 0 else 1


class CostModel:
    """The cost model of a Config's ``sim_*`` keys (arrays indexed by worker rank)."""

    def __init__(self, cfg: Config, ranks: int | None = None):
        n = ranks or cfg.workers
        self.a = _per_worker(cfg.sim_compute_s, n)
        self.b = _per_worker(cfg.sim_sample_s, n)
        self.noise = cfg.sim_noise
        self.share = cfg.sim_cpu_share
        self.latency = cfg.sim_latency_s
        self.link = 1.0 / (cfg.sim_link_mbps * MB) if cfg.sim_link_mbps else 0.0  # s per byte
        self.server = 1.0 / (cfg.sim_server_mbps * MB) if cfg.sim_server_mbps else 0.0
        self.rate = cfg.server_rate * MB

    def grow(self, n: int) -> None:
        """Costs for ranks up to n − 1: a joining worker beyond the lists gets their mean."""
        if n > len(self.a):
            self.a = np.concatenate([self.a, np.full(n - len(self.a), self.a.mean())])
            self.b = np.concatenate([self.b, np.full(n - len(self.b), self.b.mean())])

    def compute(self, ranks: np.ndarray, batch: np.ndarray, factors: np.ndarray,
                rng: np.random.Generator) -> np.ndarray:
        """Seconds each worker of ``ranks`` takes for its step on ``batch`` samples."""
        t = (self.a[ranks] + self.b[ranks] * batch) * self.stretch(factors)
        return t * rng.lognormal(0.0, self.noise, len(t)) if self.noise else t

    def stretch(self, factor):
        """How much longer a step takes at scenario factor ``factor`` (a float or an array)."""
        return 1.0 + (factor - 1.0) * self.share

    def cpu(self, factor):
        """The ``cpu`` a worker reports at that factor: its CPU time over its step time."""
        return self.share / self.stretch(factor)

    def compute_one(self, w: int, batch: float, factor: float, rng: np.random.Generator) -> float:
        """``compute`` for one worker (the event loop's path: no arrays of one)."""
        t = (self.a[w] + self.b[w] * batch) * self.stretch(factor)
        return t * rng.lognormal(0.0, self.noise) if self.noise else t

    def server_per_byte(self, factor: float, bandwidth_mbps: float) -> float:
        """Seconds a server at scenario factor ``factor`` behind a cap of ``bandwidth_mbps``
        (0: none) spends per byte it receives or sends."""
        cap = 1.0 / (bandwidth_mbps * MB) if bandwidth_mbps > 0 else 0.0
        return self.server + cap + (factor - 1.0) / self.rate


def _per_worker(values: tuple[float, ...], n: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return np.full(n, v[0]) if len(v) == 1 else v[:n].copy()


__all__ = ["CostModel", "MB", "SHAPES", "model_tensors_of", "state_copies"]
