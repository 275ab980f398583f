"""Message types and their required fields.

``SCHEMA`` maps a message type name to ``{field name: python type or tuple of
types}``. Every listed field must be present with a value of that type; extra
fields are allowed and passed through untouched. ``int`` never accepts
``bool``; ``float`` also accepts ``int`` (but not ``bool``).

To add a type, call :func:`register` (or edit ``SCHEMA`` below)::

    register("heartbeat", rank=int, load=float)

Tensor names are not checked by the schema; the conventions used by the
runtime are noted next to each type.
"""

from __future__ import annotations

from typing import Any, Mapping

FieldType = type | tuple[type, ...]

SCHEMA: dict[str, dict[str, FieldType]] = {
    # cluster membership
    "hello": {"role": str, "rank": int, "address": str, "pid": int},
    "welcome": {"rank": int, "servers": list, "table": list},
    # tensors: block values "b<key>", optimizer state "s<key>.<name>"
    "init": {"blocks": list, "optimizer": dict, "version": int, "samples": int},
    "ready": {"rank": int},
    # scheduling
    "plan_req": {"worker": int, "step": int, "report": dict},
    "plan": {
        "step": int,
        "iteration": int,
        "start": int,
        "size": int,
        "stop": bool,
        "version": int,
    },
    # parameter traffic; tensors "b<key>" in params, "g<key>" in push
    "pull": {"worker": int, "min_version": int},  # optional part_kb (reply in parts), early (eager_update)
    # optional last (a part), early (computed ahead of the version), kept (early parts stand)
    "params": {"version": int, "held_s": float},
    "push": {"worker": int, "version": int, "samples": int},  # optional seq, fragments: it ends a stream
    # sparse tables: rows of their blocks ("i<key>" tensors) at a version; the reply "r<key>"
    "rows_req": {"worker": int, "min_version": int},
    "rows": {"version": int},
    # backward_push: part of a push, + tensors "g<key>"; no reply; optional samples, start, count (its push's)
    "fragment": {"worker": int, "seq": int},
    "ack": {"version": int},
    # checkpointing; state carries arbitrary tensors
    "state_req": {"version": int},
    "state": {"version": int, "samples": int},
    # membership: the number of workers a barrier update waits for
    "members": {"workers": int},  # optional "retired": [worker ranks] (SSP clocks)
    "flush": {},  # apply a half-filled softsync group (end of a run)
    # a worker died: forget it (optional "drop": drop its pending pushes, default true)
    "lose": {"worker": int, "workers": int},
    "expect": {"version": int},
    # replication = 1: a backup named by the coordinator; primary -> backup versions and acks
    "replicate": {"backup": str},
    "replica": {"primary": int, "version": int, "samples": int, "reply_to": str},  # + tensors
    "replica_ack": {"version": int, "backup": int},
    "replica_req": {"primary": int, "version": int},  # answered with a "state"  # optional "pushes": int | null — the update in progress waits for that many
    # clip_grad_norm under a barrier: the gradient norm of each block a server holds in
    # the update ([[key, norm], ...]), then the global norm every server clips by
    "norm_req": {"version": int},
    "norm": {"version": int, "norms": list},
    "clip": {"version": int, "norm": float},
    # PSLD: measurements, emulated server stragglers, block migration
    "stats_req": {},
    "stats": {"busy_s": float, "bytes": int, "load_bytes": int, "blocks": int},
    "probe": {},  # + tensor "p": bytes whose handling times the server's rate; answered with a pong
    "straggle": {},  # optional factor, rate_mbps, bandwidth_mbps
    "migrate": {"keys": list, "to": str},  # coordinator -> source server
    "adopt": {"blocks": list, "version": int, "samples": int},  # source -> destination, + tensors; optional ledger
    # no barrier: a gradient of a handed-over block that reached its old owner, + tensors "g<key>"
    "forward": {"worker": int, "samples": int},  # optional step, delay, count, epoch, part
    "table_req": {"worker": int},  # a worker whose plan said await_table, before its first push
    "table": {"table": list, "servers": list, "version": int},
    # control
    "stop": {"reason": str},
    "error": {"message": str},
    "ping": {},
    "beat": {"role": str, "rank": int},  # a child's heartbeat, and the coordinator's answer
    "pong": {},
}


def register(type_name: str, **fields: FieldType) -> None:
    """Add (or replace) message type ``type_name`` with the given required fields."""
    if not isinstance(type_name, str) or not type_name:
        raise ValueError("message type name must be a non-empty str")
    for name, ftype in fields.items():
        types = ftype if isinstance(ftype, tuple) else (ftype,)
        if not types or not all(isinstance(t, type) for t in types):
            raise ValueError(f"field {name!r}: expected a type or tuple of types")
    SCHEMA[type_name] = dict(fields)


def _matches(value: Any, ftype: FieldType) -> bool:
    """isinstance with the wire rules: bool is not an int, int is a float."""
    types = ftype if isinstance(ftype, tuple) else (ftype,)
    for t in types:
        if t is bool:
            if isinstance(value, bool):
                return True
        elif t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif isinstance(value, t):
            return True
    return False


def _type_name(ftype: FieldType) -> str:
    types = ftype if isinstance(ftype, tuple) else (ftype,)
    return "|".join(t.__name__ for t in types)


def check_fields(type_name: str, fields: Mapping[str, Any]) -> str | None:
    """Return None if ``fields`` satisfies ``SCHEMA[type_name]``, else the reason.

    Unknown ``type_name`` is reported as a reason too (never raises).
    """
    spec = SCHEMA.get(type_name)
    if spec is None:
        return f"unknown message type {type_name!r}"
    for name, ftype in spec.items():
        if name not in fields:
            return f"{type_name!r} message lacks field {name!r}"
        value = fields[name]
        if not _matches(value, ftype):
            return (
                f"{type_name!r} field {name!r} should be {_type_name(ftype)}, "
                f"got {type(value).__name__}"
            )
    return None
