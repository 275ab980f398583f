"""PSLD's actions on servers, and a user's request for one (pure: no sockets).

``Psld`` (``policy.psld``) decides ``MoveBlock``, ``AddServer`` and ``RemoveServer``
actions; ``parse_control`` reads a user's request (one line of run_dir/control.jsonl,
``equipoise ctl``) as an action of the same types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["MoveBlock", "AddServer", "RemoveServer", "ServerAction", "parse_control"]


@dataclass(frozen=True)
class MoveBlock:
    """Migrate block ``block`` from server rank ``src`` (None: wherever it is) to ``dst``."""
    block: int
    src: int | None
    dst: int


@dataclass(frozen=True)
class AddServer:
    """Start one more server; it joins the job empty."""


@dataclass(frozen=True)
class RemoveServer:
    """Move every block off server rank ``server``, then stop it."""
    server: int


ServerAction = MoveBlock | AddServer | RemoveServer


def parse_control(line: str) -> ServerAction:
    """One control.jsonl request as a server action: {"action": "add_server"},
    {"action": "remove_server", "server": R} or {"action": "move", "block": K, "to": R}.
    Raises ValueError naming what is wrong."""
    try:
        req = json.loads(line)
    except json.JSONDecodeError:
        raise ValueError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(req, dict):
        raise ValueError(f"not an object: {line[:80]!r}")
    action = req.get("action")

    def number(key: str) -> int:
        v = req.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{action}: {key} = {v!r} must be an integer ≥ 0")
        return v

    if action == "add_server":
        return AddServer()
    if action == "remove_server":
        return RemoveServer(number("server"))
    if action == "move":
        return MoveBlock(number("block"), None, number("to"))
    raise ValueError(f"unknown action {action!r} (add_server, remove_server, move)")
