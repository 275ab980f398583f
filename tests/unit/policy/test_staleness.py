"""BSP's settings under the protocols without a barrier, and DC-ASGD: the rules of
policy/staleness.py, and the store applying them (oracles written out by hand)."""

import pytest
import torch

from equipoise.config import Config, ConfigError
from equipoise.policy.placement import Block
from equipoise.policy.staleness import bsp_step, dc_compensate, mean_delay
from equipoise.policy.sync import make_sync_policy
from equipoise.server.store import OptimizerSpec, ParameterStore, Push


def test_an_update_of_the_global_batch_on_current_weights_steps_as_bsp():
    step = bsp_step(128, 128, 0.9, 0.0)
    assert (step.lr_factor, step.momentum) == (1.0, 0.9)


@pytest.mark.parametrize("samples, delay, momentum, want", [
    (32, 0.0, 0.9, (0.25, 0.9)),     # one worker's share, no delay: the rate scales, momentum stays
    (32, 2.5, 0.9, (0.25, 0.65)),    # 1 − 0.1·3.5: the delay's implicit momentum τ/(1+τ) taken off
    (16, 7.0, 0.9, (0.125, 0.2)),    # 1 − 0.1·8
    (16, 12.0, 0.9, (0.125, 0.0)),   # more implied than asked: no explicit momentum at all
    (32, 3.0, 0.0, (0.25, 0.0)),     # plain SGD stays plain
])
def test_rate_scales_with_the_share_and_momentum_drops_by_what_the_delay_implies(samples, delay, momentum, want):
    step = bsp_step(samples, 128, momentum, delay)
    assert step.lr_factor == pytest.approx(want[0]) and step.momentum == pytest.approx(want[1])
    # (1 − μₑ)(1 − μᵢ) = 1 − μ with μᵢ = τ/(1 + τ), wherever μₑ is not clipped at 0
    if step.momentum > 0:
        assert (1 - step.momentum) * (1 - delay / (1 + delay)) == pytest.approx(1 - momentum)


def test_mean_delay_is_in_updates_of_this_size():
    assert mean_delay(32, [64, 96]) == pytest.approx(2.5)
    assert mean_delay(32, []) == 0.0
    assert mean_delay(32, [-5]) == 0.0  # never negative


def one_block(policy, momentum=0.9, global_batch=128, lr=0.1):
    spec = OptimizerSpec("sgd", lr, momentum, 0.0, "constant", 100, 10, 0.1, global_batch)
    return ParameterStore([Block(0, "w", 0, 2)], {0: torch.zeros(2)}, spec, policy)


def test_the_store_steps_with_the_rule_and_measures_delay_from_the_read_stamp():
    """Three updates of 32 samples, g = 1, under asp with async_scaling = "bsp" at lr 0.1,
    μ 0.9, B = 128. Delays from the stamps: 0, 32, 64 samples → τ = 0, 1, 2 → μₑ = 0.9,
    0.8, 0.7; rate 0.025. torch's SGD: buf₁ = g, buf₂ = 0.8·1 + 1, buf₃ = 0.7·1.8 + 1."""
    s = one_block(make_sync_policy("asp", async_scaling="bsp"))
    g = {0: torch.ones(2)}
    for read in (0, 0, 0):
        s.apply([Push(0, 0, 32, dict(g), read=read)], [0])
    bufs = [1.0, 1.8, 0.7 * 1.8 + 1.0]
    assert s.values[0].tolist() == pytest.approx([-0.025 * sum(bufs)] * 2)
    assert s.last_step.delay == pytest.approx(2.0) and s.last_step.momentum == pytest.approx(0.7)


def test_without_a_stamp_sigma_counts_as_the_delay_and_none_keeps_the_old_step():
    s = one_block(make_sync_policy("asp", async_scaling="bsp"), momentum=0.0)
    s.apply([Push(0, 0, 32, {0: torch.ones(2)})], [3])
    assert s.last_step.delay == 3.0 and s.values[0].tolist() == pytest.approx([-0.025, -0.025])
    plain = one_block(make_sync_policy("asp"), momentum=0.0)
    plain.apply([Push(0, 0, 32, {0: torch.ones(2)})], [3])
    assert plain.values[0].tolist() == pytest.approx([-0.1, -0.1]) and plain.last_step is None


def test_barrier_protocols_ignore_the_async_knobs():
    assert make_sync_policy("bsp", async_scaling="bsp", delay_compensation="dc", dc_lambda=1.0).async_scaling == "none"


def test_dc_asgd_adds_the_taylor_term_with_the_weights_read():
    g, now, then = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 3.0])
    # g + λ·g⊙g⊙(now − then) = [2 + 0.1·4·0.5, −1 + 0.1·1·(−2)]
    assert dc_compensate(g, now, then, 0.1).tolist() == pytest.approx([2.2, -1.2])
    ms = torch.zeros(2)
    out = dc_compensate(g, now, then, 0.1, ms)  # mean square = 0.05·g²; λ/√ms
    assert ms.tolist() == pytest.approx([0.2, 0.05])
    assert out.tolist() == pytest.approx([2 + 0.1 / 0.2 ** 0.5 * 4 * 0.5, -1 + 0.1 / 0.05 ** 0.5 * 1 * -2], rel=1e-5)


