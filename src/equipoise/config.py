"""Every setting of a training job, in one frozen dataclass, read in groups.

A `Config` is built from defaults, a TOML file and ``--set KEY=VALUE`` overrides, in that
order. Its keys fall into groups (config_toml.GROUPS: scaling, training, optimizer, data,
eval, batching, exchange, servers, failure, ray, observability, and apart from what a
production job sets, emulation and sim); `Config.group(name)` is one group as a frozen
dataclass of its own. Validation happens once, group by group (config_checks.py), and
every error is a `ConfigError` whose message is one line naming the key and the bad
value, so the CLI can print it and exit with status 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from dataclasses import MISSING as _MISSING
from typing import Any, Mapping, TypeVar

from .config_checks import ARGS_KEYS, BARRIER_PROTOCOLS, PROTOCOLS, validate
from .config_toml import (GROUPS, USER_CODE, ConfigError, absolute_specs, flatten_tables, parse_override,
                          read_toml, to_toml, to_toml_tables)

RESOURCE_KEYS = ("worker_resources", "server_resources")
T = TypeVar("T")


class EquipoiseWarning(UserWarning):
    """Advice about a configuration that runs but may not train well."""


# The default job (no config given: a bare `equipoise train`, `equipoise.train()`): the
# defaults, which are PyTorch's where PyTorch has the key, plus these; examples/default.toml
# writes it out.
DEFAULT_JOB = {"momentum": 0.9}


@dataclass(frozen=True)
class Config:
    """The resolved configuration of one job. Field docs live in docs/configuration.md."""

    protocol: str = "bsp"
    workers: int = 4
    servers: int = 2
    global_batch: int = 128
    worker_batch: int = 0  # μ per worker; if set, global_batch = worker_batch × workers
    reference_batch: int = 0  # warn when μ·λ is far from it (Rudra's μλ finding); 0: off
    softsync_n: int = 0  # n-softsync: update every ⌊workers/n⌋ gradients; 0: n = workers
    staleness_bound: int = 0  # SSP: the fastest worker runs at most this many iterations ahead
    lr_modulation: str = "none"  # none | per_gradient (α0/σ) | mean (α0/⟨σ⟩)
    async_scaling: str = "bsp"  # bsp: BSP's lr and momentum carried over to asp/softsync/ssp | none
    delay_compensation: str = "none"  # none | dc | dc_adaptive (DC-ASGD, Zheng et al. 2017)
    dc_lambda: float = 0.0  # DC-ASGD's λ (λ0 for dc_adaptive); > 0 when delay_compensation is set
    overlap: bool = False  # non-barrier protocols: pull the next weights while computing
    backward_push: bool = False  # push each block's gradient while backward still runs
    fragment_kb: int = 256  # backward_push, forward_pull: the least a part of a push or a pull carries (KiB); 0: a block's
    forward_pull: bool = False  # the forward starts on the first layers' weights, the rest still arriving
    eager_update: bool = False  # bsp/lbbsp with both above: each block updated and sent once all its gradients are in
    iterations: int = 0  # 0: derived from `epochs`
    epochs: float = 1.0
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.0  # torch.optim.SGD's default; the default job (DEFAULT_JOB) sets 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    lr_step_size: int = 100
    lr_gamma: float = 0.1
    warmup_iterations: int = 0  # linear warm-up: lr × (t + 1)/(W + 1) for iteration t < W, then the schedule
    lr_min: float = 0.0  # the cosine schedule's floor (CosineAnnealingLR's eta_min)
    clip_grad_norm: float = 0.0  # > 0: clip the update's gradient to this global L2 norm (clip_grad_norm_)
    model: str = "cnn"
    dataset: str = "fashion-mnist"  # a built-in name, or a provider: "file.py:fn" | "pkg.mod:fn"
    data_dir: str = ""
    loss: str = ""  # the step: "file.py:fn", fn(model, batch) -> mean | (sum, count); "": cross-entropy
    metrics: str = ""  # "file.py:fn", fn(model, batch) -> {name: number | (sum, count)}; "": loss (+ accuracy)
    collate: str = ""  # "file.py:fn" turning a list of items into a batch; "": torch's default_collate
    sparse_ids: str = ""  # "file.py:fn", fn(batch) -> {table module: ids}: a step's sparse-table rows fetched at once
    model_args: dict = field(default_factory=dict)  # keywords for the model spec's function
    data_args: dict = field(default_factory=dict)  # keywords for the dataset provider
    loss_args: dict = field(default_factory=dict)  # keywords for the loss function, after (model, batch)
    loader_workers: int = 0  # threads reading the next slice's samples while this one computes
    target: dict = field(default_factory=dict)  # {metric = "test_loss", below = 1.6} or {..., above = x}
    stop_at_target: bool = False  # end the job once the target is met
    seed: int = 0
    eval_every: int = 100
    eval_samples: int = 0  # periodic evaluations use the first N test samples (0: all)
    eval_batch: int = 128  # samples an evaluation feeds the model at once (its outputs: one batch's at a time)
    checkpoint_every: int = 200
    batch_split: tuple[int, ...] = ()
    batch_policy: str = "proportional"
    predictor: str = "ewma"
    shadow_predictors: bool = False  # LB-BSP: also run the other predictors (compare errors)
    min_batch: int = 1
    max_batch: int = 0  # 0: no per-worker cap
    hysteresis: float = 0.05
    slowdown: tuple[float, ...] = ()
    slowdown_noise: float = 0.0  # c: each step's stretch × max(0, 1 + c·z), z ~ N(0, 1)
    trace: str = ""  # CSV of (time|iteration, worker, factor)
    neighbours: tuple[dict, ...] = ()  # {worker, start, stop, share}: real CPU burners
    cpu_limit: tuple[float, ...] = ()  # CPUs per worker, enforced with a cgroup v1 quota
    membership: tuple[dict, ...] = ()  # {iteration, leave = rank} or {iteration, join = count}
    block_size: int = 262144  # elements; 0: auto (policy/block_size.py)
    placement: str = "greedy"  # round_robin | mxnet | byteps | greedy | psld | oracle
    server_slowdown: tuple[float, ...] = ()  # per server: extra time ∝ bytes, (f − 1)·bytes/server_rate
    server_trace: str = ""  # CSV of (time|iteration, server, factor)
    server_speeds: tuple[float, ...] = ()  # placement = "oracle": each server's relative throughput, if known
    server_rate: float = 1000.0  # MB/s a server at factor 1 is charged for the slowdown (not a cap)
    server_bandwidth: tuple[float, ...] = ()  # per server MB/s cap (token bucket); 0: none
    server_events: tuple[dict, ...] = ()  # {iteration, add = 1} | {iteration, remove = rank} | {iteration, move = block, to = rank}
    psld_interval: int = 10  # iterations between server measurements (and PSLD decisions)
    psld_epsilon: float = 0.1  # PSLD: probability of exploring instead of exploiting
    psld_max_servers: int = 0  # PSLD may add servers up to this many; 0: never adds
    psld_horizon: int = 50  # PSLD: iterations a move's pause must be repaid in (capped by those left)
    threads: int = 1
    device: str = "cpu"  # every worker's: cpu | cuda | cuda:N | auto (a GPU if there is one)
    devices: tuple[str, ...] = ()  # one per worker, instead of `device` (a mixed job)
    precision: str = "32"  # 32 | bf16-mixed (autocast to bfloat16)
    precisions: tuple[str, ...] = ()  # one per worker, instead of `precision`
    eval_device: str = "cpu"  # where the coordinator evaluates snapshots
    memory_limits: tuple[float, ...] = ()  # GiB of device memory each worker may use (0: its share of the device)
    deterministic: bool = False  # torch's deterministic algorithms on the workers
    timeout: float = 120.0
    heartbeat_s: float = 2.0  # children beat this often; 3 missed beats: the process is lost (0: off)
    stuck_s: float = 60.0  # a worker in one call of user code this long fails the job, named (0: never)
    worker_restarts: int = 0  # replacement workers started for lost ones, in all (torchrun's max_restarts)
    replication: int = 0  # 1: every block also on a backup server, in lockstep; 0: roll back to a snapshot
    snapshot_every: int = 10  # iterations between in-memory snapshots for that rollback (0: none; a lost server fails the job)
    snapshot_budget: float = 0.05  # the most of the training those snapshots may hold the workers for (0: no bound)
    host: str = "127.0.0.1"
    transport: str = "tcp"  # "tcp" on `host`, or "ipc": Unix sockets, this machine only
    auth: str = "plain"  # plain (authenticated, clear) | curve (encrypted too) | off; docs/configuration.md
    max_message_mb: int = 1024
    progress: bool = True
    launcher: str = "local"  # local: processes on this machine; ray: actors on a Ray cluster
    ray_address: str = ""  # "": start Ray on this machine; "auto" or "HOST:PORT": join a cluster
    # Ray resources per worker / server: one table for every rank, or a list of one per rank
    worker_resources: dict | list = field(default_factory=lambda: {"CPU": 1.0})
    server_resources: dict | list = field(default_factory=lambda: {"CPU": 1.0})
    ray_strategy: str = "SPREAD"  # placement group strategy for the job's actors
    ray_data: str = "ship"  # ship: the driver's dataset, once per node; path: loaded on each node
    tensorboard: bool = False  # scalars to run_dir/tensorboard/ (needs the tensorboard package)
    # `equipoise simulate`'s cost model (docs/simulate.md); a training job ignores these
    sim_compute_s: tuple[float, ...] = (0.002,)  # a: seconds per step, one value for all workers or one per worker
    sim_sample_s: tuple[float, ...] = (0.0002,)  # b: seconds per sample (compute = (a + b·batch) × slowdown)
    sim_noise: float = 0.0  # σ of a lognormal factor on every simulated step (0: none)
    sim_noise_shared: float = 0.0  # σ of a lognormal factor shared by all steps of an iteration (0: none)
    sim_noise_shared_corr: float = 0.0  # correlation of consecutive iterations' shared factors, in [0, 1)
    sim_cpu_share: float = 1.0  # part of a step that is the worker's own CPU work, the part a slowdown stretches
    sim_latency_s: float = 0.0002  # one-way latency of every message
    sim_link_mbps: float = 1000.0  # each worker's link, MB/s (0: free)
    sim_server_mbps: float = 1000.0  # MB/s a server at factor 1 receives+applies or sends (0: free)
    sim_host_cores: int = 0  # emulation host: workers share this many cores (0: each a machine of its own)
    sim_host_load: float = 0.0  # emulation host: other runnable processes on it, on average
    sim_host_exchange: float = 1.0  # emulation host: runnable processes a worker's exchange keeps busy
    sim_stretch_cpu: float = 0.0  # κ: an emulated slowdown f adds κ·(1 − 1/f) to a step's CPU work

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Config":
        """Build and validate a Config; unknown keys and wrongly typed values raise."""
        known = {f.name: f for f in fields(cls)}
        values = _derive_global_batch(flatten_tables(values))
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"unknown config key {key!r}{_suggest(str(key), list(known))} "
                                  "(every key: docs/configuration.md)")
            kwargs[key] = (_coerce_resources(key, value) if key in RESOURCE_KEYS
                           else _coerce_target(value) if key == "target"
                           else _coerce_args(key, value) if key in ARGS_KEYS
                           else _coerce(key, value, known[key].default))
        cfg = cls(**kwargs)
        validate(cfg)
        return cfg

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> "Config":
        """Defaults, then the TOML file at `path` (if any), then `overrides`."""
        values: dict[str, Any] = {}
        if path is not None:  # each source flattened on its own, so an override wins over a table's key
            values.update(absolute_specs(flatten_tables(read_toml(path))))
        values.update(flatten_tables(overrides or {}))
        return cls.from_dict(values)

    def replace(self, **changes: Any) -> "Config":
        base = self.to_dict()
        if self.worker_batch and "global_batch" not in changes:
            del base["global_batch"]  # derived again from worker_batch × workers
        return Config.from_dict({**base, **changes})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def to_toml(self) -> str:
        """Every key, each in its group's table: what a run directory's config.toml holds."""
        return to_toml_tables(self.to_dict())

    def group(self, name: str) -> Any:
        """Group `name` (config_toml.GROUPS) as a frozen dataclass of its keys (flat names)."""
        cls = _group_class(name)
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    def validate(self) -> None:
        """Every group's checks (config_checks.py); ConfigError at the first that fails."""
        validate(self)

    # -- derived values ---------------------------------------------------------------
    def resources(self, role: str, rank: int) -> dict:
        """The Ray resources of `role` ("worker" or "server") `rank`: its table in a
        per-rank list (ranks beyond it, replacements and added servers, take the last),
        or the one table of every rank."""
        got = self.worker_resources if role == "worker" else self.server_resources
        return got[min(rank, len(got) - 1)] if isinstance(got, list) else got

    def total_iterations(self, train_size: int) -> int:
        """Updates of global batch X the job runs: `iterations`, else epochs·N/X (≥ 1)."""
        if self.iterations > 0:
            return self.iterations
        return max(1, math.ceil(self.epochs * train_size / self.global_batch))

    @property
    def has_barrier(self) -> bool:
        """Whether every update waits for every worker (bsp, lbbsp): the one place a
        part asks it (policy/sync.py's protocols agree, from the same list)."""
        return self.protocol in BARRIER_PROTOCOLS

    @property
    def softsync_c(self) -> int:
        """Gradients per update under n-softsync: c = ⌊λ/n⌋ (n = 0 means n = λ)."""
        return max(1, self.workers // (self.softsync_n or self.workers))

    def user_specs(self) -> dict[str, str]:
        """The keys naming the user's code by spec, and their specs (imported where the
        workers run before a job starts)."""
        return {k: getattr(self, k) for k in USER_CODE if ":" in getattr(self, k)}

    def optimizer_line(self) -> str:
        """The job's effective optimizer in one line, as printed at start."""
        parts = [f"lr {self.lr:g}"]
        if self.optimizer == "sgd":
            parts.append(f"momentum {self.momentum:g}")
        parts.append(f"weight decay {self.weight_decay:g}")
        parts.append(f"clip_grad_norm {self.clip_grad_norm:g}" if self.clip_grad_norm else "no clipping")
        schedule = self.lr_schedule
        if schedule == "step":
            schedule += f" (x{self.lr_gamma:g} every {self.lr_step_size} iterations)"
        elif schedule == "cosine":
            schedule += f" (to {self.lr_min:g})"
        if self.warmup_iterations:
            schedule = f"{self.warmup_iterations} warm-up iterations, then {schedule}"
        return f"optimizer {self.optimizer}: {', '.join(parts)}; schedule {schedule}"

    def warnings(self) -> list[str]:
        """Advice that is not an error (printed by the CLI, logged by the API)."""
        out = []
        if self.reference_batch:
            ratio = self.global_batch / self.reference_batch
            if not 0.5 <= ratio <= 2.0:
                mu = self.global_batch / self.workers
                out.append(
                    f"μ·λ = {self.global_batch} ({mu:g} samples × {self.workers} workers) is {ratio:.3g}× "
                    f"reference_batch = {self.reference_batch}: Rudra found that accuracy at a fixed "
                    "number of epochs falls as μ·λ grows when learners are added, and that keeping μ·λ "
                    f"near the single-learner batch preserves it — try worker_batch ≈ "
                    f"{max(1, round(self.reference_batch / self.workers))} or retune lr")
        if self.auth == "plain" and self.transport == "tcp" and self.host not in ("127.0.0.1", "localhost", "::1"):
            out.append(f"auth = \"plain\" with host = {self.host!r}: the job's passwords cross the network "
                       "in clear; use auth = \"curve\" (encrypted) beyond loopback")
        return out

    def slice(self, part: type[T]) -> T:
        """The settings a part of the runtime reads: a dataclass whose fields are a
        subset of this one's, filled from it (a part never sees the whole Config)."""
        return part(**{f.name: getattr(self, f.name) for f in fields(part)})

    @property
    def listen_host(self) -> str:
        """What `Transport.listen` binds: the TCP host, or "ipc" for Unix sockets."""
        return "ipc" if self.transport == "ipc" else self.host

# -- helpers ---------------------------------------------------------------------------

_GROUP_CLASSES: dict[str, type] = {}


def _group_class(name: str) -> type:
    """The frozen dataclass of group `name`: its keys with Config's types and defaults."""
    if name not in GROUPS:
        raise KeyError(f"no config group {name!r} (groups: {', '.join(GROUPS)})")
    if name not in _GROUP_CLASSES:
        known = {f.name: f for f in fields(Config)}
        spec = [(flat, known[flat].type, field(default=known[flat].default) if known[flat].default_factory
                 is _MISSING else field(default_factory=known[flat].default_factory))
                for flat in GROUPS[name].values()]
        _GROUP_CLASSES[name] = make_dataclass(name.title() + "Settings", spec, frozen=True)
    return _GROUP_CLASSES[name]

def _derive_global_batch(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """With `worker_batch` (μ) set, global_batch is μ × workers; giving both must agree."""
    mu = values.get("worker_batch", 0)
    if not mu or not isinstance(mu, int) or isinstance(mu, bool) or mu < 1:
        return values
    workers = values.get("workers", Config.workers)
    if not isinstance(workers, int) or isinstance(workers, bool):
        return values  # the type error is reported by _coerce
    derived = mu * workers
    given = values.get("global_batch")
    if given is not None and given != derived:
        raise ConfigError(f"global_batch = {given!r} disagrees with worker_batch = {mu} × workers = "
                          f"{workers} = {derived}: set one of them")
    return {**values, "global_batch": derived}


def _coerce_args(key: str, value: Any) -> dict:
    """Keywords for a user's function: a table of identifiers to values a config file can
    hold (numbers, strings, booleans, lists and tables of them), as recorded in config.toml."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} = {value!r} should be a table of keywords, e.g. {key} = {{dropout = 0.2}}")

    def plain(v: Any, where: str) -> Any:
        if isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)):
            return v
        if isinstance(v, (list, tuple)):
            return [plain(x, where) for x in v]
        if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
            return {k: plain(x, f"{where}.{k}") for k, x in v.items()}
        raise ConfigError(f"{where} = {v!r} is not a number, string, boolean, list or table "
                          "(what config.toml can record)")

    for name in value:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ConfigError(f"{key}: {name!r} is not a keyword name")
    return {name: plain(v, f"{key}.{name}") for name, v in value.items()}


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Check `value` has the type of the field's default, converting where lossless."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, str):
        if isinstance(value, str):
            return value
    elif isinstance(default, tuple):
        if isinstance(value, (list, tuple)):
            return _coerce_list(key, value, default)
    raise ConfigError(f"{key} = {value!r} should be of type {_type_name(default)}")


def _coerce_list(key: str, value: Any, default: tuple) -> tuple:
    if key in _TABLE_LISTS:
        if all(isinstance(v, Mapping) for v in value):
            return tuple(dict(v) for v in value)
        raise ConfigError(f"{key} = {list(value)!r} should be a list of tables "
                          f"like [{{{', '.join(_TABLE_LISTS[key])} = ...}}]")
    elem = {"batch_split": 1, "devices": "", "precisions": ""}.get(key, 1.0)
    try:
        return tuple(_coerce(key, v, elem) for v in value)
    except ConfigError:
        raise ConfigError(f"{key} = {list(value)!r} should be a list of {_type_name(elem)}") from None


_TABLE_LISTS = {"neighbours": ("worker", "start", "stop", "share"),
                "membership": ("iteration", "leave", "join"),
                "server_events": ("iteration", "add", "remove", "move", "to")}


def _type_name(default: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", tuple: "list"}[type(default)]


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v


def _coerce_resources(key: str, value: Any) -> dict | list:
    """A table of Ray resources: name -> amount (a finite number ≥ 0), e.g. {CPU = 2, GPU = 1};
    or a non-empty list of such tables, one per rank."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{key} = [] lists no table: give one table, or one per rank")
        return [_coerce_resources(f"{key}[{i}]", v) for i, v in enumerate(value)]
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v >= 0 for k, v in value.items()):
        raise ConfigError(f"{key} = {value!r} should be a table of Ray resources with amounts ≥ 0, "
                          "like {CPU = 1, GPU = 0}")
    if not any(v > 0 for v in value.values()):
        raise ConfigError(f"{key} = {value!r} asks for nothing: give at least one resource an amount > 0")
    return {k: float(v) for k, v in value.items()}


