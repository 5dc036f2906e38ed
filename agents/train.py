"""Train a PPO agent (stable-baselines3, MlpPolicy) on one of the two environments.

Hyperparameters come from ``agents/hyperparams.yml`` keyed by env id. Training episodes draw
randomised workloads (routing: session rates across idle-to-overloaded; admission: loads from 1x
to 3x the decode capacity). An evaluation callback runs on held-out seeds and keeps the best
model; :func:`train` writes it with a JSON card (env id and kwargs, seed, timesteps, wall time,
library versions, evaluation results, sha256).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import time
from importlib import resources
from pathlib import Path

import yaml

from mooncake_gym.envs import ADMISSION_ENV_ID, ROUTING_ENV_ID

ENV_IDS = {"routing": ROUTING_ENV_ID, "admission": ADMISSION_ENV_ID}
#: Seeds of the evaluation callback (held out: training envs are seeded from the training seed).
EVAL_SEED_BASE = 10_000


def load_hyperparams(env_id: str) -> dict:
    """The ``agents/hyperparams.yml`` entry of ``env_id``."""
    text = resources.files("mooncake_gym.agents").joinpath("hyperparams.yml").read_text()
    table = yaml.safe_load(text)
    if env_id not in table:
        raise ValueError(f"env: no hyperparameters for {env_id!r} in agents/hyperparams.yml")
    return dict(table[env_id])


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def library_versions() -> dict:
    import gymnasium
    import numpy
    import stable_baselines3
    import torch

    import mooncake_gym

    return {"python": platform.python_version(), "mooncake_gym": mooncake_gym.__version__,
            "gymnasium": gymnasium.__version__, "stable_baselines3": stable_baselines3.__version__,
            "torch": torch.__version__, "numpy": numpy.__version__}


def _seeded_eval_callback(eval_env, seed: int, **kwargs):
    """SB3's EvalCallback, but every evaluation replays the same held-out episodes (the eval env is
    reseeded before each one), so "best model" compares models on equal workloads."""
    from stable_baselines3.common.callbacks import EvalCallback

    class SeededEvalCallback(EvalCallback):
        def _on_step(self) -> bool:
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_env.seed(seed)
            return super()._on_step()

    return SeededEvalCallback(eval_env, **kwargs)


def train(env: str, timesteps: int | None = None, seed: int = 0, out: str | os.PathLike = "runs/train",
          tensorboard: str | None = None, progress_bar: bool = True, threads: int = 1,
          verbose: int = 0, evaluate_card: bool = True, overrides: dict | None = None) -> Path:
    """Train PPO on ``env`` ('routing' or 'admission'); returns the path of the best model's zip.

    The card ``<zip>.json`` beside it records how it was made. ``overrides`` replaces entries of
    the ``hyperparams.yml`` entry (for experiments; the card records the values used).
    """
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import mooncake_gym  # noqa: F401  (registers the env ids)

    if env not in ENV_IDS:
        raise ValueError(f"env: expected one of {sorted(ENV_IDS)}, got {env!r}")
    if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("tensorboard: logging to TensorBoard needs the tensorboard package: "
                         "pip install 'mooncake-gym[tensorboard]'")
    env_id = ENV_IDS[env]
    hp = {**load_hyperparams(env_id), **(overrides or {})}
    total = int(timesteps if timesteps is not None else hp.pop("n_timesteps"))
    hp.pop("n_timesteps", None)
    if total < 1:
        raise ValueError(f"timesteps: expected >= 1, got {total}")
    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = hp.pop("env_kwargs", {})
    # the evaluation episodes share the training env's settings (reward, penalties, sizes) except the
    # randomised workload, which eval_env_kwargs fixes: "best model" is judged by the trained reward
    eval_kwargs = {**{k: v for k, v in env_kwargs.items() if not k.endswith("_range")}, **hp.pop("eval_env_kwargs", {})}
    n_envs = hp.pop("n_envs", 1)
    eval_freq = max(1, hp.pop("eval_freq", 10_000) // n_envs)
    n_eval = hp.pop("n_eval_episodes", 3)
    policy = hp.pop("policy", "MlpPolicy")
    normalize_reward = hp.pop("normalize_reward", False)

    # make_vec_env asks for render_mode="rgb_array" unless told otherwise; training needs no pictures
    venv = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs={"render_mode": None, **env_kwargs},
                        vec_env_cls=DummyVecEnv)
    eval_env = DummyVecEnv([lambda: Monitor(gym.make(env_id, **eval_kwargs))])
    if normalize_reward:
        # scale rewards by a running estimate of the return's spread (observations are already in
        # [0, 1] and stay raw, so the saved model needs no normalisation statistics to run)
        venv = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=hp.get("gamma", 0.99))
        eval_env = VecNormalize(eval_env, training=False, norm_obs=False, norm_reward=False)
    callback = _seeded_eval_callback(eval_env, EVAL_SEED_BASE + seed, n_eval_episodes=n_eval, eval_freq=eval_freq, best_model_save_path=str(out),
                            log_path=str(out), deterministic=True, verbose=verbose)
    model = PPO(policy, venv, seed=seed, tensorboard_log=tensorboard, verbose=verbose, **hp)
    start = time.time()
    model.learn(total_timesteps=total, callback=callback, progress_bar=progress_bar)
    wall = time.time() - start
    best = out / "best_model.zip"
    if not best.exists():  # no evaluation happened (very short runs): keep the final model
        model.save(best)
    final = out / f"ppo_{env}.zip"
    shutil.copyfile(best, final)
    card = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "eval_env_kwargs": eval_kwargs,
        "algorithm": "PPO",
        "policy": policy,
        "hyperparameters": hp,
        "seed": seed,
        "timesteps": total,
        "timesteps_run": int(model.num_timesteps),  # whole rollouts: may exceed the request
        "wall_time_s": round(wall, 1),
        "threads": threads,
        "best_eval_mean_reward": float(callback.best_mean_reward),
        "best_eval_timestep": _best_eval_timestep(out),
        "versions": library_versions(),
        "sha256": sha256_of(final),
    }
    if evaluate_card:
        card["evaluation"] = card_evaluation(env, PPO.load(final, device="cpu"))
    final.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    return final


def _best_eval_timestep(out: Path) -> int | None:
    """The timestep of the saved best model, from the evaluation callback's log."""
    import numpy as np

    log = out / "evaluations.npz"
    if not log.exists():
        return None
    with np.load(log) as d:
        return int(d["timesteps"][int(np.argmax(d["results"].mean(axis=1)))])


