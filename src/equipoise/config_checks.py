"""The checks of a `Config`, one function per group of keys (config_toml.GROUPS).

Each function checks its group's keys, reading another group's only where a value is
judged against it (a per-worker list against `workers`, a protocol option against the
protocol). `validate` runs them in the groups' order; the first error is raised as a
one-line `ConfigError` naming the key and the value.
"""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any

from .config_toml import GROUPS, ConfigError

Config = Any  # a config.Config (not imported: config.py imports this module)

PROTOCOLS = ("bsp", "asp", "lbbsp", "softsync", "ssp")
BARRIER_PROTOCOLS = ("bsp", "lbbsp")  # the protocols with a barrier: every update waits for every worker
LR_MODULATIONS = ("none", "per_gradient", "mean")
ASYNC_SCALINGS = ("bsp", "none")  # as policy/staleness.py (config imports no torch)
DELAY_COMPENSATIONS = ("none", "dc", "dc_adaptive")
OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad")
SCHEDULES = ("constant", "step", "cosine")
BUILTIN_MODELS = ("mlp", "mlp-deep", "cnn", "resnet20")
DATASETS = ("fashion-mnist", "mnist", "digits", "cifar10", "synthetic")
BATCH_POLICIES = ("proportional", "step", "model")
PLACEMENTS = ("round_robin", "mxnet", "byteps", "greedy", "psld", "oracle")
PREDICTORS = ("last", "ewma", "narx")
AUTH_MODES = ("curve", "plain", "off")  # wire/auth.py describes them
LAUNCHERS = ("local", "ray")
RAY_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")  # Ray's placement group strategies
RAY_DATA = ("ship", "path")
ARGS_KEYS = {"model_args": "model", "data_args": "dataset", "loss_args": "loss"}  # settings -> the spec they go to
DEVICE_RE = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")  # a worker's device: device.py
PRECISIONS = ("32", "bf16-mixed")


def scaling(cfg: Config) -> None:
    for key in ("workers", "threads"):
        _at_least(key, getattr(cfg, key), 1)
    _choice("launcher", cfg.launcher, LAUNCHERS)
    for key, many in (("device", "devices"), ("eval_device", None)):  # whether they exist: device.py
        values = [getattr(cfg, key)] + (list(getattr(cfg, many)) if many else [])
        for i, v in enumerate(values):
            if not DEVICE_RE.match(v):
                name = key if i == 0 else f"{many}[{i - 1}]"
                raise ConfigError(f"{name} = {v!r} is not cpu, cuda, cuda:N or auto")
    _choice("precision", cfg.precision, PRECISIONS)
    for i, v in enumerate(cfg.precisions):
        if v not in PRECISIONS:
            raise ConfigError(f"precisions[{i}] = {v!r} is not one of {', '.join(PRECISIONS)}")
    if any(not math.isfinite(x) or x < 0 for x in cfg.memory_limits):
        raise ConfigError(f"memory_limits = {list(cfg.memory_limits)} must be finite GiB ≥ 0 (0: no limit)")
    for key in ("devices", "precisions", "memory_limits"):
        if getattr(cfg, key) and len(getattr(cfg, key)) != cfg.workers:
            raise ConfigError(f"{key} has {len(getattr(cfg, key))} entries for {cfg.workers} workers: "
                              "give one per worker")


