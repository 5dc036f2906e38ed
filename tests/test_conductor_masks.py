"""Conductor-v1's action masks (MultiDiscrete: the four dimensions' masks concatenated, as
sb3-contrib's MaskablePPO takes them), on hand-made traces, and MaskablePPO training on them."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401
from mooncake_gym.model.workload import Trace

#: two requests of the same two blocks, one second apart: the second finds the first's prefix cached
SHARED = Trace([0.0, 1.0], [1024, 1024], [10, 10], [(0, 1), (0, 1)])
ADMIT_ON_0 = np.array([1, 0, 0, 8])  # admit, prefill instance 0, no pull, the default decode rule


def test_the_masks_of_the_mooncake_cluster():
    env = gym.make("mooncake_gym/Conductor-v1", trace=SHARED)
    obs, info = env.reset(seed=0)
    # 2 admit values, 8 prefill instances, 2 pull values, 8 decode instances + the default rule
    nothing_cached = [1, 1] + [1] * 8 + [1, 0] + [1] * 9
    assert info["action_mask"].dtype == np.int8 and info["action_mask"].tolist() == nothing_cached
    assert env.unwrapped.action_masks().dtype == bool
    assert env.unwrapped.action_masks().tolist() == [bool(x) for x in nothing_cached]
    obs, _, terminated, _, info = env.step(ADMIT_ON_0)
    assert not terminated
    hits = env.unwrapped.decision_view().routing.hit_tokens
    assert hits == (1023, 0, 0, 0, 0, 0, 0, 0)  # instance 0 holds it (the last token is always computed)
    assert info["action_mask"].tolist() == [1] * 21  # instances 1-7 would gain from a pull
    *_, terminated, _, info = env.step(np.array([1, 3, 1, 8]))  # a pull to instance 3
    assert terminated and info["action_mask"].tolist() == [1] * 21  # no decision pending: nothing masked


def test_a_pull_is_masked_where_every_instance_holds_the_prefix(tmp_path, preset_tables):
    one = tmp_path / "one.toml"
    one.write_text('[preset]\nname = "mask-one"\nn_prefill = 1\nn_decode = 1\n')
    env = gym.make("mooncake_gym/Conductor-v1", trace=SHARED, preset=str(one))
    _, info = env.reset(seed=0)
    assert info["action_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1]
    _, _, _, _, info = env.step(np.array([1, 0, 0, 1]))
    # the one instance holds the prefix: a pull copies nothing; taken anyway it acts as no pull
    assert info["action_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1]
    *_, terminated, _, info = env.step(np.array([1, 0, 1, 1]))
    assert terminated and env.unwrapped.sim.completed == 2


@pytest.mark.skipif(importlib.util.find_spec("sb3_contrib") is None,
                    reason="sb3-contrib is not installed (pip install 'mooncake-gym[contrib]')")
def test_maskableppo_trains_on_conductor_and_never_takes_a_masked_pull(tmp_path):
    from mooncake_gym.agents import load_agent
    from mooncake_gym.agents.train import train

    kwargs = {"episode_requests": 60}
    path = train("Conductor-v1", algo="maskableppo", timesteps=200, out=tmp_path, progress_bar=False,
                 evaluate_card=False, overrides={"n_steps": 100, "batch_size": 50, "n_epochs": 1},
                 env_kwargs=kwargs, n_envs=1, vec_env="dummy")
    assert path.name == "maskableppo_Conductor-v1.zip"
    agent = load_agent(path)
    env = gym.make("mooncake_gym/Conductor-v1", **kwargs)
    obs, info = env.reset(seed=5)
    masked = 0
    for _ in range(60):
        mask = env.unwrapped.action_masks()
        action, _ = agent.predict(obs[None], deterministic=False, action_masks=mask[None])
        action = np.asarray(action).reshape(4)
        if not mask[2 + 8 + 1]:
            masked += 1
            assert action[2] == 0  # the masked pull is never sampled
        obs, _, terminated, _, info = env.step(action.astype(np.int64))
        if terminated:
            break
    assert masked > 0  # the episode had decisions with the pull masked
