"""The main of a server or worker process (`host`), and its entry point under the local
launcher.

``python -m equipoise.launch.proc ROLE RANK COORDINATOR_ADDRESS``, with the job on stdin:
one JSON document ``{"config": {...}, "keys": {...} | null}`` that the launcher writes and
closes (the role's `JobKeys`, wire/auth.py) and the
heartbeat address. Keys never appear on a command line, where
any local user could read them (/proc/<pid>/cmdline).

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
import select
import signal
import sys
import threading
import time

STDIN_TIMEOUT = 60.0


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the idle timeout still ends orphans


_STOPPING = threading.Event()  # set before the transport closes: the heartbeat thread ends


def _beat(transport, address: str, role: str, rank: int, period: float, timeout: float) -> None:
    from ..wire import Message, PeerTimeout, WireError

    from ..user_code import USER_CODE

    conn = transport.connect(address)
    answered = time.monotonic()
    while not _STOPPING.is_set():
        try:
            fields: dict = {"role": role, "rank": rank}
            busy = USER_CODE.longest() if role == "worker" else None
            if busy is not None:  # what the user's code is doing, so that a stuck call is named
                fields["busy"] = busy.to_list()
            conn.send(Message("beat", fields))
            deadline = time.monotonic() + period
            while (left := deadline - time.monotonic()) > 0:
                conn.recv(timeout=left)
                answered = time.monotonic()
        except (PeerTimeout, WireError):
            pass  # no answer in this period (a garbled one counts as none)
        except Exception:
            if _STOPPING.is_set():
                return  # the process is ending and closed the socket
            raise
        if time.monotonic() - answered > timeout:
            print(f"error: {role} {rank}: the coordinator has not answered a heartbeat for "
                  f"{timeout:.0f} s: it is gone; exiting", file=sys.stderr, flush=True)
            os._exit(1)


def read_job(fd: int, timeout: float = STDIN_TIMEOUT) -> dict:
    """The JSON document on `fd` up to end of file; TimeoutError if it does not end within
    `timeout` seconds, ValueError if it is not a JSON object."""
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError(f"the launcher sent no complete job on stdin within {timeout:g} s")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    job = json.loads(b"".join(chunks))
    if not isinstance(job, dict):
        raise ValueError("the job on stdin is not a JSON object")
    return job


def _warm_up(optimizer: str) -> None:
    """Build and step the job's optimizer once, if it is torch.optim's (Adam, AdamW): the first
    built in a process imports about 1.5 s of torch. SGD is the store's own (server/optimizers.py SGD)
    and needs nothing."""
    if optimizer == "sgd":
        return
    import torch

    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.zeros(1)
    (torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam)([p]).step()


def host(role: str, rank: int, coordinator: str, job: dict, *, data=None, address: str | None = None,
         machine_factor: float = 1.0) -> None:
    """Run `role` `rank` of the job described by `job` (the document above) until it ends:
    the one main of a server or worker, whichever launcher hosts it. `data` is the dataset
    if the launcher shares one (else the worker loads it); `address` the host a server
    binds (default: the config's); `machine_factor` a worker's emulated machine slowdown.
    Raises on failure."""
    from ..config import Config
    from ..wire import JobKeys, make_transport

    cfg = Config.from_dict(job["config"])
    keys = JobKeys.from_dict(job["keys"]) if job.get("keys") is not None else None
    transport = make_transport("zmq", max_bytes=cfg.max_message_mb << 20, keys=keys)
    try:
        # Importing torch (and a server's optimizers) holds the interpreter for seconds, long
        # enough to look frozen: done before the heartbeat starts.
        import torch  # noqa: F401
        if role == "server":
            _warm_up(cfg.optimizer)  # so that a server added while training runs joins without a long pause
        if job.get("beats") and cfg.heartbeat_s > 0:
            threading.Thread(target=_beat, args=(transport, job["beats"], role, rank, cfg.heartbeat_s,
                                                 cfg.timeout), name="heartbeat", daemon=True).start()
        if role == "server":
            from ..server.core import Server
            Server(rank, transport, coordinator, host=address or cfg.listen_host, timeout=cfg.timeout).serve()
        elif role == "worker":
            from ..worker.loop import Worker
            Worker(cfg, rank, transport, coordinator, data=data, machine_factor=machine_factor).run()
        else:
            raise ValueError(f"unknown role {role!r}")
    finally:
        _STOPPING.set()
        transport.close()


def main(argv: list[str], job: dict | None = None) -> int:
    """ROLE RANK COORDINATOR_ADDRESS; the job from stdin, or `job` (a warm start's,
    launch/warm.py)."""
    role, rank, coordinator = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role}{rank} %(levelname)s %(message)s")
    try:
        host(role, int(rank), coordinator, read_job(sys.stdin.fileno()) if job is None else job)
    except Exception as exc:  # the launcher shows this line, naming the process
        logging.getLogger("equipoise").debug("failure", exc_info=True)
        print(f"error: {role} {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