def training(cfg: Config) -> None:
    _choice("protocol", cfg.protocol, PROTOCOLS)
    _choice("lr_modulation", cfg.lr_modulation, LR_MODULATIONS)
    _choice("async_scaling", cfg.async_scaling, ASYNC_SCALINGS)
    _choice("delay_compensation", cfg.delay_compensation, DELAY_COMPENSATIONS)
    _at_least("global_batch", cfg.global_batch, 1)
    for key in ("iterations", "seed", "worker_batch", "reference_batch", "softsync_n", "staleness_bound"):
        _at_least(key, getattr(cfg, key), 0)
    _positive("epochs", cfg.epochs)
    if cfg.workers > cfg.global_batch:
        raise ConfigError(f"workers = {cfg.workers} is more than global_batch = {cfg.global_batch}: "
                          "every worker needs at least one sample per iteration")
    if cfg.softsync_n and cfg.protocol != "softsync":
        raise ConfigError(f"softsync_n = {cfg.softsync_n} needs protocol = \"softsync\", not {cfg.protocol!r}")
    if cfg.softsync_n > cfg.workers:
        raise ConfigError(f"softsync_n = {cfg.softsync_n} must be between 1 and workers = "
                          f"{cfg.workers} (n = workers is async)")
    if not (math.isfinite(cfg.dc_lambda) and cfg.dc_lambda >= 0):
        raise ConfigError(f"dc_lambda = {cfg.dc_lambda!r} must be a finite number ≥ 0")
    if cfg.delay_compensation != "none" and not cfg.dc_lambda > 0:
        raise ConfigError(f"delay_compensation = {cfg.delay_compensation!r} needs dc_lambda > 0 "
                          "(Zheng et al. use 0.04 for dc, 2.0 for dc_adaptive)")
    if cfg.delay_compensation != "none" and cfg.protocol in BARRIER_PROTOCOLS:
        raise ConfigError(f"delay_compensation = {cfg.delay_compensation!r} needs a protocol without "
                          f"a barrier (asp, softsync, ssp), not {cfg.protocol!r}: there every gradient "
                          "is computed on the current weights")
    if cfg.staleness_bound and cfg.protocol != "ssp":
        raise ConfigError(f"staleness_bound = {cfg.staleness_bound} needs protocol = \"ssp\", "
                          f"not {cfg.protocol!r}")


def optimizer(cfg: Config) -> None:
    _choice("optimizer", cfg.optimizer, OPTIMIZERS)
    if ":" not in cfg.lr_schedule:
        _choice("lr_schedule", cfg.lr_schedule, SCHEDULES + ("a spec 'file.py:function'",))
    elif cfg.warmup_iterations:
        raise ConfigError(f"warmup_iterations = {cfg.warmup_iterations} with lr_schedule = "
                          f"{cfg.lr_schedule!r}: a user schedule gives the whole factor (warm-up included)")
    for key in ("lr_step_size", "warmup_iterations"):
        _at_least(key, getattr(cfg, key), 0)
    _positive("lr", cfg.lr)
    for key in ("momentum", "weight_decay", "lr_gamma", "lr_min", "clip_grad_norm"):
        _at_least(key, getattr(cfg, key), 0.0)
    if not math.isfinite(cfg.clip_grad_norm):
        raise ConfigError(f"clip_grad_norm = {cfg.clip_grad_norm!r} must be a finite number ≥ 0 (0: off)")
    if cfg.lr_min > cfg.lr:
        raise ConfigError(f"lr_min = {cfg.lr_min!r} is above lr = {cfg.lr!r}")
    if cfg.clip_grad_norm and cfg.eager_update:
        raise ConfigError("clip_grad_norm needs eager_update = false: a block updated as soon as its "
                          "gradients are in cannot wait for the norm over every block")
    if cfg.clip_grad_norm and cfg.backward_push and cfg.protocol not in BARRIER_PROTOCOLS:
        raise ConfigError(f"clip_grad_norm with protocol = {cfg.protocol!r} needs backward_push = false: "
                          "without a barrier each push is clipped by its own norm, known only once "
                          "backward has ended")


def data(cfg: Config) -> None:
    if cfg.dataset not in DATASETS and ":" not in cfg.dataset:
        raise ConfigError(f"dataset = {cfg.dataset!r} is neither one of {', '.join(DATASETS)} nor a "
                          "provider spec 'file.py:function' or 'package.module:function'")
    for key, target in ARGS_KEYS.items():
        spec = getattr(cfg, target)
        if getattr(cfg, key) and ":" not in spec:
            raise ConfigError(f"{key} is for a {target} of the user's own ('file.py:function'); "
                              f"{target} = {spec or '(default)'!r} is built in")
    for key in ("loss", "metrics", "collate", "sparse_ids"):
        if getattr(cfg, key) and ":" not in getattr(cfg, key):
            raise ConfigError(f"{key} = {getattr(cfg, key)!r} is not a 'file.py:function' or "
                              "'package.module:function' spec (\"\" for the default)")
    if cfg.model not in BUILTIN_MODELS and ":" not in cfg.model:
        raise ConfigError(f"model = {cfg.model!r} is neither one of {', '.join(BUILTIN_MODELS)} "
                          "nor a 'package.module:function' spec")
    _at_least("loader_workers", cfg.loader_workers, 0)


