"""mooncake_gym/agents/warmstart_admission.py's arguments for a per-scenario agent: the loads trained on, the
training seeds per CEM generation, and the card of an agent trained on one load."""

import json

import numpy as np
import pytest
import torch

import mooncake_gym  # noqa: F401  (registers the environments and scenarios)
from mooncake_gym.agents.warmstart_admission import (SCENARIO_KWARGS, TEACHERS, cem_init, complete_card, linear_admit,
                                                     workloads)

torch.set_num_threads(1)


def test_workloads_take_a_subset_of_the_loads():
    (w,) = workloads(loads=[2])
    assert w["env_kwargs"] == {**SCENARIO_KWARGS, "load": 2.0}
    assert (w["teacher"].low, w["teacher"].high, w["teacher"].max_footprint) == TEACHERS[2.0]
    assert [x["env_kwargs"]["load"] for x in workloads()] == [2.0, 3.0]
    assert workloads(loads=[3], episode_requests=50)[0]["env_kwargs"] == {**SCENARIO_KWARGS, "episode_requests": 50,
                                                                          "load": 3.0}
    with pytest.raises(ValueError, match=r"loads: expected a non-empty subset of \[2.0, 3.0\], got \[2.5\]"):
        workloads(loads=[2.5])
    with pytest.raises(ValueError, match="loads: expected a non-empty subset"):
        workloads(loads=[])


def test_cem_scores_each_candidate_on_several_training_seeds_and_writes_its_mean():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from mooncake_gym.envs.wrappers import AdmissionRuleFeatures
    from mooncake_gym.agents.agentfile import wrapper_spec
    from mooncake_gym.agents.warmstart import _wrapped

    with pytest.raises(ValueError, match="seeds_per_generation: expected an integer >= 1, got 0"):
        cem_init(seeds_per_generation=0)
    specs = [wrapper_spec(AdmissionRuleFeatures)]
    kw = {**SCENARIO_KWARGS, "episode_requests": 200, "load": 2.0}
    model = PPO("MlpPolicy", DummyVecEnv([lambda: _wrapped(kw, specs, "mooncake_gym/OverloadAdmission-v1")]),
                policy_kwargs={"net_arch": []}, n_steps=64, seed=0, device="cpu")
    logged = []
    init = cem_init(generations=2, population=3, elite=2, seeds_per_generation=2, loads=[2.0], episode_requests=200,
                    seed=0, log=logged.append)
    out = init(model, specs)
    assert [g["seed"] for g in out["generations"]] == [[100, 101], [102, 103]] and logged == out["generations"]
    assert out["seeds_per_generation"] == 2
    # the starting mean is the context rule (w = 2 on its decision, b = -1): it scores 1 per load, exactly
    assert out["generations"][0]["mean_score"] == pytest.approx(1.0)
    theta = np.asarray(out["theta"])
    obs = np.random.default_rng(0).random((100, 14)).astype(np.float32)
    actions, _ = model.predict(obs, deterministic=True)
    assert actions.tolist() == [linear_admit(theta, o) for o in obs]


def test_complete_card_of_an_agent_trained_on_one_load(tmp_path):
    kw2 = {**SCENARIO_KWARGS, "load": 2.0}
    card = {"training": {"workloads": [{"env_kwargs": kw2}], "timesteps_run": 10, "wall_time_s": 1.0}}
    (tmp_path / "a.json").write_text(json.dumps(card))
    stats = {"token_goodput": 0.0, "goodput_requests": 0.0, "wasted_prefill_gpu_s": 0.0}
    row = lambda name, tg: {"policy": name, **stats, "token_goodput": tg,  # noqa: E731
                            **{k + "_ci95": 1.0 for k in stats}}
    doc = {"seeds": [1000000], "settings": [{"scenario": "admission-load2", "rows": [
        row("user_agent", 110.0), row("context_predicted", 100.0), row("early", 20.0)]}]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    out = complete_card(tmp_path, tmp_path / "c.json", "notes", name="a")
    assert out["env_kwargs"] == kw2 and out["trained_on"] == [kw2]
    assert "admission-load3" in out["never_saw"] and "admission-load2" not in out["never_saw"]
    (ev,) = out["evaluation"]
    assert ev["best_other"]["policy"] == "context_predicted" and ev["ratio_to_best_other"] == pytest.approx(1.1)
    assert json.loads((tmp_path / "a.json").read_text()) == out


def test_growth_features_are_the_requests_opportunity_cost_on_a_hand_built_trace():
    from mooncake_gym.envs.wrappers import MARGINAL_STEP_SLO, AdmissionRuleFeatures
    from mooncake_gym.envs import OverloadAdmissionV1Env
    from mooncake_gym.model.presets import get_preset
    from test_conductor import trace_of  # the hand-built traces of the simulator's tests

    one = get_preset("mooncake").with_(n_prefill=1, n_decode=1)
    base = OverloadAdmissionV1Env(preset=one, prediction=True, prediction_sigma=0.0)
    with pytest.raises(ValueError, match="growth: expected True or False, got 1"):
        AdmissionRuleFeatures(base, growth=1)
    env = AdmissionRuleFeatures(base, growth=True)
    plain = AdmissionRuleFeatures(OverloadAdmissionV1Env(preset=one, prediction=True, prediction_sigma=0.0))
    trace = trace_of((0.0, 1000, 2000), (5.0, 3000, 700), (6.0, 2000, 200))
    obs, _ = env.reset(seed=0, options={"trace": trace})
    first, _ = plain.reset(seed=0, options={"trace": trace})
    assert env.observation_space.shape == obs.shape == (18,) and plain.observation_space.shape == (14,)
    np.testing.assert_array_equal(obs[:14], first)  # the first 14 are the plain wrapper's
    view = env.unwrapped.decision_view()
    assert obs[14] == 1.0 < view.decode_step_with_s[0] / (MARGINAL_STEP_SLO * view.tbt_slo_s)  # idle decode: clipped
    np.testing.assert_array_equal(obs[15:], [np.float32(3000 / view.decode_capacity_per_instance), 0.0, 0.0])
    obs, *_ = env.step(1)
    view = env.unwrapped.decision_view()
    assert view.decode_batch == (1,)  # the first request is decoding: the growth terms are not vacuous
    cap, slo, mean_out = view.decode_capacity_per_instance, view.tbt_slo_s, view.mean_output_tokens
    assert mean_out == pytest.approx((2000 + 700 + 200) / 3)
    grown = view.decode_used_per_instance[0] + 3700 + 1 * min(700, mean_out)
    expected = [min(1.0, (view.decode_step_with_s[0] - view.decode_step_s[0]) / (MARGINAL_STEP_SLO * slo)),
                min(1.0, grown / cap), view.decode_used_per_instance[0] / cap, view.decode_step_s[0] / (2 * slo)]
    np.testing.assert_array_equal(obs[14:], np.float32(expected))
    assert 0 < obs[16] and 0 < obs[17] < 1
    obs, _, terminated, _, _ = env.step(0)
    obs, _, terminated, _, _ = env.step(0)
    assert terminated and obs.shape == (18,) and not obs.any()
