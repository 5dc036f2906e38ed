"""The agent format: loading without unpickling, agents of any shape in evaluate, the training CLI."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import mooncake_gym.agents as agents
from mooncake_gym.agents.agentfile import AgentFormatError, as_agent, save_agent
from mooncake_gym.agents.train import parse_env_kwargs, progress_callback, train
from mooncake_gym.cli import main
from mooncake_gym.envs import ADMISSION_ENV_ID, ADMISSION_V1_ENV_ID, ROUTING_ENV_ID, ROUTING_V1_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate

torch.set_num_threads(1)

HAS_CONTRIB = importlib.util.find_spec("sb3_contrib") is not None
needs_contrib = pytest.mark.skipif(not HAS_CONTRIB, reason="sb3-contrib is not installed (pip install 'mooncake-gym[contrib]')")
#: A small routing setting for the tiny agents (4 instances, short episodes).
SMALL = {"n_instances": 4, "rate": 3.0, "episode_requests": 60}
SEEDS = [11, 12]


class MinusBest(gym.ObservationWrapper):
    """Tutorial exercise 6's feature, scaled: each instance's two TTFT estimates minus the smallest."""

    def __init__(self, env, scale=1.0):
        super().__init__(env)
        self.n, self.scale = env.unwrapped.config.n_instances, scale
        size = env.observation_space.shape[0] + 2 * self.n
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)

    def observation(self, obs):
        est = obs[: 5 * self.n].reshape(self.n, 5)[:, 3:5]
        return np.concatenate([obs, self.scale * (est - est.min()).ravel()]).astype(np.float32)


class NoPullMasks(gym.Wrapper):
    """Adds ``action_masks()``: route anywhere, never pull (the second half of the actions)."""

    def action_masks(self):
        n = self.env.unwrapped.config.n_instances
        return np.arange(self.action_space.n) < n


def _metrics(episode: dict) -> str:
    """The simulator's metrics of an episode, as sorted JSON (so NaN equals NaN)."""
    return json.dumps({k: v for k, v in episode.items() if k not in ("return", "steps", "seed", "policy", "result")},
                      sort_keys=True)


def _sb3_reference(model, make_env, seeds, vecnormalize=None, masks=False):
    """Each seed's end-of-episode metrics and return from SB3's own evaluation loop (sb3-contrib's for
    maskable agents) on a DummyVecEnv, under the training VecNormalize's statistics if any."""
    if masks:
        from sb3_contrib.common.maskable.evaluation import evaluate_policy
    else:
        from stable_baselines3.common.evaluation import evaluate_policy
    out = []
    for seed in seeds:
        venv = DummyVecEnv([lambda: Monitor(make_env())])
        if vecnormalize is not None:
            venv = VecNormalize(venv, training=False, norm_reward=False)
            venv.obs_rms = vecnormalize.obs_rms
        venv.seed(seed)
        infos = []
        kwargs = {"use_masking": True} if masks else {}
        (ret,), _ = evaluate_policy(model, venv, n_eval_episodes=1, deterministic=True, return_episode_rewards=True,
                                    callback=lambda loc, _: loc["done"] and infos.append(loc["info"]), **kwargs)
        out.append((infos[0]["metrics"], ret))
        venv.close()
    return out


def _assert_same_as_sb3(agent_path, model, make_env, vecnormalize=None, masks=False):
    ours = evaluate(ROUTING_ENV_ID, agents.load_agent(agent_path), SEEDS, **SMALL)
    theirs = _sb3_reference(model, make_env, SEEDS, vecnormalize, masks)
    for episode, (metrics, ret) in zip(ours, theirs):
        assert _metrics(episode) == _metrics(metrics)
        assert episode["return"] == pytest.approx(ret, rel=1e-5, abs=1e-4)  # Monitor rounds to 6 digits


def _tiny(cls, policy, venv, **kw):
    defaults = {"n_steps": 64, "batch_size": 64} if cls not in (DQN,) else {"learning_starts": 50, "buffer_size": 1000}
    if cls is A2C:
        defaults = {"n_steps": 8}
    return cls(policy, venv, seed=3, device="cpu", policy_kwargs={"net_arch": [16, 16]}, **{**defaults, **kw}).learn(256)


