"""protocol/checkpoint.py: a save killed at any point leaves a checkpoint that loads."""

from __future__ import annotations

import shutil

import pytest
import torch

from equipoise.protocol.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint


def _ckpt(iteration: int) -> Checkpoint:
    return Checkpoint(iteration, iteration * 8, iteration, iteration * 8, [[0, "w", 0, 4, "param", 4]], [0],
                      {0: torch.full((4,), float(iteration))}, {"0.momentum": torch.ones(4)})


def test_a_checkpoint_round_trips(tmp_path):
    save_checkpoint(tmp_path, _ckpt(3))
    got = load_checkpoint(tmp_path)
    assert (got.iteration, got.cursor, got.table) == (3, 24, [0])
    assert torch.equal(got.values[0], torch.full((4,), 3.0)) and torch.equal(got.optim["0.momentum"], torch.ones(4))


def test_a_save_killed_mid_write_or_between_its_renames_leaves_the_previous_one(tmp_path):
    save_checkpoint(tmp_path, _ckpt(1))
    (tmp_path / "checkpoint.tmp").mkdir()  # killed while writing: a partial temporary folder
    (tmp_path / "checkpoint.tmp" / "state.pt").write_bytes(b"torn")
    assert load_checkpoint(tmp_path).iteration == 1
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")  # killed between the renames
    assert load_checkpoint(tmp_path).iteration == 1
    save_checkpoint(tmp_path, _ckpt(2))
    assert load_checkpoint(tmp_path).iteration == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    shutil.rmtree(tmp_path / "checkpoint")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path)
