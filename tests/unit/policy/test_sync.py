"""Rudra's protocols (Gupta, Zhang and Wang, "Model Accuracy and Runtime Tradeoff in
Distributed Deep Learning: A Systematic Study", ICDM 2016): each policy's grouping,
blocking and learning-rate rules as pure functions, then a real `Server` on the in-memory
transport driven message by message — deterministic, no processes, no clocks except
timeouts. The per-server state machine itself is tested in test_server_sync.py."""

import threading

import pytest
import torch

from equipoise.config import Config, ConfigError
from equipoise.policy.placement import Block
from equipoise.policy.sync import BSP, SSP, SoftSync, make_sync_policy
from equipoise.server.core import Server
from equipoise.server.store import OptimizerSpec, ParameterStore, Push
from equipoise.wire import InMemoryTransport, Message

pytestmark = pytest.mark.timeout(60)


# -- pure policies ---------------------------------------------------------------------

@pytest.mark.parametrize("n, c", [(1, 8), (2, 4), (4, 2), (8, 1), (3, 2)])
def test_softsync_group_is_floor_lambda_over_n(n, c):
    assert SoftSync(n=n).group_size(8) == c
    assert not SoftSync(n=n).barrier() and not SoftSync(n=n).clocked


def test_softsync_answers_pulls_at_once_and_bsp_waits_for_the_next_version():
    assert SoftSync(n=2).pull_version(5, 9) == 0 and SoftSync(n=2).pull_ready(0, 0)
    assert BSP().pull_version(5, 9) == 10
    assert not BSP().pull_ready(10, 9) and BSP().pull_ready(10, 10)


@pytest.mark.parametrize("s", [0, 1, 4])
def test_ssp_reads_wait_while_more_than_s_clocks_ahead(s):
    p = SSP(bound=s)
    assert p.clocked and not p.barrier() and p.group_size(8) == 1
    for pushes in range(10):
        need = p.pull_version(pushes, iteration=0)
        assert need == max(0, pushes - s)
        for clock in range(12):
            # the worker may read (and so start iteration `pushes`) iff it is ≤ s ahead
            assert p.pull_ready(need, clock) == (pushes - clock <= s)


def test_staleness_is_versions_between_read_and_apply():
    assert SoftSync(n=2).staleness(7, 4) == 3
    assert SoftSync(n=2).staleness(4, 4) == 0


def test_lr_modulation_rules():
    w = [0.25, 0.75]
    assert make_sync_policy("asp").modulate(w, [3, 0]) == (w, 1.0)
    assert make_sync_policy("asp", lr_modulation="per_gradient").modulate(w, [4, 0]) == ([0.0625, 0.75], 1.0)
    weights, factor = make_sync_policy("softsync", softsync_n=2, lr_modulation="mean").modulate(w, [2, 4])
    assert weights == w and factor == pytest.approx(1 / 3)
    # ⟨σ⟩ < 1 never raises the learning rate above α0
    assert make_sync_policy("asp", lr_modulation="mean").modulate([1.0], [0])[1] == 1.0


def test_config_validates_protocol_knobs():
    assert Config.from_dict({"protocol": "softsync", "workers": 8, "global_batch": 64, "softsync_n": 4}).softsync_c == 2
    with pytest.raises(ConfigError, match="softsync_n = 9"):
        Config.from_dict({"protocol": "softsync", "workers": 8, "softsync_n": 9})
    with pytest.raises(ConfigError, match="staleness_bound = 2 needs protocol"):
        Config.from_dict({"protocol": "asp", "staleness_bound": 2})
    with pytest.raises(ConfigError, match="overlap"):
        Config.from_dict({"protocol": "bsp", "overlap": True})
    with pytest.raises(ConfigError, match="lr_modulation = 'half'"):
        Config.from_dict({"lr_modulation": "half"})


def test_mu_lambda_warning_names_the_finding():
    ok = Config.from_dict({"workers": 8, "worker_batch": 16, "reference_batch": 128})
    assert ok.global_batch == 128 and ok.warnings() == []
    far = ok.replace(worker_batch=128)
    assert far.global_batch == 1024
    (advice,) = far.warnings()
    assert "μ·λ = 1024" in advice and "reference_batch = 128" in advice and "worker_batch ≈ 16" in advice
    with pytest.raises(ConfigError, match="disagrees"):
        Config.from_dict({"workers": 8, "worker_batch": 16, "global_batch": 100})


# -- the store: modulation applied to real optimizer steps ------------------------------

def one_block_store(policy, lr=1.0):
    spec = OptimizerSpec("sgd", lr, 0.0, 0.0, "constant", 100, 10, 0.1, 4)
    return ParameterStore([Block(0, "w", 0, 1)], {0: torch.zeros(1)}, spec, policy)


def test_per_gradient_modulation_divides_each_gradient_by_its_staleness():
    s = one_block_store(make_sync_policy("softsync", softsync_n=1, lr_modulation="per_gradient"))
    s.apply([Push(0, 0, 2, {0: torch.tensor([4.0])}), Push(1, 0, 2, {0: torch.tensor([8.0])})], [2, 0])
    # g = ½·4/2 + ½·8/1 = 5
    assert s.values[0].item() == pytest.approx(-5.0)


def test_mean_modulation_divides_the_update_by_mean_staleness():
    s = one_block_store(make_sync_policy("softsync", softsync_n=1, lr_modulation="mean"))
    s.apply([Push(0, 0, 2, {0: torch.tensor([4.0])}), Push(1, 0, 2, {0: torch.tensor([8.0])})], [1, 3])
    assert s.values[0].item() == pytest.approx(-6.0 / 2)


