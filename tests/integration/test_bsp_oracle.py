"""BSP on N workers equals single-process SGD with the global batch on the same samples."""

from __future__ import annotations

import pytest

import equipoise

from .helpers import assert_equals_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("split", [None, (4, 28, 8, 24)], ids=["equal", "unequal"])
def test_bsp_equals_single_process_sgd(small, tmp_path, split):
    cfg = dict(small, iterations=24, seed=3, optimizer="sgd", momentum=0.9, weight_decay=1e-4,
               lr_schedule="step", lr_step_size=10, lr_gamma=0.5, block_size=5000)
    if split:
        cfg["batch_split"] = list(split)
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["iterations"] == 24
    assert summary["samples"] == 24 * 64
    assert_equals_reference(cfg, tmp_path / "run")
    # evaluations at 10, 20 and the end: each run or superseded by a newer one, the last run
    ev = summary["evaluations"]
    assert sorted(ev["run"] + ev["superseded"]) == [10, 20, 24] and ev["run"][-1] == 24
    # where the time went: the parts are read off one wall clock (train_s off another,
    # read within microseconds of it at each end), so they add up to the whole
    parts = [summary[k] for k in ("startup_s", "train_s", "eval_s", "shutdown_s")]
    assert min(parts) >= 0 and sum(parts) == pytest.approx(summary["total_s"], abs=0.01)


def test_bsp_adam_cosine_equals_single_process(small, tmp_path):
    cfg = dict(small, iterations=20, seed=1, optimizer="adam", lr=0.01, lr_schedule="cosine",
               workers=3, servers=3, block_size=3000)
    equipoise.train(cfg, out=tmp_path / "run")
    assert_equals_reference(cfg, tmp_path / "run")


def test_bsp_adamw_warm_up_cosine_equals_single_process(small, tmp_path):
    """nanoGPT's recipe on the servers (AdamW, decoupled weight decay, linear warm-up,
    cosine to a floor) equals torch.optim.AdamW stepped on one process with the same rates."""
    cfg = dict(small, iterations=16, seed=2, optimizer="adamw", lr=0.01, weight_decay=0.1,
               lr_schedule="cosine", warmup_iterations=4, lr_min=0.001, workers=3, servers=2, block_size=3000)
    equipoise.train(cfg, out=tmp_path / "run")
    assert_equals_reference(cfg, tmp_path / "run")


def test_bsp_with_a_user_schedule_equals_single_process(small, tmp_path):
    """A schedule of the user's own, by spec, imported by every server."""
    from pathlib import Path

    spec = f"{Path(__file__).parent / 'user_schedule.py'}:halving"
    cfg = dict(small, iterations=12, seed=4, momentum=0.9, lr_schedule=spec, block_size=5000)
    equipoise.train(cfg, out=tmp_path / "run")
    assert_equals_reference(cfg, tmp_path / "run")
