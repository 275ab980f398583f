"""Requests a user appends to run_dir/control.jsonl while the job runs (`equipoise ctl`):
read as server actions at each barrier, a malformed line reported and skipped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from ..policy.actions import ServerAction, parse_control

log = logging.getLogger("equipoise.coordinator")


class ControlFile:
    """The control file at `path`, read from where the last read ended (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def actions(self, refused: Callable[[str, str], None]) -> list[ServerAction]:
        """The requests appended since the last call; `refused(line, reason)` is told of
        each malformed line."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # only whole lines
        self.offset += end
        out = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            try:
                out.append(parse_control(line))
            except ValueError as exc:
                log.warning("control.jsonl: %s", exc)
                refused(line, str(exc))
        return out


__all__ = ["ControlFile"]
