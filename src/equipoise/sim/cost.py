"""The simulator's cost model.

Every time the simulator charges comes from here:

* a worker's step on x samples: (a + b·x) × (1 + ρ·(m·f − 1)) × two
  lognormal noise factors of mean 1, exp(N(−s²/2, s²)): one of the step's own
  (s = ``sim_noise``) and one all steps of its iteration share (s = ``sim_noise_shared``,
  the host or the job slowing down for everyone, correlated from one iteration to the
  next by ``sim_noise_shared_corr``); a, b per worker, ρ = ``sim_cpu_share``, f its
  scenario factor (``slowdown`` × ``trace``), m the stretch's CPU factor (next item). A
  slowdown stretches only the share of a step that is the worker's own CPU work, as the runtime's emulation does (worker/stretch.py: time spent
  waiting for a core another process of this machine holds is not multiplied); on
  machines of their own the share is 1 and the step takes f·(a + b·x);
* a stretched step may do more CPU work than an unstretched one: ×(1 + κ·(1 − 1/f)) at
  factor f > 1 (κ = ``sim_stretch_cpu``; 0 on machines that are slow of themselves). An
  emulated slowdown sleeps through the step (worker/stretch.py), and each wake-up may
  cost CPU (caches cooled by the host's other processes meanwhile, more so the larger
  the part of its step it sleeps, 1 − 1/f); the stretch then multiplies that extra CPU
  work too;
* on an emulation host (``sim_host_cores`` C > 0: every process of the job on one
  machine, as the validation runs are) the part of a step that is CPU work is shared
  out: a step's CPU work is c = ρ·(a + b·x) (× the factor above) and it takes
  c / r + (f − 1)·c, r the share of a core a runnable worker gets (processor sharing,
  ``host_rate``) given the workers computing at the same time, ``sim_host_exchange``
  runnable processes for each worker in an exchange (on one machine a message is CPU
  work: the copies, ZeroMQ's I/O threads, the server applying a push; counted in the
  event engine, host.py, where exchanges overlap steps) and ``sim_host_load`` other
  runnable processes;
* a message: ``sim_latency_s`` one way, plus bytes / ``sim_link_mbps`` on the worker's
  link for a push (the gradients) and for a pull (the weights);
* a server handling B bytes (receiving and applying a push, or sending a pull):
  B × max(1 / ``sim_server_mbps`` + (f − 1) / ``server_rate``, (1 − β) / its
  ``server_bandwidth`` cap), f its scenario factor — what a real server is charged for
  its emulated slowdown and cap (server/core.py): the cap is a token bucket that
  refills while the server works or sleeps out the slowdown, and β is the share of an
  iteration's bytes (a push and a pull per worker) its 5 ms burst lets through.

calibrate.py fits these keys to a real run (docs/simulate.md, Calibration).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import Config
from ..wire.bandwidth import TokenBucket

MB = 1e6
# Input shape, classes and training samples of each dataset, as load_dataset returns them
# (a unit test checks digits): the simulator needs the model's tensors and the epoch
# length, not the data.
SHAPES = {"fashion-mnist": ((1, 28, 28), 10, 60000), "mnist": ((1, 28, 28), 10, 60000),
          "digits": ((1, 8, 8), 10, 1500), "cifar10": ((3, 32, 32), 10, 50000),
          "synthetic": ((1, 28, 28), 10, 8192)}


def dataset_shape(cfg: Config) -> tuple:
    """(input_shape, num_classes, training samples) of the configured dataset: a built-in
    one's from SHAPES, a user provider's by building it here (shape and classes None when
    its training Dataset does not declare them)."""
    if cfg.dataset in SHAPES:
        return SHAPES[cfg.dataset]
    from ..workload import load_workload

    work = load_workload(cfg)
    return work.input_shape, work.num_classes, len(work)


def model_tensors_of(cfg: Config) -> list[tuple[str, int, str, int]]:
    """(name, numel, kind, itemsize) of the configured model, as the runtime cuts blocks."""
    from ..models import build_model
    from ..protocol.blocks import model_tensors

    shape, classes, _ = dataset_shape(cfg)
    return model_tensors(build_model(cfg.model, shape, classes, cfg.model_args))


def state_copies(cfg: Config) -> int:
    """Copies of a block a migration moves: values plus the optimizer's state."""
    return 3 if cfg.optimizer in ("adam", "adamw") else 2 if cfg.momentum > 0 else 1


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
        self.cores, self.load = cfg.sim_host_cores, cfg.sim_host_load
        self.exchange = cfg.sim_host_exchange
        self.overhead = cfg.sim_stretch_cpu
        self.shared = cfg.sim_noise_shared
        self.corr = cfg.sim_noise_shared_corr
        self._shared_rng, self._shared = np.random.default_rng([cfg.seed, 1]), np.ones(0)
        self._z = self._shared_rng.standard_normal() * self.shared  # stationary from the start

    def common(self, iteration: int) -> float:
        """The noise factor every step of ``iteration`` shares, exp(z − s²/2) with
        s = ``sim_noise_shared`` (mean 1) and z an AR(1) series of variance s² whose
        consecutive values correlate by ``sim_noise_shared_corr`` (a host's load comes
        and goes in waves longer than an iteration), drawn from a stream of its own
        (seeded by ``seed``) in iteration order."""
        if not self.shared:
            return 1.0
        while iteration >= len(self._shared):
            z = self._z
            more = []
            for e in self._shared_rng.standard_normal(64):
                z = self.corr * z + math.sqrt(1.0 - self.corr ** 2) * self.shared * e
                more.append(math.exp(z - self.shared ** 2 / 2))
            self._z, self._shared = z, np.concatenate([self._shared, more])
        return float(self._shared[iteration])

    def grow(self, n: int) -> None:
        """Costs for ranks up to n − 1: a joining worker beyond the lists gets their mean."""
        if n > len(self.a):
            self.a = np.concatenate([self.a, np.full(n - len(self.a), self.a.mean())])
            self.b = np.concatenate([self.b, np.full(n - len(self.b), self.b.mean())])

    def work(self, ranks: np.ndarray, batch: np.ndarray, rng: np.random.Generator,
             iteration: int = 0) -> np.ndarray:
        """(a + b·x) × the noise factors of each worker of ``ranks`` on ``batch`` samples
        in ``iteration``: its step at factor 1 as in the calibration run."""
        t = (self.a[ranks] + self.b[ranks] * batch) * self.common(iteration)
        return t * rng.lognormal(-self.noise ** 2 / 2, self.noise, len(t)) if self.noise else t

    def compute(self, ranks: np.ndarray, batch: np.ndarray, factors: np.ndarray,
                rng: np.random.Generator, iteration: int = 0) -> np.ndarray:
        """Seconds each worker of ``ranks`` takes for its step on ``batch`` samples, each on
        a machine of its own (an emulation host's steps are shared out by ``host_compute``
        and host.py instead)."""
        return self.work(ranks, batch, rng, iteration) * self.stretch(factors)

    def inflate(self, factor):
        """The CPU work of a step at scenario factor ``factor`` over that at factor 1:
        1 + κ·(1 − 1/f) for f > 1 (the emulation's wake-ups), else 1."""
        if not self.overhead:  # the event loop's scalar path, as cheap as it was without κ
            return 1.0
        f = np.maximum(np.asarray(factor, dtype=float), 1.0)
        m = 1.0 + self.overhead * (1.0 - 1.0 / f)
        return float(m) if m.ndim == 0 else m

    def cpu_work(self, work, factor):
        """CPU seconds of steps of ``work`` seconds of a + b·x (noise included) at
        scenario factor ``factor``: ρ·work, more when stretched (``inflate``)."""
        return self.share * work * self.inflate(factor)

    def stretch(self, factor):
        """How much longer a step takes at scenario factor ``factor`` (a float or an array):
        its CPU part ρ, inflated, × f, plus the rest."""
        return 1.0 + self.share * (self.inflate(factor) * factor - 1.0)

    def cpu(self, factor):
        """The ``cpu`` a worker reports at that factor: its CPU time over its step time."""
        return self.share * self.inflate(factor) / self.stretch(factor)

    def work_one(self, w: int, batch: float, rng: np.random.Generator, iteration: int = 0) -> float:
        """``work`` for one worker (the event loop's path: no arrays of one)."""
        t = (self.a[w] + self.b[w] * batch) * self.common(iteration)
        return t * rng.lognormal(-self.noise ** 2 / 2, self.noise) if self.noise else t

    def host_rate(self, factors: np.ndarray, others: float = 0.0) -> float:
        """r: the share of a core each runnable worker gets while the workers at scenario
        factors ``factors`` compute at once on ``sim_host_cores`` C cores beside
        ``sim_host_load`` L + ``others`` other runnable processes. A worker at f sleeps
        (f − 1)·c of its step (the emulation's stretch) and is runnable for c / r of it,
        so it competes for a core with probability p = 1 / (1 + r·(f − 1));
        r = min(1, C / (L + others + Σ p)), the fixed point of an increasing map, reached
        from r = 1 by iteration."""
        f = np.asarray(factors, dtype=float) - 1.0
        load = self.load + others
        r = 1.0
        for _ in range(100):
            new = min(1.0, self.cores / (load + float(np.sum(1.0 / (1.0 + r * f)))))
            if r - new < 1e-9:
                return new
            r = new
        return r

    def host_speed(self, factors: np.ndarray, others: float = 0.0) -> np.ndarray:
        """CPU seconds per second of steps at ``factors`` computing at once (host_rate's
        r): a step of CPU work c takes c / r + (f − 1)·c, so 1 / (1/r + f − 1)."""
        f = np.asarray(factors, dtype=float)
        return 1.0 / (1.0 / self.host_rate(f, others) + f - 1.0)

    def host_compute(self, start: np.ndarray, work: np.ndarray, factors: np.ndarray) -> np.ndarray:
        """Wall seconds of steps that start at ``start`` with ``work`` (seconds of a + b·x,
        noise included) under processor sharing of the host's cores: the core share r
        (``host_rate``) of the workers computing is recomputed whenever one starts or
        finishes, and each progresses at 1 / (1/r + f − 1) CPU seconds per second."""
        n = len(start)
        f = np.asarray(factors, dtype=float)
        left = self.cpu_work(np.asarray(work, dtype=float), f)  # CPU seconds still to do
        end = np.full(n, np.inf)
        t = float(start.min())
        while np.isinf(end).any():
            active = (start <= t) & np.isinf(end)
            waiting = start > t
            if not active.any():
                t = float(start[waiting].min())
                continue
            speed = self.host_speed(f[active])
            finish = left[active] / speed
            dt = min(float(finish.min()), float(start[waiting].min()) - t if waiting.any() else np.inf)
            idx = np.flatnonzero(active)
            left[idx] -= speed * dt
            t += dt
            end[idx[finish <= dt * (1.0 + 1e-12)]] = t
        return end - start

    def server_per_byte(self, factor: float, bandwidth_mbps: float, burst_share: float = 0.0) -> float:
        """Seconds a server at scenario factor ``factor`` behind a cap of ``bandwidth_mbps``
        (0: none) spends per byte it receives or sends. The cap is a token bucket
        (wire.bandwidth.TokenBucket) that refills while the server works or sleeps out its
        slowdown, so a message takes the longer of the two, not their sum; and the share
        ``burst_share`` of a busy period's bytes that the bucket's burst lets through (it
        fills while the server idles, as during the workers' compute) passes uncapped."""
        work = self.server + (factor - 1.0) / self.rate
        if bandwidth_mbps <= 0:
            return work
        return max(work, max(0.0, 1.0 - burst_share) / (bandwidth_mbps * MB))

    def burst_bytes(self, bandwidth_mbps: float) -> float:
        """Bytes a full bucket of a ``bandwidth_mbps`` cap lets through at once (the
        runtime's TokenBucket's default burst)."""
        return TokenBucket(bandwidth_mbps * MB).burst if bandwidth_mbps > 0 else 0.0


def _per_worker(values: tuple[float, ...], n: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return np.full(n, v[0]) if len(v) == 1 else v[:n].copy()


__all__ = ["CostModel", "MB", "SHAPES", "dataset_shape", "model_tensors_of", "state_copies"]