def _coerce_target(value: Any) -> dict:
    """{metric = NAME, below = X} or {metric = NAME, above = X}; NAME is an evaluation
    record's key (test_<metric>) or the metric's own name (test_ is added)."""
    if value in ({}, None):
        return {}
    ok = (isinstance(value, Mapping) and set(value) in ({"metric", "below"}, {"metric", "above"})
          and isinstance(value["metric"], str) and value["metric"])
    bound = value.get("below", value.get("above")) if ok else None
    if not ok or isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
        raise ConfigError(f"target = {value!r} should be {{metric = \"test_loss\", below = 1.6}} or "
                          "{metric = NAME, above = NUMBER}")
    metric = value["metric"] if value["metric"].startswith("test_") else f"test_{value['metric']}"
    return {"metric": metric, **{k: float(v) for k, v in value.items() if k != "metric"}}


def _suggest(key: str, known: list[str]) -> str:
    """ "; did you mean …?" naming the known keys closest to `key` (a torch user's `clip`
    finds `clip_grad_norm`), or ""."""
    import difflib

    close = [k for k in known if key.lower() in k] if len(key) >= 3 else []
    close += [k for k in difflib.get_close_matches(key.lower(), known, n=3, cutoff=0.6) if k not in close]
    return f"; did you mean {' or '.join(close[:3])}?" if close else ""


GROUPS["sim"].update({f.name[len("sim_"):]: f.name for f in fields(Config) if f.name.startswith("sim_")})

__all__ = ["GROUPS", "flatten_tables", "Config", "ConfigError", "EquipoiseWarning", "parse_override", "read_toml", "to_toml", "PROTOCOLS"]
