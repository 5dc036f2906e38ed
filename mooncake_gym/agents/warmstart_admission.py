"""Issue 13's admission agent: behaviour cloning of the context rule, then PPO, on ``OverloadAdmission-v1``.

The observation is :class:`mooncake_gym.envs.wrappers.AdmissionRuleFeatures` (the request's
predicted context and footprint, the decode instance's KV use and iteration time, the prefill queue,
the offered load and the rules' own decisions); the env is the admission scenarios' (preset
``mooncake-overload``, ``prediction=True``, sigma 0.5, 3,000-request episodes) at loads 2 and 3,
each load with its own teacher (the context rule with the knobs best on training seeds at that
load) and its own vector envs. Cloning, PPO and checkpoint selection (token goodput on training
seeds 900-902, the cloned policy kept unless PPO beats it) are :func:`warm_start_ppo`'s.
Every seed is below 1,000; ``compare`` evaluates on seeds from 1,000,000::

    python -m mooncake_gym.agents.warmstart_admission OUT [--budget-s 1500] [--demo-seeds 8] [--cem JSON]
        [--loads 2,3] [--name ppo_admission_v1] [--growth]

writes ``OUT/NAME.zip`` and its card (docs/admission-v1.md has the figures of every attempt):
``--loads 2`` trains a per-scenario agent on load 2 alone, ``--growth`` adds the wrapper's
opportunity-cost features.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mooncake_gym.agents.warmstart import _wrapped, warm_start_ppo
from mooncake_gym.agents.warmstart import complete_card as complete_card_of
from mooncake_gym.baselines.admission import ContextRule
from mooncake_gym.envs.wrappers import AdmissionRuleFeatures
from mooncake_gym.evaluation.episodes import run_episode

ENV_ID = "mooncake_gym/OverloadAdmission-v1"
NAME = "ppo_admission_v1"
#: The admission scenarios' arguments (mooncake_gym/evaluation/scenarios.py) without the load.
SCENARIO_KWARGS = {"preset": "mooncake-overload", "episode_requests": 3000, "prediction": True,
                   "prediction_sigma": 0.5}
#: The teacher's knobs per load: (low, high, max_footprint) of ``context_predicted``.
TEACHERS = {2.0: (0.7, 0.9, 8000), 3.0: (0.5, 0.8, 8000)}


def workloads(envs_per_load: int = 2, loads=None, episode_requests: int | None = None) -> list[dict]:
    """One workload per load of :data:`TEACHERS` (or of ``loads``, a subset), with the context rule at
    that load's knobs as the teacher (``episode_requests`` replaces the scenarios' 3,000, for tests)."""
    loads = list(TEACHERS) if loads is None else [float(x) for x in loads]
    unknown = [x for x in loads if x not in TEACHERS]
    if unknown or not loads:
        raise ValueError(f"loads: expected a non-empty subset of {sorted(TEACHERS)}, got {loads}")
    size = {} if episode_requests is None else {"episode_requests": int(episode_requests)}
    return [{"env_kwargs": {**SCENARIO_KWARGS, **size, "load": load}, "teacher": ContextRule(*TEACHERS[load], length="predicted"),
             "envs": envs_per_load} for load in loads]


def linear_admit(theta: np.ndarray, obs: np.ndarray) -> int:
    """The linear policy's action: admit (1) iff ``w . obs + b > 0``, ``theta = (w, b)``."""
    return 1 if float(obs @ theta[:-1] + theta[-1]) > 0.0 else 0


def episode_goodput(env, seed: int, act) -> float:
    """Token goodput of one episode of ``env`` (wrapped) from ``seed`` with ``act(obs) -> action``."""
    obs, _ = env.reset(seed=int(seed))
    while True:
        obs, _, terminated, truncated, info = env.step(act(obs))
        if terminated or truncated:
            return float(info["metrics"]["token_goodput"])


