"""A worker's requests for rows of sparse tables (PSClient.rows): one request per server
holding rows asked for, many blocks in one tensor (wire/names.py ``pack_parts``), and
again of a block's new owner where the block was handed over without a barrier since
the worker's table (the old owner answers with its address)."""

from __future__ import annotations

import torch

from ..wire import Message
from ..wire.names import pack_parts, unpack_parts

__all__ = ["fetch_rows", "MAX_ROW_HOPS"]

MAX_ROW_HOPS = 4  # a rows request follows a block handed over without a barrier this many times


def fetch_rows(client, version: int | None, wanted: dict[int, torch.Tensor], error: type[Exception]
               ) -> dict[int, torch.Tensor]:
    """PSClient.rows: by key, rows × width; `error` (the client's) names what went wrong."""
    owner = {b.key: r for r, blocks in client.by_server.items() for b in blocks}
    width = {b.key: b.width for blocks in client.by_server.values() for b in blocks}
    route, pending = dict(owner), dict(wanted)
    out: dict[int, torch.Tensor] = {}
    for _ in range(MAX_ROW_HOPS):
        ticket = client._send("rows", lambda r, blocks: Message(
            "rows_req", {"worker": client.worker, "min_version": int(version or 0), "epoch": client.epoch},
            pack_parts("I", {k: ids for k, ids in pending.items() if route.get(k) == r})),
            only=sorted({route[k] for k in pending if k in route}))
        moved: dict[int, str] = {}
        for r, reply in client.wait(ticket).items():
            got = reply.fields.get("version")
            if version is not None and got != version:  # e.g. a lost worker's share recomputed after the update
                raise error(f"{client.who}: server {r} has table rows of version {got}, not {version}; "
                            "recomputing a lost worker's share with sparse tables is not supported yet")
            try:
                values = unpack_parts(reply.tensors, "R")
                moved.update({int(k): str(a) for k, a in reply.fields.get("moved", [])})
            except (ValueError, TypeError) as exc:
                raise error(f"{client.who}: server {r}'s rows reply: {exc}") from None
            for k, v in values.items():
                if k not in pending or k not in width or v.numel() != pending[k].numel() * width[k]:
                    raise error(f"{client.who}: server {r}'s rows reply has {v.numel()} values for "
                                f"block {k}, not the rows asked for")
                out[k] = v.view(-1, width[k])
        # blocks handed over since this worker's table (no barrier): asked of their new owner
        pending = {k: pending[k] for k in moved if k in pending and k not in out}
        if not pending:
            return out
        ranks = {conn.address: r for r, conn in client.conns.items()}
        for k in pending:
            if moved[k] not in ranks:
                raise error(f"{client.who}: block {k} moved to {moved[k]}, a server this worker "
                            "is not connected to")
            route[k] = ranks[moved[k]]
    raise error(f"{client.who}: rows of blocks {sorted(pending)[:5]} moved {MAX_ROW_HOPS} times "
                "while being asked for")
