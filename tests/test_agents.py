"""Shipped PPO agents, training and the compare command."""

import json
import math
import shutil

import pytest
import torch

import mooncake_gym.agents as agents
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.agents.train import load_hyperparams, sha256_of, train
from mooncake_gym.cli import main
from mooncake_gym.envs import ADMISSION_ENV_ID, ADMISSION_V1_ENV_ID, ROUTING_ENV_ID, ROUTING_V1_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate

torch.set_num_threads(1)

EPISODE = {"routing": {"rate": 6.0, "episode_requests": 200}, "admission": {"load": 2.0, "episode_requests": 200},
           "admission-v1": {"load": 2.0, "episode_requests": 200, "prediction": True},
           "routing-cluster": {"load": 0.6, "episode_requests": 200}}
ENV_IDS = {"routing": ROUTING_ENV_ID, "admission": ADMISSION_ENV_ID, "admission-v1": ADMISSION_V1_ENV_ID,
           "routing-cluster": ROUTING_V1_ENV_ID}


@pytest.mark.parametrize("name", sorted(agents.SHIPPED))
def test_shipped_agent_loads_verified_and_runs_an_episode(name):
    if name not in agents.available():
        pytest.fail(f"shipped agent {name} is missing from mooncake_gym/agents/ (zip and card expected)")
    card = agents.card(name)
    assert card["sha256"] == sha256_of(agents.agent_dir() / f"{name}.zip")
    assert card["env_id"] == ENV_IDS[agents.SHIPPED[name]]
    # trained within issue 13's budget (30 minutes on this 2-core machine); a warm-started agent may
    # keep its cloned policy (timesteps 0: no PPO checkpoint was better) after a PPO run of timesteps_run;
    # a distilled student of expert iteration (agents/expert.py) was fit to labelled decisions instead
    assert card.get("timesteps_run", card["timesteps"]) > 0 or card.get("labelled_decisions", 0) > 0
    # the realistic cluster's agents (issue 26): 60 minutes, trained while 4 other jobs shared the 2 cores
    assert card["wall_time_s"] <= (60 if agents.SHIPPED[name] == "routing-cluster" else 30) * 60
    model = agents.load_agent(name)
    problem = agents.SHIPPED[name]
    preset = {"preset": card["env_kwargs"]["preset"]} if problem == "routing-cluster" else {}  # (its own cluster)
    (episode,) = evaluate(ENV_IDS[problem], model, [123], **EPISODE[problem], **preset)
    assert episode["steps"] == 200
    assert all(math.isfinite(v) for v in episode.values() if isinstance(v, float) and not math.isnan(v))


def test_tampered_agent_is_refused(tmp_path, monkeypatch):
    for name in agents.available():
        shutil.copy(agents.agent_dir() / f"{name}.zip", tmp_path / f"{name}.zip")
        shutil.copy(agents.agent_dir() / f"{name}.json", tmp_path / f"{name}.json")
    name = next(iter(agents.available()))
    with open(tmp_path / f"{name}.zip", "ab") as f:
        f.write(b"\0")
    monkeypatch.setattr(agents, "agent_dir", lambda: tmp_path)
    with pytest.raises(agents.AgentIntegrityError, match="does not match the sha256 recorded for it"):
        agents.load_agent(name)


def test_untrusted_user_file_needs_consent(tmp_path):
    shutil.copy(agents.agent_dir() / "ppo_routing.zip", tmp_path / "mine.zip")  # an SB3 zip without a card
    with pytest.raises(ValueError, match="can run code"):
        agents.load_agent(tmp_path / "mine.zip")
    with pytest.raises(FileNotFoundError):
        agents.load_agent(tmp_path / "other.zip", trusted=True)
    assert agents.load_agent(tmp_path / "mine.zip", trusted=True).source == "pickle"  # the user's consent


def test_training_smoke_produces_a_loadable_agent(tmp_path):
    path = train("routing", timesteps=1024, seed=1, out=tmp_path, progress_bar=False, evaluate_card=False)
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["sha256"] == sha256_of(path) and card["timesteps"] == 1024 and card["seed"] == 1
    assert card["env_id"] == ROUTING_ENV_ID and card["versions"]["stable_baselines3"]
    model = agents.load_agent(path, trusted=True)
    (episode,) = evaluate(ROUTING_ENV_ID, model, [5], **EPISODE["routing"])
    assert episode["steps"] == 200


def test_hyperparameters_exist_for_both_envs():
    for env_id in (ROUTING_ENV_ID, ADMISSION_ENV_ID):  # `train`'s envs (the v1 agent has its own script)
        hp = load_hyperparams(env_id)
        assert hp["policy"] == "MlpPolicy" and hp["n_timesteps"] > 0
    with pytest.raises(ValueError, match="no hyperparameters"):
        load_hyperparams("nope-v0")


def test_compare_json_small_setting(capsys):
    code = main(["compare", "--preset", "lecture", "--env", "all", "--seeds", "2", "--rates", "6", "--loads", "2",
                 "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seeds"] == [cmp.COMPARE_SEED_BASE, cmp.COMPARE_SEED_BASE + 1]
    problems = [s["problem"] for s in doc["settings"]]
    assert problems == ["routing", "admission"]
    for setting in doc["settings"]:
        columns, _ = cmp.columns_of(setting["problem"])
        names = [r["policy"] for r in setting["rows"]]
        expected = list(cmp.policies_for(setting["problem"], {}))
        assert names[: len(expected)] == expected and len(names) == len(set(names))
        assert any(n.startswith("ppo") for n in names), "the shipped agent is compared"
        for row in setting["rows"]:
            for key, *_ in columns[1:]:
                if key == "load_correlation":  # undefined (null) when a load series is constant
                    continue
                assert isinstance(row[key], float) and math.isfinite(row[key]), (row["policy"], key)
                assert math.isfinite(row[key + "_ci95"]) and row[key + "_ci95"] >= 0


def test_mean_ci95():
    m, h = cmp.mean_ci95([1.0])
    assert m == 1.0 and math.isnan(h)
    m, h = cmp.mean_ci95([1.0, 3.0])
    # Student's t with 1 degree of freedom is Cauchy: t(0.975, 1) = tan(0.475 pi) = 12.706...
    assert m == 2.0 and h == pytest.approx(math.tan(0.475 * math.pi) * math.sqrt(2) / math.sqrt(2), rel=1e-12)
    assert math.isnan(cmp.mean_ci95([])[0])


def test_agent_for_other_spaces_gets_a_clear_error():
    model = agents.load_agent("ppo_routing")
    with pytest.raises(ValueError, match="agent: trained for observation_space"):
        evaluate(ADMISSION_ENV_ID, model, [0], **EPISODE["admission"])
    with pytest.raises(ValueError, match="retrain it"):
        evaluate(ROUTING_ENV_ID, model, [0, 1], n_instances=4, **EPISODE["routing"])


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"tensorboard: .*mooncake-gym\[tensorboard\]"):
        train("routing", timesteps=16, out=tmp_path, tensorboard=str(tmp_path / "tb"), progress_bar=False)


def test_compare_finds_the_problem_of_a_user_agent(capsys):
    path = str(agents.agent_dir() / "ppo_admission.zip")
    assert cmp.problem_of(agents.load_agent("ppo_admission")) == "admission"
    assert cmp.problem_of(agents.load_agent("ppo_routing")) == "routing"
    assert main(["compare", "--preset", "lecture", "--env", "routing", "--agent", path, "--seeds", "1", "--json"]) == 2
    assert "the agent solves admission, but --env is routing" in capsys.readouterr().err
