"""A short fuzzing run against a real server process (benchmarks/bench_fuzz.py): it
survives a couple of thousand bad messages, keeps answering a valid worker exactly, holds
a bounded number of requests and writes a bounded number of log lines."""

from multiprocessing import resource_tracker

import pytest

from benchmarks.bench_fuzz import Fuzz
from equipoise.runtime.server import MAX_HELD

pytestmark = pytest.mark.timeout(120)
resource_tracker.ensure_running()  # spawn starts it once per process: not a child left behind


def test_a_live_server_survives_fuzzing_and_serves_a_valid_worker_exactly():
    messages, every = 2000, 40
    r = Fuzz(messages, seed=7, valid_every=every).run()
    assert r["crashed"] is None and r["hung"] is None and r["stopped_cleanly"], r
    assert r["messages"] == messages and set(r["sent_by_category"]) >= {"garbage", "fields", "tensors", "versions"}
    # one exchange before, one every `every` messages, one after; each bit-exact
    assert r["valid_checks"] == messages // every + 2 and r["valid_checks_failed"] == 0, r["failures"]
    assert r["replies_by_kind"]["error"] > 0 and r["log_tracebacks"] == 0
    assert 0 <= r["held"]["max"] <= MAX_HELD
    # Unlimited, every refused message wrote a warning (≥ 90% of them are refused); the
    # server and the transport each log at most 2·64 + 2 lines per minute (QuietLog).
    assert r["log_warnings"] < messages // 4
    # The server holds small records only: its RSS may move by allocator noise and a
    # few 1 MiB messages in flight, far below 128 MiB.
    assert r["server_rss_mb"]["max"] - r["server_rss_mb"]["start"] < 128
