"""Consistent snapshots of the servers' state: evaluation, checkpoints, the final model.

The coordinator asks for a snapshot at a quiet moment (a barrier, or once every worker
stopped); this part fetches the state, writes the checkpoint and model.pt, and evaluates
on a thread of its own so training goes on meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..telemetry.metrics import MetricsWriter
from ..workload import EvalAborted
from ..wire import Message, names
from ..protocol.blocks import write_values
from ..protocol.checkpoint import Checkpoint, save_checkpoint, tensor_bytes, write_atomic
from .rpc import JobError

log = logging.getLogger("equipoise.coordinator")


@dataclass(frozen=True)
class SnapshotSettings:
    """The configuration snapshots read."""

    eval_every: int
    eval_samples: int
    checkpoint_every: int
    timeout: float
    target: dict  # {metric = "test_<name>", below | above = value}; {}: none
    eval_device: str = "cpu"  # where snapshots are evaluated
    eval_batch: int = 128  # samples an evaluation feeds the model at once


@dataclass
class State:
    """Every block's values and optimizer state, and the servers' version and samples."""

    values: dict[int, torch.Tensor]
    optim: dict[str, torch.Tensor]
    version: int
    samples: int
    gradients: dict[int, int] = field(default_factory=dict)  # per block key: gradients applied in all


class Snapshots:
    def __init__(self, settings: SnapshotSettings, run_dir: Path, data, metrics: MetricsWriter,
                 new_model: Callable[[], nn.Module], total: int):
        self.settings, self.run_dir, self.data = settings, Path(run_dir), data
        self.metrics, self.new_model, self.total = metrics, new_model, total
        self._evals = ThreadPoolExecutor(1, thread_name_prefix="eval")
        self._pending: list[tuple[int, Future]] = []  # (iteration, its evaluation)
        self.superseded: list[int] = []  # iterations whose evaluation a newer one replaced
        self._final = threading.Event()  # the final evaluation is due: a periodic one still running stops
        self._taken_at: int | None = None
        self.reached: dict | None = None  # when the target was first met (an eval's thread sets it)

    def due(self, t: int) -> tuple[bool, bool]:
        """(evaluate, checkpoint) at iteration t; both at the end. Once per t (a barrier
        re-entered after workers joined asks again)."""
        if self._taken_at == t:
            return False, False
        self._taken_at = t
        s, final = self.settings, t >= self.total
        want_eval = final or bool(s.eval_every and t % s.eval_every == 0 and t > 0)
        want_eval = want_eval and self.data.eval is not None  # no evaluation set: nothing to evaluate
        want_ckpt = final or bool(s.checkpoint_every and t % s.checkpoint_every == 0 and t > 0)
        return want_eval, want_ckpt

    @staticmethod
    def fetch(broadcast: Callable[[Message, str], dict[int, Message]], version: int) -> State:
        """The state of every server once it holds `version` (0: what it has now)."""
        values, optim, versions, samples, gradients = {}, {}, [], [], {}
        for rank, reply in broadcast(Message("state_req", {"version": version}), "state").items():
            if reply.fields.get("blocks", 1) == 0:
                continue  # an empty server's version stood still: it has nothing to say
            values.update(names.values_of(reply.tensors))
            optim.update(names.states_of(reply.tensors))
            versions.append(reply.fields["version"])
            samples.append(reply.fields["samples"])
            gradients.update({int(k): int(n) for k, n in reply.fields.get("block_gradients", [])})
        return State(values, optim, min(versions), min(samples), gradients)

    def take(self, t: int, state: State, *, cursor: int, blocks: list, table: list[int], elapsed: float,
             want_eval: bool, want_ckpt: bool) -> None:
        """Write what is due of the snapshot of iteration t (the final one writes model.pt)."""
        if want_ckpt:
            path = save_checkpoint(self.run_dir, Checkpoint(t, cursor, state.version, state.samples,
                                                            [b.to_list() for b in blocks], list(table),
                                                            state.values, state.optim))
            self.event("checkpoint", t, path=str(path))
        if t >= self.total:
            model = self.new_model()
            write_values(model, blocks, state.values)  # a plain state_dict: load with weights_only=True
            write_atomic(self.run_dir / "model.pt", tensor_bytes(model.state_dict()))
        if want_eval:
            self._supersede(t)
            if t >= self.total:
                self._final.set()
            self._pending.append((t, self._evals.submit(self._evaluate, t, blocks, state.values, elapsed)))

    def _supersede(self, t: int) -> None:
        """Drop the evaluations still queued (not begun) for a newer one, at iteration t:
        an evaluation that falls behind training is replaced, not queued, so the job
        never waits at its end for a backlog. The final one also stops a periodic one
        still running, at its next batch (`_evaluate`): the job waits for the final one
        only. Each dropped one is an `eval_superseded` event and listed in summary.json's
        `evaluations`."""
        kept = []
        for at, f in self._pending:
            if not f.done() and f.cancel():
                self.superseded.append(at)
                self.event("eval_superseded", at, by=t)
            else:
                kept.append((at, f))
        self._pending = kept

    def replay_from(self, t: int) -> None:
        """The job rolled back to iteration t: the snapshots from t on are due again."""
        if self._taken_at is not None and self._taken_at >= t:
            self._taken_at = None
        if t < self.total:
            self._final.clear()

    def event(self, name: str, t: int, **fields) -> None:
        self.metrics.write({"type": "event", "event": name, "iteration": t, "time": time.time(), **fields})

    def _evaluate(self, t: int, blocks, values, elapsed: float) -> dict | None:
        """The metrics (test_<name> for each) of the snapshot taken `elapsed` training
        seconds in; the first that meets the target records when it did."""
        from ..device import resolve

        # One thread while training runs beside it; the final one runs after training, the
        # workers idle: every core of this machine (it was the largest part of a short job's wall time).
        torch.set_num_threads(max(1, os.cpu_count() or 1) if t >= self.total else 1)
        model = self.new_model()
        write_values(model, blocks, values)
        device = resolve(self.settings.eval_device, "evaluation (eval_device)")
        limit = 0 if t >= self.total else self.settings.eval_samples
        final = t >= self.total
        try:
            # not stopped while a target waits to be met: it may be the one that meets it first
            waiting = bool(self.settings.target) and self.reached is None
            metrics = self.data.evaluate(model.to(device), batch_size=self.settings.eval_batch, limit=limit,
                                         device=device, abort=None if final or waiting else self._final.is_set)
        except EvalAborted:
            self.superseded.append(t)
            self.event("eval_superseded", t, by=self.total, begun=True)
            return None
        n = self.data.num_eval
        record = {"type": "eval", "iteration": t, "time": time.time(), "elapsed": elapsed,
                  **{f"test_{k}": v for k, v in metrics.items()},
                  "test_samples": min(limit, n) if limit else n}
        self.metrics.write(record)
        target = self.settings.target
        if target and self.reached is None and meets(target, record):
            self.reached = {"iteration": t, "elapsed": elapsed, "metric": target["metric"],
                            "value": record[target["metric"]]}
            self.event("target", t, **{k: v for k, v in self.reached.items() if k != "iteration"})
        return record

    def check(self) -> None:
        """Raise now, as a JobError naming the iteration and the exception, if an
        evaluation failed (the user's metrics function or evaluation set): the job ends at
        once, not after training."""
        for t, f in self._pending:
            if f.done() and f.exception() is not None:
                exc = f.exception()
                raise JobError(f"evaluation at iteration {t} failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}")

    def results(self) -> list[dict]:
        """Every evaluation's record, in order, waiting at most `timeout` for those still
        running; one that is later is reported (an event) and left out, never a reason
        to fail a job that has finished training."""
        self.check()
        out = []
        for t, f in self._pending:
            try:
                record = f.result(timeout=max(60.0, self.settings.timeout))
                if record is not None:  # None: stopped for the final one
                    out.append(record)
            except FutureTimeout:
                log.warning("the evaluation at iteration %d did not finish within %.0f s: left out", t,
                            max(60.0, self.settings.timeout))
                self.event("eval_timed_out", t)
        self.check()
        return out

    def close(self) -> None:
        """Stop evaluating: one still running (a hung metrics function) is not waited for."""
        self._evals.shutdown(wait=False, cancel_futures=True)


def meets(target: dict, record: dict) -> bool:
    """Whether an evaluation record meets `target` ({metric, below | above})."""
    value = record.get(target["metric"])
    if not isinstance(value, (int, float)) or value != value:
        return False
    return value < target["below"] if "below" in target else value > target["above"]


__all__ = ["meets", "Snapshots", "SnapshotSettings", "State"]
