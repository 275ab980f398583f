"""Ctrl-C and SIGTERM recorded by `equipoise.interrupt`, raised at the coordinator's
check (or at once on a second signal, or one the check did not take in time)."""

import signal
import threading
import time

import pytest

from equipoise import interrupt


@pytest.fixture
def installed():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupt.install()
    yield
    interrupt.uninstall()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == saved


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


@pytest.mark.timeout(30)  # a delivery that misses this thread leaves it waiting: the test fails
def test_a_signal_no_check_takes_is_delivered_again_to_a_blocked_main_thread(installed, monkeypatch):
    monkeypatch.setattr(interrupt, "GRACE", 0.05)
    signal.raise_signal(signal.SIGTERM)
    never = threading.Event()
    with pytest.raises(interrupt.Terminated):
        never.wait(300)  # blocked in C: the second delivery must reach this thread and end it
    interrupt.check()


def test_after_one_is_raised_further_signals_are_ignored(installed):
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        interrupt.check()
    signal.raise_signal(signal.SIGINT)  # the launcher is cleaning up: not cut short
    signal.raise_signal(signal.SIGTERM)
    interrupt.check()


def test_a_taken_signal_is_not_delivered_again(installed, monkeypatch):
    monkeypatch.setattr(interrupt, "GRACE", 0.05)
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        interrupt.check()
    time.sleep(0.2)  # four times the grace: a timer not cancelled would have fired
    interrupt.check()