@pytest.mark.parametrize("cls", [PPO, A2C, DQN])
def test_vecnormalized_agent_evaluates_as_in_sb3(tmp_path, cls):
    venv = VecNormalize(DummyVecEnv([lambda: gym.make(ROUTING_ENV_ID, **SMALL)]), norm_reward=False)
    model = _tiny(cls, "MlpPolicy", venv)
    path = save_agent(model, tmp_path / "a.zip", ROUTING_ENV_ID)
    card = json.loads(path.with_suffix(".json").read_text())
    assert card["algorithm"] == cls.__name__ and card["obs_normalization"]["mean"] == venv.obs_rms.mean.tolist()
    _assert_same_as_sb3(path, model, lambda: gym.make(ROUTING_ENV_ID, **SMALL), vecnormalize=venv)
    # without its statistics the same network acts differently: the normalisation is really applied
    raw = evaluate(ROUTING_ENV_ID, model.policy, SEEDS, **SMALL)
    assert [_metrics(e) for e in raw] != [_metrics(e) for e in evaluate(ROUTING_ENV_ID, agents.load_agent(path), SEEDS, **SMALL)]


def test_wrapped_agent_evaluates_as_in_sb3(tmp_path):
    make = lambda: MinusBest(gym.make(ROUTING_ENV_ID, **SMALL), scale=0.5)  # noqa: E731
    model = _tiny(PPO, "MlpPolicy", DummyVecEnv([make]))
    path = save_agent(model, tmp_path / "w.zip", ROUTING_ENV_ID, wrappers=[(MinusBest, {"scale": 0.5})])
    assert json.loads(path.with_suffix(".json").read_text())["wrappers"] == [
        {"class": f"{__name__}.MinusBest", "kwargs": {"scale": 0.5}}]
    _assert_same_as_sb3(path, model, make)
    # run_episode on an env that already has the wrapper uses it as is; a bare model on the bare env
    # is refused with what differs, not a misleading "retrain it" alone
    from mooncake_gym.evaluation.episodes import run_episode

    agent = agents.load_agent(path)
    assert _metrics(run_episode(make(), agent, seed=SEEDS[0])) == _metrics(evaluate(ROUTING_ENV_ID, agent, SEEDS[:1], **SMALL)[0])
    with pytest.raises(ValueError, match=r"observation_space Box\(30,\), but mooncake_gym/PrefillRouting-v0 has Box\(22,\)"):
        evaluate(ROUTING_ENV_ID, model, SEEDS, **SMALL)


@needs_contrib
def test_recurrent_agent_evaluates_as_in_sb3(tmp_path):
    from sb3_contrib import RecurrentPPO

    make = lambda: gym.make(ROUTING_ENV_ID, **SMALL)  # noqa: E731
    model = RecurrentPPO("MlpLstmPolicy", DummyVecEnv([make]), n_steps=64, batch_size=64, seed=3, device="cpu",
                         policy_kwargs={"net_arch": [16], "lstm_hidden_size": 8}).learn(128)
    path = save_agent(model, tmp_path / "r.zip", ROUTING_ENV_ID)
    assert agents.load_agent(path).recurrent
    _assert_same_as_sb3(path, model, make)


@needs_contrib
def test_maskable_agent_evaluates_as_in_sb3_and_obeys_the_masks(tmp_path):
    from sb3_contrib import MaskablePPO

    make = lambda: NoPullMasks(gym.make(ROUTING_ENV_ID, **SMALL))  # noqa: E731
    model = _tiny(MaskablePPO, "MlpPolicy", DummyVecEnv([make]))
    path = save_agent(model, tmp_path / "m.zip", ROUTING_ENV_ID, wrappers=[NoPullMasks])
    _assert_same_as_sb3(path, model, make, masks=True)
    assert all(e["fetched_tokens"] == 0 for e in evaluate(ROUTING_ENV_ID, agents.load_agent(path), SEEDS, **SMALL))


