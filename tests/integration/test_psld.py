"""PSLD with real processes on loopback (Chen et al., SoCC 2020): blocks migrate and servers come
and go while a BSP job trains, and the job ends with exactly the parameters of a run
without any of it; a user asks a running job for a server from the command line; PSLD
moves load off a slowed server by itself, with a barrier and without."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

import equipoise

from .helpers import cli, records, start_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BASE = dict(dataset="digits", model="mlp", workers=3, servers=2, global_batch=48, iterations=24,
            block_size=4000, eval_every=0, checkpoint_every=0, progress=False, timeout=60.0, psld_interval=4)


def final(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)


@pytest.mark.parametrize("optimizer", ["adam"])  # the most state a block carries; SGD's momentum moves the same way
def test_migrations_and_elastic_servers_leave_the_parameters_unchanged(tmp_path, optimizer):
    kw = dict(BASE, optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.003)
    events = [{"iteration": 3, "move": 0, "to": 1}, {"iteration": 5, "add": 1},
              {"iteration": 6, "move": 1, "to": 2}, {"iteration": 6, "move": 3, "to": 2},
              {"iteration": 11, "remove": 0}, {"iteration": 15, "move": 0, "to": 2}]
    equipoise.train(kw, out=tmp_path / "plain")
    # The moved run (with Adam) also streams its pushes and pulls (backward_push,
    # forward_pull) and updates blocks ahead (eager_update): moves between them change
    # nothing either.
    pipelined = {"backward_push": True, "forward_pull": True, "eager_update": True} if optimizer == "adam" else {}
    summary = equipoise.train(dict(kw, server_events=events, **pipelined), out=tmp_path / "moved")
    a, b = final(tmp_path / "plain"), final(tmp_path / "moved")
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # no update lost or applied twice, state moved too
    ev = [r for r in records(tmp_path / "moved", "event")
          if r["event"] in ("block_moved", "server_added", "server_removed")]
    # the two moves to server 2 at iteration 6 go as one migration (``ServerManager._grouped``)
    assert [r["event"] for r in ev] == ["block_moved", "server_added", "block_moved", "server_removed",
                                        "block_moved"]
    assert ev[1]["server"] == 2 and ev[2]["blocks"] == [1, 3] and ev[2]["to"] == 2 and ev[3]["server"] == 0
    assert all(r["bytes"] > 0 for r in ev if r["event"] == "block_moved")  # values and state went over
    servers = records(tmp_path / "moved", "servers")
    assert servers[-1]["servers"] == [1, 2]  # server 0 is gone
    assert sum(servers[-1]["load_bytes"]) == sum(servers[0]["load_bytes"])
    assert summary["samples"] == 24 * 48


def test_a_user_adds_a_server_to_a_running_job(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--out", str(out)]
    for k, v in dict(BASE, iterations=5000, slowdown=[20.0, 20.0, 20.0]).items():
        args += ["--set", f"{k}={json.dumps(v) if not isinstance(v, bool) else str(v).lower()}"]
    proc = start_cli(*args)
    try:
        wait_for(lambda: len(records(out, "iteration")) >= 5, 90, "the job to train")
        done = cli("ctl", str(out), "add-server")
        assert done.returncode == 0, done.stderr
        bad = cli("ctl", str(out), "move", "1")
        assert bad.returncode == 2 and "takes 2 number(s)" in bad.stderr
        wait_for(lambda: any(r["event"] == "server_added" for r in records(out, "event")), 90,
                 "the server to be added")
        assert cli("ctl", str(out), "move", "0", "2").returncode == 0
        wait_for(lambda: any(r["event"] == "block_moved" for r in records(out, "event")), 90,
                 "the block to move")
        at = records(out, "iteration")[-1]["iteration"]
        wait_for(lambda: records(out, "iteration")[-1]["iteration"] >= at + 10, 60,
                 "training to go on after the move")
    finally:
        proc.send_signal(signal.SIGINT)  # enough seen; Ctrl-C stops every process
        proc.wait(timeout=60)
    assert proc.returncode == 130, proc.stderr.read()
    moved = [r for r in records(out, "event") if r["event"] == "block_moved"]
    assert moved[0]["blocks"] == [0] and moved[0]["to"] == 2


def test_ctl_refuses_what_is_not_a_run_directory(tmp_path):
    done = cli("ctl", str(tmp_path), "add-server")
    assert done.returncode == 2 and "not a run directory" in done.stderr


@pytest.mark.parametrize("protocol", ["bsp", "ssp"])
def test_psld_moves_load_off_a_slowed_server(tmp_path, protocol):
    """Also without a barrier (SSP): the blocks are handed over while the workers run,
    and every block still gets every gradient once, counted on the servers — with the
    pushes streamed during backward (a step during which blocks move is pushed whole;
    a fragment that reaches a block's old owner is forwarded with its push)."""
    knobs = {"staleness_bound": 1, "backward_push": True, "fragment_kb": 4} if protocol == "ssp" else {}
    summary = equipoise.train(dict(BASE, placement="psld", iterations=60, servers=3, block_size=2000,
                                   server_slowdown=[1.0, 1.0, 8.0], server_rate=20.0, psld_interval=5,
                                   psld_epsilon=0.0, protocol=protocol, **knobs), out=tmp_path / "run")
    assert summary["samples"] == 60 * 48
    if protocol == "ssp":  # one plan per worker batch of 16
        assert summary["gradients"] == {"owed": 180, "applied_min": 180, "applied_max": 180}
        assert (summary["duplicates"], summary["too_old"]) == (0, 0)  # every push id arrived once
        assert summary["staleness_max"] <= 1
    servers = records(tmp_path / "run", "servers")
    slow_share = [r["load_bytes"][r["servers"].index(2)] / sum(r["load_bytes"]) for r in servers]
    assert slow_share[-1] < slow_share[0] / 2, slow_share
    busy = servers[0]["busy_s"]
    assert busy[2] > max(busy[0], busy[1])  # the slowdown is real busy time on server 2


def test_psld_probes_a_light_server_before_moving_the_slow_servers_only_block(tmp_path):
    """The MLP's first layer (64 KB) alone on an 8x-slower server, the other servers
    holding 10 KB and 1 KB: PSLD probes the slow server and the light one that looks
    fastest, measures it faster, and moves the layer there, for good. The probe's rate
    is reported with the event. The slow server is left with no more than the light
    server's small blocks: in about one run of ten under load, the same plan then moved
    the light server's 1 KB block onto it (that server's rate, mostly an exchange's fixed
    cost, an extrapolation that made it look the slowest once the layer was gone)."""
    summary = equipoise.train(dict(BASE, placement="psld", workers=2, servers=3, iterations=20, block_size=1 << 20,
                                   server_slowdown=[8.0, 1.0, 1.0], server_rate=20.0, psld_interval=5,
                                   psld_epsilon=0.0), out=tmp_path / "run")
    assert summary["samples"] == 20 * 48
    events = records(tmp_path / "run", "event")
    probed = [r for r in events if r["event"] == "servers_probed"]
    assert probed and probed[0]["iteration"] == 5 and probed[0]["servers"] == [0, 1]
    first = records(tmp_path / "run", "servers")[0]  # the interval the probe followed
    assert float(probed[0]["mbps"]["1"]) > first["throughput_mbps"][0]  # faster than the slow server measured
    moved = [r for r in events if r["event"] == "block_moved"]
    # (mostly with a small block of server 2's, to the same server: one migration)
    assert moved[0]["iteration"] == 5 and 0 in moved[0]["from"] and moved[0]["to"] == 1
    assert records(tmp_path / "run", "servers")[-1]["load_bytes"][0] <= first["load_bytes"][2]  # 1,064 bytes
