"""Entry point of a server or worker process started by the local launcher.

``python -m equipoise.runtime.proc ROLE RANK COORDINATOR_ADDRESS CONFIG_JSON``

The process dies with its parent (PR_SET_PDEATHSIG on Linux), ignores Ctrl-C (the
launcher decides how the job ends), and exits 1 with a one-line error on failure.
"""

from __future__ import annotations

import ctypes
import json
import logging
import signal
import sys


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the idle timeout still ends orphans


def main(argv: list[str]) -> int:
    role, rank, coordinator, cfg_json = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role}{rank} %(levelname)s %(message)s")
    from ..config import Config
    from ..wire import make_transport

    cfg = Config.from_dict(json.loads(cfg_json))
    transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20)
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