#: Held-out settings of the card's evaluation (seeds never used in training: see compare.py).
CARD_SEEDS = (2_000_000, 2_000_001, 2_000_002)
CARD_SETTINGS = {
    "routing": [{"rate": 4.0, "episode_requests": 1000}, {"rate": 8.0, "episode_requests": 1000}],
    "admission": [{"load": 2.0, "episode_requests": 2000}],
}
CARD_BASELINES = {"routing": ("cache", "kvcentric"), "admission": ("baseline", "early")}
CARD_METRICS = {"routing": ("mean_ttft_s", "slo_attainment", "hit_ratio"),
                "admission": ("completed", "goodput", "wasted_prefill_s")}


def card_evaluation(env: str, model) -> list[dict]:
    """The agent next to the strongest baselines on held-out seeds: means over ``CARD_SEEDS``."""
    import numpy as np

    from mooncake_gym.baselines import make_policy
    from mooncake_gym.evaluation import evaluate

    rows = []
    for kwargs in CARD_SETTINGS[env]:
        row = {"env_kwargs": kwargs, "seeds": list(CARD_SEEDS)}
        for name in ("ppo", *CARD_BASELINES[env]):
            policy = model if name == "ppo" else make_policy(env, name)
            episodes = evaluate(ENV_IDS[env], policy, CARD_SEEDS, **kwargs)
            row[name] = {m: float(np.mean([e[m] for e in episodes])) for m in CARD_METRICS[env]}
        rows.append(row)
    return rows
