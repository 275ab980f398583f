"""User mistakes: one line naming the key and the bad value, exit code 2, no traceback."""

from __future__ import annotations

import pytest

from .helpers import cli

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("args, words", [
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
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    proc = cli("train", "--out", str(tmp_path / "run"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
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
