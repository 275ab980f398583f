"""Clipping by global norm (clip_grad_norm): BSP on 4 workers and LB-BSP with unequal
workers equal single-process training with torch.nn.utils.clip_grad_norm_, bit for bit,
for SGD with momentum and for AdamW with warm-up and cosine decay. The norm is over every
block on every server (each server reports its blocks' norms, the coordinator takes the
norm of them all as clip_grad_norm_ does); the runs' records say that it clipped."""

from __future__ import annotations

import pytest

import equipoise

from equipoise.config import Config
from equipoise.reference import oracle_diff

from .helpers import assert_equals_reference, assert_near_reference, records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SGD = dict(optimizer="sgd", lr=0.2, momentum=0.9, weight_decay=1e-4)
ADAMW = dict(optimizer="adamw", lr=0.01, weight_decay=0.1, lr_schedule="cosine", warmup_iterations=4,
             lr_min=0.001)


def clipped(run) -> list[float]:
    return [r["grad_norm"] for r in records(run, "iteration")]


@pytest.mark.parametrize("recipe", [SGD, ADAMW], ids=["sgd-momentum", "adamw-warmup-cosine"])
def test_bsp_clipped_equals_clip_grad_norm_on_one_process(small, tmp_path, recipe):
    cfg = dict(small, **recipe, iterations=16, seed=7, workers=4, servers=3, block_size=3000,
               clip_grad_norm=0.5, eval_every=0)
    equipoise.train(cfg, out=tmp_path / "run")
    norms = clipped(tmp_path / "run")
    assert len(norms) == 16
    # Clipping is active (the norm above 0.5) on most steps: else the test would not
    # tell clipping from none.
    assert sum(n > 0.5 for n in norms) >= 12, norms
    assert_equals_reference(cfg, tmp_path / "run")


@pytest.mark.parametrize("recipe", [SGD, ADAMW], ids=["sgd-momentum", "adamw-warmup-cosine"])
def test_lbbsp_unequal_workers_clipped_equals_clip_grad_norm_on_one_process(small, tmp_path, recipe):
    cfg = dict(small, **recipe, protocol="lbbsp", predictor="last", hysteresis=0.0, iterations=16, seed=8,
               workers=4, servers=2, block_size=3000, slowdown=[1.0, 1.0, 2.0, 4.0], clip_grad_norm=0.5,
               eval_every=0)
    equipoise.train(cfg, out=tmp_path / "run")
    batches = [r["batch"] for r in records(tmp_path / "run", "iteration")]
    assert len({tuple(b) for b in batches}) > 1, batches  # the split changed: LB-BSP at work
    norms = clipped(tmp_path / "run")
    assert sum(n > 0.5 for n in norms) >= 12, norms
    assert_equals_reference(cfg, tmp_path / "run")


def test_without_a_barrier_each_push_is_clipped_by_its_own_norm(small, tmp_path):
    """ASP: no update of the global batch exists to take the norm of; each worker clips
    its own gradient before pushing. With one worker that is clip_grad_norm_ on one
    process, step for step. Not bit for bit: the worker takes the norm over the model's
    parameters, the reference over the servers' blocks (the same numbers, summed in
    another grouping), so the clip coefficient may differ in its last bit or two
    (float32: ~1e-7 relative) at a step; ten SGD steps of lr 0.2 on gradients clipped to
    norm 0.5 carry that into the weights as at most ~1e-7 × 10 × 0.2 × 0.5 × 10 (momentum's
    amplification) ≈ 1e-6, under test_recovery's 1e-5, while training moves them by more
    than 1e-3 and clipping changes them by more than 1e-5 (asserted)."""
    base = dict(small, **SGD, iterations=10, seed=9, workers=1, servers=2, block_size=3000, clip_grad_norm=0.5,
                eval_every=0, checkpoint_every=0)
    equipoise.train(dict(base, protocol="asp"), out=tmp_path / "asp")
    assert_near_reference(dict(base, protocol="bsp"), tmp_path / "asp")
    unclipped = oracle_diff(Config.from_dict(dict(base, protocol="bsp", clip_grad_norm=0.0)), tmp_path / "asp")[0]
    assert unclipped > 1e-5  # the clipping mattered: without it the reference lands elsewhere