def set_linear_policy(model, theta: np.ndarray) -> None:
    """Make ``model``'s policy (``net_arch=[]``: the action logits are linear in the observation) take
    :func:`linear_admit`'s actions: logit(reject) = 0, logit(admit) = ``w . obs + b``."""
    import torch

    net = model.policy.action_net
    if net.weight.shape != (2, len(theta) - 1):
        raise ValueError(f"model: expected a linear policy (net_arch=[]) on {len(theta) - 1} features, got "
                         f"action_net weights of shape {tuple(net.weight.shape)}")
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
        net.weight[1] = torch.as_tensor(theta[:-1], dtype=net.weight.dtype)
        net.bias[1] = float(theta[-1])


def _log(entry: dict) -> None:
    print(json.dumps(entry), flush=True)


def cem_init(generations: int = 15, population: int = 12, elite: int = 3, budget_s: float = 1200.0, seed: int = 0,
             std: float = 1.0, seeds_per_generation: int = 1, loads=None, episode_requests: int | None = None,
             log=_log):
    """The ``init`` of :func:`warm_start_ppo` that searches a linear policy by the cross-entropy method.

    Cross-entropy method (Szita and Lorincz, Neural Computation 2006, noisy CEM): a Gaussian over
    ``theta = (w, b)`` starts at the context rule (w = 2 on feature 10, its decision; b = -1) with
    standard deviation ``std``; each generation draws ``population`` candidates, runs each for one
    episode per load on each of the generation's ``seeds_per_generation`` training seeds
    (``100 + seeds_per_generation x generation + i``: common random numbers), scores it by the mean
    over those seeds of the sum over loads (``loads``: :func:`workloads`'s) of its token goodput over
    the teacher's on that episode, and refits the Gaussian to the ``elite`` best (plus decaying
    noise). The mean is written into the model's (linear) policy."""
    if seeds_per_generation < 1:
        raise ValueError(f"seeds_per_generation: expected an integer >= 1, got {seeds_per_generation}")
    rng = np.random.default_rng(seed)

    def init(model, specs) -> dict:
        import time

        start = time.time()
        envs = [(_wrapped(w["env_kwargs"], specs, ENV_ID), w["teacher"]) for w in workloads(loads=loads, episode_requests=episode_requests)]
        n = model.observation_space.shape[0] + 1
        mean, sd = np.zeros(n), np.full(n, float(std))
        mean[10], mean[-1] = 2.0, -1.0
        history, last_s = [], 0.0
        for g in range(generations):
            if time.time() - start + last_s > budget_s:  # the next generation would not fit the budget
                break
            gen_start = time.time()
            ep_seeds = [100 + seeds_per_generation * g + i for i in range(seeds_per_generation)]
            refs = [[_teacher_goodput(env, teacher, s) for env, teacher in envs] for s in ep_seeds]
            cands = mean + sd * rng.standard_normal((population, n))
            cands[0] = mean  # the current mean is scored too
            scores = np.array([np.mean([sum(episode_goodput(env, s, lambda o, t=theta: linear_admit(t, o)) / ref
                                            for (env, _), ref in zip(envs, rs)) for s, rs in zip(ep_seeds, refs)])
                               for theta in cands])
            best = cands[np.argsort(-scores)[:elite]]
            noise = max(0.0, 0.3 * (1 - g / generations))
            mean, sd = best.mean(0), best.std(0) + noise
            history.append({"generation": g, "seed": ep_seeds[0] if len(ep_seeds) == 1 else ep_seeds, "mean_score": float(scores[0]),
                            "best_score": float(scores.max()), "wall_s": round(time.time() - start, 1)})
            log(history[-1])
            last_s = time.time() - gen_start
        for env, _ in envs:
            env.close()
        set_linear_policy(model, mean)
        return {"method": "cem", "theta": [round(float(x), 4) for x in mean], "generations": history,
                "population": population, "elite": elite, "std": std, "seeds_per_generation": seeds_per_generation,
                "wall_s": round(time.time() - start, 1)}

    init.__doc__ = ("cross-entropy method on a linear policy started at the context rule "
                    "(mooncake_gym/agents/warmstart_admission.cem_init)")
    return init


def _teacher_goodput(env, teacher, seed: int) -> float:
    return float(run_episode(env, teacher, int(seed))["token_goodput"])


