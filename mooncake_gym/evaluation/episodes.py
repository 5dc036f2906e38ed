"""Run any policy — a hand-coded baseline, a trained SB3 model, a user's function — on an environment.

Two adapters make the one policy interface work on a Gym env:

* :class:`ViewPolicy` wraps a baseline ``policy(view) -> action``: it reads the simulator's decision
  view from the unwrapped env (``env.unwrapped.decision_view()``) and turns the answer into an env
  action with ``env.unwrapped.encode_action``. A baseline run through the env gives exactly the
  metrics of :func:`mooncake_gym.sim.routing.simulate` / :func:`mooncake_gym.sim.admission.simulate` on the
  same trace. A policy with feedback (``observe``, :mod:`mooncake_gym.sim.policy`) is connected to the
  episode's simulator at each reset.
* :class:`ModelPolicy` wraps a trained agent (:class:`~mooncake_gym.agents.Agent`, an SB3 model,
  or anything with ``predict(obs, deterministic=True)``): it reads the observation, behind the
  agent's wrappers and observation normalisation, with recurrent state and action masks.

:func:`evaluate` runs one of them over a list of seeds and returns the per-episode metrics.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from mooncake_gym._engine.stepper import NativeDecider
from mooncake_gym.agents.agentfile import as_agent
from mooncake_gym.analysis.rollout import DEFAULT_HORIZON, best_trial, check_base, check_horizon, env_trials, rollout_name
from mooncake_gym.sim.policy import policy_name, reset_policy


class ViewPolicy:
    """Adapter: a policy over the simulator's decision view, acting on an env.

    Where the episode's simulator runs on the native engine and the policy is one of the engine's
    rules (``PrefillRouting-v0`` with kvcentric, relsplit, a production router, ...:
    :class:`~mooncake_gym._engine.stepper.NativeDecider`), the engine makes the policy's decisions
    without a view built in Python: the same actions, drawn from the same generator stream (the
    differential tests of the engine's rules), so the same episode, several times faster."""

    def __init__(self, policy: Callable, name: str | None = None):
        self.policy = policy
        self.name = name or policy_name(policy)
        self._decider = None

    def reset(self, env: gym.Env, seed: int | None) -> None:
        self.finish()
        reset_policy(self.policy, seed)
        # the feedback channel, if the policy has one (sim/policy.py): the env's, else its episode's simulator's
        listen = getattr(env.unwrapped, "listen", None) or getattr(getattr(env.unwrapped, "sim", None), "listen", None)
        if listen is not None:
            listen(self.policy)
        self._decider = NativeDecider.of(getattr(env.unwrapped, "sim", None), self.policy)

    def act(self, env: gym.Env, obs) -> int:
        base = env.unwrapped
        if self._decider is not None:
            return base.encode_action(self._decider())
        return base.encode_action(self.policy(base.decision_view()))

    def finish(self) -> None:
        """End the episode: the policy's generator and running state as answering in Python leaves them."""
        if self._decider is not None:
            self._decider.close()
            self._decider = None


class RolloutPolicy(ViewPolicy):
    """Adapter: the rollout reference (:mod:`mooncake_gym.analysis.rollout`) over the baseline
    ``policy`` with look-ahead ``horizon``, acting on an env with snapshots (``PrefillRouting-v0``
    and ``-v1`` over a routing rule; ``OverloadAdmission-v1`` and ``Conductor-v1``'s admission over
    an admission rule): its trials (:func:`~mooncake_gym.analysis.rollout.env_trials`) run on the
    env's simulator, which each decision leaves as it found it. A reference row, not a deployable
    policy (it reads the trace's future requests)."""

    kind = "reference"

    def __init__(self, policy: Callable, horizon: int = DEFAULT_HORIZON, name: str | None = None):
        check_base(policy)
        self.horizon = check_horizon(horizon)
        super().__init__(policy, name or rollout_name(policy_name(policy), self.horizon))

    def reset(self, env: gym.Env, seed: int | None) -> None:
        super().reset(env, seed)
        self._decider = None  # (the base rule answers the views of the trials, in Python or on the engine)

    def act(self, env: gym.Env, obs) -> int:
        tried, costs = env_trials(env, self.policy, self.horizon)
        return tried[best_trial(costs)]


class ModelPolicy:
    """Adapter: an SB3 model, a loaded :class:`~mooncake_gym.agents.Agent` or anything with
    ``predict`` acting on the observation. It applies the agent's observation wrappers
    (:meth:`prepare`) and normalisation, carries a recurrent policy's LSTM state and
    ``episode_start`` through the episode, and passes the env's ``action_masks()`` to a maskable one."""

    def __init__(self, model: Any, name: str = "ppo", deterministic: bool = True):
        self.model = model
        self.agent = as_agent(model)
        self.name = name
        self.deterministic = deterministic
        self.state = None
        self.episode_start = True

    def prepare(self, env: gym.Env) -> gym.Env:
        """``env`` behind the agent's wrappers; raises ``ValueError`` saying what differs if the
        agent does not fit it."""
        env = self.agent.wrap(env)
        self.agent.check_fits(env)
        return env

    def reset(self, env: gym.Env, seed: int | None) -> None:
        self.state, self.episode_start = None, True

    def act(self, env: gym.Env, obs) -> int:
        masks = self.agent.action_masks(env)
        action, self.state = self.agent.predict(
            np.asarray(obs)[None], state=self.state, episode_start=np.array([self.episode_start]),
            deterministic=self.deterministic, action_masks=None if masks is None else masks[None])
        self.episode_start = False
        return env_action(action, self.agent.action_space)


def env_action(action, space):
    """One env action from a model's output for one env: an int (Discrete), or an int64 vector
    (MultiDiscrete: Conductor-v1's four decisions)."""
    a = np.asarray(action).reshape(-1)
    return a.astype(np.int64) if isinstance(space, gym.spaces.MultiDiscrete) else int(a[0])


def check_model_fits(model, env: gym.Env) -> None:
    """Raise ``ValueError`` naming what differs if ``model`` (an SB3 model or an agent) was trained on
    other observation or action spaces, or another env id, than ``env``'s."""
    as_agent(model).check_fits(env)


@contextmanager
def torch_threads(threads: int | None):
    """Run the block with torch limited to ``threads`` threads (``None``: leave torch's setting)."""
    if threads is None:
        yield
        return
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {threads!r}")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    object with per-request arrays, if ``keep_result``). An agent's observation wrappers are put
    around ``env`` for the episode unless it already has them."""
    p = as_env_policy(policy)
    if isinstance(p, ModelPolicy):
        env = p.prepare(env)
    obs, _ = env.reset(seed=seed, options=options)
    p.reset(env, seed)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(p.act(env, obs))
        total += reward
        steps += 1
        if terminated or truncated:
            if isinstance(p, ViewPolicy):
                p.finish()
            return _finish(env, info, total, steps, seed, keep_result)


def _evaluate_model_lockstep(env_id: str, policy: ModelPolicy, seeds: Sequence[int], keep_result: bool,
                             env_kwargs: dict) -> list[dict]:
    """A model over several seeds at once: one env per seed stepped in lockstep, so that each
    network forward pass serves all the episodes still running (same results as one by one).
    A recurrent policy's state is kept per episode; action masks are stacked per step."""
    agent = policy.agent
    envs = []
    try:
        for _ in seeds:
            envs.append(gym.make(env_id, **env_kwargs))
            envs[-1] = policy.prepare(envs[-1])
        obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
        states: list = [None] * len(envs)     # per episode: the LSTM state, arrays of shape (layers, 1, hidden)
        totals, steps = [0.0] * len(envs), [0] * len(envs)
        results: list[dict | None] = [None] * len(envs)
        active = list(range(len(envs)))
        while active:
            masks = [agent.action_masks(envs[k]) for k in active]
            state = None
            if agent.recurrent and steps[active[0]] > 0:
                state = tuple(np.concatenate([states[k][i] for k in active], axis=1) for i in range(len(states[active[0]])))
            actions, new_state = agent.predict(
                np.stack([obs[k] for k in active]), state=state,
                episode_start=np.array([steps[k] == 0 for k in active]), deterministic=policy.deterministic,
                action_masks=None if masks[0] is None else np.stack(masks))
            still = []
            for j, (k, a) in enumerate(zip(active, np.asarray(actions).reshape(len(active), -1))):
                if agent.recurrent:
                    states[k] = tuple(s[:, j:j + 1] for s in new_state)
                obs[k], reward, terminated, truncated, info = envs[k].step(env_action(a, agent.action_space))
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


def evaluate(env_id: str, policy, seeds: Sequence[int], keep_result: bool = False, threads: int | None = 1,
             **env_kwargs) -> list[dict]:
    """Run ``policy`` for one episode per seed of ``seeds`` on ``gym.make(env_id, **env_kwargs)``;
    returns the per-episode metrics (see :func:`run_episode`). A trained agent (SB3 model or
    :class:`~mooncake_gym.agents.Agent`) acts deterministically, behind its wrappers and
    normalisation, with torch limited to ``threads`` threads (default 1; ``None`` leaves torch's
    setting): batched forward passes of small networks gain nothing from more on a busy machine."""
    p = as_env_policy(policy)
    if isinstance(p, ModelPolicy):
        with torch_threads(threads):
            return _evaluate_model_lockstep(env_id, p, list(seeds), keep_result, env_kwargs)
    env = gym.make(env_id, **env_kwargs)
    try:
        return [run_episode(env, p, seed=s, keep_result=keep_result) for s in seeds]
    finally:
        env.close()
