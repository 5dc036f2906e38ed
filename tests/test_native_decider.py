"""The engine's rules acting through an env (``evaluation.episodes.ViewPolicy`` with
``_engine.stepper.NativeDecider``): an episode of a native rule on a ``PrefillRouting-v0`` episode on
the engine takes the same actions, returns, metrics and generator draws as the same rule answering
the views in Python, and the fast path is taken exactly where the engine can make the decisions."""

import gymnasium as gym
import numpy as np
import pytest

from mooncake_gym import _engine
from mooncake_gym._engine.stepper import NativeDecider
from mooncake_gym.baselines import make_policy
from mooncake_gym.evaluation.episodes import RolloutPolicy, ViewPolicy, evaluate, run_episode
from mooncake_gym.evaluation.scenarios import get_scenario

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

ENV = "mooncake_gym/PrefillRouting-v0"


def episode(policy, decider: bool, seed: int, monkeypatch, **env_kwargs):
    """``policy``'s episode through ``ViewPolicy`` with the engine's decisions (``decider``) or the
    views answered in Python; the metrics, the actions taken and the policy's generator after."""
    if not decider:
        monkeypatch.setattr(NativeDecider, "of", classmethod(lambda cls, sim, policy: None))
    env = gym.make(ENV, engine="native", **env_kwargs)
    actions = []
    step = env.step

    def recording_step(action):
        actions.append(int(action))
        return step(action)

    env.step = recording_step
    try:
        m = run_episode(env, ViewPolicy(policy), seed=seed)
    finally:
        monkeypatch.undo()
        env.close()
    return m, actions, policy.rng.bit_generator.state


@pytest.mark.parametrize("name,knobs", [
    ("kvcentric", {}), ("random", {}), ("load", {}), ("cache", {}),
    ("relsplit", {"long_instances": 3, "work_weight": 2.0}), ("sizesplit", {"long_instances": 2}),
    ("dynamo", {}), ("preble", {}), ("p2c", {}), ("llmd", {}), ("vllm_kvaware", {}),
])
def test_same_episode_as_the_views_answered_in_python(name, knobs, monkeypatch):
    kwargs = {"rate": 11.0, "episode_requests": 400}
    for seed in (3, 17):
        fast = episode(make_policy("routing", name, **knobs), True, seed, monkeypatch, **kwargs)
        slow = episode(make_policy("routing", name, **knobs), False, seed, monkeypatch, **kwargs)
        assert fast[1] == slow[1]                      # every action
        assert fast[2] == slow[2]                      # the generator ends in the same state
        for k, v in slow[0].items():                   # return, metrics, bit for bit
            assert fast[0][k] == v or (isinstance(v, float) and np.isnan(v) and np.isnan(fast[0][k])), k
        assert len(set(fast[1])) > 1


def test_relsplit_running_scale_is_written_back(monkeypatch):
    fast, slow = make_policy("routing", "relsplit"), make_policy("routing", "relsplit")
    episode(fast, True, 5, monkeypatch, rate=11.0, episode_requests=300)
    episode(slow, False, 5, monkeypatch, rate=11.0, episode_requests=300)
    assert slow.scale._weight > 0
    assert (fast.scale._sum, fast.scale._weight, fast._load_s) == (slow.scale._sum, slow.scale._weight, slow._load_s)


def test_the_fast_path_is_taken_only_where_the_engine_decides():
    def decider_after_reset(policy, **env_kwargs):
        env = gym.make(ENV, **env_kwargs)
        env.reset(seed=0)
        p = ViewPolicy(policy) if not isinstance(policy, ViewPolicy) else policy
        p.reset(env, 0)
        try:
            return p._decider
        finally:
            env.close()

    assert isinstance(decider_after_reset(make_policy("routing", "kvcentric"), engine="native"), NativeDecider)
    assert decider_after_reset(make_policy("routing", "kvcentric"), engine="python") is None
    # a rule the engine does not know, a user's function, a scraped observation: answered in Python
    assert decider_after_reset(make_policy("routing", "lbgr"), engine="native") is None
    assert decider_after_reset(lambda view: 0, engine="native") is None
    scraped = {"mode": "scraped", "routers": 2, "scrape_period_s": 0.5, "scrape_delay_s": 0.1}
    assert decider_after_reset(make_policy("routing", "kvcentric"), observation=scraped) is None
    # the rollout reference's base rule answers its trials' views, not through the decider
    assert decider_after_reset(RolloutPolicy(make_policy("routing", "kvcentric"), horizon=4), engine="native") is None


def test_scenario_table_numbers_unchanged_by_the_fast_path(monkeypatch):
    """A scenario's rows through ``evaluate`` (what compare and tune run) are the same either way."""
    s = get_scenario("routing-saturated")
    kwargs = {**s.kwargs, "episode_requests": 500}
    fast = evaluate(s.base_env_id, make_policy("routing", "relsplit"), [1_000_000, 1_000_001], **kwargs)
    monkeypatch.setattr(NativeDecider, "of", classmethod(lambda cls, sim, policy: None))
    slow = evaluate(s.base_env_id, make_policy("routing", "relsplit"), [1_000_000, 1_000_001], **kwargs)
    assert [(m["return"], m["mean_ttft_s"]) for m in fast] == [(m["return"], m["mean_ttft_s"]) for m in slow]