def train(out, budget_s: float = 1500.0, demo_seeds: int = 8, timesteps: int = 5_000_000, chunk: int = 40_000,
          hyperparameters: dict | None = None, cem: dict | None = None, loads=None, name: str = NAME,
          growth: bool = False) -> dict:
    """Behaviour cloning (or, with ``cem``, :func:`cem_init` with those arguments on a linear policy),
    then PPO with checkpoint selection, within ``budget_s`` seconds in all, on the loads ``loads``
    (default both), behind :class:`AdmissionRuleFeatures` (with its opportunity-cost features if
    ``growth``); writes ``OUT/NAME.zip`` and its card."""
    arch = [] if cem is not None else [64, 64]
    hp = {"learning_rate": 3e-5, "gamma": 0.995, "policy_kwargs": {"net_arch": arch}, **(hyperparameters or {})}
    init = None if cem is None else cem_init(**{"loads": loads, **cem})
    wrapper = (AdmissionRuleFeatures, {"growth": True}) if growth else AdmissionRuleFeatures
    return warm_start_ppo(workloads(loads=loads), out, wrappers=[wrapper], timesteps=timesteps,
                          demo_seeds=range(demo_seeds), select_seeds=range(900, 903), chunk=chunk, bc_epochs=30,
                          time_budget_s=budget_s, hyperparameters=hp, env_id=ENV_ID, metric="token_goodput",
                          goal="max", name=name, init=init)


def complete_card(out, compare_json, notes: str, name: str = NAME) -> dict:
    """:func:`mooncake_gym.agents.warmstart.complete_card` of ``OUT/NAME.json`` (default
    ``ppo_admission_v1.json``): ``evaluation`` from the JSON of ``mooncake-gym compare --scenario
    admission-load2,admission-load3 --agent OUT/ppo_admission_v1.zip --json`` (``compare_json``), the
    agent's row and the best other row of each scenario (and ``early``'s, the waste reference)."""
    keys = ("token_goodput", "goodput_requests", "wasted_prefill_gpu_s")

    def evaluation_of(setting: dict, seeds) -> dict:
        rows = {r["policy"]: {k: r[k] for k in keys} | {k + "_ci95": r[k + "_ci95"] for k in keys}
                for r in setting["rows"]}
        agent = rows.pop("user_agent")
        best = max(rows, key=lambda n: rows[n]["token_goodput"])
        return {"scenario": setting["scenario"], "seeds": seeds, "agent": agent,
                "best_other": {"policy": best, **rows[best]}, "early": rows["early"],
                "ratio_to_best_other": agent["token_goodput"] / rows[best]["token_goodput"]}

    def fields(t: dict) -> dict:
        trained_on = [w["env_kwargs"] for w in t["workloads"]]
        unseen_loads = [f"admission-load{load:g}" for load in TEACHERS if load not in [w["load"] for w in trained_on]]
        return {"timesteps": t["timesteps_run"], "trained_on": trained_on,
                "never_saw": ["held-out seeds (>= 1,000,000)", *unseen_loads, "admission-load1.5",
                              "admission-tight-slo", "other output-length prediction errors than sigma 0.5",
                              "Conductor-v1"]}

    return complete_card_of(Path(out) / f"{name}.json", compare_json, notes, evaluation_of, fields)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="behaviour cloning of the context rule, then PPO (issue 13's admission agent)")
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=1500.0)
    ap.add_argument("--demo-seeds", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=40_000)
    ap.add_argument("--hp", default="{}", help="PPO hyperparameters overriding the defaults (JSON)")
    ap.add_argument("--cem", help="start from cem_init(**CEM) on a linear policy instead of cloning (JSON)")
    ap.add_argument("--loads", default="2,3", help="the admission scenarios' loads to train on (comma-separated)")
    ap.add_argument("--name", default=NAME, help="the agent's file name (OUT/NAME.zip)")
    ap.add_argument("--growth", action="store_true", help="add AdmissionRuleFeatures' opportunity-cost features")
    a = ap.parse_args()
    train(a.out, a.budget_s, a.demo_seeds, chunk=a.chunk, hyperparameters=json.loads(a.hp),
          cem=None if a.cem is None else json.loads(a.cem), loads=[float(x) for x in a.loads.split(",")], name=a.name,
          growth=a.growth)
