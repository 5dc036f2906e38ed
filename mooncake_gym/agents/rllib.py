"""Ray RLlib glue: the environments on Ray's workers, the domain metrics, and PPO training.

Needs the ``ray`` extra (``pip install 'mooncake-gym[ray]'``; it brings gymnasium 1.2, so keep it
in its own venv: ``make test-ray``, ``docs/scale-out.md``).

- :func:`register_rllib_envs` registers both env ids (``mooncake_gym/PrefillRouting-v0``,
  ``mooncake_gym/OverloadAdmission-v0``) with RLlib's registry through creators that import
  :mod:`mooncake_gym` in the worker process before ``gym.make``. RLlib's env runners are fresh
  processes that never import the package, so the plain id alone fails there with
  ``NamespaceNotFound: Namespace mooncake_gym not found``; the creators (or the id form
  ``"mooncake_gym:mooncake_gym/PrefillRouting-v0"``, which makes gymnasium import the module first)
  avoid it. ``env_config`` is passed to ``gym.make`` as keyword arguments.
- :class:`DomainMetricsCallback` reads the simulator's end-of-episode metrics from the final step's
  ``info["metrics"]`` and logs them with the env runner's metrics logger (mean over the episodes of
  an iteration): routing ``mean_ttft_s`` and ``hit_ratio`` (hit share); admission ``completed``,
  ``goodput`` and ``wasted_prefill_s``. They appear in each training result under ``env_runners``.
- :func:`train_rllib` trains RLlib's PPO on a local Ray instance or on the cluster at ``address``
  with the hyperparameters of ``mooncake_gym/agents/hyperparams.yml`` translated to RLlib's names.

Its checkpoints are evaluated as agents by :mod:`mooncake_gym.agents.rllib_checkpoint`.
"""

from __future__ import annotations

import functools
import os

from mooncake_gym.agents.rllib_checkpoint import require_ray  # noqa: F401  (also this module's: tune and train use it)
from mooncake_gym.agents.train import ENV_IDS, load_hyperparams

#: The end-of-episode metrics the callback reports, per problem (of :data:`ENV_IDS`, the problems
#: trained by their command-line name and their env ids).
DOMAIN_METRICS = {"routing": ("mean_ttft_s", "hit_ratio"),
                  "admission": ("completed", "goodput", "wasted_prefill_s")}
#: RLlib PPO settings :func:`train_rllib` accepts in ``overrides`` (RLlib's names).
OVERRIDABLE = ("lr", "gamma", "lambda_", "entropy_coeff", "clip_param", "train_batch_size_per_learner",
               "minibatch_size", "num_epochs", "fcnet_hiddens")


def init_ray(address: str | None = None) -> None:
    """Connect to the Ray cluster at ``address``, or start a local Ray instance (once per process)."""
    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)


def make_env(env_id: str, env_config=None):
    """RLlib's env creator: ``gym.make(env_id, **env_config)`` after importing :mod:`mooncake_gym`
    in this (worker) process, which registers the ids."""
    import gymnasium as gym

    import mooncake_gym  # noqa: F401  (registers the env ids in the worker)

    return gym.make(env_id, **dict(env_config or {}))


def register_rllib_envs() -> None:
    """Register both env ids with RLlib (``ray.tune.registry.register_env``); call after ``ray.init``."""
    from ray.tune.registry import register_env

    for env_id in ENV_IDS.values():
        register_env(env_id, functools.partial(make_env, env_id))


def _domain_metrics(info) -> dict:
    """The domain metrics of a final step's ``info`` (empty if it carries no ``metrics``)."""
    metrics = (info or {}).get("metrics")
    if not metrics:
        return {}
    # the first problem whose metrics it carries (an admission episode's have no hit ratio)
    keys = next((keys for keys in DOMAIN_METRICS.values() if all(k in metrics for k in keys)), ())
    return {k: float(metrics[k]) for k in keys}


@functools.cache
def _callback_class():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class DomainMetricsCallback(RLlibCallback):
        """Logs the domain metrics of each finished episode (mean over an iteration's episodes)."""

        def on_episode_end(self, *, episode, metrics_logger=None, **kwargs):
            if metrics_logger is None:
                return
            for key, value in _domain_metrics(episode.get_infos(-1)).items():
                metrics_logger.log_value(key, value, reduce="mean")

    return DomainMetricsCallback


def __getattr__(name):  # DomainMetricsCallback is built on first use: importing this module needs no Ray
    if name == "DomainMetricsCallback":
        require_ray()
        return _callback_class()
    raise AttributeError(name)