def evaluation(cfg: Config) -> None:
    if cfg.stop_at_target and not cfg.target:
        raise ConfigError("stop_at_target = true needs a target, e.g. target = {metric = \"test_loss\", "
                          "below = 1.6}")
    for key in ("eval_every", "eval_samples", "checkpoint_every"):
        _at_least(key, getattr(cfg, key), 0)
    _at_least("eval_batch", cfg.eval_batch, 1)


def batching(cfg: Config) -> None:
    _choice("batch_policy", cfg.batch_policy, BATCH_POLICIES)
    _choice("predictor", cfg.predictor, PREDICTORS)
    _at_least("min_batch", cfg.min_batch, 0)
    _at_least("max_batch", cfg.max_batch, 0)
    if not 0.0 <= cfg.hysteresis < 1.0:
        raise ConfigError(f"hysteresis = {cfg.hysteresis!r} must be in [0, 1)")
    if cfg.batch_split:
        if len(cfg.batch_split) != cfg.workers:
            raise ConfigError(f"batch_split = {list(cfg.batch_split)} has {len(cfg.batch_split)} entries "
                              f"but workers = {cfg.workers}")
        if any(x < 0 for x in cfg.batch_split) or sum(cfg.batch_split) != cfg.global_batch:
            raise ConfigError(f"batch_split = {list(cfg.batch_split)} must be ≥ 0 and sum to "
                              f"global_batch = {cfg.global_batch}")
        if 0 in cfg.batch_split and not cfg.has_barrier:
            raise ConfigError(f"batch_split = {list(cfg.batch_split)} gives a worker no samples, which only "
                              f"a barrier's update can leave out (protocol = {cfg.protocol!r})")
    if cfg.min_batch * cfg.workers > cfg.global_batch:
        raise ConfigError(f"min_batch = {cfg.min_batch} × workers = {cfg.workers} is more than "
                          f"global_batch = {cfg.global_batch}")
    if cfg.max_batch and cfg.max_batch < cfg.min_batch:
        raise ConfigError(f"max_batch = {cfg.max_batch} is less than min_batch = {cfg.min_batch}")
    if cfg.max_batch and cfg.max_batch * cfg.workers < cfg.global_batch:
        raise ConfigError(f"max_batch = {cfg.max_batch} × workers = {cfg.workers} cannot hold "
                          f"global_batch = {cfg.global_batch}")


def exchange(cfg: Config) -> None:
    _choice("transport", cfg.transport, ("tcp", "ipc"))
    _choice("auth", cfg.auth, AUTH_MODES)
    _at_least("max_message_mb", cfg.max_message_mb, 1)
    _at_least("fragment_kb", cfg.fragment_kb, 0)
    if cfg.overlap and cfg.forward_pull:
        raise ConfigError("forward_pull = true needs overlap = false (with overlap the pull already "
                          "arrives during the next step)")
    if cfg.eager_update and not (cfg.backward_push and cfg.forward_pull and cfg.protocol in BARRIER_PROTOCOLS):
        raise ConfigError(f"eager_update = true needs backward_push = true, forward_pull = true and a barrier "
                          f"protocol (bsp, lbbsp); here backward_push = {str(cfg.backward_push).lower()}, "
                          f"forward_pull = {str(cfg.forward_pull).lower()}, protocol = {cfg.protocol!r}")
    if cfg.overlap and cfg.protocol in BARRIER_PROTOCOLS:
        raise ConfigError(f"overlap = true needs a protocol without a barrier (asp, softsync, ssp), "
                          f"not {cfg.protocol!r}: under a barrier the next weights do not exist "
                          "until every worker has pushed")


