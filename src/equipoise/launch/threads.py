"""An in-process launcher: servers and workers as threads on the in-memory transport.

The same main loops as the local launcher, with no sockets and no processes: for tests
of protocol behaviour and for debugging a job under a Python debugger. It is not fast
(the GIL serialises Python work), so never benchmark with it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..config import Config
from ..wire import InMemoryTransport
from ..protocol.checkpoint import Checkpoint
from ..coordinator.pacings import make_coordinator
from ..coordinator.rpc import JobError
from ..server.core import Server
from ..worker.loop import Worker


class _Peer(threading.Thread):
    def __init__(self, name: str, target):
        super().__init__(name=name, daemon=True)
        self._target_fn, self.error = target, None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:  # reported by check(), naming the peer
            self.error = exc


def run_threads(cfg: Config, run_dir: Path, data, resume: Checkpoint | None = None) -> dict:
    """Run one job with every role in this process; returns its summary."""
    transport = InMemoryTransport(max_bytes=cfg.max_message_mb << 20)
    listener = transport.listen()
    peers = [_Peer(f"server{r}", Server(r, transport, listener.address, timeout=cfg.timeout).serve)
             for r in range(cfg.servers)]
    peers += [_Peer(f"worker{r}", Worker(cfg, r, transport, listener.address).run)
              for r in range(cfg.workers)]
    for p in peers:
        p.start()

    class Threads:
        """The coordinator's `Peers`: every role a thread."""

        def check(self) -> None:
            for p in peers:
                if p.error is not None:
                    raise JobError(f"{p.name} failed: {type(p.error).__name__}: {p.error}")

        def spawn(self, role: str, rank: int) -> None:
            main = (Server(rank, transport, listener.address, timeout=cfg.timeout).serve if role == "server"
                    else Worker(cfg, rank, transport, listener.address).run)
            peer = _Peer(f"{role}{rank}", main)
            peers.append(peer)
            peer.start()

        def retired(self, role: str, rank: int) -> None:
            pass

        def started(self) -> None:
            pass

        def tolerate(self, role: str) -> None:
            pass  # a thread cannot be killed from outside: there are no losses to tolerate

        def lost(self) -> list:
            self.check()
            return []

    try:
        summary = make_coordinator(cfg, run_dir, transport, listener, data, peers=Threads(), resume=resume).run()
    except BaseException:
        transport.close()  # a failed job: every peer's next wait ends (closed), none waits out its timeout
        for p in peers:
            p.join(timeout=10)
        raise
    for p in peers:
        p.join(timeout=10)
    transport.close()
    return summary