@pytest.mark.parametrize("name", sorted(agents.SHIPPED))
def test_shipped_agent_without_unpickling_acts_as_sb3_load(name):
    """The weights-only agent and SB3's (unpickling) load of the same zip give the same episodes."""
    problem = agents.SHIPPED[name]
    env_id = {"routing": ROUTING_ENV_ID, "admission": ADMISSION_ENV_ID, "admission-v1": ADMISSION_V1_ENV_ID,
              "routing-cluster": ROUTING_V1_ENV_ID}[problem]
    kw = {"routing": {"rate": 8.0, "episode_requests": 300}, "admission": {"load": 2.0, "episode_requests": 400},
          "admission-v1": {"load": 2.0, "episode_requests": 400, "prediction": True},
          "routing-cluster": {"preset": agents.card(name)["env_kwargs"].get("preset", "mooncake"), "load": 0.6,
                              "episode_requests": 300}}[problem]
    agent = agents.load_agent(name)
    assert agent.source == "weights"
    pickled = PPO.load(agents.agent_dir() / f"{name}.zip", device="cpu")
    if agents.card(name)["wrappers"]:  # SB3's load knows nothing of the wrappers: give it the card's
        pickled = as_agent(pickled, env_id, agents.card(name)["wrappers"])
    ours, theirs = evaluate(env_id, agent, [0, 1], **kw), evaluate(env_id, pickled, [0, 1], **kw)
    assert [json.dumps(e, sort_keys=True) for e in ours] == [json.dumps(e, sort_keys=True) for e in theirs]


def test_tampered_card_of_a_shipped_agent_is_refused(tmp_path, monkeypatch):
    for name in agents.available():
        for ext in ("zip", "json"):
            shutil.copy(agents.agent_dir() / f"{name}.{ext}", tmp_path / f"{name}.{ext}")
    card = json.loads((tmp_path / "ppo_routing.json").read_text())
    card["architecture"]["activation_fn"] = "ReLU"
    (tmp_path / "ppo_routing.json").write_text(json.dumps(card))
    monkeypatch.setattr(agents, "agent_dir", lambda: tmp_path)
    with pytest.raises(agents.AgentIntegrityError, match=r"ppo_routing.json does not match the sha256 recorded"):
        agents.load_agent("ppo_routing")
    agents.load_agent("ppo_admission")  # the untouched one still loads


class _Payload:
    def __reduce__(self):
        return (os.mkdir, (os.environ["AGENT_PAYLOAD_DIR"],))


def test_pickle_carrying_zip_is_refused_without_the_flag(tmp_path, monkeypatch):
    """A zip whose card is in the format but whose policy.pth carries a pickled call is refused, and
    the call does not run; SB3's own 'data' member (pickles) is never read."""
    marker = tmp_path / "pwned"
    monkeypatch.setenv("AGENT_PAYLOAD_DIR", str(marker))
    src = agents.agent_dir() / "ppo_admission.zip"
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.namelist():
            if item == "policy.pth":
                blob = __import__("io").BytesIO()
                torch.save({"w": _Payload()}, blob)
                zout.writestr(item, blob.getvalue())
            else:
                zout.writestr(item, zin.read(item))
    from mooncake_gym.agents.agentfile import sha256_of

    card = {**agents.card("ppo_admission"), "sha256": sha256_of(bad)}
    bad.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(AgentFormatError, match="policy.pth is not a plain tensor state dict"):
        agents.load_agent(bad)
    with pytest.raises(AgentFormatError):
        agents.load_agent(bad, trusted=True)  # a card in the format is always loaded weights-only
    assert not marker.exists()
    # a zip with valid weights but garbage where SB3 keeps its pickles loads: 'data' is not read
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(good, "w") as zout:
        for item in zin.namelist():
            zout.writestr(item, b"not json, not a pickle" if item == "data" else zin.read(item))
    good.with_suffix(".json").write_text(json.dumps({**agents.card("ppo_admission"), "sha256": sha256_of(good)}))
    assert agents.load_agent(good).source == "weights"
    # no card: refused on the CLI in one line, unpickled with --unsafe-pickle
    shutil.copy(src, tmp_path / "nocard.zip")
    assert main(["compare", "--preset", "lecture", "--env", "admission", "--agent", str(tmp_path / "nocard.zip"),
                 "--seeds", "1", "--json"]) == 2


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(policy="CnnPolicy"), "policy 'CnnPolicy' is not allowed for PPO"),
    (lambda c: c["architecture"].update(activation_fn="Evil"), "activation_fn 'Evil' is not one of"),
    (lambda c: c["architecture"].update(features_extractor_class="os.system"), "architecture key 'features_extractor_class'"),
    (lambda c: c["architecture"].update(net_arch=[64, 32]), "weights in .* do not fit the card's architecture"),
    (lambda c: c.update(algorithm="TRPO"), "algorithm 'TRPO' is not one of"),
    (lambda c: c.update(wrappers=[{"class": "subprocess.Popen", "kwargs": {}}]), "subprocess.Popen is not a gymnasium.Wrapper"),
    (lambda c: c.update(wrappers=[{"class": "some_unimported_module.W", "kwargs": {}}]), "not imported; importing a module"),
    (lambda c: c.update(wrappers=[{"class": "stable_baselines3.common.monitor.Monitor", "kwargs": {"filename": "/x"}}]),
     "Monitor is not an observation wrapper"),

    # sizes from the card are bounded before anything is built or read (mooncake_gym.model.limits)
    (lambda c: c["architecture"].update(net_arch=[65536] * 8), "up to 60,132,229,123 parameters, more than 16,000,000"),
    (lambda c: c["observation_space"].update(shape=[10**9], low=[0.0], high=[1.0]), "1000000000 entries, more than"),
    (lambda c: c["observation_space"].update(low=c["observation_space"]["low"][:-1]), "low must list"),
    (lambda c: c["action_space"].update(n=10**12), "n must be an integer in 1..65536"),
    (lambda c: c["action_space"].update(n=True), "n must be an integer"),
    (lambda c: c["action_space"].update(start=5), r"start must be 0 \(SB3's policies act on 0..n-1\), got 5"),
    # every field the loader reads has its type: a clear error, never a traceback
    (lambda c: c.update(env_id=5), "env_id must be a JSON str, got int"),
    (lambda c: c.update(algorithm=["PPO"]), "algorithm must be a JSON str, got list"),
    (lambda c: c.update(architecture=[64]), "architecture must be a JSON dict, got list"),
    (lambda c: c.update(observation_space="Box"), "observation_space must be a JSON dict"),
    (lambda c: c.update(obs_normalization={"mean": [[1.0], [2.0, 3.0]], "var": [1.0], "clip_obs": 10.0,
                                           "epsilon": 1e-8}), "mean and var must be lists of at most"),
])
def test_bad_cards_are_clear_errors(tmp_path, change, message):
    path = tmp_path / "a.zip"
    shutil.copy(agents.agent_dir() / "ppo_admission.zip", path)
    card = agents.card("ppo_admission")
    change(card)
    path.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(AgentFormatError, match=message):
        agent = agents.load_agent(path)
        evaluate(ADMISSION_ENV_ID, agent, [0], load=2.0, episode_requests=50)


