"""User mistakes: one line naming the key and the bad value, exit code 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .helpers import cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


CASES = [
    (["--set", "protocol=foo"], ["protocol", "foo"]),
    (["--set", "global_batch=-8"], ["global_batch", "-8"]),
    (["--set", "workers=100", "--set", "global_batch=64"], ["workers", "100"]),
    (["--set", "dataset=digits", "--set", "global_batch=5000"], ["global_batch", "5000", "1500"]),
    (["--set", "dataset=mnist", "--set", "data_dir=/nonexistent/mnist"], ["/nonexistent/mnist"]),
    (["--set", "learning_rate=0.1"], ["learning_rate"]),
    (["--set", "lr=fast"], ["lr", "fast"]),
    (["--set", "slowdown=[1,2]"], ["slowdown", "workers"]),
    (["/nonexistent/job.toml"], ["/nonexistent/job.toml"]),
    (["--resume", "/nonexistent/run"], ["/nonexistent/run"]),
    (["--set", "dataset=digits", "--set", "workers=2", "--set", 'devices=["cpu", "cuda:1"]'],
     ["worker 1", "cuda:1", "no CUDA device"]),
    (["--set", "device=gpu"], ["device", "gpu"]),
]

# Every case through the CLI's `main` in one interpreter (one torch import, not twelve),
# each with its own stderr; the exit status a process would have is `main`'s return (or
# argparse's SystemExit). The cases below run the CLI as a process of its own.
DRIVER = """
import contextlib, io, json, sys
from equipoise.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    out.append([rc, err.getvalue()])
print(json.dumps(out))
"""


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    argvs = [["train", "--out", str(tmp_path / f"run{i}"), *args] for i, (args, _) in enumerate(CASES)]
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for (args, words), (rc, stderr) in zip(CASES, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True):
        assert rc == 2, (args, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1, (args, stderr)
        assert "Traceback" not in stderr
        for word in words:
            assert word in lines[0], (word, lines[0])


def test_bad_toml_file(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text("protocol = \n")
    proc = cli("train", str(bad), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_data_file_names_the_file(tmp_path):
    data = tmp_path / "mnist"
    data.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (data / name).write_bytes(b"\x00\x00\x08\x03garbage")
    proc = cli("train", "--set", "dataset=mnist", "--set", f'data_dir="{data}"', "--out", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert "idx" in proc.stderr and str(data) in proc.stderr and "Traceback" not in proc.stderr


def test_an_unreachable_ray_cluster_is_a_one_line_error_and_no_run_directory(tmp_path):
    """Ray itself retries an unreachable head for minutes; equipoise checks first."""
    out = tmp_path / "run"
    r = cli("train", "--set", "dataset=digits", "--launcher", "ray", "--ray-address", "127.0.0.1:9",
            "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "equipoise: error: ray_address = '127.0.0.1:9': no Ray head answers there within 10 s "
        "([Errno 111] Connection refused)"]
    assert not out.exists()
