"""Expert iteration (mooncake_gym/agents/expert.py): the rollout's labels and trial costs per decision, the soft
targets, cloning to a distribution, and the recipe's checks."""

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401
from mooncake_gym.agents.agentfile import apply_wrappers, wrapper_spec
from mooncake_gym.agents.expert import expert_iteration, label_episode, soft_targets
from mooncake_gym.agents.warmstart import clone
from mooncake_gym.analysis.rollout import best_trial, rollout_trials
from mooncake_gym.baselines.sizesplit import RelativeSizeSplit
from mooncake_gym.envs.wrappers import RoutingRelativeFeatures
from mooncake_gym.evaluation.scenarios import get_scenario
from mooncake_gym.sim.policy import reset_policy

KWARGS = dict(n_instances=3, rate=9.0, episode_requests=40)


def wrapped_env():
    env = gym.make("mooncake_gym/PrefillRouting-v0", **KWARGS)
    return apply_wrappers(env, [wrapper_spec(RoutingRelativeFeatures)], trusted=True)


def test_label_episode_records_the_rollouts_choices_and_every_trials_cost():
    obs, actions, costs, mean_ttft, agreement = label_episode(wrapped_env(), RelativeSizeSplit(3.0, 1), 6, seed=4)
    assert obs.shape == (40, wrapped_env().observation_space.shape[0]) and actions.shape == (40,)
    assert costs.shape == (40, 6) and agreement == 1.0
    # the same episode, decision by decision, through rollout_route itself
    env = gym.make("mooncake_gym/PrefillRouting-v0", **KWARGS)
    env.reset(seed=4)
    base = RelativeSizeSplit(3.0, 1)
    reset_policy(base, 4)
    u, ttfts = env.unwrapped, []
    for k in range(40):
        tried, trial_costs = rollout_trials(u.sim, base, 6)
        a = u.encode_action(tried[best_trial(trial_costs)])
        row = np.full(6, np.inf)
        for route, c in zip(tried, trial_costs):
            row[u.encode_action(route)] = min(row[u.encode_action(route)], c)
        assert actions[k] == a and costs[k, a] == min(trial_costs)
        assert np.array_equal(costs[k], row)
        ttfts.append(env.step(a)[4]["ttft_s"])
    assert mean_ttft == pytest.approx(np.mean(ttfts), abs=1e-12)
    assert np.isinf(costs).any()  # the pulls that would copy nothing are not tried


def test_soft_targets_weigh_each_trial_by_its_cost():
    costs = np.array([[1.0, 1.2, np.inf], [5.0, 5.0, 4.0]])
    t = soft_targets(costs, 0.2)
    e = np.exp(-1.0)
    assert t[0] == pytest.approx([1 / (1 + e), e / (1 + e), 0.0], abs=1e-7)
    assert t[1] == pytest.approx([np.exp(-5) / (1 + 2 * np.exp(-5)), np.exp(-5) / (1 + 2 * np.exp(-5)),
                                  1 / (1 + 2 * np.exp(-5))], abs=1e-7)


