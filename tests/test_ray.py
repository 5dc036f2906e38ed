"""Ray RLlib training and Ray Tune sweeps (the ``ray`` extra; run by ``make test-ray`` in .venv-ray).

Small on purpose: 50-request episodes, 200-step train batches, at most one remote env runner."""

import math

import pytest

# ray.rllib, not ray: a folder named ray on sys.path (Ray's own /tmp/ray beside a checkout in /tmp, which the
# editable install puts on sys.path) imports as an empty namespace package
pytest.importorskip("ray.rllib", reason="needs the ray extra: make test-ray (pip install 'mooncake-gym[ray]')")

import ray  # noqa: E402
import torch  # noqa: E402

from mooncake_gym.experiments import tune
from mooncake_gym.agents.rllib import train_rllib  # noqa: E402

SMALL = {"train_batch_size_per_learner": 200, "minibatch_size": 50, "num_epochs": 1}
EPISODE = {"episode_requests": 50}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_rllib_ppo_on_routing_with_a_remote_env_runner_reports_ttft_and_hit_share(tmp_path):
    # the plain id on a remote env runner: works only through the registered creator (a worker
    # process that never imported mooncake_gym would raise NamespaceNotFound)
    history = train_rllib("routing", 2, num_env_runners=1, env_kwargs=EPISODE, overrides=SMALL, out=tmp_path / "ckpt")
    assert [h["iteration"] for h in history] == [1, 2]
    assert [h["timesteps"] for h in history] == [200, 400]
    for h in history:
        assert 0 < h["mean_ttft_s"] < 60 and 0 <= h["hit_ratio"] <= 1
        # reward -TTFT / 5 s per request, 50 requests an episode: return = -10 x mean TTFT
        assert h["episode_return_mean"] == pytest.approx(-10 * h["mean_ttft_s"], rel=1e-9)
    assert (tmp_path / "ckpt" / "rllib_checkpoint.json").is_file()


def test_rllib_ppo_on_admission_reports_completed_goodput_and_waste():
    history = train_rllib("admission", 2, num_env_runners=0, env_kwargs=EPISODE, overrides=SMALL)
    assert [h["timesteps"] for h in history] == [200, 400]
    for h in history:
        assert 0 < h["goodput"] <= h["completed"] <= 50
        assert h["wasted_prefill_s"] >= 0 and math.isfinite(h["episode_return_mean"])
        assert "mean_ttft_s" not in h and "hit_ratio" not in h


def test_a_baseline_sweep_on_ray_tune_gives_the_local_loop_s_scores():
    kwargs = dict(policy="early", env="admission", budget=2, search="random", seeds=2, episode_requests=200)
    on_ray = tune.tune_baseline(backend="ray", **kwargs)
    local = tune.tune_baseline(backend="local", **kwargs)
    assert len(on_ray["results"]) == 2
    assert on_ray["results"] == local["results"] and on_ray["knobs"] == local["knobs"]


def test_a_two_trial_ppo_sweep_on_ray_tune():
    doc = tune.tune_ppo("routing", budget=2, search="random", iterations=2, env_kwargs=EPISODE, overrides=SMALL)
    assert len(doc["results"]) == 2
    assert [r["knobs"] for r in doc["results"]] == tune.candidates(tune.PPO_KNOBS, "random", 2, 0)
    for r in doc["results"]:
        assert r["iteration"] == 2 and r["timesteps"] == 400
        assert r["score"] == pytest.approx(-10 * r["mean_ttft_s"], rel=1e-9)
    assert doc["score"] == max(r["score"] for r in doc["results"])


