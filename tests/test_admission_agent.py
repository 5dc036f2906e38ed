"""Issue 13's admission agent: the AdmissionRuleFeatures wrapper (exact on a hand-built trace), the
linear policy of the CEM start, the generic warm start's arguments, and the shipped ppo_admission_v1."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import mooncake_gym  # noqa: F401  (registers the environments and scenarios)
from mooncake_gym import agents
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.envs.wrappers import AdmissionRuleFeatures
from mooncake_gym.agents.warmstart import warm_start_ppo
from mooncake_gym.agents.warmstart_admission import linear_admit, set_linear_policy
from mooncake_gym.baselines.admission import ContextRule, EarlyRejection, decode_load_with
from mooncake_gym.envs import ADMISSION_V1_ENV_ID, OverloadAdmissionV1Env
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.model.presets import get_preset
from mooncake_gym.evaluation.scenarios import get_scenario
from test_conductor import trace_of  # the hand-built traces of the simulator's tests

torch.set_num_threads(1)
ONE = get_preset("mooncake").with_(n_prefill=1, n_decode=1)


def test_features_are_the_rules_quantities_on_a_hand_built_trace():
    env = AdmissionRuleFeatures(OverloadAdmissionV1Env(preset=ONE, prediction=True, prediction_sigma=0.0))
    sat = env.unwrapped.saturation.cluster_per_s
    obs, _ = env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 50), (0.5, 3000, 700), (1.0, 2000, 200))})
    assert env.observation_space.shape == obs.shape == (14,)
    view = env.unwrapped.decision_view()
    np.testing.assert_array_equal(obs[[1, 3, 9]], [0.0, 0.0, 0.0])  # empty decode; no arrival gap seen yet
    assert obs[0] == np.float32(decode_load_with(view, 1050) / 2)
    assert obs[4] == np.float32(1050 / 20_000)
    assert obs[5] == np.float32(math.log1p(1050 * 50) / math.log1p(1e8))
    assert obs[6] == np.float32(math.log1p(50) / math.log1p(4096))
    np.testing.assert_array_equal(obs[10:], [1.0, 1.0, 1.0, 1.0])
    obs, *_ = env.step(1)
    view = env.unwrapped.decision_view()
    assert obs[4] == np.float32(3700 / 20_000)
    assert obs[9] == pytest.approx(min(1.0, 2.0 / (4 * sat)), rel=1e-6)  # one gap of 0.5 s: 2 arrivals/s
    rules = [ContextRule(0.7, 0.9, 8000), ContextRule(0.5, 0.8, 8000), ContextRule(0.5, 0.9, 12000), EarlyRejection(0.9)]
    np.testing.assert_array_equal(obs[10:], [float(r(view)) for r in rules])
    obs, *_ = env.step(0)
    assert obs[9] == pytest.approx(min(1.0, 2.0 / (4 * sat)), rel=1e-6)  # two gaps of 0.5 s
    obs, _, terminated, _, _ = env.step(0)
    assert terminated and not obs.any()


def test_features_need_the_prediction():
    with pytest.raises(ValueError, match="env: AdmissionRuleFeatures wraps OverloadAdmission-v1 made with prediction=True"):
        AdmissionRuleFeatures(gym.make(ADMISSION_V1_ENV_ID, episode_requests=10))


def test_linear_policy_in_sb3_acts_as_linear_admit():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    make = lambda: AdmissionRuleFeatures(gym.make(ADMISSION_V1_ENV_ID, episode_requests=50, prediction=True))  # noqa: E731
    model = PPO("MlpPolicy", DummyVecEnv([make]), policy_kwargs={"net_arch": []}, n_steps=64, seed=0, device="cpu")
    theta = np.array([0.5, -1.0, 0.0, 0.3, -2.0, 0.1, 0.2, -0.4, 0.0, 0.6, 2.0, 0.5, -0.5, 0.25, -0.75])
    set_linear_policy(model, theta)
    obs = np.random.default_rng(0).random((200, 14)).astype(np.float32)
    actions, _ = model.predict(obs, deterministic=True)
    assert actions.tolist() == [linear_admit(theta, o) for o in obs]
    assert 0 < actions.sum() < 200  # both actions occur: the check is not vacuous
    with pytest.raises(ValueError, match="model: expected a linear policy"):
        set_linear_policy(model, theta[:5])


def test_warm_start_refuses_an_unknown_goal(tmp_path):
    with pytest.raises(ValueError, match="goal: expected 'min' or 'max'"):
        warm_start_ppo([], tmp_path, goal="best")


def test_shipped_admission_agent_runs_behind_its_wrapper_and_fits_the_admission_scenarios():
    if "ppo_admission_v1" not in agents.available():
        pytest.fail("shipped agent ppo_admission_v1 is missing from mooncake_gym/agents/ (zip and card expected)")
    card = agents.card("ppo_admission_v1")
    assert card["env_id"] == ADMISSION_V1_ENV_ID
    # written before the wrappers moved to mooncake_gym.envs: the card loads unchanged
    assert [w["class"] for w in card["wrappers"]] == ["mooncake_gym.admission_features.AdmissionRuleFeatures"]
    assert all(s < 1000 for s in card["training"]["select_seeds"])  # training seeds only
    agent = agents.load_agent("ppo_admission_v1")
    (ep,) = evaluate(ADMISSION_V1_ENV_ID, agent, [5], load=2.0, episode_requests=300, prediction=True)
    assert ep["steps"] == 300 and 0 < ep["token_goodput"]
    fitting = {}
    for name in ("admission-load2", "conductor-mooncake"):
        setting = cmp.scenario_setting(get_scenario(name))
        fitting[name] = cmp.agents_fitting(setting, {"ppo_admission_v1": (agents.SHIPPED["ppo_admission_v1"], agent)})
    assert list(fitting["admission-load2"]) == ["ppo_admission_v1"]
    assert fitting["conductor-mooncake"] == {}  # another action space
    assert cmp.problem_of(agent) == cmp.ADMISSION_V1


def test_tune_on_an_admission_scenario_gives_a_row_of_its_table():
    from mooncake_gym.experiments.tune import tune_baseline

    doc = tune_baseline("context_predicted", "admission", budget=2, search="random", seeds=1, scenario="admission-load3")
    assert doc["env"] == cmp.ADMISSION_V1 and doc["metric"] == "token_goodput" and doc["scenario"] == "admission-load3"
    assert len(doc["results"]) == 2 and doc["score"] == max(r["score"] for r in doc["results"]) > 0
    policies = cmp.with_tuned(cmp.policies_for(cmp.ADMISSION_V1, {}), cmp.ADMISSION_V1, [doc])
    assert "context_predicted (tuned on admission-load3)" in policies
