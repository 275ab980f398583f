"""Ctrl-C and SIGTERM for `equipoise train`, raised where the coordinator waits.

Python's own handler raises KeyboardInterrupt wherever the main thread happens to be.
Inside a C call that runs Python (a zmq socket closed by the garbage collector, a
finaliser) the exception is printed as ignored and lost, and the job trains on. So the
handler installed here only records the signal; the coordinator's waits (`Rpc.tick`,
`Rpc.expect`, each at most a second apart) raise it through `check`. A signal not taken
within `GRACE` seconds (the main thread is somewhere that does not wait on peers: loading
data, importing) is delivered again, and a second delivery raises at once, as does a
second Ctrl-C.
"""

from __future__ import annotations

import signal
import threading

GRACE = 2.0  # seconds a recorded signal may wait for the coordinator's next check


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C (not an Exception: no `except Exception` takes it)."""


_pending: type[BaseException] | None = None
_timer: threading.Timer | None = None
_generation = 0  # counts signals recorded, so a late timer knows its own was taken


def _exception(signum: int) -> type[BaseException]:
    return KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _handler(signum: int, frame) -> None:
    global _pending, _timer, _generation
    if _pending is not None:  # a second signal, or the first not taken in time
        _clear()
        raise _exception(signum)
    _pending, _generation = _exception(signum), _generation + 1
    _timer = threading.Timer(GRACE, _again, (signum, _generation))
    _timer.daemon = True
    _timer.start()


def _again(signum: int, generation: int) -> None:
    if _pending is not None and _generation == generation:  # not taken yet
        signal.raise_signal(signum)


def _clear() -> None:
    global _pending, _timer
    _pending = None
    if _timer is not None:
        _timer.cancel()
        _timer = None


def install() -> None:
    """Record SIGINT and SIGTERM instead of raising them (main thread only)."""
    _clear()
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def check() -> None:
    """Raise the signal recorded since the last check, if any."""
    if _pending is not None:
        exc = _pending
        _clear()
        raise exc()


__all__ = ["GRACE", "Terminated", "check", "install"]
