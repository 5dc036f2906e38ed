"""Run any policy — a hand-coded baseline, a trained SB3 model, a user's function — on an environment.

Two adapters make the one policy interface work on a Gym env:

* :class:`ViewPolicy` wraps a baseline ``policy(view) -> action``: it reads the simulator's decision
  view from the unwrapped env (``env.unwrapped.decision_view()``) and turns the answer into an env
  action with ``env.unwrapped.encode_action``. A baseline run through the env gives exactly the
  metrics of :func:`mooncake_gym.routing.simulate` / :func:`mooncake_gym.overload.simulate` on the
  same trace.
* :class:`ModelPolicy` wraps anything with SB3's ``predict(obs, deterministic=True)``: it reads the
  observation.

:func:`evaluate` runs one of them over a list of seeds and returns the per-episode metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from .policy import policy_name, reset_policy


class ViewPolicy:
    """Adapter: a policy over the simulator's decision view, acting on an env."""

    def __init__(self, policy: Callable, name: str | None = None):
        self.policy = policy
        self.name = name or policy_name(policy)

    def reset(self, env: gym.Env, seed: int | None) -> None:
        reset_policy(self.policy, seed)

    def act(self, env: gym.Env, obs) -> int:
        base = env.unwrapped
        return base.encode_action(self.policy(base.decision_view()))


class ModelPolicy:
    """Adapter: an SB3 model (or anything with ``predict``) acting on the observation."""

    def __init__(self, model: Any, name: str = "ppo", deterministic: bool = True):
        self.model = model
        self.name = name
        self.deterministic = deterministic

    def reset(self, env: gym.Env, seed: int | None) -> None:
        check_model_fits(self.model, env)

    def act(self, env: gym.Env, obs) -> int:
        action, _ = self.model.predict(obs, deterministic=self.deterministic)
        return int(action)


def check_model_fits(model, env: gym.Env) -> None:
    """Raise ``ValueError`` if ``model`` was trained on other observation or action spaces than ``env``'s
    (for example an agent saved before an environment's version changed)."""
    for name in ("observation_space", "action_space"):
        mine, theirs = getattr(model, name, None), getattr(env, name)
        if mine is not None and mine != theirs:
            raise ValueError(f"agent: trained for {name} {mine}, but {env.spec.id if env.spec else env} has {theirs}; "
                             "retrain it for this version of the environment")


def as_env_policy(policy) -> ViewPolicy | ModelPolicy:
    """Wrap ``policy`` in the right adapter (already-wrapped policies pass through)."""
    if isinstance(policy, (ViewPolicy, ModelPolicy)):
        return policy
    if hasattr(policy, "predict"):
        return ModelPolicy(policy)
    if callable(policy):
        return ViewPolicy(policy)
    raise TypeError(f"policy: expected a callable(view) or an object with predict(obs), got {type(policy).__name__}")


def _finish(env: gym.Env, info: dict, total: float, steps: int, seed, keep_result: bool) -> dict:
    metrics = dict(info.get("metrics") or env.unwrapped.sim.result("env").metrics)
    metrics["return"] = total
    metrics["steps"] = steps
    metrics["seed"] = seed
    if keep_result:
        metrics["result"] = env.unwrapped.sim.result(metrics.get("policy", "env"))
    return metrics


def run_episode(env: gym.Env, policy, seed: int | None = None, options: dict | None = None,
                keep_result: bool = False) -> dict:
    """One episode of ``policy`` on ``env``; returns the simulator's end-of-episode metrics plus
    ``return`` (sum of rewards), ``steps`` and ``seed`` (and ``result``, the simulator's full result
    object with per-request arrays, if ``keep_result``)."""
    p = as_env_policy(policy)
    obs, _ = env.reset(seed=seed, options=options)
    p.reset(env, seed)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(p.act(env, obs))
        total += reward
        steps += 1
        if terminated or truncated:
            return _finish(env, info, total, steps, seed, keep_result)


def _evaluate_model_lockstep(env_id: str, policy: ModelPolicy, seeds: Sequence[int], keep_result: bool,
                             env_kwargs: dict) -> list[dict]:
    """A model over several seeds at once: one env per seed stepped in lockstep, so that each
    network forward pass serves all the episodes still running (same results as one by one)."""
    envs = [gym.make(env_id, **env_kwargs) for _ in seeds]
    try:
        check_model_fits(policy.model, envs[0])
        obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
        totals, steps = [0.0] * len(envs), [0] * len(envs)
        results: list[dict | None] = [None] * len(envs)
        active = list(range(len(envs)))
        while active:
            actions, _ = policy.model.predict(np.stack([obs[k] for k in active]), deterministic=policy.deterministic)
            still = []
            for k, a in zip(active, actions):
                obs[k], reward, terminated, truncated, info = envs[k].step(int(a))
                totals[k] += reward
                steps[k] += 1
                if terminated or truncated:
                    results[k] = _finish(envs[k], info, totals[k], steps[k], seeds[k], keep_result)
                else:
                    still.append(k)
            active = still
        return results
    finally:
        for env in envs:
            env.close()


def evaluate(env_id: str, policy, seeds: Sequence[int], keep_result: bool = False, **env_kwargs) -> list[dict]:
    """Run ``policy`` for one episode per seed of ``seeds`` on ``gym.make(env_id, **env_kwargs)``;
    returns the per-episode metrics (see :func:`run_episode`)."""
    p = as_env_policy(policy)
    if isinstance(p, ModelPolicy) and len(seeds) > 1:
        return _evaluate_model_lockstep(env_id, p, list(seeds), keep_result, env_kwargs)
    env = gym.make(env_id, **env_kwargs)
    try:
        return [run_episode(env, p, seed=s, keep_result=keep_result) for s in seeds]
    finally:
        env.close()
