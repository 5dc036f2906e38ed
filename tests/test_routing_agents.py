"""Issue 13's routing agents: the size-split reference rule, the bound on a heterogeneous pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.sizesplit import SizeSplit
from mooncake_gym.analysis.bounds import ttft_lower_bound
from mooncake_gym.model.costmodel import CostModel, InstanceSpec
from mooncake_gym.sim.routing import Route, RoutingConfig, simulate
from mooncake_gym.model.workload import Trace

COST = CostModel()


def test_sizesplit_keeps_long_requests_on_the_first_instances():
    # long, short, long, short at once on two instances: long ones (prefill > long_s) only on
    # instance 0, so the second short one waits behind a short one, not a long one
    long_ids, short_ids = (lambda k: tuple(range(100 * k, 100 * k + 64))), (lambda k: tuple(range(100 * k, 100 * k + 4)))
    trace = Trace([0.0] * 4, [32768, 2048, 32768, 2048], [1] * 4, [long_ids(1), short_ids(2), long_ids(3), short_ids(4)])
    config = RoutingConfig(n_instances=2)
    short, long_ = COST.prefill_s(2048, 0), COST.prefill_s(32768, 0)
    assert long_ > 2.0 > short
    run = simulate(trace, SizeSplit(long_s=2.0, long_instances=1), config, COST)
    assert run.instance.tolist() == [0, 1, 0, 1]
    assert run.ttft_s.tolist() == pytest.approx([long_, short, 2 * long_, 2 * short], rel=1e-12)
    # kvcentric puts the second long request behind the short one, and the second short behind a long one
    kv = simulate(trace, make_policy("routing", "kvcentric"), config, COST)
    assert kv.instance[2] == kv.instance[1] != kv.instance[0] == kv.instance[3]
    assert kv.ttft_s.tolist() == pytest.approx([long_, short, short + long_, long_ + short], rel=1e-12)


def test_sizesplit_without_split_or_weight_is_kvcentric():
    trace = Trace([0.0, 0.1, 0.2, 0.3], [4096] * 4, [1] * 4,
                  [tuple(range(8)), tuple(range(8)), (0, 1, 2, 3, 50, 51, 52, 53), tuple(range(8))])
    config = RoutingConfig(n_instances=3)
    a = simulate(trace, SizeSplit(long_s=None, work_weight=0.0), config, COST, seed=3)
    b = simulate(trace, make_policy("routing", "kvcentric"), config, COST, seed=3)
    assert a.instance.tolist() == b.instance.tolist() and a.ttft_s.tolist() == b.ttft_s.tolist()
    with pytest.raises(ValueError, match="long_s"):
        SizeSplit(long_s=0.0)
    with pytest.raises(ValueError, match="long_instances"):
        SizeSplit(long_instances=0)


def test_sizesplit_work_weight_prefers_the_fast_instance():
    # one H800 (3.2x the compute of the A800) busy with a long prompt: Algorithm 1 sends the next
    # request to the idle A800; weighting the request's own work there keeps it on the fast H800
    config = RoutingConfig(instances="1xH800+1xA800")
    fast, slow = (replace(COST, instance=InstanceSpec(gpu=g)) for g in ("H800", "A800"))
    trace = Trace([0.0, 0.0], [32768, 8192], [1, 1], [tuple(range(64)), tuple(range(100, 116))])
    f0, f1, s1 = fast.prefill_s(32768, 0), fast.prefill_s(8192, 0), slow.prefill_s(8192, 0)
    assert s1 < f0 + f1 and f0 + f1 + 2 * f1 < s1 + 2 * s1
    kv = simulate(trace, make_policy("routing", "kvcentric"), config, COST)
    assert kv.instance.tolist() == [0, 1] and kv.ttft_s.tolist() == [f0, s1]
    run = simulate(trace, SizeSplit(long_s=None, work_weight=2.0), config, COST)
    assert run.instance.tolist() == [0, 0] and run.ttft_s.tolist() == pytest.approx([f0, f0 + f1], rel=1e-12)


def test_bound_on_a_heterogeneous_pool_uses_the_fastest_kind():
    trace = Trace([0.0, 0.0, 0.0], [8192, 8192, 8192], [1, 1, 1],
                  [tuple(range(16)), tuple(range(100, 116)), tuple(range(200, 216))])
    config = RoutingConfig(instances="1xH800+1xA800")
    fast = replace(COST, instance=InstanceSpec(gpu="H800"))
    bound = ttft_lower_bound(trace, config, COST)
    w = fast.prefill_s(8192, 0)
    assert bound.min_service_s.tolist() == [w, w, w]
    # SRPT on one machine of speed 1 + w / w_A800 (the H800 does the fastest kind's work at rate 1,
    # the A800 at most at rate w / w_A800: bounds.py), three jobs of w at once: done at w / speed,
    # 2 w / speed and 3 w / speed
    speed = 1 + w / COST.prefill_s(8192, 0)
    assert bound.srpt_mean_s == pytest.approx(2 * w / speed, rel=1e-12)
    for name in ("kvcentric", "cache", "load"):
        run = simulate(trace, make_policy("routing", name), config, COST)
        assert run.metrics["mean_ttft_s"] >= bound.mean_ttft_s


def test_shipped_agent_runs_an_episode_it_never_saw_behind_its_wrapper(tmp_path):
    import json
    import shutil

    from mooncake_gym import agents
    from mooncake_gym.envs import ROUTING_ENV_ID
    from mooncake_gym.evaluation.episodes import evaluate

    from mooncake_gym.evaluation.scenarios import get_scenario

    card = agents.card("ppo_routing_saturated")
    assert card["wrappers"] == [{"class": "mooncake_gym.envs.wrappers.RoutingRelativeFeatures", "kwargs": {}}]
    assert [w["scenario"] for w in card["trained_on"]] == ["routing-saturated"]
    assert "routing-heterogeneous" in card["never_saw"]
    agent = agents.load_agent("ppo_routing_saturated")
    kw = get_scenario("routing-heterogeneous").config(episode_requests=200)
    (episode,) = evaluate(ROUTING_ENV_ID, agent, [7], **kw)
    assert episode["steps"] == 200 and 0 < episode["mean_ttft_s"] < 60
    # a card written before the wrappers moved to mooncake_gym.envs (0.2) names the old module: it loads
    # unchanged and acts the same
    for ext in ("zip", "json"):
        shutil.copy(agents.agent_dir() / f"ppo_routing_saturated.{ext}", tmp_path / f"old.{ext}")
    old = json.loads((tmp_path / "old.json").read_text())
    old["wrappers"] = [{"class": "mooncake_gym.wrappers.RoutingRelativeFeatures", "kwargs": {}}]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert evaluate(ROUTING_ENV_ID, agents.load_agent(tmp_path / "old.zip"), [7], **kw) == [episode]