def test_a_policy_member_larger_than_its_card_allows_is_refused_before_it_is_inflated(tmp_path):
    """A zip bomb in place of policy.pth (40 MB of zeros, 40 kB compressed, with a header that tells
    the truth) is refused by the card's bound, 4 bytes a parameter plus 1 MiB; it is streamed in 1 MiB
    chunks, so a header that lies about the size is refused the same way."""
    from mooncake_gym.agents.agentfile import sha256_of

    src = agents.agent_dir() / "ppo_admission.zip"
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.namelist():
            zout.writestr(item, bytes(40 << 20) if item == "policy.pth" else zin.read(item))
    assert bomb.stat().st_size < 1 << 20
    bomb.with_suffix(".json").write_text(json.dumps({**agents.card("ppo_admission"), "sha256": sha256_of(bomb)}))
    with pytest.raises(AgentFormatError, match=r"policy.pth is larger than the 1,088,780 bytes its card's architecture"):
        agents.load_agent(bomb)


def test_the_parameter_bound_is_the_network_size_of_the_shipped_agents():
    from mooncake_gym.agents.agentfile import _architecture_kwargs, parameter_bound, space_from_json

    for name in agents.SHIPPED:
        card, agent = agents.card(name), agents.load_agent(name)
        bound = parameter_bound(card["algorithm"], space_from_json(card["observation_space"], "o"),
                                space_from_json(card["action_space"], "a"), _architecture_kwargs(card["architecture"]))
        assert bound == sum(p.numel() for p in agent.policy.parameters())


def test_mismatch_says_what_differs():
    agent = agents.load_agent("ppo_routing")
    with pytest.raises(ValueError, match=r"Box\(42,\), but mooncake_gym/PrefillRouting-v0 has Box\(22,\).*"
                                         r"Discrete\(16\), but .* has Discrete\(8\).*trained with env_kwargs"):
        evaluate(ROUTING_ENV_ID, agent, [0], n_instances=4, episode_requests=10)
    with pytest.raises(ValueError, match="trained on env mooncake_gym/PrefillRouting-v0, not mooncake_gym/OverloadAdmission-v0"):
        evaluate(ADMISSION_ENV_ID, agent, [0], episode_requests=10)