# -- a real server on the in-memory transport ------------------------------------------

class Harness:
    """One server thread; `push`/`pull` speak to it as worker connections would."""

    def __init__(self, protocol, workers, **knobs):
        self.transport = InMemoryTransport()
        self.coord_listener = self.transport.listen()
        self.server = Server(0, self.transport, self.coord_listener.address, timeout=30)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        _, hello = self.coord_listener.recv(timeout=5)
        self.admin = self.transport.connect(hello.fields["address"])
        spec = OptimizerSpec("sgd", 1.0, 0.0, 0.0, "constant", 100, 10, 0.1, 4).to_dict()
        self.admin.send(Message("init", {"blocks": [Block(0, "w", 0, 1).to_list()], "optimizer": spec,
                                         "version": 0, "samples": 0, "protocol": protocol,
                                         "workers": workers, **knobs}, {"b0": torch.zeros(1)}))
        assert self.admin.recv(timeout=5).type == "ready"
        self.conns = [self.transport.connect(hello.fields["address"]) for _ in range(workers)]

    def push(self, worker, version, g, samples=1):
        self.conns[worker].send(Message("push", {"worker": worker, "version": version, "samples": samples},
                                        {"g0": torch.tensor([float(g)])}))
        reply = self.conns[worker].recv(timeout=5)
        assert reply.type == "ack", reply.fields
        return reply.fields["version"], reply.fields["staleness"]

    def pull(self, worker, min_version):
        self.conns[worker].send(Message("pull", {"worker": worker, "min_version": min_version}))

    def params(self, worker, timeout=5.0):
        """(version, value) of the pull's answer, or None if it is still held."""
        try:
            reply = self.conns[worker].recv(timeout=timeout)
        except TimeoutError:
            return None
        return reply.fields["version"], reply.tensors["b0"].item()

    def admin_call(self, msg):
        self.admin.send(msg)
        return self.admin.recv(timeout=5)

    def close(self):
        ack = self.admin_call(Message("stop", {"reason": "test"}))
        self.thread.join(timeout=5)
        self.transport.close()
        return dict((int(s), n) for s, n in ack.fields["histogram"])


def test_softsync_server_updates_every_c_gradients_from_any_workers():
    h = Harness("softsync", workers=4, softsync_n=2)  # c = 2
    assert h.push(0, 0, 1.0) == (0, [])          # held: a group needs two gradients
    assert h.push(0, 0, 3.0) == (1, [0, 0])      # the same worker may fill it: mean 2 applied
    h.pull(1, 0)
    assert h.params(1) == (1, pytest.approx(-2.0))
    assert h.push(2, 0, 10.0) == (1, [])         # computed on version 0, now pending
    assert h.push(1, 1, 2.0) == (2, [0])         # completes the group; σ(worker 2) = 1
    assert h.push(2, 2, 0.0) == (2, [1])         # worker 2 learns its σ with its next ack
    assert h.admin_call(Message("flush", {})).fields["version"] == 3  # the half group applied
    h.pull(3, 0)
    assert h.params(3) == (3, pytest.approx(-2.0 - 6.0 - 0.0))
    assert h.close() == {0: 4, 1: 1}  # five gradients, each applied once


def test_ssp_server_holds_a_pull_more_than_s_clocks_ahead_of_the_slowest():
    s = 1
    h = Harness("ssp", workers=2, staleness_bound=s)
    policy = SSP(bound=s)
    assert h.push(0, 0, 1.0) == (0, [0])           # applied at once; clock = min(1, 0) = 0
    h.pull(0, policy.pull_version(1, 0))            # 1 ahead of worker 1: allowed
    assert h.params(0) == (0, pytest.approx(-1.0))
    assert h.push(0, 0, 1.0) == (0, [1])           # σ: worker 0 read clock 0 one push ahead
    h.pull(0, policy.pull_version(2, 0))            # 2 ahead: held until worker 1 pushes
    assert h.params(0, timeout=0.3) is None
    assert h.push(1, 0, 1.0) == (1, [0])            # clock 1 releases the held pull
    assert h.params(0) == (1, pytest.approx(-3.0))
    # A worker that stopped no longer holds the clock back.
    assert h.push(0, 1, 1.0) == (1, [1])           # two pushed before, read clock 1: σ = 1 ≤ s
    h.pull(0, policy.pull_version(3, 0))
    assert h.params(0, timeout=0.3) is None
    assert h.admin_call(Message("members", {"workers": 1, "retired": [1]})).type == "ack"
    assert h.params(0)[0] == 3
    assert h.close() == {0: 2, 1: 2}


def test_ssp_server_refuses_a_push_claiming_an_unpublished_version():
    h = Harness("ssp", workers=2, staleness_bound=0)
    h.conns[0].send(Message("push", {"worker": 0, "version": 5, "samples": 1}, {"g0": torch.tensor([1.0])}))
    reply = h.conns[0].recv(timeout=5)
    assert reply.type == "error" and "claims version 5" in reply.fields["message"]
    assert h.push(0, 0, 1.0) == (0, [0])           # and the server goes on
    h.close()


def test_async_server_records_staleness_per_gradient():
    h = Harness("asp", workers=3)
    assert h.push(0, 0, 1.0) == (1, [0])
    assert h.push(1, 0, 1.0) == (2, [1])
    assert h.push(2, 0, 1.0) == (3, [2])
    assert h.close() == {0: 1, 1: 1, 2: 1}