def test_clone_to_one_hot_targets_is_clone_to_the_actions():
    from stable_baselines3 import PPO

    env = wrapped_env()
    rng = np.random.default_rng(0)
    obs = rng.random((300, env.observation_space.shape[0]), dtype=np.float32)
    actions = rng.integers(0, env.action_space.n, 300)
    one_hot = np.eye(env.action_space.n, dtype=np.float32)[actions]
    stats = []
    for target in (actions, one_hot):
        model = PPO("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
        stats.append(clone(model, obs, target, np.zeros(300, np.float32), epochs=3, batch=64, value_coef=0.0))
    assert stats[0]["policy_loss"] == pytest.approx(stats[1]["policy_loss"], rel=1e-5)
    assert stats[0]["agreement"] == stats[1]["agreement"]


@pytest.mark.parametrize("kwargs, message", [
    ({"rounds": 0}, r"^rounds: expected an integer >= 1, got 0$"),
    ({"episodes": 0}, r"^episodes: expected an integer >= 1, got 0$"),
    ({"tau": -1.0}, r"^tau: expected a time >= 0 s, got -1.0$"),
    ({"select_seeds": range(999, 1001)}, r"training seeds below 1,000"),
])
def test_expert_iteration_refuses_bad_settings(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        expert_iteration("routing-saturated", tmp_path, RelativeSizeSplit(), horizon=4, **kwargs)


# --- the realistic cluster (PrefillRouting-v1, the routing-cluster scenarios)
CLUSTER = dict(preset="mooncake", load=0.6, episode_requests=30)


def cluster_env(engine=None):
    env = gym.make("mooncake_gym/PrefillRouting-v1", engine=engine, **CLUSTER)
    return apply_wrappers(env, [wrapper_spec(RoutingRelativeFeatures)], trusted=True)


def test_relative_features_on_the_cluster_read_its_prefill_pools_view():
    from mooncake_gym.baselines.sizesplit import ServiceScale
    from mooncake_gym.envs.wrappers import rule_features

    env = cluster_env()
    n = env.unwrapped.preset.n_prefill
    base_dim = env.unwrapped.observation_space.shape[0]
    assert env.observation_space.shape == (base_dim + 4 * n + 2,)
    obs, _ = env.reset(seed=3)
    scale, slo = ServiceScale(), env.unwrapped.preset.ttft_slo_s
    for _ in range(10):
        view = env.unwrapped.decision_view().routing
        expected = np.asarray(rule_features(view, slo, scale), np.float32)
        assert np.array_equal(obs[base_dim:], expected)
        obs = env.step(0)[0]


def test_label_episode_on_the_cluster_is_the_rollouts_and_the_same_on_both_engines():
    from mooncake_gym.agents.expert import base_rule

    labels = []
    for engine in ("python", "native"):
        rule, name = base_rule("relsplit", None, "routing-cluster")
        labels.append(label_episode(cluster_env(engine), rule, 4, seed=5))
    (o_py, a_py, c_py, ttft_py, agree_py), (o_nat, a_nat, c_nat, ttft_nat, _) = labels
    assert a_py.shape == (30,) and agree_py == 1.0
    assert np.array_equal(o_py, o_nat) and np.array_equal(a_py, a_nat) and np.array_equal(c_py, c_nat)
    assert ttft_py == ttft_nat
    # every label is the cheapest trial of its decision
    assert all(c_py[k, a_py[k]] == c_py[k].min() for k in range(30))


def test_base_rule_takes_the_problem_of_the_tune_file(tmp_path):
    import json

    from mooncake_gym.agents.expert import base_rule

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"policy": "relsplit", "env": "routing-cluster",
                                "knobs": {"long_factor": 6.0, "long_instances": 1, "min_load": 0.0}}))
    rule, name = base_rule("relsplit", str(path), "routing-cluster")
    assert name == "relsplit(long_factor=6.0, long_instances=1, min_load=0.0)"
    with pytest.raises(ValueError, match=r"^--tuned: expected a routing tune result of relsplit, "
                                         r"got routing-cluster/relsplit$"):
        base_rule("relsplit", str(path))


def test_expert_iteration_on_a_mix_labels_each_scenario_and_selects_by_the_score(tmp_path):
    import json

    from mooncake_gym.agents.warmstart import selection_score
    from mooncake_gym.evaluation.episodes import evaluate

    names = ["routing-saturated", "routing-bursty"]
    overrides = [{"episode_requests": 20}, {"episode_requests": 12}]
    base = RelativeSizeSplit(3.0, 1)
    card = expert_iteration(names, tmp_path, base, horizon=3, rounds=2, episodes=1, epochs=1,
                            select_seeds=range(900, 902), name="mix", overrides=overrides)
    data = np.load(tmp_path / "mix-data.npz")
    # each round: one episode of each scenario (20 + 12 decisions), seeds 0 then 1
    assert [h["labels"] for h in card["training"]["history"]] == [32, 64] and len(data["actions"]) == 64
    kwargs = [{**dict(get_scenario(n).kwargs), **o} for n, o in zip(names, overrides)]
    refs = [float(np.mean([e["mean_ttft_s"] for e in evaluate("mooncake_gym/PrefillRouting-v0", base, [900, 901], **k)]))
            for k in kwargs]
    assert card["training"]["base_select_mean_ttft_s"] == refs
    for h in card["training"]["history"]:
        assert len(h["select_mean_ttft_s"]) == 2
        assert h["select_ratio_to_base"] == [t / b for t, b in zip(h["select_mean_ttft_s"], refs)]
        assert h["select_score"] == selection_score(h["select_mean_ttft_s"], refs)
    scores = [h["select_score"] for h in card["training"]["history"]]
    assert card["training"]["selected_round"] == int(np.argmin(scores))
    assert [t["scenario"] for t in card["trained_on"]] == [
        "routing-saturated with {'episode_requests': 20}", "routing-bursty with {'episode_requests': 12}"]
    assert card["env_kwargs"] == kwargs[0] and card["scenarios"] == names
    assert "routing-saturated" in card["never_saw"]  # (other episodes than the scenario's)
    assert json.loads((tmp_path / "mix.json").read_text()) == card


