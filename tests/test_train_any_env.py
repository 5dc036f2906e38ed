"""``mooncake-gym train --env ID`` on every registered environment: the lecture's two, the v1
environments, Conductor-v1 and every scenario; ``--env-kwargs`` checked against the env's own
signature before any training."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import mooncake_gym  # noqa: F401  (registers the ids)
from mooncake_gym.agents import load_agent
from mooncake_gym.agents.train import (ENV_IDS, check_env_kwargs, env_parameters, load_hyperparams,
                                       registered_env_ids, resolve_env, train)
from mooncake_gym.cli import main
from mooncake_gym.evaluation.scenarios import SCENARIOS

#: PPO of a few hundred steps: two rollouts of 100 steps, one epoch each
TINY = {"n_steps": 100, "batch_size": 50, "n_epochs": 1}


def test_every_registered_id_resolves_short_and_long():
    ids = registered_env_ids()
    expected = {ENV_IDS["routing"], ENV_IDS["admission"], "mooncake_gym/PrefillRouting-v1",
                "mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1", *(s.env_id for s in SCENARIOS.values())}
    assert set(ids) == expected
    assert resolve_env("routing") == ("mooncake_gym/PrefillRouting-v0", "routing")
    assert resolve_env("Conductor-v1") == resolve_env("mooncake_gym/Conductor-v1") == \
        ("mooncake_gym/Conductor-v1", "Conductor-v1")
    with pytest.raises(ValueError, match=r"^--env: expected one of routing, admission, Conductor-v1, .*got 'v2'$"):
        resolve_env("v2")


def test_a_scenario_takes_its_base_environments_algorithm_and_its_own_workload():
    hp = load_hyperparams("mooncake_gym/routing-saturated-v1")
    base = load_hyperparams("mooncake_gym/PrefillRouting-v0")
    assert "env_kwargs" not in hp and "eval_env_kwargs" not in hp
    assert hp == {k: v for k, v in base.items() if k not in ("env_kwargs", "eval_env_kwargs")}


def test_env_kwargs_are_checked_against_the_environments_signature():
    with pytest.raises(ValueError) as e:
        check_env_kwargs("mooncake_gym/PrefillRouting-v0", {"preset": "h100"})
    accepted = ", ".join(env_parameters("mooncake_gym/PrefillRouting-v0"))
    assert str(e.value) == f"--env-kwargs: mooncake_gym/PrefillRouting-v0 takes no 'preset'; it accepts {accepted}"
    assert "rate_range" in accepted and "preset" not in accepted
    check_env_kwargs("mooncake_gym/PrefillRouting-v1", {"preset": "h100", "load": 0.5})  # v1 takes a preset
    with pytest.raises(ValueError, match=r"routing-mooncake-trace-v1 needs trace=\.\.\. "):
        check_env_kwargs("mooncake_gym/routing-mooncake-trace-v1", {})


def _small(env_id: str, tmp_path) -> dict:
    """Short episodes (where the env takes a length), and a tiny trace where one must be given."""
    params = env_parameters(env_id)
    kwargs = {}
    if "episode_requests" in params:
        kwargs["episode_requests"] = 60
    scenario = next((s for s in SCENARIOS.values() if s.env_id == env_id), None)
    if scenario is not None and scenario.requires:  # a trace file: replayed (trace) or drawn from (base_trace)
        path = tmp_path / "trace.jsonl"
        path.write_text("".join(json.dumps({"timestamp": 500 * i, "input_length": 600 + 10 * (i % 40), "output_length": 20,
                                            "hash_ids": [i % 3, 100 + i]}) + "\n" for i in range(1200)))
        kwargs.update({key: str(path) for key in scenario.requires})
        if "trace" in scenario.requires:
            if "window_requests" in params:
                kwargs["window_requests"] = 200
            kwargs.pop("episode_requests", None)
    return kwargs


@pytest.mark.parametrize("env_id", registered_env_ids())
def test_every_id_constructs_and_trains_a_few_hundred_steps(env_id, tmp_path):
    kwargs = _small(env_id, tmp_path)
    path = train(env_id, timesteps=200, out=tmp_path / "run", progress_bar=False, evaluate_card=False,
                 overrides=TINY, env_kwargs=kwargs, n_envs=1, vec_env="dummy")
    short = env_id.removeprefix("mooncake_gym/")
    assert path.name == f"ppo_{short}.zip"
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["env_id"] == env_id and card["timesteps_run"] == 200
    agent = load_agent(path)
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=1)
    action, _ = agent.predict(obs[None])
    assert env.action_space.contains(action.reshape(env.action_space.shape or ()).astype(env.action_space.dtype)
                                     if env.action_space.shape else int(action.reshape(-1)[0]))
    env.close()


def test_the_command_line_trains_a_v1_environment_on_another_preset(tmp_path, capsys):
    out = tmp_path / "cond"
    assert main(["train", "--env", "PrefillRouting-v1", "--env-kwargs", "preset=h100,episode_requests=40",
                 "--timesteps", "64", "--n-envs", "1", "--no-progress", "--no-evaluate", "--out", str(out)]) == 0
    card = json.loads((out / "ppo_PrefillRouting-v1.json").read_text())
    assert card["env_kwargs"]["preset"] == "h100" and card["env_kwargs"]["episode_requests"] == 40
    assert "load_range" in card["env_kwargs"]  # the recipe's workload under the user's settings
    capsys.readouterr()
    assert main(["train", "--env", "admission", "--env-kwargs", "presets=h100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mooncake-gym train: error: --env-kwargs: mooncake_gym/OverloadAdmission-v0 takes no "
                          "'presets'; it accepts load, load_range,") and err.count("\n") == 1
