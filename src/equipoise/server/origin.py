"""Who may send a server what: each message's authenticated sender (`Message.origin`,
the role, and `Message.origin_rank`, the rank, that the transport's authentication
vouches for; both None without authentication, which passes) against the message type
and the rank it claims."""

from __future__ import annotations

from ..wire import Message
from ..wire.auth import impersonated

# Who may send each message type; a type not listed is the coordinator's alone.
SENDERS = {"push": {"worker"}, "fragment": {"worker"}, "pull": {"worker"}, "rows_req": {"worker"}, "ping": {"coordinator", "server", "worker"},
           "adopt": {"coordinator", "server"},  # adopt: from the server handing its blocks over
           "forward": {"server"},  # a block's gradient that reached its old owner (no barrier)
           "replica": {"server"}, "replica_ack": {"server"}}  # replication = 1: primary <-> backup


def refusal(msg: Message, peer: str) -> tuple[str, str, str] | None:
    """(kind, what to reply, what to log) if `msg` may not come from its sender, else
    None: a type its role may not send, or a worker's message whose `worker` field
    names another rank than its credentials' (it would push, pull or be held as that
    worker)."""
    if msg.origin is not None and msg.origin not in SENDERS.get(msg.type, ("coordinator",)):
        return (f"not from a {msg.origin}", f"does not accept {msg.type!r} from a {msg.origin}",
                f"refused {msg.type!r} from {peer}, a {msg.origin}")
    claimed = impersonated(msg)
    if claimed is not None:
        claim = str(claimed)[:20]
        return ("another rank", f"refused {msg.type!r}: worker {msg.origin_rank}'s credentials claim worker {claim}",
                f"refused {msg.type!r} claiming worker {claim!r} from the credentials of worker {msg.origin_rank}")
    return None
