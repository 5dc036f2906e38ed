"""Relative size: ServiceScale, the relsplit rule and RoutingRelativeFeatures, exact on hand-made traces."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the env ids)
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.sizesplit import RelativeSizeSplit, ServiceScale, SizeSplit
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.routing import RoutingConfig, simulate
from mooncake_gym.model.workload import Trace
from mooncake_gym.envs.wrappers import RELATIVE_CAP, RoutingRelativeFeatures

COST = CostModel()


def test_service_scale_is_a_bias_corrected_moving_mean_of_earlier_requests():
    s = ServiceScale(memory=2)  # decay 1/2
    assert s.mean_s is None
    assert s.ratio(1.0) == 1.0  # the first request has nothing to compare with
    assert s.mean_s == 1.0
    assert s.ratio(3.0) == 3.0
    assert s.mean_s == pytest.approx((0.5 * 1 + 3) / (0.5 + 1), rel=1e-15)
    assert s.ratio(7.0) == pytest.approx(7.0 / (3.5 / 1.5), rel=1e-15)
    s.reset()
    assert s.mean_s is None and s.ratio(5.0) == 1.0
    with pytest.raises(ValueError, match="memory"):
        ServiceScale(memory=0.5)
    with pytest.raises(ValueError, match="long_factor"):
        RelativeSizeSplit(long_factor=0.0)


def _trace(scale: int) -> Trace:
    # three short prompts, then one 16x longer, all at t = 0 on two instances; no shared prefixes
    sizes = [2048 * scale] * 3 + [32768 * scale]
    blocks = [tuple(range(1000 * k, 1000 * k + n // 512)) for k, n in enumerate(sizes)]
    return Trace([0.0] * 4, sizes, [1] * 4, blocks)


def test_relsplit_threshold_follows_the_workload_where_an_absolute_one_does_not():
    config = RoutingConfig(n_instances=2)
    short, long_ = COST.prefill_s(2048, 0), COST.prefill_s(32768, 0)
    assert long_ > 3 * short
    trace = _trace(1)
    # the short ones all have the mean's size (ratio 1); the long one is more than 3x the mean:
    # relsplit takes the decisions of sizesplit with long_s = 3 x the short prefill
    rel = simulate(trace, RelativeSizeSplit(long_factor=3.0, long_instances=1), config, COST, seed=5)
    ab = simulate(trace, SizeSplit(long_s=3 * short, long_instances=1), config, COST, seed=5)
    assert rel.instance.tolist() == ab.instance.tolist() and rel.instance[3] == 0
    # kvcentric sends the long one to the instance with one short prompt queued, which is instance 1
    # when the first three went 0, 1, 0: the split changes that decision
    kv = simulate(trace, make_policy("routing", "kvcentric"), config, COST, seed=5)
    if kv.instance.tolist()[:3] == [0, 1, 0]:
        assert kv.instance[3] == 1
    # with min_load, no split while less than that many mean requests are queued per instance:
    # 1.5 short prompts per instance when the long one arrives, so min_load 2 routes it as kvcentric
    gated = simulate(trace, RelativeSizeSplit(long_factor=3.0, long_instances=1, min_load=2.0), config, COST, seed=5)
    assert gated.instance.tolist() == kv.instance.tolist()
    with pytest.raises(ValueError, match="min_load"):
        RelativeSizeSplit(min_load=-1.0)
    # every prompt 4x longer: the absolute threshold now calls every request long and piles all four
    # on instance 0; the relative one still calls only the last one long
    trace4 = _trace(4)
    assert COST.prefill_s(2048 * 4, 0) > 3 * short
    ab4 = simulate(trace4, SizeSplit(long_s=3 * short, long_instances=1), config, COST, seed=5)
    assert ab4.instance.tolist() == [0, 0, 0, 0]
    rel4 = simulate(trace4, RelativeSizeSplit(long_factor=3.0, long_instances=1), config, COST, seed=5)
    assert sorted(rel4.instance.tolist()[:3]) in ([0, 0, 1], [0, 1, 1]) and rel4.instance[3] == 0


def R(x):
    """The relative scaling, written out: min(1, log1p(x) / log1p(32))."""
    return min(1.0, math.log1p(x) / math.log1p(RELATIVE_CAP))


def test_relative_features_exact_and_restart_at_reset():
    trace = Trace([0.0, 0.0], [1024, 4096], [1, 1], [(1, 2), (10, 11, 12, 13, 14, 15, 16, 17)])
    env = RoutingRelativeFeatures(gym.make("mooncake_gym/PrefillRouting-v0", trace=trace, n_instances=2),
                                  memory=10)
    p0, p1 = COST.prefill_s(1024, 0), COST.prefill_s(4096, 0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5 * 2 + 2 + 4 * 2 + 2,)
    # the first request is the running mean's size (ratio 1); nothing queued
    first = np.float32([0, 1, 0, R(1), 0, 1, 0, R(1), R(1), 0])
    np.testing.assert_allclose(obs[12:], first, rtol=1e-6)
    obs, *_ = env.step(0)
    # the second: its service over the first one's (the mean so far); the queue, p0 on one of two
    # instances, in the same unit; the estimate difference stays in the env's time scaling
    t_scale = 1.0 / math.log1p(10 * 5.0 / 0.1)
    want = [math.log1p(p0 / 0.1) * t_scale, 0, 0, R(p1 / p0), 0, 1, 0, R(p1 / p0), R(p1 / p0), R(p0 / 2 / p0)]
    np.testing.assert_allclose(obs[12:], np.float32(want), rtol=1e-5)
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs[12:], first, rtol=1e-6)  # the running mean restarted
