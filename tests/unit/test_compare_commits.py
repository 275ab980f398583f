"""The statistics and extraction of benchmarks/compare_commits.py, on hand-made runs and on
the benchmarks' committed results files (no subprocess, no git)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import compare_commits as cc
from benchmarks.common import RESULTS_DIR


def _doc(name: str) -> dict:
    return json.loads((RESULTS_DIR / name).read_text(encoding="utf-8"))


def test_bench_ddp_extractor_reads_the_committed_results():
    doc = _doc("bench_ddp.json")
    got = cc.extract("bench_ddp", doc)
    assert got == {"equipoise.samples_per_s": doc["equipoise"]["samples_per_s"],
                   "equipoise.steady_samples_per_s": doc["equipoise"]["steady_samples_per_s"],
                   "ddp.samples_per_s": doc["ddp"]["samples_per_s"]}
    assert all(v > 0 for v in got.values())


def test_bench_lbbsp_extractor_names_every_system():
    doc = _doc("bench_lbbsp_full.json")
    got = cc.extract("bench_lbbsp", doc)
    assert set(got) == {f"{s}.samples_per_s" for s in doc["results"]} | {"ideal.samples_per_s"}
    assert {"bsp.samples_per_s", "asp.samples_per_s", "ddp.samples_per_s"} <= set(got)
    assert got["bsp.samples_per_s"] == doc["results"]["bsp"]["samples_per_s"] > 0


def test_fallback_collects_every_samples_per_s_leaf_with_its_path():
    doc = {"a": {"samples_per_s": 3, "runs": [{"samples_per_s": 2.5}, {"samples_per_s": None}]},
           "samples_per_s": True, "b": {"samples_per_s_x": 1.0, "flag": "x"}}
    assert cc.extract("bench_unknown", doc) == {"a.samples_per_s": 3.0, "a.runs[0].samples_per_s": 2.5,
                                               "a.runs[1].samples_per_s": None, "samples_per_s": None}
    assert cc.at(doc, "a.samples_per_s") == 3.0
    assert cc.at(doc, "a.missing") is None and cc.at(doc, "b.flag") is None


def _run(side: str, **metrics: float | None) -> dict:
    return {"side": side, "metrics": metrics}


def test_summary_medians_ranges_and_pair_ratios():
    # base 100, 120, 110; head 90, 132, 99 -> pairs 0.9, 1.1, 0.9; medians 110 and 99.
    runs = [_run("base", x=100.0), _run("head", x=90.0), _run("base", x=120.0),
            _run("head", x=132.0), _run("base", x=110.0), _run("head", x=99.0)]
    m = cc.summarise(runs)["x"]
    assert m["base"] == {"values": [100.0, 120.0, 110.0], "median": 110.0, "min": 100.0, "max": 120.0}
    assert m["head"]["values"] == [90.0, 132.0, 99.0] and m["head"]["median"] == 99.0
    assert m["ratio"] == pytest.approx(0.9)
    assert m["pair_ratios"] == pytest.approx([0.9, 1.1, 0.9])
    assert (m["pair_ratio_min"], m["pair_ratio_max"]) == pytest.approx((0.9, 1.1))
    table = cc.report_table({"x": m})
    assert "| x " in table and "110 (100–120)" in table and "0.900 (pairs 0.900–1.100)" in table


def test_a_failed_run_keeps_its_place_and_drops_only_its_pair():
    runs = [_run("base", x=100.0), _run("head"), _run("base", x=200.0), _run("head", x=220.0)]
    m = cc.summarise(runs)["x"]
    assert m["head"]["values"] == [None, 220.0] and m["head"]["median"] == 220.0
    assert m["base"]["median"] == 150.0
    assert m["pair_ratios"] == pytest.approx([1.1])
    only_base = cc.summarise([_run("base", y=1.0), _run("head")])["y"]
    assert math.isnan(only_base["ratio"]) and only_base["pair_ratios"] == []
    assert cc.finite(only_base)["ratio"] is None


def test_recorded_command_line_names_no_absolute_path():
    root = Path("/repo")
    argv = ["--out", "/repo/benchmarks/results/x.json", "--base", "HEAD~1", "--out", "/tmp/c.json"]
    assert cc.relative_argv(argv, root) == ["--out", "benchmarks/results/x.json", "--base", "HEAD~1",
                                            "--out", "<outside>/c.json"]


def test_runs_made_earlier_are_summarised_as_base_head_pairs(monkeypatch):
    monkeypatch.setattr(cc, "resolve", lambda rev: rev * 4)  # no git in a unit test
    path = str(RESULTS_DIR / "bench_ddp.json")
    got = cc.from_runs("b", "h", "bench_ddp", [path, path, path])
    assert [r["side"] for r in got["runs"]] == ["base", "head", "base"]
    m = got["metrics"]["equipoise.samples_per_s"]
    # The same file on both sides: every pair ratio and the ratio of medians are exactly 1.
    assert m["ratio"] == 1.0 and m["pair_ratio_min"] == m["pair_ratio_max"] == 1.0
    assert got["commits"] == {"base": "bbbb", "head": "hhhh"}