def test_the_store_compensates_a_push_that_carries_its_weights_and_counts_it():
    s = one_block(make_sync_policy("asp", delay_compensation="dc", dc_lambda=0.5), momentum=0.0, lr=1.0)
    s.values[0].copy_(torch.tensor([1.0, 1.0]))
    s.apply([Push(0, 0, 128, {0: torch.tensor([2.0, 2.0])}, then={0: torch.tensor([0.0, 2.0])})], [1])
    # g̃ = 2 + 0.5·4·(±1) = [4, 0]; w = 1 − g̃
    assert s.values[0].tolist() == pytest.approx([-3.0, 1.0]) and s.compensated == 1
    s.apply([Push(0, 0, 128, {0: torch.tensor([1.0, 1.0])})], [1])  # no weights kept: applied as it is
    assert s.values[0].tolist() == pytest.approx([-4.0, 0.0]) and s.compensated == 1


def test_copy_on_write_reuses_a_free_retired_buffer_behind_a_busy_one():
    """Two retired buffers, the first still lent: the free one is taken by position (a
    list.remove would compare multi-element tensors with ==, which raises)."""
    s = one_block(make_sync_policy("asp"), momentum=0.0)
    done = [False]
    s.lend([s.values[0]], lambda: False)  # v0: never released
    s.apply([Push(0, 0, 128, {0: torch.ones(2)})])
    s.lend([s.values[0]], lambda: done[0])  # v1: released below
    s.apply([Push(0, 0, 128, {0: torch.ones(2)})])
    done[0] = True
    s.lend([s.values[0]], lambda: False)  # v2 busy, v1 free behind the busy v0
    s.apply([Push(0, 0, 128, {0: torch.ones(2)})])
    assert s.values[0].tolist() == pytest.approx([-0.3, -0.3])


def base_cfg(**kw):
    return dict(dataset="digits", model="mlp", workers=2, servers=1, **kw)


def test_config_refuses_bad_async_knobs():
    assert Config.from_dict(base_cfg()).async_scaling == "bsp"
    with pytest.raises(ConfigError, match="async_scaling"):
        Config.from_dict(base_cfg(async_scaling="linear"))
    with pytest.raises(ConfigError, match="dc_lambda > 0"):
        Config.from_dict(base_cfg(protocol="asp", delay_compensation="dc"))
    with pytest.raises(ConfigError, match="without a barrier"):
        Config.from_dict(base_cfg(delay_compensation="dc", dc_lambda=0.04))
    with pytest.raises(ConfigError, match="dc_lambda"):
        Config.from_dict(base_cfg(protocol="asp", dc_lambda=float("nan")))


def test_under_the_rule_a_modulation_only_moves_weight_to_the_fresher_gradients():
    """async_scaling = "bsp" sizes the step itself; per_gradient's 1/σ then re-weights the
    group (normalised to sum 1) and mean changes nothing: no second division by σ."""
    g = [Push(0, 0, 32, {0: torch.full((2,), 4.0)}, read=0), Push(1, 0, 32, {0: torch.full((2,), 8.0)}, read=0)]
    pg = one_block(make_sync_policy("softsync", softsync_n=2, async_scaling="bsp", lr_modulation="per_gradient"),
                   momentum=0.0, global_batch=64, lr=1.0)
    pg.apply([Push(p.worker, 0, 32, dict(p.tensors), read=0) for p in g], [3, 1])
    # weights ½/3 and ½/1, normalised: ¼ and ¾; g = 1 + 6 = 7; the step: 64/64 of lr 1
    assert pg.values[0].tolist() == pytest.approx([-7.0, -7.0])
    mean = one_block(make_sync_policy("softsync", softsync_n=2, async_scaling="bsp", lr_modulation="mean"),
                     momentum=0.0, global_batch=64, lr=1.0)
    mean.apply([Push(p.worker, 0, 32, dict(p.tensors), read=0) for p in g], [3, 1])
    assert mean.values[0].tolist() == pytest.approx([-6.0, -6.0])


def test_a_zero_momentum_update_restarts_the_momentum_from_its_gradient():
    """torch's SGD leaves the buffer alone when momentum is 0; the rule's buf = 0·buf + g
    means the next update's buffer starts from its own gradient. B = b = 32, μ = 0.9;
    delays (samples since read): 0, 0, then 320 (τ = 10 → μₑ = 0), then 256 (τ = 8 →
    μₑ = 0.1, whose buffer must start from g, not from 1.9)."""
    s = one_block(make_sync_policy("asp", async_scaling="bsp"), global_batch=32, lr=1.0)
    for g, read in ((1.0, 0), (1.0, 32), (-5.0, 0), (2.0, 96)):
        s.samples = max(s.samples, 320) if g == -5.0 else s.samples
        s.apply([Push(0, 0, 32, {0: torch.full((2,), g)}, read=read)], [0])
    # bufs: 1; 0.9·1 + 1 = 1.9; μₑ = 0: a plain step of −5, buffer dropped; then buf = 2 afresh
    assert s.values[0].tolist() == pytest.approx([-(1 + 1.9 - 5 + 2)] * 2)