def servers(cfg: Config) -> None:
    _at_least("servers", cfg.servers, 1)
    _choice("placement", cfg.placement, PLACEMENTS)
    for key in ("block_size", "psld_max_servers"):
        _at_least(key, getattr(cfg, key), 0)
    _at_least("psld_interval", cfg.psld_interval, 1)
    _at_least("psld_horizon", cfg.psld_horizon, 1)
    if not 0.0 <= cfg.psld_epsilon <= 1.0:
        raise ConfigError(f"psld_epsilon = {cfg.psld_epsilon!r} must be in [0, 1]")
    if cfg.server_speeds and (len(cfg.server_speeds) != cfg.servers or any(
            not (math.isfinite(v) and v > 0) for v in cfg.server_speeds)):
        raise ConfigError(f"server_speeds = {list(cfg.server_speeds)} needs one throughput > 0 per server "
                          f"(servers = {cfg.servers})")
    if cfg.psld_max_servers and cfg.psld_max_servers < cfg.servers:
        raise ConfigError(f"psld_max_servers = {cfg.psld_max_servers} is less than servers = {cfg.servers}")
    for i, ev in enumerate(cfg.server_events):
        ok = set(ev) in ({"iteration", "add"}, {"iteration", "remove"}, {"iteration", "move", "to"})
        if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ev.values()):
            raise ConfigError(f"server_events[{i}] = {ev!r} must be {{iteration = N, add = COUNT}}, "
                              "{iteration = N, remove = RANK} or {iteration = N, move = BLOCK, to = RANK} "
                              "with non-negative integers")


def failure(cfg: Config) -> None:
    _positive("timeout", cfg.timeout)
    _at_least("heartbeat_s", cfg.heartbeat_s, 0.0)
    _at_least("stuck_s", cfg.stuck_s, 0.0)
    for key in ("worker_restarts", "snapshot_every"):
        _at_least(key, getattr(cfg, key), 0)
    if not 0.0 <= cfg.snapshot_budget <= 1.0:
        raise ConfigError(f"snapshot_budget = {cfg.snapshot_budget!r} must be a fraction of the training "
                          "time in [0, 1] (0: snapshots every snapshot_every iterations, whatever they cost)")
    if cfg.replication not in (0, 1):
        raise ConfigError(f"replication = {cfg.replication!r} must be 0 (a lost server is recovered from "
                          "the in-memory snapshots of snapshot_every) or 1 (a backup on the next server)")
    if cfg.replication and cfg.protocol not in BARRIER_PROTOCOLS:
        raise ConfigError(f"replication = 1 needs a barrier protocol (bsp, lbbsp), not {cfg.protocol!r}")


def ray(cfg: Config) -> None:
    _choice("ray_strategy", cfg.ray_strategy, RAY_STRATEGIES)
    _choice("ray_data", cfg.ray_data, RAY_DATA)
    for key, count in (("server_resources", cfg.servers), ("worker_resources", cfg.workers)):
        got = getattr(cfg, key)
        if isinstance(got, list) and len(got) != count:
            raise ConfigError(f"{key} lists {len(got)} tables for {count} {key.split('_')[0]}s: give one per "
                              "rank (or one table for all)")
    if cfg.launcher == "ray":
        for key in ("cpu_limit", "neighbours"):
            if getattr(cfg, key):
                raise ConfigError(f"{key} starts processes beside the workers on this machine: it needs "
                                  "launcher = \"local\", not \"ray\"")
        if cfg.transport != "tcp":
            raise ConfigError(f"transport = {cfg.transport!r} is this machine only: launcher = \"ray\" "
                              "needs transport = \"tcp\"")


def observability(cfg: Config) -> None:
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard = true needs the tensorboard package: pip install 'equipoise[tensorboard]'")


