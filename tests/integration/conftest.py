"""Integration tests run real jobs: a coordinator in the test process, servers and
workers as child processes talking ZeroMQ on loopback. The launcher stops every child
before a job returns or raises; the fixture below checks none is left behind."""

from __future__ import annotations

import os

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_orphans():
    before = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    yield
    left = [p for p in psutil.Process(os.getpid()).children(recursive=True) if p.pid not in before]
    names = []
    for p in left:  # named, killed and reaped, so that no later test finds them
        try:
            names.append(p.cmdline()[-4:])
        except psutil.Error:
            names.append(f"pid {p.pid}, exited and not reaped")
        try:
            p.kill()
            p.wait(timeout=10)
        except psutil.Error:
            pass
    assert not left, f"processes left running: {names}"
    # nor this process a child subreaper (launch/warm.py, while a job's template runs):
    # orphans of later tests' processes would become its zombies
    assert _subreaper() == 0, "this process is still a child subreaper after the test"


def _subreaper() -> int:
    import ctypes

    value = ctypes.c_int(0)
    try:
        ctypes.CDLL("libc.so.6").prctl(37, ctypes.byref(value), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    except OSError:
        return 0
    return value.value


@pytest.fixture
def small(tmp_path):
    """A small, fast job: the digits data set and an MLP."""
    return dict(dataset="digits", model="mlp", global_batch=64, workers=4, servers=2,
                iterations=20, eval_every=10, checkpoint_every=10, lr=0.05, progress=False,
                timeout=60.0)
