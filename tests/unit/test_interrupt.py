"""Ctrl-C and SIGTERM recorded by `equipoise.interrupt`, raised at the coordinator's
check (or at once on a second signal, or one the check did not take in time)."""

import signal
import time

import pytest

from equipoise import interrupt


@pytest.fixture
def installed():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupt.install()
    yield
    interrupt._clear()
    signal.signal(signal.SIGINT, saved[0])
    signal.signal(signal.SIGTERM, saved[1])


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt),
                                            (signal.SIGTERM, interrupt.Terminated)])
def test_a_signal_is_raised_by_the_next_check(installed, signum, raised):
    signal.raise_signal(signum)  # the handler returns: nothing raised here
    with pytest.raises(raised):
        interrupt.check()
    interrupt.check()  # taken once


def test_a_second_signal_raises_at_once(installed):
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    interrupt.check()  # the second took the first with it


def test_a_signal_no_check_takes_is_delivered_again(installed, monkeypatch):
    monkeypatch.setattr(interrupt, "GRACE", 0.05)
    signal.raise_signal(signal.SIGTERM)
    with pytest.raises(interrupt.Terminated):
        deadline = time.monotonic() + 30  # the timer's second delivery ends this loop
        while time.monotonic() < deadline:
            time.sleep(0.01)
    interrupt.check()


def test_a_taken_signal_is_not_delivered_again(installed, monkeypatch):
    monkeypatch.setattr(interrupt, "GRACE", 0.05)
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        interrupt.check()
    time.sleep(0.2)  # four times the grace: a timer not cancelled would have fired
    interrupt.check()
