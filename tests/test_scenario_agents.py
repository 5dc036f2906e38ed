"""Per-scenario agents (issue 13: "one per scenario where it must"): ``compare`` shows an agent whose
card names ``scenarios`` only in those scenarios' tables, and a tutorial agent (``scenarios`` empty) in
none; the shipped ``ppo_routing_saturated`` and ``ppo_routing``."""

from __future__ import annotations

import pytest
import torch

from mooncake_gym.experiments import compare as cmp
from mooncake_gym.agents import Agent

torch.set_num_threads(1)


class _Constant:
    """A stand-in policy network: always instance 0."""

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return [0] * len(obs), state


def _agent(card: dict) -> Agent:
    return Agent(_Constant(), None, None, card=card)


def test_a_per_scenario_agent_is_compared_only_on_its_scenarios_and_a_tutorial_agent_on_none():
    agents = {"general": ("routing", _agent({})), "bursty_only": ("routing", _agent({"scenarios": ["routing-bursty"]})),
              "tutorial": ("routing", _agent({"scenarios": []}))}
    on_bursty = cmp.policies_for("routing", agents, "routing-bursty")
    on_saturated = cmp.policies_for("routing", agents, "routing-saturated")
    plain = cmp.policies_for("routing", agents)  # compare's own settings (no scenario)
    assert "general" in on_bursty and "general" in on_saturated and "general" in plain
    assert "bursty_only" in on_bursty
    assert "bursty_only" not in on_saturated and "bursty_only" not in plain
    assert "tutorial" in plain and "tutorial" not in on_bursty and "tutorial" not in on_saturated
    # the agents' rows come after every baseline's, as before
    assert list(on_bursty)[-2:] == ["general", "bursty_only"]
    assert list(plain)[-2:] == ["general", "tutorial"]
    assert cmp.agent_scenarios(_agent({})) is None and cmp.agent_scenarios(_agent({"scenarios": []})) == []
    with pytest.raises(ValueError, match="scenarios"):
        cmp.agent_scenarios(_agent({"scenarios": "routing-bursty"}))


@pytest.mark.parametrize("name, scenario", [("ppo_routing_saturated", "routing-saturated")])
def test_shipped_per_scenario_agent_card_names_its_one_scenario_and_compare_shows_it_there_only(name, scenario):
    from mooncake_gym import agents
    from mooncake_gym.evaluation.scenarios import get_scenario, scenarios_of

    card = agents.card(name)
    assert card["scenarios"] == [scenario]
    assert [w["scenario"] for w in card["trained_on"]] == [scenario]
    trained_kwargs = dict(card["trained_on"][0]["env_kwargs"])
    assert trained_kwargs.pop("reward", "ttft") == "ttft"  # the env's default reward
    assert trained_kwargs == get_scenario(scenario).config()
    never = " ".join(map(str, card["never_saw"]))
    assert all(s.name in never for s in scenarios_of("routing") if s.name != scenario)
    assert all(s < 1_000 for s in card["training"]["demo_seeds"] + card["training"]["select_seeds"])
    (evaluation,) = card["evaluation"]
    assert evaluation["scenario"] == scenario
    assert evaluation["seeds"][0] == cmp.COMPARE_SEED_BASE and len(evaluation["seeds"]) >= 5
    shipped = {name: ("routing", agents.load_agent(name))}
    assert name in cmp.policies_for("routing", shipped, scenario)
    other = "routing-saturated" if scenario != "routing-saturated" else "routing-bursty"
    assert name not in cmp.policies_for("routing", shipped, other)
    assert name not in cmp.policies_for("routing", shipped)


def test_complete_routing_card_takes_the_best_baseline_row_default_or_tuned(tmp_path):
    import json

    from mooncake_gym.agents.warmstart import complete_routing_card

    kw = {"rate": 8.0}
    card = {"training": {"workloads": [{"scenario": "routing-bursty", "env_kwargs": kw}], "selected_timestep": 61440,
                         "timesteps_run": 552960, "wall_time_s": 1390.8}}
    (tmp_path / "a.json").write_text(json.dumps(card))
    rows = [{"policy": "user_agent", "mean_ttft_s": 0.5}, {"policy": "ppo_routing_saturated", "mean_ttft_s": 0.4},
            {"policy": "kvcentric", "mean_ttft_s": 0.7}, {"policy": "preble (tuned on routing-bursty)", "mean_ttft_s": 0.625}]
    doc = {"seeds": [1000000], "settings": [{"scenario": "routing-bursty", "rows": rows}]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    out = complete_routing_card(tmp_path / "a.json", tmp_path / "c.json", "n", per_scenario=True)
    assert out["evaluation"] == [{"scenario": "routing-bursty", "seeds": [1000000], "agent_mean_ttft_s": 0.5,
                                  "best_baseline": "preble (tuned on routing-bursty)",
                                  "best_baseline_mean_ttft_s": 0.625, "ratio": 0.8}]
    assert out["scenarios"] == ["routing-bursty"] and out["timesteps"] == 61440 and out["env_kwargs"] == kw
    assert "routing-bursty" not in out["never_saw"] and "routing-saturated" in out["never_saw"]
    assert json.loads((tmp_path / "a.json").read_text()) == out


def test_the_tutorial_agent_is_on_compare_preset_lecture_and_on_no_scenario_table():
    """``ppo_routing``, PPO from scratch (docs/tutorial.md), lands on kvcentric: it is kept for the
    tutorial and off the leaderboard (issue 26: no shipped agent worse than 1.02x the best rule)."""
    from mooncake_gym import agents
    from mooncake_gym.evaluation.scenarios import scenarios_of

    card = agents.card("ppo_routing")
    assert card["scenarios"] == [] and card["env_id"] == "mooncake_gym/PrefillRouting-v0"
    assert "not a leaderboard entry" in card["notes"] and "1.35x the best tuned rule" in card["notes"]
    shipped = {"ppo_routing": ("routing", agents.load_agent("ppo_routing"))}
    assert "ppo_routing" in cmp.policies_for("routing", shipped)  # compare --preset lecture's settings
    for sc in scenarios_of("routing"):
        assert "ppo_routing" not in cmp.policies_for("routing", shipped, sc.name)
    (elsewhere,) = [e for e in cmp.agents_elsewhere([cmp.scenario_setting(scenarios_of("routing")[0])])
                    if e["agent"] == "ppo_routing"]
    assert elsewhere["see"] == "mooncake-gym compare --preset lecture"
