"""Entry point of a server or worker process started by the local launcher.

``python -m equipoise.runtime.proc ROLE RANK COORDINATOR_ADDRESS HEARTBEAT_ADDRESS CONFIG_JSON``

The process dies with its parent (PR_SET_PDEATHSIG on Linux), ignores Ctrl-C (the
launcher decides how the job ends), and exits 1 with a one-line error on failure. With a
heartbeat address it beats every `heartbeat_s` from a thread of its own, so the launcher
can tell a frozen process from a busy one; if the coordinator stops answering the beats
for `timeout` seconds the process exits 1 on its own (the coordinator is gone).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the idle timeout still ends orphans


def _beat(transport, address: str, role: str, rank: int, period: float, timeout: float) -> None:
    from ..wire import Message, PeerTimeout

    conn = transport.connect(address)
    answered = time.monotonic()
    while True:
        try:
            conn.send(Message("beat", {"role": role, "rank": rank}))
        except PeerTimeout:
            pass
        deadline = time.monotonic() + period
        while (left := deadline - time.monotonic()) > 0:
            try:
                conn.recv(timeout=left)
                answered = time.monotonic()
            except PeerTimeout:
                break
            except Exception:  # a garbled answer is no answer
                continue
        if time.monotonic() - answered > timeout:
            print(f"error: {role} {rank}: the coordinator has not answered a heartbeat for "
                  f"{timeout:.0f} s: it is gone; exiting", file=sys.stderr, flush=True)
            os._exit(1)


def main(argv: list[str]) -> int:
    role, rank, coordinator, beats, cfg_json = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role}{rank} %(levelname)s %(message)s")
    from ..config import Config
    from ..wire import make_transport

    cfg = Config.from_dict(json.loads(cfg_json))
    transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20)
    # Importing torch (and a server's optimizers) holds the interpreter for seconds, long
    # enough to look frozen: done before the heartbeat starts.
    import torch  # noqa: F401
    if role == "server":
        from .server import _warm_up
        _warm_up()
    if beats and cfg.heartbeat_s > 0:
        threading.Thread(target=_beat, args=(transport, beats, role, int(rank), cfg.heartbeat_s, cfg.timeout),
                         name="heartbeat", daemon=True).start()
    try:
        if role == "server":
            from .server import Server
            Server(int(rank), transport, coordinator, host=cfg.listen_host, timeout=cfg.timeout).serve()
        elif role == "worker":
            from .worker import Worker
            Worker(cfg, int(rank), transport, coordinator).run()
        else:
            raise ValueError(f"unknown role {role!r}")
    except Exception as exc:  # the launcher shows this line, naming the process
        logging.getLogger("equipoise").debug("failure", exc_info=True)
        print(f"error: {role} {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
