"""Heterogeneous prefill pools: instances of different GPUs and cache sizes in one routing cluster."""

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.baselines import make_policy
from mooncake_gym.model.costmodel import CostModel, InstanceSpec
from mooncake_gym.sim.routing import Route, RoutingConfig, RoutingSimulator, parse_instances, simulate
from mooncake_gym.model.workload import Request, Trace, synthetic_trace

COST = CostModel()  # LLaMA2-70B on an 8 x A800 node
H800 = CostModel(instance=InstanceSpec("H800"))


def trace_of(*reqs):
    return Trace.from_requests([Request(t, n, 10, tuple(ids)) for t, n, ids in reqs], name="tiny")


def test_config_from_a_pool_string():
    c = RoutingConfig(instances="2xH800+A800")
    assert c.n_instances == 3
    assert c.instances == (InstanceSpec("H800"), InstanceSpec("H800"), InstanceSpec("A800"))
    assert c.instance_costs(COST) == (H800, H800, COST)
    assert RoutingConfig(instances=["h800", InstanceSpec("A100", n_gpus=4)]).instances == (
        InstanceSpec("H800"), InstanceSpec("A100", n_gpus=4))
    assert RoutingConfig(n_instances=2, cache_blocks=[5, 7]).instance_cache_blocks() == (5, 7)
    assert RoutingConfig().instance_cache_blocks() == (3000,) * 8 and RoutingConfig().instances is None


@pytest.mark.parametrize("kwargs, name", [
    ({"instances": "4xB200"}, r"instances\[0\]"),
    ({"instances": "4xH800 and 4xA800"}, "instances"),
    ({"instances": "0xH800"}, "instances"),
    ({"instances": [1, 2]}, r"instances\[0\]"),
    ({"instances": []}, "instances"),
    ({"instances": "2xH800", "n_instances": 3}, "n_instances"),
    ({"n_instances": 2, "cache_blocks": [1, 2, 3]}, "cache_blocks"),
    ({"n_instances": 2, "cache_blocks": [1, -2]}, "cache_blocks"),
])
def test_bad_pools_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RoutingConfig(**kwargs)


def test_a_faster_instance_has_a_shorter_prefill_in_the_view():
    trace = trace_of((0.0, 2048, [1, 2, 3, 4]), (0.05, 2560, [1, 2, 3, 4, 5]))
    sim = RoutingSimulator(trace, RoutingConfig(instances="H800+A800"))
    v = sim.view
    assert v.prefill_s == (H800.prefill_s(2048, 0), COST.prefill_s(2048, 0))
    assert v.prefill_s[0] < v.prefill_s[1]
    v = sim.step(0)  # the H800 instance, 0 s queued
    assert sim.last["ttft_s"] == H800.prefill_s(2048, 0)
    q = H800.prefill_s(2048, 0) - 0.05
    assert v.queue_s == (pytest.approx(q, abs=1e-12), 0.0)
    assert v.hit_tokens == (2048, 0) and v.best_instance == 0
    assert v.prefill_s == (H800.prefill_s(2560, 2048), COST.prefill_s(2560, 0))
    assert v.transfer_s == (0.0, COST.transfer_s(2048))
    assert v.pull_prefill_s == (H800.prefill_s(2560, 2048), COST.prefill_s(2560, 2048))  # each at its own speed
    sim.step(Route(1, True))
    assert sim.last["ttft_s"] == COST.transfer_s(2048) + COST.prefill_s(2560, 2048)


def test_per_instance_cache_sizes():
    trace = trace_of(*[(10.0 * k, 1024, [1, 2] if k % 2 == 0 else [3, 4]) for k in range(5)])
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2, cache_blocks=(2, 4)))
    assert [inst.cache.capacity_blocks for inst in sim.instances] == [2, 4]
    assert sim.view.cache_blocks == (2, 4)  # the view's capacities, per instance
    for instance in (0, 0, 1, 1):  # blocks 1, 2 then 3, 4 to each instance
        v = sim.step(instance)
    # instance 0 has room for 2 blocks: 3, 4 evicted 1, 2; instance 1 holds all four
    assert v.block_ids == (1, 2) and v.hit_tokens == (0, 1023)
    assert len(sim.instances[0].cache) == 2 and len(sim.instances[1].cache) == 4


def test_homogeneous_default_is_unchanged_and_the_mixed_path_agrees():
    trace = synthetic_trace(2, 8.0, duration_s=None, n_requests=500)
    base = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(n_instances=4))
    same = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(instances="4xA800"))
    # A100 and A800 differ as specs but not in speed: the per-kind path gives the same numbers
    mixed = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(instances="2xA800+2xA100"))
    for r in (same, mixed):
        assert r.ttft_s.tobytes() == base.ttft_s.tobytes() and r.instance.tolist() == base.instance.tolist()


def test_kvcentric_sends_more_work_to_the_faster_instances():
    trace = synthetic_trace(0, 8.0, duration_s=120.0)
    fast_first = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(instances="4xH800+4xA800"))
    share = fast_first.metrics["request_share"]
    assert sum(share[:4]) > 0.6
    slow = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(instances="8xA800"))
    fast = simulate(trace, make_policy("routing", "kvcentric"), RoutingConfig(instances="8xH800"))
    assert fast.metrics["mean_ttft_s"] < fast_first.metrics["mean_ttft_s"] < slow.metrics["mean_ttft_s"]


def test_env_with_a_heterogeneous_pool():
    env = gym.make("mooncake_gym/PrefillRouting-v0", instances="2xH800+2xA800", cache_blocks=[100, 100, 50, 50],
                   rate=4.0, episode_requests=50)
    obs, info = env.reset(seed=0)
    assert obs.shape == (5 * 4 + 2,) and env.action_space.n == 8 and info["action_mask"].shape == (8,)
    v = env.unwrapped.decision_view()
    assert v.prefill_s[0] == v.prefill_s[1] < v.prefill_s[2] == v.prefill_s[3]
    assert list(env.unwrapped.config.instance_cache_blocks()) == [100, 100, 50, 50]
    with pytest.raises(ValueError, match="n_instances"):
        gym.make("mooncake_gym/PrefillRouting-v0", instances="2xH800", n_instances=8)
    env.unwrapped.render_mode = "ansi"
    assert "cache" in env.unwrapped.render()
    assert parse_instances("2xH800") == (InstanceSpec("H800"),) * 2
    assert np.isfinite(obs).all()