def test_train_backend_rllib_on_the_command_line(tmp_path, capsys):
    from mooncake_gym.cli import main

    out = tmp_path / "run"
    assert main(["train", "--env", "routing", "--backend", "rllib", "--iterations", "1", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # hyperparams.yml's routing batch: 4 x 512 env steps, two whole 1,000-request episodes
    assert lines[0].startswith("iteration   1  env steps     2048  episode_return_mean")
    assert "mean_ttft_s" in lines[0] and "hit_ratio" in lines[0]
    assert lines[-1] == f"RLlib checkpoint: {out}" and (out / "rllib_checkpoint.json").is_file()


# --- an RLlib checkpoint as an agent: evaluate, compare --agent, lab grade --agent ----------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny routing checkpoint: one 200-step iteration on 50-request episodes."""
    out = tmp_path_factory.mktemp("rllib") / "ckpt"
    train_rllib("routing", 1, env_kwargs=EPISODE, overrides=SMALL, out=out)
    return out


def _by_hand(out, env_id, seed, **env_kwargs):
    """One episode with the module's arg-max action, the module called directly (not through Agent)."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str(out / "learner_group" / "learner" / "rl_module" / "default_policy"))
    env = gym.make(env_id, **env_kwargs)
    obs, _ = env.reset(seed=seed)
    while True:
        with torch.no_grad():
            logits = module.forward_inference({"obs": torch.as_tensor(obs[None])})["action_dist_inputs"]
        obs, _, terminated, truncated, info = env.step(int(logits.argmax()))
        if terminated or truncated:
            return info["metrics"]


def test_an_rllib_checkpoint_is_evaluated_like_an_agent_file(checkpoint):
    from mooncake_gym.agents import load_agent
    from mooncake_gym.agents.agentfile import AgentFormatError
    from mooncake_gym.evaluation import evaluate

    with pytest.raises(AgentFormatError, match="is an RLlib checkpoint, which loads only by unpickling .*--unsafe-pickle"):
        load_agent(checkpoint)
    agent = load_agent(checkpoint, trusted=True)
    assert agent.env_id == "mooncake_gym/PrefillRouting-v0" and agent.source == "rllib"
    assert agent.card["env_kwargs"] == {"rate_range": [2.0, 12.0], "episode_requests": 50}  # hyperparams.yml's + EPISODE
    episodes = evaluate("mooncake_gym/PrefillRouting-v0", agent, seeds=[5, 6], episode_requests=50)
    for seed, metrics in zip([5, 6], episodes):
        hand = _by_hand(checkpoint, "mooncake_gym/PrefillRouting-v0", seed, episode_requests=50)
        assert metrics["mean_ttft_s"] == hand["mean_ttft_s"] and metrics["hit_ratio"] == hand["hit_ratio"]
        assert metrics["steps"] == 50


def test_compare_agent_takes_an_rllib_checkpoint(checkpoint, capsys):
    import json

    from mooncake_gym.agents import load_agent
    from mooncake_gym.cli import main
    from mooncake_gym.evaluation import evaluate

    argv = ["compare", "--preset", "lecture", "--agent", str(checkpoint), "--unsafe-pickle", "--seeds", "1"]
    assert main([*argv, "--env", "admission"]) == 2  # a routing agent
    assert "--agent: the agent solves routing, but --env is admission" in capsys.readouterr().err
    assert main([*argv, "--env", "routing", "--rates", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (setting,) = doc["settings"]
    row = next(r for r in setting["rows"] if r["policy"] == "user_agent")
    assert {"ppo_routing", "kvcentric"} <= {r["policy"] for r in setting["rows"]}  # beside the shipped agents
    (episode,) = evaluate(setting["env_id"], load_agent(checkpoint, trusted=True), doc["seeds"], **setting["env_kwargs"])
    assert doc["seeds"] == [1_000_000] and row["mean_ttft_s"] == episode["mean_ttft_s"]


def test_lab_grade_agent_takes_an_rllib_checkpoint(checkpoint, capsys):
    import json

    from mooncake_gym.agents import load_agent
    from mooncake_gym.course import lab
    from mooncake_gym.evaluation import evaluate

    assert lab.main(["grade", "--env", "routing", "--agent", str(checkpoint), "--unsafe-pickle", "--seeds", "3",
                     "--env-kwarg", "episode_requests=100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (episode,) = evaluate("mooncake_gym/PrefillRouting-v0", load_agent(checkpoint, trusted=True), [3],
                          **{**lab.GRADE_KWARGS["routing"], "episode_requests": 100})
    assert doc["seeds"] == [3] and doc["scores"]["submission"]["mean_ttft_s"] == episode["mean_ttft_s"]
    assert doc["scores"]["submission"]["score"] is None  # --env-kwarg changed the rubric's workload
