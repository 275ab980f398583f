"""Ctrl-C and SIGTERM for `equipoise train`, raised where the coordinator waits.

Python's own handler raises KeyboardInterrupt wherever the main thread happens to be.
Inside a C call that runs Python (a zmq socket closed by the garbage collector, a
finaliser) the exception is printed as ignored and lost, and the job trains on. So the
handler installed here only records the signal; the coordinator's waits (`Rpc.tick`,
`Rpc.expect`, each at most a second apart) raise it through `check`. A signal not taken
within `GRACE` seconds (the main thread is somewhere that does not wait on peers: loading
data, importing, awaiting the final evaluation) is delivered to the main thread again,
and a second delivery raises at once, as does a second Ctrl-C. Once one was raised,
further signals are ignored: the launcher is stopping every child (within seconds), and
a second exception would cut its clean-up short.
"""

from __future__ import annotations

import signal
import threading

GRACE = 2.0  # seconds a recorded signal may wait for the coordinator's next check


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C (not an Exception: no `except Exception` takes it)."""


_pending: type[BaseException] | None = None
_taken = False  # a signal was raised: later ones are ignored while the launcher cleans up
_timer: threading.Timer | None = None
_generation = 0  # counts signals recorded, so a late timer knows its own was taken
_saved: dict[int, object] | None = None  # the handlers `install` replaced


def _exception(signum: int) -> type[BaseException]:
    return KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _handler(signum: int, frame) -> None:
    global _pending, _timer, _generation, _taken
    if _taken:  # the launcher is stopping every child already (within seconds)
        return
    if _pending is not None:  # a second signal, or the first not taken in time
        _clear()
        _taken = True
        raise _exception(signum)
    _pending, _generation = _exception(signum), _generation + 1
    _timer = threading.Timer(GRACE, _again, (signum, _generation))
    _timer.daemon = True
    _timer.start()


def _again(signum: int, generation: int) -> None:
    """Deliver the signal again, to the main thread: raise_signal would deliver it to
    this thread, and a main thread blocked in C (a lock, a queue) would not wake."""
    if _pending is not None and _generation == generation:  # not taken yet
        signal.pthread_kill(threading.main_thread().ident, signum)


def _clear() -> None:
    global _pending, _timer
    _pending = None
    if _timer is not None:
        _timer.cancel()
        _timer = None


def install() -> None:
    """Record SIGINT and SIGTERM instead of raising them (main thread only), until
    `uninstall`."""
    global _saved, _taken
    _clear()
    _taken = False
    _saved = {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def reinstall() -> None:
    """Put the handlers back if something replaced them since `install` (ray.init
    installs its own for SIGTERM); nothing if `install` was not called."""
    if _saved is not None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _handler)


def uninstall() -> None:
    """The handlers `install` replaced, back; a signal still recorded is dropped."""
    global _saved
    _clear()
    if _saved is not None:
        for sig, previous in _saved.items():
            signal.signal(sig, previous)
        _saved = None


def check() -> None:
    """Raise the signal recorded since the last check, if any."""
    global _taken
    if _pending is not None:
        exc = _pending
        _clear()
        _taken = True
        raise exc()


__all__ = ["GRACE", "Terminated", "check", "install", "reinstall", "uninstall"]
