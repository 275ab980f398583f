"""A short fuzzing run against a real server process (benchmarks/bench_fuzz.py), per auth
mode: it survives a couple of thousand bad messages, keeps answering a valid worker
exactly, holds a bounded number of requests and writes a bounded number of log lines.
Authenticated as in a real job, it refuses every coordinator-only message a worker's keys
send, and strangers (no keys, another job's) get no reply and no handshake."""

from multiprocessing import resource_tracker

import pytest

from benchmarks.bench_fuzz import Fuzz
from benchmarks.fuzz_messages import IMPOSTOR_TYPES
from equipoise.server.core import MAX_HELD

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
resource_tracker.ensure_running()  # spawn starts it once per process: not a child left behind


@pytest.mark.parametrize("auth", ["plain", "curve", "off"])
def test_a_live_server_survives_fuzzing_and_serves_a_valid_worker_exactly(auth):
    messages, every = 2000, 40
    r = Fuzz(messages, seed=7, valid_every=every, auth=auth).run()
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
    imp, strangers = r["impostor"], r["strangers"]
    if auth == "off":  # no roles: a worker's stop would be obeyed, so none is sent
        assert imp["sent"] == 0 and strangers["handshakes"].get("succeeded", 0) > 0
    else:
        # every coordinator-only message from a worker's keys answered "does not accept ... from a worker"
        assert imp["sent"] > 0 and imp["refused"] == imp["sent"], imp
        assert imp["answered_otherwise"] == 0 and imp["unanswered"] == 0
        assert set(imp["sent_by_type"]) == set(IMPOSTOR_TYPES)
        # strangers: no handshake succeeded (some were seen failing), no reply
        hs = strangers["handshakes"]
        assert strangers["replies"] == 0 and hs.get("succeeded", 0) == 0 and sum(hs.values()) > 0, strangers
    assert r["problems"] == []
