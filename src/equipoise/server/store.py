"""The numbers of one parameter server: its blocks, their optimizer and version.

`ParameterStore` is transport-free and makes no synchronisation decision: the server
asks its `ServerSync` (policy/sync.py) which pushes form an update and with what σ, and
hands them here. An update is *apply then publish*: grouped gradients are combined by
sample count (modulated by σ as the policy says), the learning rate is set from training
progress, a real `torch.optim` optimizer steps (plain SGD, without momentum or weight
decay, is its one line of arithmetic, done here), and the version increments.

Replies send the value tensors themselves, without a copy (`lend`): the store never
changes a lent tensor in place while its reader is not done. An update first moves each
block whose tensor is still being read to another buffer (copy-on-write, into a retired
buffer no longer read, else a fresh one), so every reply holds the values of the version
it was taken at, and a version read by many replies is one shared snapshot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from ..policy.placement import Block
from ..protocol.optimizer import OptimizerSpec, global_norm, user_schedule  # noqa: F401 (the store's names)
from ..policy.staleness import Step, bsp_step, dc_compensate, mean_delay
from ..policy.sync import SyncPolicy
from .optimizers import SGD, make_optimizer as _make_optimizer, make_rows_optimizer
from ..sparse.step import check_rows, sparse_sum, table_push_ok

RETIRED_KEPT = 2  # replaced tensors kept per block for reuse (`_retire`)
ROWS_LOAN_WAIT_S = 30.0  # a shard lent to a send is waited for this long before it is copied (`_copy_on_write`)
INT_SLOT = ":int"  # an optimizer's state held as a Python int (SparseAdam's step) travels as a tensor so named


@dataclass
class Prepared:
    """An update combined, not yet stepped (`ParameterStore.prepare`)."""
    plan: "_Plan"
    early: dict
    combined: dict[int, torch.Tensor]


@dataclass
class Push:
    worker: int
    version: int
    samples: int
    tensors: dict[int, torch.Tensor]
    start: int = -1  # barrier protocols: the slice's first position in the global order
    count: float | None = None  # units the worker's loss averaged over (None: its samples)
    read: int | None = None  # no barrier: the server's samples when the weights were read (its stamp)
    then: dict[int, torch.Tensor] | None = None  # delay compensation: the weights it was computed on
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # a table block's gradient: of these rows only

    @property
    def weight(self) -> float:
        """What the push weighs in its group: its loss's units (samples by default)."""
        return float(self.samples) if self.count is None else self.count


@dataclass
class Early:
    """A block's update computed ahead of its version's (`ParameterStore.speculate`)."""
    sig: tuple
    value: torch.Tensor
    state: dict
    grads: tuple  # the gradients it was computed from, kept so that their ids stay theirs


@dataclass
class _Plan:
    group: list[Push]
    weights: list[float]
    by_samples: list[float]
    lr: float  # the learning rate times its factor
    momentum: float
    step: Step | None


class PushError(ValueError):
    """A push the store refuses; the message names the worker and the fault."""


