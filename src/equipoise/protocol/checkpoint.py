"""The run directory's checkpoint/: the latest consistent state of a job.

Layout: ``checkpoint/meta.json`` (iteration, stream cursor, server version and sample
count, blocks, block → server table) and ``checkpoint/state.pt`` (block values and
optimizer state as a flat dict of tensors, written with `torch.save` and read back with
``weights_only=True``: never unpickle arbitrary objects). A checkpoint is written to
``checkpoint.tmp``, its files and folder fsynced, and swapped in by two renames
(``checkpoint`` → ``checkpoint.old``, ``checkpoint.tmp`` → ``checkpoint``): a process
killed mid-write leaves the previous checkpoint intact, and one killed between the two
renames leaves it as ``checkpoint.old``, which `load_checkpoint` then reads and the next
`save_checkpoint` puts back first. meta.json records the SHA-256 of state.pt, so a
state.pt from another save, or one truncated or changed, is refused; `load_checkpoint`
checks every key of meta.json and every block's tensor against the blocks it lists, and
refuses anything else in one line naming the file and what is wrong. The run
directory's other files are written by `write_atomic` (temp, fsync, rename): a crash
mid-write leaves the previous file whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..policy.placement import Block


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


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` so that a crash at any moment leaves either the old file or
    the new one whole: a temp file beside it, fsynced, renamed over it, the folder fsynced."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def tensor_bytes(tensors: dict) -> bytes:
    """`torch.save` of a dict of tensors, as bytes (for `write_atomic`)."""
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


META_KEYS = {"iteration": int, "cursor": int, "version": int, "samples": int, "blocks": list, "table": list}


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> Path:
    final = Path(run_dir) / "checkpoint"
    tmp, old = final.with_name("checkpoint.tmp"), final.with_name("checkpoint.old")
    if old.exists() and not final.exists():  # the last save was killed between its renames
        old.rename(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {f"v{k}": v.contiguous() for k, v in ckpt.values.items()}
    tensors.update({f"s{k}": v.contiguous() for k, v in ckpt.optim.items()})
    state = tensor_bytes(tensors)
    (tmp / "state.pt").write_bytes(state)
    meta = {k: getattr(ckpt, k) for k in ("iteration", "cursor", "version", "samples",
                                          "blocks", "table", "extra")}
    meta["state_sha256"] = hashlib.sha256(state).hexdigest()
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
    """The checkpoint of `run_dir`; CheckpointError (one line naming the file and what is
    wrong) if it is missing, unreadable, inconsistent or not what save_checkpoint wrote."""
    folder = Path(run_dir) / "checkpoint"
    if not folder.exists() and folder.with_name("checkpoint.old").exists():
        folder = folder.with_name("checkpoint.old")  # a save killed between its renames
    meta_path, state_path = folder / "meta.json", folder / "state.pt"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        state = state_path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint in {folder} ({exc.filename} is missing)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{meta_path} is unreadable: {type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path} does not hold a JSON object")
    for key, kind in META_KEYS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CheckpointError(f"{meta_path}: {key} is missing or not {'a list' if kind is list else 'an integer'}")
    digest = meta.get("state_sha256")
    if digest is not None and hashlib.sha256(state).hexdigest() != digest:
        raise CheckpointError(f"{state_path} is not the state {meta_path} was saved with (its SHA-256 differs: "
                              "truncated, changed or from another save)")
    try:
        tensors = torch.load(io.BytesIO(state), weights_only=True, map_location="cpu")
    except Exception as exc:  # a corrupt file: torch raises many kinds (a pickle of objects is refused here too)
        raise CheckpointError(f"{state_path} is unreadable: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise CheckpointError(f"{state_path} does not hold a dict of tensors")
    try:
        values = {int(k[1:]): v for k, v in tensors.items() if k.startswith("v")}
        blocks = [Block.from_list(r) for r in meta["blocks"]]
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{meta_path}: blocks are malformed ({exc})") from None
    for b in blocks:
        got = values.get(b.key)
        if got is None or got.numel() != b.numel or got.element_size() != b.itemsize:
            have = "missing" if got is None else f"{got.numel()} elements of {got.element_size()} bytes"
            raise CheckpointError(f"{state_path}: block {b.key} ({b.name}) should hold {b.numel} elements of "
                                  f"{b.itemsize} bytes, has {have}")
    if len(meta["table"]) != len(blocks) or set(values) != {b.key for b in blocks}:
        raise CheckpointError(f"{meta_path}: its table or state.pt's values do not match its {len(blocks)} blocks")
    optim = {k[1:]: v for k, v in tensors.items() if k.startswith("s")}
    return Checkpoint(meta["iteration"], meta["cursor"], meta["version"], meta["samples"],
                      meta["blocks"], meta["table"], values, optim, meta.get("extra", {}))