def test_evaluate_restores_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        evaluate(ADMISSION_ENV_ID, agents.load_agent("ppo_admission"), [0], load=2.0, episode_requests=20)
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="threads: expected an integer >= 1"):
            evaluate(ADMISSION_ENV_ID, agents.load_agent("ppo_admission"), [0], threads=0, load=2.0, episode_requests=20)
    finally:
        torch.set_num_threads(before)


def test_env_kwargs_parsing():
    assert parse_env_kwargs("rate=8,rate_range=[2, 12],reward=slo,allow_pull=false") == {
        "rate": 8, "rate_range": [2, 12], "reward": "slo", "allow_pull": False}
    assert parse_env_kwargs('{"n_instances": 4}') == {"n_instances": 4}
    with pytest.raises(ValueError, match="--env-kwargs: expected key=value"):
        parse_env_kwargs("rate")


def test_progress_bar_without_rich_is_tqdm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    assert type(progress_callback()).__name__ == "TqdmCallback"


def test_contrib_algorithms_without_sb3_contrib_are_one_line_errors(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)  # import sb3_contrib now raises ImportError
    for algo in ("recurrentppo", "maskableppo"):
        assert main(["train", "--env", "routing", "--algo", algo, "--timesteps", "64", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "pip install 'mooncake-gym[contrib]'" in err


def test_train_cli_options_make_a_loadable_agent(tmp_path, capsys):
    """--algo, --env-kwargs, --n-envs, --vecnormalize and --wrapper end up in the card and the agent."""
    out = tmp_path / "run"
    code = main(["train", "--env", "routing", "--algo", "a2c", "--timesteps", "64", "--out", str(out), "--no-progress",
                 "--no-evaluate", "--env-kwargs", "n_instances=4,rate=3,episode_requests=60", "--n-envs", "2", "--vecnormalize",
                 "--wrapper", f"{__name__}.MinusBest:scale=0.5"])
    assert code == 0, capsys.readouterr().err
    card = json.loads((out / "a2c_routing.json").read_text())
    assert card["algorithm"] == "A2C" and card["n_envs"] == 2
    assert card["env_kwargs"] == {"n_instances": 4, "rate": 3, "episode_requests": 60}  # rate replaced rate_range
    assert card["wrappers"] == [{"class": f"{__name__}.MinusBest", "kwargs": {"scale": 0.5}}]
    assert len(card["obs_normalization"]["mean"]) == 30 and "evaluation" not in card
    agent = agents.load_agent(out / "a2c_routing.zip")
    (episode,) = evaluate(ROUTING_ENV_ID, agent, [5], **SMALL)
    assert episode["steps"] == 60


@pytest.mark.filterwarnings("ignore:Training and eval env are not of the same type")  # eval runs in-process
def test_subprocess_and_in_process_envs_train_the_same_agent(tmp_path):
    kw = dict(timesteps=128, seed=2, progress_bar=False, evaluate_card=False, n_envs=2,
              env_kwargs={"n_instances": 4, "episode_requests": 40}, overrides={"n_steps": 64, "batch_size": 64})
    a = train("routing", out=tmp_path / "d", vec_env="dummy", **kw)
    b = train("routing", out=tmp_path / "s", vec_env="subproc", **kw)
    wa, wb = (torch.load(__import__("io").BytesIO(zipfile.ZipFile(p).read("policy.pth")), weights_only=True) for p in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_tutorial_train_command_runs(tmp_path):
    """Tutorial part 4's command line (fewer steps), through the installed console script."""
    script = Path(sys.executable).with_name("mooncake-gym")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "mooncake_gym.cli"]
    proc = subprocess.run([*cmd, "train", "--env", "routing", "--timesteps", "512", "--out", str(tmp_path / "tutorial")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"best model: {tmp_path / 'tutorial' / 'ppo_routing.zip'}" in proc.stdout
    assert agents.load_agent(tmp_path / "tutorial" / "ppo_routing.zip").source == "weights"


@needs_contrib
@pytest.mark.parametrize("algo, wrappers", [("recurrentppo", ()), ("maskableppo", (NoPullMasks,))])
def test_train_contrib_algorithms(tmp_path, algo, wrappers):
    """train() runs sb3-contrib's algorithms with their evaluation callback and writes loadable agents."""
    path = train("routing", algo=algo, timesteps=128, seed=1, out=tmp_path, progress_bar=False, evaluate_card=False,
                 n_envs=1, wrappers=wrappers, env_kwargs={"n_instances": 4, "rate": 3.0, "episode_requests": 40},
                 overrides={"n_steps": 64, "batch_size": 64, "eval_freq": 64, "n_eval_episodes": 1})
    card = json.loads(path.with_suffix(".json").read_text())
    assert path.name == f"{algo}_routing.zip" and card["best_eval_timestep"] in (64, 128)
    agent = agents.load_agent(path)
    assert (agent.recurrent, agent.maskable) == (algo == "recurrentppo", algo == "maskableppo")
    (episode,) = evaluate(ROUTING_ENV_ID, agent, [5], **SMALL)
    assert episode["steps"] == 60 and (algo != "maskableppo" or episode["fetched_tokens"] == 0)


def test_wrapper_mismatch_says_what_differs():
    from mooncake_gym.agents.agentfile import as_agent
    from mooncake_gym.evaluation.episodes import run_episode

    policy = agents.load_agent("ppo_routing").policy
    agent = as_agent(policy, ROUTING_ENV_ID, wrappers=[NoPullMasks, MinusBest])
    env = MinusBest(gym.make(ROUTING_ENV_ID, episode_requests=10))
    with pytest.raises(ValueError, match=rf"trained behind wrappers \['{__name__}.NoPullMasks', '{__name__}.MinusBest'\] "
                                         rf"\(innermost first\), but the env has \['{__name__}.MinusBest'\] of them"):
        run_episode(env, agent, seed=0)


def test_an_agents_wrappers_are_built_before_any_episode(tmp_path, capsys):
    """A card whose wrapper refuses its arguments is a one-line error of compare before the
    baselines run (check_wrappers builds them once on the agent's own env)."""
    from mooncake_gym.agents.agentfile import sha256_of

    path = tmp_path / "a.zip"
    shutil.copy(agents.agent_dir() / "ppo_admission_v1.zip", path)
    card = agents.card("ppo_admission_v1")
    card["wrappers"] = [{**card["wrappers"][0], "kwargs": {"growth": "yes"}}]
    path.with_suffix(".json").write_text(json.dumps({**card, "sha256": sha256_of(path)}))
    agent = agents.load_agent(path)
    with pytest.raises(AgentFormatError, match="its wrappers do not build on mooncake_gym/OverloadAdmission-v1: "
                                               "growth: expected True or False"):
        agent.check_wrappers()
    assert main(["compare", "--preset", "lecture", "--env", "admission", "--agent", str(path), "--seeds", "1", "--json"]) == 2
    assert "growth: expected True or False" in capsys.readouterr().err
    agents.load_agent("ppo_admission_v1").check_wrappers()  # the shipped card's build


def _has_ray() -> bool:
    from mooncake_gym.agents.rllib_checkpoint import require_ray

    try:
        require_ray()
        return True
    except ValueError:
        return False


@pytest.mark.skipif(_has_ray(), reason="the error without the ray extra (tests/test_ray.py evaluates a checkpoint)")
@pytest.mark.parametrize("command", ["compare", "lab grade"])
def test_an_rllib_checkpoint_without_ray_is_one_line_naming_the_option_and_the_extra(command, tmp_path, capsys):
    from mooncake_gym.course import lab

    (tmp_path / "rllib_checkpoint.json").write_text("{}")  # what marks a checkpoint folder; nothing else is read
    argv = ["--agent", str(tmp_path), "--unsafe-pickle", "--seeds", "1"]
    if command == "compare":
        assert main(["compare", "--preset", "lecture", "--env", "routing", *argv]) == 2
    else:
        with pytest.raises(SystemExit) as refused:
            lab.main(["grade", "--env", "routing", *argv])
        assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--agent: {tmp_path} is an RLlib checkpoint: Ray RLlib and Tune are not installed; " \
           "pip install 'mooncake-gym[ray]'" in err
    with pytest.raises(ValueError, match=f"^agent: {tmp_path} is an RLlib checkpoint: Ray RLlib"):
        agents.load_agent(tmp_path, trusted=True)  # the Python API (evaluate's agents) names its argument