def rllib_hyperparams(env: str) -> tuple[dict, dict]:
    """PPO settings in RLlib's names and the training env kwargs, from ``mooncake_gym/agents/hyperparams.yml``
    (SB3's names translated: a train batch is one rollout of every env, ``n_steps x n_envs``)."""
    if env not in ENV_IDS:
        raise ValueError(f"env: expected one of {sorted(ENV_IDS)}, got {env!r}")
    hp = load_hyperparams(ENV_IDS[env])
    training = {
        "lr": hp["learning_rate"], "gamma": hp["gamma"], "lambda_": hp["gae_lambda"],
        "entropy_coeff": hp["ent_coef"], "clip_param": hp["clip_range"],
        "train_batch_size_per_learner": hp["n_steps"] * hp.get("n_envs", 1),
        "minibatch_size": hp["batch_size"], "num_epochs": hp["n_epochs"],
        "fcnet_hiddens": list(hp.get("policy_kwargs", {}).get("net_arch", [64, 64])),
    }
    return training, dict(hp.get("env_kwargs", {}))


def ppo_config(env: str, num_env_runners: int = 0, seed: int = 0, env_kwargs: dict | None = None,
               overrides: dict | None = None):
    """The RLlib ``PPOConfig`` of :func:`train_rllib`."""
    require_ray()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if not isinstance(num_env_runners, int) or num_env_runners < 0:
        raise ValueError(f"--num-env-runners: expected an integer >= 0, got {num_env_runners!r}")
    training, env_defaults = rllib_hyperparams(env)
    unknown = sorted(set(overrides or {}) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"overrides: unknown PPO settings {unknown}; expected some of {list(OVERRIDABLE)}")
    training.update(overrides or {})
    # a train batch smaller than the minibatch (a short test run) is one minibatch
    training["minibatch_size"] = min(training["minibatch_size"], training["train_batch_size_per_learner"])
    hidden = training.pop("fcnet_hiddens")
    return (PPOConfig()
            .environment(ENV_IDS[env], env_config={**env_defaults, **(env_kwargs or {})})
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1)
            .training(**training)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=hidden))
            .callbacks(_callback_class())
            .debugging(seed=seed))


def iteration_summary(result: dict) -> dict:
    """The figures of one training iteration's result: iteration, env steps so far, mean episode
    return and the domain metrics (NaN where no episode finished in the iteration)."""
    runners = result.get("env_runners", {})
    out = {"iteration": int(result.get("training_iteration", 0)),
           "timesteps": int(result.get("num_env_steps_sampled_lifetime",
                                       runners.get("num_env_steps_sampled_lifetime", 0))),
           "episode_return_mean": float(runners.get("episode_return_mean", float("nan")))}
    for keys in DOMAIN_METRICS.values():
        for k in keys:
            if k in runners:
                out[k] = float(runners[k])
    return out


def train_rllib(env: str, iterations: int, num_env_runners: int = 0, address: str | None = None, seed: int = 0,
                env_kwargs: dict | None = None, overrides: dict | None = None, out: str | os.PathLike | None = None,
                progress=None, threads: int = 1) -> list[dict]:
    """Train RLlib PPO on ``env`` ('routing' or 'admission') for ``iterations`` iterations with
    ``num_env_runners`` remote env runners (0: sample in the driver); returns one
    :func:`iteration_summary` per iteration. Ray runs locally, or on the cluster at ``address``
    (``ray start --head`` prints it). ``out``: save the final algorithm there as an RLlib checkpoint.
    ``progress(summary)`` is called after each iteration. ``threads``: torch threads of this process
    (where the learner runs; Ray gives its workers one thread per CPU they hold)."""
    require_ray()
    import torch

    torch.set_num_threads(threads)
    if env not in ENV_IDS:
        raise ValueError(f"--env: expected one of {sorted(ENV_IDS)}, got {env!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"--iterations: expected an integer >= 1, got {iterations!r}")
    config = ppo_config(env, num_env_runners, seed, env_kwargs, overrides)
    init_ray(address)  # inside a Ray Tune trial (or after ray.init) Ray is running already: kept
    register_rllib_envs()
    algo = config.build_algo()
    try:
        history = []
        for _ in range(iterations):
            history.append(iteration_summary(algo.train()))
            if progress is not None:
                progress(history[-1])
        if out is not None:
            os.makedirs(out, exist_ok=True)
            algo.save(os.path.abspath(out))
        return history
    finally:
        algo.stop()
