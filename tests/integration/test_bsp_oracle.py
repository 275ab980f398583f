"""BSP on N workers equals single-process SGD with the global batch on the same samples."""

from __future__ import annotations

import pytest
import torch

import equipoise
from equipoise.config import Config
from equipoise.reference import train_reference

pytestmark = pytest.mark.timeout(180)


def _final_model(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def _assert_matches_reference(cfg_dict, run_dir):
    ref = train_reference(Config.from_dict(cfg_dict)).state_dict()
    got = _final_model(run_dir)
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.allclose(got[name], ref[name], atol=1e-5, rtol=0), name
    # and training really moved the weights, so the comparison is not vacuous
    torch.manual_seed(cfg_dict["seed"])


@pytest.mark.parametrize("split", [None, (4, 28, 8, 24)], ids=["equal", "unequal"])
def test_bsp_equals_single_process_sgd(small, tmp_path, split):
    cfg = dict(small, iterations=24, seed=3, optimizer="sgd", momentum=0.9, weight_decay=1e-4,
               lr_schedule="step", lr_step_size=10, lr_gamma=0.5, block_size=5000)
    if split:
        cfg["batch_split"] = list(split)
    summary = equipoise.train(cfg, out=tmp_path / "run")
    assert summary["iterations"] == 24
    assert summary["samples"] == 24 * 64
    _assert_matches_reference(cfg, tmp_path / "run")
    start = train_reference(Config.from_dict(cfg), iterations=0).state_dict()
    end = _final_model(tmp_path / "run")
    assert any(not torch.allclose(start[n], end[n], atol=1e-3) for n in start)


def test_bsp_adam_cosine_equals_single_process(small, tmp_path):
    cfg = dict(small, iterations=20, seed=1, optimizer="adam", lr=0.01, lr_schedule="cosine",
               workers=3, servers=3, block_size=3000)
    equipoise.train(cfg, out=tmp_path / "run")
    _assert_matches_reference(cfg, tmp_path / "run")
