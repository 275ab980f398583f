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


# -- damaged checkpoints: one line naming the file and what is wrong ------------------

def _meta(tmp_path):
    import json
    return json.loads((tmp_path / "checkpoint" / "meta.json").read_text())


def _write_meta(tmp_path, meta):
    import json
    (tmp_path / "checkpoint" / "meta.json").write_text(json.dumps(meta))


def _state_with_its_digest(tmp_path, state: bytes):
    """Write `state` as state.pt and its SHA-256 into meta.json: only the contents are wrong."""
    import hashlib

    (tmp_path / "checkpoint" / "state.pt").write_bytes(state)
    meta = _meta(tmp_path)
    meta["state_sha256"] = hashlib.sha256(state).hexdigest()
    _write_meta(tmp_path, meta)


def _one_line(exc_info, *needles):
    text = str(exc_info.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize("key", ["iteration", "cursor", "version", "samples", "blocks", "table"])
def test_a_meta_json_missing_a_key_is_named(tmp_path, key):
    save_checkpoint(tmp_path, _ckpt(3))
    meta = _meta(tmp_path)
    del meta[key]
    _write_meta(tmp_path, meta)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    _one_line(info, "meta.json", key)


def test_a_truncated_state_or_one_of_another_save_is_refused_by_its_digest(tmp_path):
    save_checkpoint(tmp_path, _ckpt(3))
    state = tmp_path / "checkpoint" / "state.pt"
    whole = state.read_bytes()
    state.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    _one_line(info, "state.pt", "SHA-256")
    other = tmp_path / "other"
    save_checkpoint(other, _ckpt(4))  # same shapes, another save
    state.write_bytes((other / "checkpoint" / "state.pt").read_bytes())
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    _one_line(info, "state.pt", "SHA-256")


def test_a_block_of_the_wrong_shape_is_named_even_with_a_matching_digest(tmp_path):
    from equipoise.protocol.checkpoint import tensor_bytes

    save_checkpoint(tmp_path, _ckpt(3))
    _state_with_its_digest(tmp_path, tensor_bytes({"v0": torch.zeros(5), "s0.momentum": torch.ones(4)}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    _one_line(info, "state.pt", "block 0 (w) should hold 4 elements of 4 bytes, has 5")


def test_a_pickled_object_is_refused_not_unpickled(tmp_path):
    import pickle

    save_checkpoint(tmp_path, _ckpt(3))

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))

    _state_with_its_digest(tmp_path, pickle.dumps({"v0": Boom()}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    _one_line(info, "state.pt", "unreadable")


def test_resume_from_a_damaged_checkpoint_exits_2_in_one_line_and_writes_nothing(tmp_path, capsys):
    from equipoise.cli import main
    from equipoise.config import Config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(Config.from_dict({"dataset": "digits", "model": "mlp"}).to_toml())
    save_checkpoint(run, _ckpt(3))
    meta = _meta(run)
    del meta["cursor"]
    _write_meta(run, meta)
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "meta.json" in lines[0] and "cursor" in lines[0], err
    assert {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_run_file_is_replaced_whole(tmp_path):
    from equipoise.protocol.checkpoint import write_atomic

    path = tmp_path / "summary.json"
    write_atomic(path, "old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp file left
