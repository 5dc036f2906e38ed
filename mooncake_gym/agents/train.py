"""Train an agent (stable-baselines3 PPO, A2C or DQN; sb3-contrib RecurrentPPO or MaskablePPO) on
any registered environment: ``routing`` and ``admission`` (the lecture's two, ``PrefillRouting-v0``
and ``OverloadAdmission-v0``), the v1 environments, ``Conductor-v1`` and every scenario id
(:func:`resolve_env`), its keyword arguments checked against the environment's own signature.

Hyperparameters come from ``mooncake_gym/agents/hyperparams.yml`` keyed by env id (the PPO recipe; ``a2c`` and
``dqn`` sub-entries for those); a scenario takes its base environment's entry without that entry's
workload (the scenario fixes its own). Training episodes of the recipes draw randomised workloads
(routing: session rates across idle-to-overloaded; admission: loads from 1x to 3x the decode
capacity; the v1 environments: loads across their saturation). An
evaluation callback runs on held-out seeds and keeps the best model; :func:`train` writes it in the
agent format of :mod:`mooncake_gym.agents.agentfile` (zip + JSON card: env id and kwargs,
algorithm and architecture, VecNormalize statistics and wrappers, seed, timesteps, wall time,
library versions, evaluation results, sha256).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import platform
import shutil
import time
from importlib import resources
from pathlib import Path

import yaml

from mooncake_gym._files import write_atomic
from mooncake_gym.agents import load_agent
from mooncake_gym.agents.agentfile import (ALGO_NAMES, algorithm_class, apply_wrappers, format_card, ObsNormalizer,
                                           POLICIES, sha256_of, wrapper_spec)
from mooncake_gym.baselines import POLICIES as BASELINES, make_policy
from mooncake_gym.envs import ADMISSION_ENV_ID, ROUTING_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate


ENV_IDS = {"routing": ROUTING_ENV_ID, "admission": ADMISSION_ENV_ID}
#: Seeds of the evaluation callback (held out: training envs are seeded from the training seed).
EVAL_SEED_BASE = 10_000
#: Hyperparameter keys that describe the run, not the algorithm (shared by every algorithm).
RUN_KEYS = ("n_timesteps", "n_envs", "policy", "env_kwargs", "eval_env_kwargs", "eval_freq", "n_eval_episodes",
            "normalize_reward")
#: A vectorised env runs its envs in subprocesses when one step takes at least this long: below it
#: the pipes cost more than they save (measured on a 2-core machine: 4 routing envs took 0.14 ms
#: per env step in one process and 0.40 ms in subprocesses, at 0.1 ms per plain step).
SUBPROC_MIN_STEP_S = 1e-3


#: The prefix of the package's env ids (``--env Conductor-v1`` is ``mooncake_gym/Conductor-v1``).
ENV_NAMESPACE = "mooncake_gym/"


def registered_env_ids() -> list[str]:
    """Every env id the package registers: the v0 and v1 environments, Conductor-v1, the scenarios."""
    import gymnasium as gym

    import mooncake_gym  # noqa: F401  (registers the env ids)

    return sorted(i for i in gym.registry if i.startswith(ENV_NAMESPACE))


def resolve_env(env: str) -> tuple[str, str]:
    """``(env id, short name)`` of ``--env``: ``routing`` / ``admission`` (the v0 environments) or a
    registered id, with or without ``mooncake_gym/`` (``Conductor-v1``, ``routing-saturated-v1``)."""
    if env in ENV_IDS:
        return ENV_IDS[env], env
    full = env if env.startswith(ENV_NAMESPACE) else ENV_NAMESPACE + env
    ids = registered_env_ids()
    if full not in ids:
        names = [*ENV_IDS, *(i[len(ENV_NAMESPACE):] for i in ids)]
        raise ValueError(f"--env: expected one of {', '.join(names)}, got {env!r}")
    return full, full[len(ENV_NAMESPACE):]


def env_parameters(env_id: str) -> list[str]:
    """The keyword arguments the environment of ``env_id`` takes (its class's ``__init__``)."""
    import inspect

    import gymnasium as gym

    cls = gym.spec(env_id).entry_point
    if isinstance(cls, str):
        module, _, name = cls.partition(":")
        cls = getattr(importlib.import_module(module), name)
    return [n for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_env_kwargs(env_id: str, kwargs: dict) -> None:
    """``ValueError`` of one line naming an argument ``env_id``'s environment does not take (and
    listing those it takes), or a scenario's argument that must be given."""
    accepted = env_parameters(env_id)
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise ValueError(f"--env-kwargs: {env_id} takes no {unknown[0]!r}; it accepts {', '.join(accepted)}")
    scenario = _scenario(env_id)
    if scenario is not None:
        missing = scenario.missing(**kwargs)
        if missing:
            raise ValueError(f"--env-kwargs: {env_id} needs {', '.join(f'{m}=...' for m in missing)} "
                             f"(scenario {scenario.name} has no default)")


def _problem_of(env_id: str):
    """The problem (``mooncake_gym.evaluation.problems``) of ``env_id``'s environment, or None."""
    from mooncake_gym.evaluation.problems import PROBLEMS

    scenario = _scenario(env_id)
    base = scenario.base_env_id if scenario is not None else env_id
    return next((p for p in PROBLEMS.values() if base in p.env_ids), None)


def _scenario(env_id: str):
    from mooncake_gym.evaluation.scenarios import SCENARIOS

    return next((s for s in SCENARIOS.values() if s.env_id == env_id), None)


def load_hyperparams(env_id: str, algo: str = "ppo") -> dict:
    """The ``mooncake_gym/agents/hyperparams.yml`` entry of ``env_id`` for ``algo`` (ppo, a2c, dqn, recurrentppo,
    maskableppo): the run's settings plus that algorithm's hyperparameters. A scenario's id takes the
    entry of its base environment without its workload (``env_kwargs``, ``eval_env_kwargs``): the
    scenario's registered arguments are the workload."""
    text = resources.files("mooncake_gym.agents").joinpath("hyperparams.yml").read_text()
    table = yaml.safe_load(text)
    scenario = _scenario(env_id) if env_id not in table else None
    if scenario is not None and scenario.base_env_id in table:
        entry = {k: v for k, v in table[scenario.base_env_id].items() if k not in ("env_kwargs", "eval_env_kwargs")}
    elif env_id in table:
        entry = dict(table[env_id])
    else:
        raise ValueError(f"env: no hyperparameters for {env_id!r} in mooncake_gym/agents/hyperparams.yml")
    subs = {k: entry.pop(k) for k in ("a2c", "dqn") if k in entry}
    algo = algo.lower()
    if algo not in ALGO_NAMES:
        raise ValueError(f"algo: expected one of {sorted(ALGO_NAMES)}, got {algo!r}")
    if algo in subs:
        entry = {**{k: v for k, v in entry.items() if k in RUN_KEYS}, **subs[algo]}
    elif algo in ("a2c", "dqn"):
        raise ValueError(f"algo: no {algo} sub-entry for {env_id!r} in mooncake_gym/agents/hyperparams.yml")
    entry["policy"] = POLICIES[ALGO_NAMES[algo]]
    return entry


def parse_env_kwargs(text: str | None) -> dict:
    """``--env-kwargs``: a JSON object, or ``key=value,key=value`` with each value read as JSON when
    it parses (numbers, booleans, lists such as ``rate_range=[2,12]``) and as a string otherwise."""
    if text is None or not text.strip():
        return {}
    text = text.strip()
    if text.startswith("{"):
        value = _json_or_text(text)
        if not isinstance(value, dict):
            raise ValueError(f"--env-kwargs: expected a JSON object or key=value,..., got {text!r}")
        return value
    out, depth, part = {}, 0, ""
    for ch in text + ",":
        depth += 1 if ch in "[{" else -1 if ch in "]}" else 0
        if ch == "," and depth == 0:
            key, sep, raw = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--env-kwargs: expected key=value, got {part.strip()!r}")
            out[key.strip()] = _json_or_text(raw)
            part = ""
        else:
            part += ch
    return out


def _json_or_text(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw.strip()


def merge_env_kwargs(recipe: dict, user: dict) -> dict:
    """The recipe's env kwargs with the user's on top; a fixed value replaces the recipe's range
    (``rate=8`` drops ``rate_range``) and a range the fixed value."""
    out = dict(recipe)
    for key in user:
        out.pop(key[: -len("_range")] if key.endswith("_range") else f"{key}_range", None)
    out.update(user)
    return out


def library_versions() -> dict:
    import gymnasium
    import numpy
    import stable_baselines3
    import torch

    import mooncake_gym

    versions = {"python": platform.python_version(), "mooncake_gym": mooncake_gym.__version__,
                "gymnasium": gymnasium.__version__, "stable_baselines3": stable_baselines3.__version__,
                "torch": torch.__version__, "numpy": numpy.__version__}
    if importlib.util.find_spec("sb3_contrib") is not None:
        import sb3_contrib

        versions["sb3_contrib"] = sb3_contrib.__version__
    return versions


def _seeded_eval_callback(eval_env, seed: int, maskable: bool = False, **kwargs):
    """SB3's EvalCallback (sb3-contrib's MaskableEvalCallback for maskable agents), but every
    evaluation replays the same held-out episodes (the eval env is reseeded before each one), so
    "best model" compares models on equal workloads. ``best_obs_rms`` keeps the observation
    statistics the best model was evaluated with (VecNormalize)."""
    if maskable:
        from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback as base
    else:
        from stable_baselines3.common.callbacks import EvalCallback as base

    class SeededEvalCallback(base):
        best_obs_rms = None

        def _on_step(self) -> bool:
            best = self.best_mean_reward
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_env.seed(seed)
            keep = super()._on_step()
            if self.best_mean_reward > best and hasattr(self.eval_env, "obs_rms"):
                self.best_obs_rms = copy.deepcopy(self.eval_env.obs_rms)
            return keep

    return SeededEvalCallback(eval_env, **kwargs)


def progress_callback():
    """A progress bar that needs only installed packages: SB3's (tqdm + rich) if rich is there,
    else a plain tqdm bar, else none."""
    if importlib.util.find_spec("rich") is not None and importlib.util.find_spec("tqdm") is not None:
        from stable_baselines3.common.callbacks import ProgressBarCallback

        return ProgressBarCallback()
    if importlib.util.find_spec("tqdm") is None:
        return None
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm import tqdm

    class TqdmCallback(BaseCallback):
        def _on_training_start(self) -> None:
            self.bar = tqdm(total=self.locals["total_timesteps"] - self.model.num_timesteps, unit="step", desc="train")

        def _on_step(self) -> bool:
            self.bar.update(self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    return TqdmCallback()


def _step_seconds(env_id: str, env_kwargs: dict, steps: int = 200) -> float:
    """Mean wall time of one step of ``env_id`` under random actions (for choosing a vec env)."""
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        start = time.perf_counter()
        for _ in range(steps):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
        return (time.perf_counter() - start) / steps
    finally:
        env.close()


def vec_env_class(vec_env: str, n_envs: int, env_id: str, env_kwargs: dict):
    """``DummyVecEnv`` or ``SubprocVecEnv``: ``auto`` takes subprocesses only when there are several
    envs and cores and one step takes at least :data:`SUBPROC_MIN_STEP_S` (results are the same)."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if vec_env not in ("auto", "dummy", "subproc"):
        raise ValueError(f"vec_env: expected auto, dummy or subproc, got {vec_env!r}")
    if vec_env == "auto":
        pays = n_envs > 1 and (os.cpu_count() or 1) > 1 and _step_seconds(env_id, env_kwargs) >= SUBPROC_MIN_STEP_S
        vec_env = "subproc" if pays else "dummy"
    return SubprocVecEnv if vec_env == "subproc" else DummyVecEnv


def train(env: str, timesteps: int | None = None, seed: int = 0, out: str | os.PathLike = "runs/train",
          tensorboard: str | None = None, progress_bar: bool = True, threads: int = 1,
          verbose: int = 0, evaluate_card: bool = True, overrides: dict | None = None, algo: str = "ppo",
          env_kwargs: dict | None = None, n_envs: int | None = None, vecnormalize: bool = False,
          wrappers=(), vec_env: str = "auto") -> Path:
    """Train ``algo`` on ``env`` ('routing', 'admission' or a registered id: :func:`resolve_env`);
    returns the path of the best model's zip (``<algo>_<env>.zip``, e.g. ``ppo_routing.zip``,
    ``ppo_Conductor-v1.zip``) beside its card (``.json``).

    ``overrides`` replaces entries of the ``hyperparams.yml`` entry (for experiments; the card records
    the values used); ``env_kwargs`` goes on top of the recipe's training workload (see
    :func:`merge_env_kwargs`) and of the evaluation callback's; ``n_envs`` replaces the recipe's
    number of parallel envs; ``vecnormalize`` normalises observations with ``VecNormalize`` (its
    statistics go into the card); ``wrappers`` are observation wrappers (classes or
    ``(class, kwargs)``) put around every env, recorded in the card by import path.
    """
    import gymnasium as gym
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import mooncake_gym  # noqa: F401  (registers the env ids)

    env_id, env = resolve_env(env)
    if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("tensorboard: logging to TensorBoard needs the tensorboard package: "
                         "pip install 'mooncake-gym[tensorboard]'")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {threads!r}")
    if n_envs is not None and (not isinstance(n_envs, int) or isinstance(n_envs, bool) or not 1 <= n_envs <= 256):
        raise ValueError(f"n_envs: expected an integer in 1..256, got {n_envs!r}")
    algo_cls = algorithm_class(algo)   # a one-line error naming the extra if sb3-contrib is missing
    algo_name = ALGO_NAMES[algo.lower()]
    specs = [wrapper_spec(w) for w in wrappers]
    hp = {**load_hyperparams(env_id, algo), **(overrides or {})}
    total = int(timesteps if timesteps is not None else hp.pop("n_timesteps"))
    hp.pop("n_timesteps", None)
    if total < 1:
        raise ValueError(f"timesteps: expected >= 1, got {total}")
    out = Path(out)
    user_kwargs = dict(env_kwargs or {})
    check_env_kwargs(env_id, user_kwargs)
    env_kwargs = merge_env_kwargs(hp.pop("env_kwargs", {}), user_kwargs)
    # the evaluation episodes share the training env's settings (reward, penalties, sizes) except the
    # randomised workload, which eval_env_kwargs fixes: "best model" is judged by the trained reward
    eval_kwargs = {**{k: v for k, v in env_kwargs.items() if not k.endswith("_range")}, **hp.pop("eval_env_kwargs", {}),
                   **{k: v for k, v in user_kwargs.items() if not k.endswith("_range")}}
    try:
        probe = apply_wrappers(gym.make(env_id, **env_kwargs), specs, trusted=True)  # the caller named them
    except TypeError as e:
        raise ValueError(f"--env-kwargs: {env_id} does not take them: {e}") from None
    maskable = algo_name == "MaskablePPO"
    try:
        if maskable:
            try:
                probe.get_wrapper_attr("action_masks")
            except AttributeError:
                raise ValueError(f"algo: MaskablePPO needs action masks, and {env_id} (with its wrappers) has no "
                                 "action_masks() method") from None
    finally:
        probe.close()
    n_envs = n_envs if n_envs is not None else hp.pop("n_envs", 1)
    hp.pop("n_envs", None)
    eval_freq = max(1, hp.pop("eval_freq", 10_000) // n_envs)
    n_eval = hp.pop("n_eval_episodes", 3)
    policy = hp.pop("policy", POLICIES[algo_name])
    normalize_reward = hp.pop("normalize_reward", False)
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)

    wrap = (lambda e: apply_wrappers(e, specs, trusted=True)) if specs else None
    # make_vec_env asks for render_mode="rgb_array" unless told otherwise; training needs no pictures
    # "module:id" makes subprocess workers import the package that registers the id
    venv = make_vec_env(f"mooncake_gym:{env_id}", n_envs=n_envs, seed=seed, env_kwargs={"render_mode": None, **env_kwargs},
                        wrapper_class=wrap, vec_env_cls=vec_env_class(vec_env, n_envs, env_id, env_kwargs))
    eval_env = DummyVecEnv([lambda: Monitor(apply_wrappers(gym.make(env_id, **eval_kwargs), specs, trusted=True))])
    if normalize_reward or vecnormalize:
        # normalize_reward scales rewards by a running estimate of the return's spread; vecnormalize
        # standardises observations (the statistics go into the card and are applied when acting)
        venv = VecNormalize(venv, norm_obs=vecnormalize, norm_reward=normalize_reward, gamma=hp.get("gamma", 0.99))
        eval_env = VecNormalize(eval_env, training=False, norm_obs=vecnormalize, norm_reward=False)
    callback = _seeded_eval_callback(eval_env, EVAL_SEED_BASE + seed, maskable=maskable, n_eval_episodes=n_eval,
                                     eval_freq=eval_freq, best_model_save_path=str(out), log_path=str(out),
                                     deterministic=True, verbose=verbose)
    callbacks = [callback]
    bar = progress_callback() if progress_bar else None
    if bar is not None:
        callbacks.append(bar)
    try:
        model = algo_cls(policy, venv, seed=seed, tensorboard_log=tensorboard, verbose=verbose, device="cpu",
                          **copy.deepcopy(hp))  # A2C adds classes to policy_kwargs in place
    except TypeError as e:
        raise ValueError(f"hyperparameters: {algo_name} does not take them: {e}") from None
    start = time.time()
    try:
        model.learn(total_timesteps=total, callback=callbacks)
    finally:
        venv.close()
    wall = time.time() - start
    best = out / "best_model.zip"
    obs_rms = callback.best_obs_rms
    if not best.exists():  # no evaluation happened (very short runs): keep the final model
        model.save(best)
        obs_rms = getattr(model.get_vec_normalize_env(), "obs_rms", None)
    normalizer = None
    if vecnormalize:
        vn = model.get_vec_normalize_env()
        normalizer = ObsNormalizer(obs_rms.mean, obs_rms.var, vn.clip_obs, vn.epsilon)
    final = out / f"{algo.lower()}_{env}.zip"
    shutil.copyfile(best, final)
    card = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "eval_env_kwargs": eval_kwargs,
        "algorithm": algo_name,
        "policy": policy,
        "hyperparameters": hp,
        "n_envs": n_envs,
        "seed": seed,
        "timesteps": total,
        "timesteps_run": int(model.num_timesteps),  # whole rollouts: may exceed the request
        "wall_time_s": round(wall, 1),
        "threads": threads,
        "best_eval_mean_reward": float(callback.best_mean_reward),
        "best_eval_timestep": _best_eval_timestep(out),
        "versions": library_versions(),
        **format_card(model, env_id, specs, normalizer, algo_name),
        "sha256": sha256_of(final),
    }
    card_file = final.with_suffix(".json")
    write_atomic(card_file, json.dumps(card, indent=2) + "\n")
    if evaluate_card:
        card["evaluation"] = card_evaluation(env, load_agent(final), env_kwargs, algo.lower(), eval_kwargs)
        write_atomic(card_file, json.dumps(card, indent=2) + "\n")
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


def card_evaluation(env: str, model, env_kwargs: dict | None = None, name: str = "ppo",
                    eval_kwargs: dict | None = None) -> list[dict]:
    """The agent (row key ``name``) next to the strongest baselines on held-out seeds: means over
    ``CARD_SEEDS`` on the ``CARD_SETTINGS`` workloads, with the other settings of ``env_kwargs``
    (cluster size, reward...) as the agent was trained. Another environment than the lecture's two
    (:func:`resolve_env`'s short name): one row on its evaluation workload ``eval_kwargs``, the
    agent and its problem's strongest baselines (``CARD_BASELINES`` of the decision) by the
    problem's main metric and the episode return."""
    import numpy as np

    if env not in CARD_SETTINGS:
        env_id = resolve_env(env)[0]
        problem = _problem_of(env_id)
        metrics = ("return",) if problem is None else (problem.metric, "return")
        baselines = {} if problem is None else {
            who: problem.policy(who) for who in CARD_BASELINES[problem.decision] if who in BASELINES[problem.baselines]}
        kwargs = dict(eval_kwargs or {})
        row = {"env_kwargs": kwargs, "seeds": list(CARD_SEEDS)}
        for who, policy in {name: model, **baselines}.items():
            episodes = evaluate(env_id, policy, CARD_SEEDS, **kwargs)
            row[who] = {m: float(np.mean([e[m] for e in episodes])) for m in metrics}
        return [row]

    workload = ("rate", "load", "episode_requests", "trace", "base_trace", "speed")
    base = {k: v for k, v in (env_kwargs or {}).items() if k not in workload and not k.endswith("_range")}
    rows = []
    for setting in CARD_SETTINGS[env]:
        kwargs = {**base, **setting}
        row = {"env_kwargs": kwargs, "seeds": list(CARD_SEEDS)}
        for who in (name, *CARD_BASELINES[env]):
            policy = model if who == name else make_policy(env, who)
            episodes = evaluate(ENV_IDS[env], policy, CARD_SEEDS, **kwargs)
            row[who] = {m: float(np.mean([e[m] for e in episodes])) for m in CARD_METRICS[env]}
        rows.append(row)
    return rows
