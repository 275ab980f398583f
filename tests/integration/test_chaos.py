"""Two repetitions of the chaos benchmark (benchmarks/bench_chaos.py, seed 0): BSP jobs
whose workers and servers are killed or frozen at drawn moments complete, every blow is
in summary.json's `recovered`, and the final weights are within 1e-5 of the oracle (the
tolerance is argued in test_recovery's docstring)."""

from __future__ import annotations

import pytest

from benchmarks.bench_chaos import ITERATIONS, TOLERANCE, draw, repetition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("rep", [0])  # the benchmark runs 20; one keeps the suite short
def test_chaos_repetition_completes_equal_to_the_oracle(tmp_path, rep):
    record = repetition(0, rep, tmp_path / "run")
    assert record["status"] == "completed", record["error"]
    assert record["iterations"] == ITERATIONS
    assert len(record["schedule"]) == len(draw(0, rep)[1])
    assert all("missed" not in b for b in record["schedule"]), record["schedule"]
    assert record["unaccounted"] == [], record["recovered"]
    assert record["diff"] <= TOLERANCE and record["moved"] > 100 * TOLERANCE
    assert record["ok"]