class ParameterStore:
    def __init__(self, blocks: list[Block], values: Mapping[int, torch.Tensor], spec: OptimizerSpec,
                 policy: SyncPolicy, *, version: int = 0, samples: int = 0,
                 optim_state: Mapping[str, torch.Tensor] | None = None, adopt: bool = False):
        """``adopt``: a table's shards in ``values`` are this store's to keep (an init
        message's, decoded for this server alone): held as they are, not copied — a copy
        would hold the table twice while the message lives."""
        self.blocks = {b.key: b for b in blocks}
        self.spec, self.policy = spec, policy
        self.version, self.samples = version, samples
        self.values = {k: values[k].detach() if adopt and b.kind == "rows" and values[k].is_contiguous()
                       else values[k].detach().clone().contiguous() for k, b in self.blocks.items()}
        self._params = [torch.nn.Parameter(self.values[k], requires_grad=False)
                        for k, b in self.blocks.items() if b.kind == "param"]
        self._param_keys = [k for k, b in self.blocks.items() if b.kind == "param"]
        self._param_of = dict(zip(self._param_keys, self._params))  # block key → its Parameter
        self.optimizer = _make_optimizer(spec, self._params)
        # sparse tables' blocks: (rows, width) views stepped by torch's sparse step (server/rows.py)
        self._rows_of = {k: torch.nn.Parameter(self.values[k].view(-1, b.width), requires_grad=False)
                         for k, b in self.blocks.items() if b.kind == "rows"}
        self.rows_optimizer = make_rows_optimizer(spec, list(self._rows_of.values()))
        self._step_untouched = spec.name == "adam" or (spec.name == "sgd" and spec.momentum > 0)
        self._dense_keys, self._empty = {k for k, b in self.blocks.items() if b.kind != "rows"}, {}
        self._schedule = user_schedule(spec.schedule)
        self._plain_sgd = spec.name == "sgd" and spec.momentum == 0 and spec.weight_decay == 0
        self.last_step: Step | None = None  # async_scaling = "bsp": how the last update stepped
        self._mean_square: dict[int, torch.Tensor] = {}  # dc_adaptive: per block, Zheng et al.'s MeanSquare
        self.compensated = 0  # delay compensation: gradients corrected (the others had no w_then)
        self._sums: dict[int, torch.Tensor] = {}
        self._loans: list[tuple[list[torch.Tensor], Callable[[], bool]]] = []  # (tensors, done)
        self._retired: dict[int, list[torch.Tensor]] = {}  # earlier buffers of each block
        self.early: dict[int, Early] = {}  # blocks whose next update was computed ahead (speculate)
        self.committed: set[int] = set()  # the blocks the last update took from `early`
        self.generation = 0  # updates applied by this store: a speculation is of one generation
        if optim_state:
            self._load_optim_state(optim_state)

    # -- updates ----------------------------------------------------------------------
    def check(self, push: Push, partial: bool = False, checked: frozenset[int] | set[int] = frozenset()) -> None:
        """Raise PushError unless the push holds exactly this server's blocks (`partial`:
        some of them, at least one), finite; a table's blocks only where the worker's
        batch touched them (so none at all, possibly, on a server holding tables only).
        The tensors of `checked` blocks (a push's fragments, checked as they came) are
        not checked again."""
        keys = set(push.tensors)
        dense = self._dense_keys
        bare = not keys and len(dense) == len(self.blocks)  # empty, with no table block it could leave out
        if not keys <= self.blocks.keys() or (bare if partial else not dense <= keys):
            missing = sorted(set(self.blocks) - set(push.tensors))[:5]
            extra = sorted(set(push.tensors) - set(self.blocks))[:5]
            raise PushError(f"push from worker {push.worker} has wrong blocks "
                            f"(missing {missing}, unexpected {extra})")
        if push.samples < (0 if self.policy.barrier() else 1):  # none: planned no samples at a barrier (LB-BSP)
            raise PushError(f"push from worker {push.worker} has samples = {push.samples}")
        if push.count is not None and not (math.isfinite(push.count) and push.count >= 0):
            raise PushError(f"push from worker {push.worker} has count = {push.count} (a finite number ≥ 0)")
        table = [k for k in push.tensors if k not in checked and self.blocks[k].kind == "rows"]
        if table and not table_push_ok([self.blocks[k] for k in table], [push.rows.get(k) for k in table],
                                       [push.tensors[k] for k in table], [self.values[k].dtype for k in table]):
            for key in table:  # one is wrong: found and named
                self._check_rows(push, key, push.tensors[key])
        for key, t in push.tensors.items():
            if key in checked or self.blocks[key].kind == "rows":
                continue
            if t.shape != self.values[key].shape or t.dtype != self.values[key].dtype:
                raise PushError(f"push from worker {push.worker}: block {key} has shape "
                                f"{tuple(t.shape)} {t.dtype}, expected {tuple(self.values[key].shape)}")
            # one sum, not an isfinite mask: NaN and inf propagate (a block whose sum overflows is refused too)
            if not math.isfinite(float(t.sum())):
                raise PushError(f"push from worker {push.worker}: block {key} holds a non-finite "
                                "gradient (NaN or inf)")

    def _check_rows(self, push: Push, key: int, t: torch.Tensor) -> None:
        """A table block's gradient: rows within the block, their values flat, finite."""
        b, who = self.blocks[key], f"push from worker {push.worker}"
        rows = push.rows.get(key)
        if rows is None:
            raise PushError(f"{who}: block {key} of table {b.name} comes without its rows")
        try:
            check_rows(b, rows, who)
        except ValueError as exc:
            raise PushError(str(exc)) from None
        if t.dim() != 1 or t.numel() != rows.numel() * b.width or t.dtype != self.values[key].dtype:
            raise PushError(f"{who}: block {key} has {tuple(t.shape)} {t.dtype} for {rows.numel()} rows of "
                            f"{b.width}")
        if not math.isfinite(float(t.sum())):
            raise PushError(f"{who}: block {key} holds a non-finite gradient (NaN or inf)")

    def lend(self, tensors: list[torch.Tensor], done: Callable[[], bool]) -> None:
        """`tensors` (of `values`) are read, e.g. by a zero-copy send, until `done()`:
        no update changes them in place before then."""
        self._loans = [loan for loan in self._loans if not loan[1]()]
        self._loans.append((tensors, done))

    def _await(self, ids: set[int], timeout: float) -> bool:
        """Wait until none of the tensors `ids` is lent any more; False if some still are
        after `timeout` seconds (the sends that read them are ZeroMQ's, on its own thread)."""
        deadline = time.monotonic() + timeout
        while ids & self._busy():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    def _busy(self) -> set[int]:
        """The ids of the tensors still lent (`lend`)."""
        self._loans = [loan for loan in self._loans if not loan[1]()]
        return {id(t) for tensors, _ in self._loans for t in tensors}

    def _buffer(self, key: int, busy: set[int] | None = None) -> torch.Tensor | None:
        """A retired tensor of block `key` that nothing reads any more (`busy`: the lent
        tensors' ids, if known), taken to compute into (touched memory: a fresh one costs
        page faults on large blocks); None if there is none."""
        retired = self._retired.get(key)
        if not retired:
            return None
        busy = self._busy() if busy is None else busy
        free = next((i for i, t in enumerate(retired) if id(t) not in busy), None)
        return None if free is None else retired.pop(free)  # by position: remove would compare elementwise

    def _retire(self, key: int, tensor: torch.Tensor) -> None:
        """Keep a block's replaced tensor for reuse (at most RETIRED_KEPT per block)."""
        retired = self._retired.setdefault(key, [])
        retired.append(tensor)
        del retired[:-RETIRED_KEPT]

    def _copy_on_write(self) -> None:
        """Before an update: move every block whose tensor is still lent to another buffer.
        A sparse table's shard is waited for instead (at most ROWS_LOAN_WAIT_S): only a
        snapshot's `state` reply lends one whole, the update touches a few of its rows, and
        a copy would double the table on this server for as long as the spare is kept
        (`_retire`) — a table of 10⁷ rows held 2.5 GB extra on four servers."""
        busy = self._busy()
        if not busy:
            return
        shards = {id(v) for k, v in self.values.items() if id(v) in busy and self.blocks[k].kind == "rows"}
        if shards and self._await(shards, ROWS_LOAN_WAIT_S):
            busy = self._busy()
        params = self._param_of
        for key, value in self.values.items():
            if id(value) not in busy:
                continue
            spare = self._buffer(key, busy)
            spare = value.clone() if spare is None else spare.copy_(value)
            self._retire(key, value)
            self.values[key] = spare
            if key in params:
                params[key].data = spare  # the optimizer's state stays keyed by the same Parameter
            elif key in self._rows_of:
                self._rows_of[key].data = spare.view(-1, self.blocks[key].width)

    def apply(self, group: list[Push], staleness: list[int] | None = None, *, forwarded: bool = False) -> None:
        """Combine a group of pushes (sorted by slice, then worker, for determinism: under
        a barrier the slices of one iteration are contiguous in worker order, also after
        a lost worker's slice was cut among the others) and step once.
        `staleness` (σ of each push) drives the policy's learning-rate modulation.

        Without a barrier a push may lack blocks this server holds (its worker routed by
        the table before a hand-over: those gradients come forwarded by the old owner).
        A block is then stepped by the pushes that have it, each with its weight in the
        group, so every gradient counts once with the share it has in its update; a block
        no push has is not stepped. `forwarded`: such a forwarded gradient, applied on
        its own — the version and the sample count do not move (the worker's push for
        this server's other blocks counted them).

        A block whose update `speculate` computed ahead from the same gradients, weights,
        learning rate and momentum on the same values (`early`) takes that result, the
        same numbers: the step of one block never reads another's."""
        self.finish(self.prepare(group, staleness), forwarded=forwarded)

    def prepare(self, group: list[Push], staleness: list[int] | None = None) -> "Prepared":
        """The first half of `apply`: the group's combined gradient of each block, nothing
        stepped yet. `grad_sq` of it is this server's part of the update's squared
        gradient norm (clip_grad_norm); `finish` steps."""
        plan = self._plan(group, staleness)
        if self.policy.async_scaling == "bsp":
            self.last_step = plan.step
        group = plan.group
        grads = self._compensated(group) if self.policy.delay_compensation != "none" else None
        early = {k: e for k, e in self.early.items() if e.sig == self._signature(k, plan)}
        whole = all(len(p.tensors) == len(self.blocks) for p in group)
        combined: dict[int, torch.Tensor] = {}
        for k, b in self.blocks.items():
            if k in early:
                continue
            have = range(len(group)) if whole else [i for i, p in enumerate(group) if k in p.tensors]
            if not have:
                continue
            w = plan.weights if b.kind != "buffer" else plan.by_samples
            if b.kind == "rows":  # a sparse table's: the rows each push touched (server/rows.py)
                combined[k] = sparse_sum([group[i].rows[k] for i in have], [group[i].tensors[k] for i in have],
                                         [w[i] for i in have], (b.rows, b.width))
                continue
            if not whole:  # buffers are averages: over the pushes that have them
                w = [w[i] for i in have]
                if b.kind == "buffer":
                    w = [x / sum(w) for x in w] if sum(w) > 0 else w
            combined[k] = self._combine(k, [grads[i].get(k, group[i].tensors[k]) if grads else group[i].tensors[k]
                                            for i in have], w)
        return Prepared(plan, early, combined)

    @staticmethod
    def grad_norms(prepared: "Prepared", blocks: Mapping[int, Block]) -> dict[int, float]:
        """The L2 norm of each parameter block's combined gradient, as `clip_grad_norm_`
        computes it (torch._foreach_norm, in the gradients' dtype, one thread: the same
        reduction order on every machine). Stacked in block order over every server,
        their norm is the update's global gradient norm (`global_norm`)."""
        keys = [k for k in sorted(prepared.combined) if blocks[k].kind == "param"]
        if not keys:
            return {}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            norms = torch._foreach_norm([prepared.combined[k] for k in keys], 2.0)
        finally:
            torch.set_num_threads(threads)
        return {k: float(n) for k, n in zip(keys, norms)}

    def finish(self, prepared: "Prepared", norm: float | None = None, *, forwarded: bool = False) -> None:
        """The second half of `apply`: step with the combined gradients, clipped first
        when `norm` (the update's global gradient norm, `global_norm`) is given: each
        parameter gradient times min(1, clip / (norm + 1e-6)), in float32, the
        arithmetic of `clip_grad_norm_`."""
        plan, early, combined = prepared.plan, prepared.early, prepared.combined
        self._copy_on_write()
        if norm is not None and self.spec.clip > 0:
            coef = (self.spec.clip / (torch.tensor(norm, dtype=torch.float32) + 1e-6)).clamp(max=1.0)
            for k, g in combined.items():
                if self.blocks[k].kind == "param":
                    g.mul_(coef.to(g.dtype))
        for key, param in zip(self._param_keys, self._params):
            param.grad = combined.get(key)
        for key, param in self._rows_of.items():  # an untouched shard: an empty gradient (made once) where
            # that moves anything (SparseAdam's step count, SGD's momentum), else none (Adagrad, plain SGD)
            if key not in combined and self._step_untouched and key not in self._empty:
                self._empty[key] = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(
                    0, param.shape[1], dtype=param.dtype), param.shape)
            param.grad = combined.get(key, self._empty.get(key) if self._step_untouched else None)
        if self.rows_optimizer is not None:
            self._set_hyper(self.rows_optimizer, plan.lr, plan.momentum)
            self.rows_optimizer.step()
        for key, b in self.blocks.items():
            if b.kind == "buffer" and key in combined:
                self.values[key].copy_(combined[key])
        self._set_hyper(self.optimizer, plan.lr, plan.momentum)
        if plan.momentum == 0 and self.spec.momentum > 0:
            # torch's SGD skips a zero momentum without touching the buffer; the rule's
            # buf = 0·buf + g means the next momentum starts from g afresh.
            for param in self._params:
                if param.grad is not None:
                    self.optimizer.state.get(param, {}).pop("momentum_buffer", None)
        if self._params:
            self.optimizer.step()  # a parameter without a gradient (None) is not stepped
        params = self._param_of
        for k, e in early.items():  # the updates computed ahead: their values and optimizer state
            self._retire(k, self.values[k])
            self.values[k] = e.value
            if k in params:
                params[k].data = e.value
                self.optimizer.state.pop(params[k], None)
                if e.state:
                    self.optimizer.state[params[k]] = e.state
        self.committed = set(early)
        self.early = {}
        self.generation += 1
        if not forwarded:
            self.version += 1
            self.samples += sum(p.samples for p in plan.group)

    def speculate(self, group: list[Push], keys: list[int]) -> None:
        """Compute ahead the update of each block of `keys` from `group`, the pushes its
        version's update will be made of as far as they are known (some still partial:
        each has every block of `keys`), on side buffers: the store does not change.
        `apply` takes a block's result if its group turns out the same (the same
        gradients with the same weights, learning rate and momentum, on this version's
        values), and computes it again otherwise (a worker lost meanwhile, a group cut
        differently). Barrier protocols, σ = 0, without delay compensation."""
        plan = self._plan(group, None)
        params = self._param_of
        for k in keys:
            b = self.blocks[k]
            w = plan.weights if b.kind == "param" else plan.by_samples
            g = self._combine(k, [p.tensors[k] for p in plan.group], w)
            state: dict = {}
            out = self._buffer(k)
            if b.kind == "buffer":  # buffers: the average itself
                value = g.clone() if out is None else out.copy_(g)
            elif self._plain_sgd:  # apply's w −= lr·g, the same kernel, into other memory in one pass
                value = torch.add(self.values[k], g, alpha=-plan.lr, out=out)
            else:
                value = self.values[k].clone() if out is None else out.copy_(self.values[k])
                side = torch.nn.Parameter(value, requires_grad=False)
                optimizer = _make_optimizer(self.spec, [side])
                kept = {n: t.clone() if isinstance(t, torch.Tensor) else t
                        for n, t in self.optimizer.state.get(params[k], {}).items()}
                if plan.momentum == 0 and self.spec.momentum > 0:
                    kept.pop("momentum_buffer", None)
                if kept:
                    optimizer.state[side] = kept
                self._set_hyper(optimizer, plan.lr, plan.momentum)
                side.grad = g
                optimizer.step()
                state = optimizer.state.get(side, {})
            self.early[k] = Early(self._signature(k, plan), value, state,
                                  tuple(p.tensors[k] for p in plan.group))

    def _plan(self, group: list[Push], staleness: list[int] | None) -> "_Plan":
        """The arithmetic of one update before any block is touched: the group in its
        order, each push's weight (and its weight among the buffers, by samples), the
        learning rate and momentum."""
        staleness = [0] * len(group) if staleness is None else list(staleness)
        order = sorted(range(len(group)), key=lambda i: (group[i].start, group[i].worker))
        group, staleness = [group[i] for i in order], [staleness[i] for i in order]
        base = self.policy.weights([p.weight for p in group])
        weights, lr_factor = self.policy.modulate(base, staleness)
        momentum, step = self.spec.momentum, None
        if self.policy.async_scaling == "bsp":
            # The rule sizes the step (α0/σ was Rudra's estimate of it): a modulation only
            # moves weight within the group towards its fresher gradients.
            step = self._bsp_step(group, staleness)
            total = sum(weights)
            if total > 0:
                weights = [w * sum(base) / total for w in weights]
            lr_factor, momentum = step.lr_factor, step.momentum
        # Buffers (BatchNorm statistics) are averaged over samples, never scaled by staleness.
        by_samples = self.policy.weights([p.samples for p in group])
        lr = self.spec.rate(self.samples / self.spec.global_batch, self._schedule)
        return _Plan(group, weights, by_samples, lr * lr_factor, momentum, step)

    def _signature(self, key: int, plan: "_Plan") -> tuple:
        """What a block's update depends on besides its values: the store's generation
        (updates so far), the step's hyper-parameters, and each gradient with its weight."""
        w = plan.weights if self.blocks[key].kind == "param" else plan.by_samples
        return (self.generation, plan.lr, plan.momentum,
                tuple((p.worker, p.start, x, id(p.tensors.get(key))) for p, x in zip(plan.group, w)))

    def _set_hyper(self, optimizer: "SGD | torch.optim.Optimizer", lr: float, momentum: float) -> None:
        for g in optimizer.param_groups:
            g["lr"] = lr
            if "momentum" in g:
                g["momentum"] = momentum

    def _bsp_step(self, group: list[Push], staleness: list[int]) -> Step:
        """BSP's lr and momentum for this update (policy/staleness.py): its samples against
        the global batch, and its gradients' delay — samples applied since each was read,
        from the stamp the worker echoed; σ updates of this size where it sent none."""
        samples = sum(p.samples for p in group)
        delays = [self.samples - p.read if p.read is not None else s * samples
                  for p, s in zip(group, staleness)]
        return bsp_step(samples, self.spec.global_batch, self.spec.momentum, mean_delay(samples, delays))

    def _compensated(self, group: list[Push]) -> list[dict[int, torch.Tensor]]:
        """DC-ASGD: each parameter gradient corrected by λ·g⊙g⊙(w_now − w_then), where the
        push carries the weights it was computed on (`then`); a push without them (the
        server no longer held that read) is applied as it is."""
        lam, adaptive = self.policy.dc_lambda, self.policy.delay_compensation == "dc_adaptive"
        out: list[dict[int, torch.Tensor]] = []
        for p in group:
            fixed: dict[int, torch.Tensor] = {}
            if p.then is not None and lam > 0:
                for k, b in self.blocks.items():
                    if b.kind != "param" or k not in p.then or k not in p.tensors:
                        continue
                    ms = None
                    if adaptive:
                        ms = self._mean_square.get(k)
                        if ms is None:
                            ms = self._mean_square[k] = torch.zeros_like(self.values[k])
                    fixed[k] = dc_compensate(p.tensors[k], self.values[k], p.then[k], lam, ms)
                self.compensated += 1
            out.append(fixed)
        return out

    def _combine(self, key: int, tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
        """Σ wᵢ·gᵢ into a buffer reused across updates: allocating fresh memory for every
        update costs more than the arithmetic (page faults on large blocks)."""
        if len(tensors) == 1 and weights[0] == 1.0:
            return tensors[0]  # t·1.0 is t exactly
        out = self._sums.get(key)
        if out is None:
            out = self._sums[key] = torch.empty_like(self.values[key])
        return _weighted_sum(tensors, weights, out)

    # -- state ------------------------------------------------------------------------
    def optim_state(self) -> dict[str, torch.Tensor]:
        """Optimizer state as flat tensors named '<block key>.<state name>'."""
        out: dict[str, torch.Tensor] = {}
        for key, param, optimizer in self._stepped():
            for name, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor):
                    out[f"{key}.{name}"] = value.detach().clone()
                elif isinstance(value, int) and not isinstance(value, bool):  # SparseAdam's step count
                    out[f"{key}.{name}{INT_SLOT}"] = torch.tensor(value, dtype=torch.int64)
        return out

    def _stepped(self) -> list:
        """(key, Parameter, its optimizer) of every block an optimizer steps."""
        return ([(k, p, self.optimizer) for k, p in zip(self._param_keys, self._params)]
                + [(k, p, self.rows_optimizer) for k, p in self._rows_of.items()])

    def _load_optim_state(self, state: Mapping[str, torch.Tensor]) -> None:
        for key, param, optimizer in self._stepped():
            prefix = f"{key}."
            entry = {n[len(prefix):]: t.clone() for n, t in state.items() if n.startswith(prefix)}
            entry = {n.removesuffix(INT_SLOT): int(t) if n.endswith(INT_SLOT) else t for n, t in entry.items()}
            if entry:
                optimizer.state[param] = entry


def _weighted_sum(tensors: list[torch.Tensor], weights: list[float], out: torch.Tensor) -> torch.Tensor:
    torch.mul(tensors[0], weights[0], out=out)
    for t, w in zip(tensors[1:], weights[1:]):
        out.add_(t, alpha=w)
    return out
