"""TokenBucket (the emulated link cap) on virtual time: every number below is a sum of
powers of two, so the arithmetic is exact and the tests compare with ==."""

import pytest

from equipoise.clock import VirtualClock
from equipoise.wire.bandwidth import TokenBucket


def test_bucket_spends_its_burst_then_charges_debt_at_rate():
    clock = VirtualClock(start=100.0)
    bucket = TokenBucket(rate=1000.0, burst=500.0, clock=clock)
    assert bucket.delay(200) == 0.0            # 300 tokens left
    assert bucket.delay(800) == 0.5            # 500 bytes of debt at 1000 B/s
    clock.sleep(0.5)
    assert bucket.delay(0) == 0.0              # the debt is paid, nothing left over
    clock.advance(0.25)
    assert bucket.delay(1250) == 1.0           # 250 tokens earned, 1000 bytes short
    clock.advance(10.0)
    assert bucket.delay(500) == 0.0            # refilled, but only up to the burst
    assert bucket.delay(250) == 0.25


def test_a_paced_stream_averages_the_rate_after_the_burst():
    clock = VirtualClock()
    bucket = TokenBucket(rate=1000.0, burst=500.0, clock=clock)
    for _ in range(10):                        # 2500 bytes: 500 free, 2000 at 1000 B/s
        clock.sleep(bucket.delay(250))
    assert clock.now() == 2.0


def test_bucket_refuses_a_rate_that_is_not_positive():
    for rate in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            TokenBucket(rate, clock=VirtualClock())