def emulation(cfg: Config) -> None:
    """The emulated slowdowns, traces, CPU burners and caps, and scripted membership."""
    from .scenario import Scenario, Trace  # scenario.py imports nothing of ours
    if cfg.slowdown:
        if len(cfg.slowdown) != cfg.workers:
            raise ConfigError(f"slowdown = {list(cfg.slowdown)} has {len(cfg.slowdown)} entries "
                              f"but workers = {cfg.workers}")
        if any(not (math.isfinite(f) and f >= 1.0) for f in cfg.slowdown):
            raise ConfigError(f"slowdown = {list(cfg.slowdown)}: every factor must be ≥ 1")
    if not (math.isfinite(cfg.slowdown_noise) and 0.0 <= cfg.slowdown_noise <= 1.0):
        raise ConfigError(f"slowdown_noise = {cfg.slowdown_noise}: must be between 0 and 1")
    if cfg.cpu_limit:
        if len(cfg.cpu_limit) != cfg.workers or any(not (0.01 <= c <= 64) for c in cfg.cpu_limit):
            raise ConfigError(f"cpu_limit = {list(cfg.cpu_limit)} needs one value per worker "
                              f"(workers = {cfg.workers}), each between 0.01 and 64 CPUs")
    for key, column in (("trace", "worker"), ("server_trace", "server")):
        if getattr(cfg, key):
            try:
                Trace.from_csv(getattr(cfg, key), column=column)
            except (ValueError, OSError) as exc:
                raise ConfigError(f"{key} = {getattr(cfg, key)!r}: {exc}") from None
    try:
        neighbours = Scenario.from_config({"neighbours": [dict(n) for n in cfg.neighbours]}).neighbours
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"neighbours = {[dict(n) for n in cfg.neighbours]!r}: {exc}") from None
    for n in neighbours:
        if not 0 <= n.worker < cfg.workers:
            raise ConfigError(f"neighbours: worker = {n.worker} is not a worker rank (workers = {cfg.workers})")
    if cfg.membership and cfg.protocol not in BARRIER_PROTOCOLS:
        raise ConfigError(f"membership events need protocol bsp or lbbsp, not {cfg.protocol!r}")
    for i, ev in enumerate(cfg.membership):
        ok = set(ev) in ({"iteration", "leave"}, {"iteration", "join"})
        if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ev.values()):
            raise ConfigError(f"membership[{i}] = {ev!r} must be {{iteration = N, leave = RANK}} "
                              "or {iteration = N, join = COUNT} with non-negative integers")
    _positive("server_rate", cfg.server_rate)
    if cfg.server_slowdown and (len(cfg.server_slowdown) != cfg.servers or any(
            not (math.isfinite(f) and f >= 1.0) for f in cfg.server_slowdown)):
        raise ConfigError(f"server_slowdown = {list(cfg.server_slowdown)} needs one factor ≥ 1 per "
                          f"server (servers = {cfg.servers})")
    if cfg.server_bandwidth and (len(cfg.server_bandwidth) != cfg.servers or any(
            not (math.isfinite(b) and b >= 0.0) for b in cfg.server_bandwidth)):
        raise ConfigError(f"server_bandwidth = {list(cfg.server_bandwidth)} needs one MB/s value ≥ 0 "
                          f"per server (servers = {cfg.servers}; 0 = no cap)")


def sim(cfg: Config) -> None:
    for key in ("sim_compute_s", "sim_sample_s"):
        v = getattr(cfg, key)
        if len(v) not in (1, cfg.workers) or any(not (math.isfinite(x) and x >= 0) for x in v):
            raise ConfigError(f"{key} = {list(v)} needs one value ≥ 0 for all workers or one per worker "
                              f"(workers = {cfg.workers})")
    if not 0.0 <= cfg.sim_noise_shared_corr < 1.0:
        raise ConfigError(f"sim_noise_shared_corr = {cfg.sim_noise_shared_corr!r} must be in [0, 1)")
    if not 0.0 < cfg.sim_cpu_share <= 1.0:
        raise ConfigError(f"sim_cpu_share = {cfg.sim_cpu_share!r} must be in (0, 1]")
    for key in ("sim_noise", "sim_noise_shared", "sim_latency_s", "sim_link_mbps", "sim_server_mbps",
                "sim_host_cores", "sim_host_load", "sim_host_exchange", "sim_stretch_cpu"):
        if not (math.isfinite(getattr(cfg, key)) and getattr(cfg, key) >= 0):
            raise ConfigError(f"{key} = {getattr(cfg, key)!r} must be a finite number ≥ 0")


# Each group's checks, in the order they run (GROUPS' order).
CHECKS = {"scaling": scaling, "training": training, "optimizer": optimizer, "data": data, "eval": evaluation,
          "batching": batching, "exchange": exchange, "servers": servers, "failure": failure, "ray": ray,
          "observability": observability, "emulation": emulation, "sim": sim}
assert list(CHECKS) == list(GROUPS)


def validate(cfg: Config) -> None:
    """Every group's checks; ConfigError (one line) at the first that fails."""
    for check in CHECKS.values():
        check(cfg)


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} = {value!r} is not one of {', '.join(options)}")


def _at_least(key: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(f"{key} = {value!r} must be ≥ {low}")


def _positive(key: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{key} = {value!r} must be a positive number")


__all__ = ["CHECKS", "validate"]