def test_expert_iteration_refuses_a_mix_of_env_ids_and_mismatched_overrides(tmp_path):
    with pytest.raises(ValueError, match=r"^scenario: expected scenarios of one env id, got "
                                         r"\['mooncake_gym/PrefillRouting-v0', 'mooncake_gym/PrefillRouting-v1'\]$"):
        expert_iteration(["routing-saturated", "routing-cluster-saturated"], tmp_path, RelativeSizeSplit(), horizon=4)
    with pytest.raises(ValueError, match=r"^overrides: expected one dict per scenario \(2\), got 1$"):
        expert_iteration(["routing-saturated", "routing-bursty"], tmp_path, RelativeSizeSplit(), horizon=4,
                         overrides=[{}])


def test_parse_workload_reads_json_values_and_strings():
    from mooncake_gym.agents.expert import parse_workload

    assert parse_workload("routing-cluster-saturated") == ("routing-cluster-saturated", {})
    assert parse_workload("routing-cluster-saturated:load=null:load_range=[0.35,0.55]:base_trace=a/b.jsonl") == (
        "routing-cluster-saturated", {"load": None, "load_range": [0.35, 0.55], "base_trace": "a/b.jsonl"})
    with pytest.raises(ValueError, match=r"^--scenario: expected NAME:KEY=VALUE:\.\.\., got 'routing-saturated:load'$"):
        parse_workload("routing-saturated:load")
    with pytest.raises(ValueError, match=r"^scenario: expected one of"):
        parse_workload("no-such-scenario")


def test_fine_tune_on_a_mix_runs_ppo_on_each_scenario_and_scores_against_each_reference(tmp_path):
    from mooncake_gym.agents.expert import fine_tune
    from mooncake_gym.agents.warmstart import selection_score

    names = ["routing-saturated", "routing-bursty"]
    overrides = [{"episode_requests": 20}, {"episode_requests": 12}]
    base = RelativeSizeSplit(3.0, 1)
    expert_iteration(names, tmp_path, base, horizon=3, rounds=1, episodes=1, epochs=1, select_seeds=range(900, 901),
                     name="mix", overrides=overrides)
    card = fine_tune(tmp_path / "mix.zip", names, tmp_path, base, timesteps=1024, chunk=1024, envs=1,
                     value_episodes=1, select_seeds=range(900, 901), name="mix_ppo", overrides=overrides)
    t = card["training"]
    assert [w["scenario"] for w in t["workloads"]] == names and [w["envs"] for w in t["workloads"]] == [1, 1]
    assert [w["env_kwargs"]["episode_requests"] for w in t["workloads"]] == [20, 12]
    refs = [w["reference_mean_ttft_s"] for w in t["workloads"]]
    for h in t["history"]:
        assert len(h["select_mean_ttft_s"]) == 2
        assert h["score"] == selection_score(h["select_mean_ttft_s"], refs)
    assert t["timesteps_run"] == 1024


def test_resume_goes_on_from_a_card_written_before_the_scores(tmp_path):
    import json

    from mooncake_gym.agents.warmstart import selection_score

    kw = dict(horizon=3, episodes=1, epochs=1, select_seeds=range(900, 902), name="one",
              overrides={"episode_requests": 15})
    first = expert_iteration("routing-saturated", tmp_path, RelativeSizeSplit(3.0, 1), rounds=1, **kw)
    assert first["training"]["history"][0]["select_score"] == selection_score(
        [first["training"]["history"][0]["select_ratio_to_base"]], [1.0])
    for h in first["training"]["history"]:  # a card of before this change: no score
        del h["select_score"]
    (tmp_path / "one.json").write_text(json.dumps(first))
    card = expert_iteration("routing-saturated", tmp_path, RelativeSizeSplit(3.0, 1), rounds=2, resume=True, **kw)
    history = card["training"]["history"]
    assert [h["round"] for h in history] == [0, 1] and history[1]["labels"] == 30
    ratios = [h["select_ratio_to_base"] for h in history]
    assert card["training"]["selected_round"] == int(np.argmin(ratios))
