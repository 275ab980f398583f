"""Calibrating the simulator on a real job and simulating that job again.

The calibration fits the workers' compute (a + b·x) and its noise, the host's cores and
load, and the servers' cost per byte, from the run's records, then the one-way latency
by bisection so that the simulation of the run's own config takes the run's steady mean
iteration time (after the first two iterations: process start-up is not simulated). So
the simulated steady mean must come back equal to the real one: up to the bisection's
bracket (2^-30 of it, about 1e-11 s) and the rounding of the latency to 1e-9 s, which
moves each of the four messages of an iteration by at most 5e-10 s. Against a real mean
of several milliseconds that is below 1e-6 relative; 1e-4 is asserted, so the test
checks that the pipeline (records → fit → simulation) reproduces the run, on any
machine. What it does not check is that the model predicts *other* configs: that is
the validate preset of benchmarks/bench_sim.py (docs/simulate.md, Validation).
"""

from __future__ import annotations

import json

import pytest

import equipoise
from equipoise.sim.calibrate import steady_iteration_s
from equipoise.telemetry.metrics import read_metrics

pytestmark = pytest.mark.slow  # every test here runs real jobs


def test_calibrated_simulation_reproduces_the_real_run(tmp_path):
    real = equipoise.train({"dataset": "digits", "model": "mlp", "workers": 2, "iterations": 30,
                            "eval_every": 0, "checkpoint_every": 0, "progress": False}, out=tmp_path / "real")
    sim = equipoise.simulate(tmp_path / "real" / "config.toml", calibrate=tmp_path / "real", out=tmp_path / "sim")
    real_mean = steady_iteration_s(read_metrics(tmp_path / "real" / "metrics.jsonl"))
    assert steady_iteration_s(read_metrics(tmp_path / "sim" / "metrics.jsonl")) == pytest.approx(real_mean, rel=1e-4)
    fitted = json.loads((tmp_path / "sim" / "calibration.json").read_text())
    assert fitted["fit"]["iterations_used"] == 28  # iterations 0 and 1 are left out as warm-up
    assert all(b > 0 for b in fitted["keys"]["sim_sample_s"])
    assert sim["simulated"] is True and sim["samples"] == real["samples"]
