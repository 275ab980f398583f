"""The run directory's checkpoint/: the latest consistent state of a job.

Layout: ``checkpoint/meta.json`` (iteration, stream cursor, server version and sample
count, blocks, block → server table) and ``checkpoint/state.pt`` (block values and
optimizer state as a flat dict of tensors, written with `torch.save` and read back with
``weights_only=True``: never unpickle arbitrary objects). A checkpoint is written to
``checkpoint.tmp``, its files and folder fsynced, and swapped in by two renames
(``checkpoint`` → ``checkpoint.old``, ``checkpoint.tmp`` → ``checkpoint``): a process
killed mid-write leaves the previous checkpoint intact, and one killed between the two
renames leaves it as ``checkpoint.old``, which `load_checkpoint` then reads and the next
`save_checkpoint` puts back first.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint is missing or unreadable; the message names the path."""


@dataclass
class Checkpoint:
    iteration: int
    cursor: int
    version: int
    samples: int
    blocks: list[list]
    table: list[int]
    values: dict[int, torch.Tensor]
    optim: dict[str, torch.Tensor]
    extra: dict[str, Any] = field(default_factory=dict)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> Path:
    final = Path(run_dir) / "checkpoint"
    tmp, old = final.with_name("checkpoint.tmp"), final.with_name("checkpoint.old")
    if old.exists() and not final.exists():  # the last save was killed between its renames
        old.rename(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {f"v{k}": v.contiguous() for k, v in ckpt.values.items()}
    tensors.update({f"s{k}": v.contiguous() for k, v in ckpt.optim.items()})
    torch.save(tensors, tmp / "state.pt")
    meta = {k: getattr(ckpt, k) for k in ("iteration", "cursor", "version", "samples",
                                          "blocks", "table", "extra")}
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    for path in (tmp / "state.pt", tmp / "meta.json", tmp):
        _fsync(path)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    _fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(run_dir: Path) -> Checkpoint:
    folder = Path(run_dir) / "checkpoint"
    if not folder.exists() and folder.with_name("checkpoint.old").exists():
        folder = folder.with_name("checkpoint.old")  # a save killed between its renames
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        tensors = torch.load(folder / "state.pt", weights_only=True, map_location="cpu")
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint in {folder} ({exc.filename} is missing)") from None
    except Exception as exc:  # a corrupt file: torch/json raise many kinds
        raise CheckpointError(f"checkpoint in {folder} is unreadable: {type(exc).__name__}: {exc}") from None
    if not isinstance(tensors, dict):
        raise CheckpointError(f"checkpoint {folder / 'state.pt'} does not hold a dict of tensors")
    values = {int(k[1:]): v for k, v in tensors.items() if k.startswith("v")}
    optim = {k[1:]: v for k, v in tensors.items() if k.startswith("s")}
    return Checkpoint(meta["iteration"], meta["cursor"], meta["version"], meta["samples"],
                      meta["blocks"], meta["table"], values, optim, meta.get("extra", {}))
