"""RoutingRuleFeatures (mooncake_gym/envs/wrappers.py): exact features on a tiny hand-made workload."""

import math
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the env ids)
from mooncake_gym.model.costmodel import CostModel, InstanceSpec
from mooncake_gym.model.workload import Trace
from mooncake_gym.envs.wrappers import RoutingRuleFeatures

SLO = 5.0


def T(s):
    """The env's time scaling, written out: min(1, log1p(s / 0.1) / log1p(10 SLO / 0.1))."""
    return min(1.0, math.log1p(s / 0.1) / math.log1p(10 * SLO / 0.1))


def make(trace, **kw):
    return RoutingRuleFeatures(gym.make("mooncake_gym/PrefillRouting-v0", trace=trace, ttft_slo_s=SLO, **kw))


def test_rule_features_exact_on_two_instances():
    # two requests at t = 0 with the same two-block prefix, then a third much later
    trace = Trace([0.0, 0.0, 100.0], [1024, 1024, 1024], [1, 1, 1], [(1, 2), (1, 2), (7, 8)])
    env = make(trace, n_instances=2)
    cost = CostModel()
    p0 = cost.prefill_s(1024, 0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5 * 2 + 2 + 4 * 2 + 2,)
    np.testing.assert_array_equal(obs[:12], env.unwrapped._observe())  # the env's own observation first, unchanged
    # idle cluster, nothing cached: equal estimates, both are kvcentric's choice, no pull
    np.testing.assert_allclose(obs[12:], np.float32([0, 1, 0, T(p0), 0, 1, 0, T(p0), T(p0), 0]), rtol=1e-6)

    obs, *_ = env.step(0)  # first request to instance 0, no pull
    hit = 1023  # two blocks cover the prompt but one token is always computed
    own = p0 + cost.prefill_s(1024, hit)  # queue p0 on 0, then the cached prefill
    pulled = cost.transfer_s(hit) + cost.prefill_s(1024, hit)  # instance 1: pull the prefix, then prefill
    best = min(own, pulled)
    want = [T(own - best), own == best, 0, T(cost.prefill_s(1024, hit)),
            T(pulled - best), pulled == best, 1, T(pulled),
            T(min(cost.prefill_s(1024, hit), pulled)), T(p0 / 2)]
    np.testing.assert_allclose(obs[12:], np.float32(want), rtol=1e-6)

    env.step(1)
    obs, _, terminated, _, _ = env.step(0)
    assert terminated
    np.testing.assert_array_equal(obs, np.zeros(22, np.float32))  # no decision pending: all zeros


def test_rule_features_carry_each_instance_speed():
    trace = Trace([0.0], [4096], [1], [tuple(range(8))])
    env = make(trace, instances="1xH800+1xA800")
    base = CostModel()
    fast = replace(base, instance=InstanceSpec(gpu="H800")).prefill_s(4096, 0)
    slow = replace(base, instance=InstanceSpec(gpu="A800")).prefill_s(4096, 0)
    assert fast < slow
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs[12:], np.float32([0, 1, 0, T(fast), T(slow - fast), 0, 0, T(slow), T(fast), 0]),
                               rtol=1e-6)


def test_rule_features_refuse_other_envs():
    with pytest.raises(ValueError, match="RoutingRuleFeatures wraps a PrefillRouting-v0"):
        RoutingRuleFeatures(gym.make("CartPole-v1"))
