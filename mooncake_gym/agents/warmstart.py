"""PPO warm-started by imitation: behaviour cloning of a hand-coded rule, then PPO.

PPO from a random policy on a saturated cluster spends its budget in queues that a random router
builds (issue 13, attempt 1 in ``docs/routing-agents.md``). The field's answer is to start from a
demonstrator (behaviour cloning, then policy-gradient fine-tuning: e.g. Vinyals et al., AlphaStar,
Nature 2019; "kickstarting", Schmitt et al., arXiv 1803.03835): here the policy network is first fit
to a teacher's actions (cross-entropy) and the value network to the teacher's discounted returns
(squared error), on training seeds, then trained by PPO on the env's own reward (minus TTFT / SLO).

:func:`warm_start_ppo` does it on several workloads at once (one vector env per entry of
``workloads``, each with its own teacher) and writes the agent in the project's format
(``mooncake_gym/agents/agentfile.py``) with a card. Every seed it uses is below 1,000 (training seeds). It is
written for routing (``PrefillRouting-v0``, mean TTFT: the defaults) and serves any environment
whose unwrapped env has ``decision_view()`` and ``encode_action()`` with a per-episode metric to
select checkpoints by (``env_id``, ``metric``, ``goal``): ``mooncake_gym/agents/warmstart_admission.py`` uses it
for ``OverloadAdmission-v1`` and token goodput, and ``mooncake_gym/agents/expert.py`` for PPO from its
distilled student.

The routing recipe (``python -m mooncake_gym.agents.warmstart OUT --scenarios ...``) made
``ppo_routing_ws`` and ``ppo_routing_bursty``, once shipped and since retired: behaviour clones of the
hand rule ``relsplit`` (then PPO), 1.00-1.78x the best tuned rule's mean TTFT on the leaderboard's 10
held-out seeds (``docs/routing-agents.md``). It stays as the documented recipe of those attempts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from mooncake_gym._files import write_atomic
from mooncake_gym.agents.agentfile import apply_wrappers, as_agent, save_agent, sha256_of, wrapper_spec
from mooncake_gym.agents.train import library_versions
from mooncake_gym.baselines import POLICIES
from mooncake_gym.baselines.routing import KVCentric
from mooncake_gym.baselines.sizesplit import RelativeSizeSplit, SizeSplit
from mooncake_gym.envs.wrappers import RoutingRelativeFeatures, RoutingRuleFeatures
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.evaluation.scenarios import get_scenario, scenarios_of
from mooncake_gym.sim.policy import reset_policy

ENV_ID = "mooncake_gym/PrefillRouting-v0"


def _wrapped(env_kwargs: dict, wrappers, env_id: str = ENV_ID):
    import gymnasium as gym

    return apply_wrappers(gym.make(env_id, render_mode=None, **env_kwargs), wrappers, trusted=True)


def demonstrations(env_kwargs: dict, teacher, seeds, wrappers, gamma: float, env_id: str = ENV_ID):
    """Observations (behind ``wrappers``), the teacher's env actions and the discounted returns of
    its episodes on ``seeds``."""
    env = _wrapped(env_kwargs, wrappers, env_id)
    obs_all, act_all, ret_all = [], [], []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=int(seed))
            reset_policy(teacher, int(seed))
            rewards, done = [], False
            base = env.unwrapped
            while not done:
                a = base.encode_action(teacher(base.decision_view()))
                obs_all.append(obs)
                act_all.append(a)
                obs, r, term, trunc, _ = env.step(a)
                rewards.append(r)
                done = term or trunc
            g, ret = 0.0, np.empty(len(rewards))
            for t in range(len(rewards) - 1, -1, -1):
                g = rewards[t] + gamma * g
                ret[t] = g
            ret_all.append(ret)
    finally:
        env.close()
    return np.asarray(obs_all, np.float32), np.asarray(act_all, np.int64), np.concatenate(ret_all).astype(np.float32)


def clone(model, obs, actions, returns, epochs: int = 10, batch: int = 512, lr: float = 1e-3, seed: int = 0,
          policy_coef: float = 1.0, value_coef: float = 0.5) -> dict:
    """Fit ``model``'s policy to ``actions`` (cross-entropy, weight ``policy_coef``) and its value to
    ``returns`` (squared error, weight ``value_coef``; 0 leaves the value network alone); returns
    the last epoch's mean losses and the share of the teacher's actions the policy's argmax takes.
    ``actions``: the teacher's action per observation, or (2-D) its distribution over the actions
    (soft targets: the cross-entropy to it; the agreement is then with its most likely action)."""
    import torch

    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    o, a, g = torch.as_tensor(obs), torch.as_tensor(actions), torch.as_tensor(returns)
    soft = a.ndim == 2
    rng = np.random.default_rng(seed)
    stats = {}
    for _ in range(epochs):
        order = rng.permutation(len(o))
        pl, vl = [], []
        for start in range(0, len(o), batch):
            idx = torch.as_tensor(order[start:start + batch])
            if soft:
                logits = policy.get_distribution(o[idx]).distribution.logits  # (normalised log-probabilities)
                values = policy.predict_values(o[idx])
                loss_pi = -(a[idx] * logits).sum(-1).mean()
            else:
                values, log_prob, _ = policy.evaluate_actions(o[idx], a[idx])
                loss_pi = -log_prob.mean()
            loss_v = torch.nn.functional.mse_loss(values.flatten(), g[idx])
            opt.zero_grad()
            (policy_coef * loss_pi + value_coef * loss_v).backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
            opt.step()
            pl.append(loss_pi.item())
            vl.append(loss_v.item())
        stats = {"policy_loss": float(np.mean(pl)), "value_loss": float(np.mean(vl))}
    with torch.no_grad():
        pred = policy.get_distribution(o).distribution.probs.argmax(-1)
    stats["agreement"] = float((pred == (a.argmax(-1) if soft else a)).float().mean())
    return stats


def mean_ttft(model, workloads, seeds, wrappers) -> list[float]:
    """The deterministic policy's mean TTFT on each workload over ``seeds``."""
    return mean_metric(model, workloads, seeds, wrappers)


def mean_metric(model, workloads, seeds, wrappers, env_id: str = ENV_ID, metric: str = "mean_ttft_s") -> list[float]:
    """The deterministic policy's mean ``metric`` per episode on each workload over ``seeds``."""

    agent = as_agent(model, env_id, wrappers)
    return [float(np.mean([e[metric] for e in evaluate(env_id, agent, seeds, **w["env_kwargs"])])) for w in workloads]


def selection_score(ttfts, references) -> float:
    """A checkpoint's score (lower is better) from its mean TTFT per workload and the references':
    the mean ratio plus 4 times every ratio's excess over 1, so that a checkpoint that is worse than
    the reference on one workload loses to one that is not."""
    ratios = [t / r for t, r in zip(ttfts, references)]
    return float(np.mean(ratios) + 4.0 * sum(max(0.0, x - 1.0) for x in ratios))


def warm_start_ppo(workloads: list[dict], out, wrappers=(), timesteps: int = 300_000, demo_seeds=range(20),
                   select_seeds=range(900, 903), chunk: int = 50_000, bc_epochs: int = 10, seed: int = 0,
                   hyperparameters: dict | None = None, time_budget_s: float = 1800.0, env_id: str = ENV_ID,
                   metric: str = "mean_ttft_s", goal: str = "min", name: str = "ppo_warmstart", init=None) -> dict:
    """Behaviour cloning of each workload's teacher, then PPO on all workloads together.

    ``workloads``: ``[{"env_kwargs": {...}, "teacher": policy, "envs": n, "reference": policy}]``
    (``envs`` vector envs of that workload of ``env_id``; ``reference`` optional). PPO runs in chunks
    of ``chunk`` steps until ``timesteps`` or ``time_budget_s`` (the clock includes cloning; a chunk
    starts only if one as long as the last still fits); after cloning and each chunk the policy's mean
    ``metric`` on ``select_seeds`` (training seeds) is measured and the best checkpoint is kept (the
    cloned policy, timestep 0, unless a later one scores better): with references on every workload
    (``goal`` "min" only) by :func:`selection_score` against the references' mean ``metric`` on the
    same seeds, otherwise by the sum of its ratios to the cloned policy's (smallest for ``goal``
    "min", largest for "max"). ``init(model, wrapper_specs) -> dict`` (its docstring's first line
    names it in the card) replaces behaviour cloning as the start of PPO when given (the workloads'
    teachers are then unused). Writes ``out/NAME.zip`` and its card; returns the card."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    if goal not in ("min", "max"):
        raise ValueError(f"goal: expected 'min' or 'max', got {goal!r}")
    sign = 1.0 if goal == "min" else -1.0
    with_refs = all(w.get("reference") is not None for w in workloads)
    if with_refs and goal != "min":
        raise ValueError("workloads: a 'reference' per workload scores checkpoints by selection_score, "
                         f"for a metric to minimise (goal 'min'), got goal {goal!r}")
    torch.set_num_threads(1)
    start = time.time()
    specs = [wrapper_spec(w) for w in wrappers]
    hp = {"n_steps": 512, "batch_size": 256, "n_epochs": 5, "learning_rate": 1e-4, "gamma": 0.99,
          "gae_lambda": 0.95, "ent_coef": 0.0, "clip_range": 0.1, "policy_kwargs": {"net_arch": [128, 128]},
          **(hyperparameters or {})}
    fns = [lambda kw=w["env_kwargs"]: Monitor(_wrapped(kw, specs, env_id))
           for w in workloads for _ in range(w.get("envs", 1))]
    venv = DummyVecEnv(fns)
    venv.seed(seed)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hp)
    if init is None:
        demos = [demonstrations(w["env_kwargs"], w["teacher"], demo_seeds, specs, hp["gamma"], env_id)
                 for w in workloads]
        obs, act, ret = (np.concatenate([d[i] for d in demos]) for i in range(3))
        bc = clone(model, obs, act, ret, epochs=bc_epochs, seed=seed)
        method = "behaviour cloning of each workload's teacher, then PPO (mooncake_gym/agents/warmstart.py)"
    else:
        bc = init(model, specs)
        method = f"{(init.__doc__ or init.__name__).strip().splitlines()[0]}, then PPO (mooncake_gym/agents/warmstart.py)"
    key = f"select_{metric}"
    history = [{"timesteps": 0, "wall_s": round(time.time() - start, 1), "bc": bc,
                key: mean_metric(model, workloads, list(select_seeds), specs, env_id, metric)}]
    if with_refs:
        ref = [float(np.mean([e[metric] for e in evaluate(env_id, w["reference"], list(select_seeds),
                                                          **w["env_kwargs"])])) for w in workloads]
        score_of = lambda sel: selection_score(sel, ref)  # noqa: E731
    else:
        ref = history[0][key]
        score_of = lambda sel: float(sum(s / r for s, r in zip(sel, ref)))  # noqa: E731
    history[0]["score"] = score_of(history[0][key])
    print(json.dumps(history[-1]), flush=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    best_score, best_at = history[0]["score"], 0
    save_agent(model, out / f"{name}.zip", env_id, specs)
    done, last_chunk_s = 0, 0.0
    while done < timesteps and time.time() - start + last_chunk_s < time_budget_s:  # the next chunk fits the budget
        chunk_start = time.time()
        model.learn(total_timesteps=chunk, reset_num_timesteps=False)
        done = int(model.num_timesteps)
        sel = mean_metric(model, workloads, list(select_seeds), specs, env_id, metric)
        score = score_of(sel)
        history.append({"timesteps": done, "wall_s": round(time.time() - start, 1), key: sel, "score": score})
        print(json.dumps(history[-1]), flush=True)
        last_chunk_s = time.time() - chunk_start
        if sign * score < sign * best_score:
            best_score, best_at = score, done
            save_agent(model, out / f"{name}.zip", env_id, specs)
    venv.close()
    card = json.loads((out / f"{name}.json").read_text())
    card.update({
        "algorithm": "PPO", "policy": "MlpPolicy", "hyperparameters": hp, "seed": seed,
        "training": {"method": method,
                     "workloads": [{**({"scenario": w["scenario"]} if "scenario" in w else {}),
                                    "env_kwargs": w["env_kwargs"], "teacher": repr(w["teacher"]),
                                    "envs": w.get("envs", 1),
                                    **({"reference": repr(w["reference"]), f"reference_{metric}": r}
                                       if with_refs else {})} for w, r in zip(workloads, ref)],
                     "demo_seeds": list(demo_seeds), "select_seeds": list(select_seeds), "bc_epochs": bc_epochs,
                     "timesteps_run": done, "selected_timestep": best_at,
                     "wall_time_s": round(time.time() - start, 1), "history": history},
        "threads": 1, "versions": library_versions(),
        "sha256": sha256_of(out / f"{name}.zip"),
    })
    write_atomic(out / f"{name}.json", json.dumps(card, indent=2) + "\n")
    return card


def issue13_workloads(sanity: bool = False) -> list[dict]:
    """The workloads of attempts 5-6 (the first ``ppo_routing_ws``, retired): saturated (12 sessions/s,
    teacher sizesplit 1.5 s / 2 instances) and heterogeneous (4xH800+4xA800 at 24/s, sizesplit 0.8 s /
    1 instance), 2 envs each; with ``sanity``, also 4-8 sessions/s with kvcentric as the teacher (docs/routing-agents.md)."""
    out = [{"env_kwargs": {"rate": 12.0, "episode_requests": 3000}, "teacher": SizeSplit(1.5, 2, 0.0), "envs": 2},
           {"env_kwargs": {"rate": 24.0, "episode_requests": 3000, "instances": "4xH800+4xA800"},
            "teacher": SizeSplit(0.8, 1, 0.0), "envs": 2}]
    if sanity:
        out.append({"env_kwargs": {"rate_range": [4.0, 8.0], "episode_requests": 3000}, "teacher": KVCentric(), "envs": 2})
    return out


#: The registered routing scenarios an agent trains on (every one but the trace, its unseen test),
#: with the number of vector envs of each.
SCENARIO_ENVS = {"routing-saturated": 2, "routing-bursty": 2, "routing-heterogeneous": 1,
                 "routing-stale-multirouter": 1, "routing-sanity": 1, "routing-sanity-8": 1}


def scenario_workloads(long_factor: float = 6.0, long_instances: int = 2, min_load: float = 0.0,
                       envs: dict | None = None) -> list[dict]:
    """The workloads of attempts 7-8 (the retired ``ppo_routing_ws``): each registered routing scenario
    of ``envs`` (``{name: vector envs}``, default :data:`SCENARIO_ENVS`; its ``config()``), with one
    teacher for all, ``relsplit`` (sizesplit with a threshold relative to the running mean size; knobs chosen on
    training seeds 0-9 of these scenarios, docs/routing-agents.md), and kvcentric (the best tuned
    baseline on each) as the reference for checkpoint selection. A per-scenario agent (attempt 10,
    the retired ``ppo_routing_bursty``) passes its one scenario in ``envs``."""
    return [{"scenario": name, "env_kwargs": get_scenario(name).config(), "envs": envs,
             "teacher": RelativeSizeSplit(long_factor, long_instances, min_load=min_load), "reference": KVCentric()}
            for name, envs in (SCENARIO_ENVS if envs is None else envs).items()]


def complete_card(path, compare_json, notes: str, evaluation_of, fields) -> dict:
    """Add to the agent card ``path`` (``OUT/NAME.json`` of :func:`warm_start_ppo`) what the card
    format names beside the training record: ``env_kwargs`` (the first workload's),
    ``fields(training)`` (``timesteps``, ``trained_on``, ``never_saw``...), ``timesteps_run``,
    ``wall_time_s``, ``evaluation`` (``evaluation_of(setting, seeds)`` per setting of the JSON of
    ``mooncake-gym compare --scenario ... --agent OUT/NAME.zip --json``, ``compare_json``) and
    ``notes``. Returns the card."""
    path = Path(path)
    card = json.loads(path.read_text())
    doc = json.loads(Path(compare_json).read_text())
    t = card["training"]
    card.update({"env_kwargs": t["workloads"][0]["env_kwargs"], **fields(t), "timesteps_run": t["timesteps_run"],
                 "wall_time_s": t["wall_time_s"], "notes": notes,
                 "evaluation": [evaluation_of(setting, doc["seeds"]) for setting in doc["settings"]]})
    write_atomic(path, json.dumps(card, indent=2) + "\n")
    return card


def complete_routing_card(path, compare_json, notes: str, per_scenario: bool = False, problem: str = "routing",
                          scenarios: list | None = None) -> dict:
    """:func:`complete_card` of an agent trained on routing scenarios: ``trained_on`` and
    ``never_saw`` (the other routing scenarios, and the held-out seeds), ``evaluation`` per scenario
    the agent's mean TTFT and the best baseline row's, default or tuned (the bound and the agents
    are not baselines); with ``per_scenario``, ``scenarios`` (the scenarios it was trained on:
    ``compare`` shows it only there, ``mooncake_gym.experiments.compare.agent_scenarios``), or
    ``scenarios`` when given. ``problem``: the scenarios' problem ("routing", or "routing-cluster"
    for the realistic cluster's), whose other scenarios the agent never saw."""
    def fields(t: dict) -> dict:
        trained = [w["scenario"] for w in t["workloads"]]
        return {"timesteps": t["selected_timestep"],
                "trained_on": [{"scenario": w["scenario"], "env_kwargs": w["env_kwargs"]} for w in t["workloads"]],
                "never_saw": [s.name for s in scenarios_of(problem) if s.name not in trained]
                + ["seeds >= 1,000,000 (compare's held-out seeds)"],
                **({"scenarios": scenarios or trained} if per_scenario or scenarios else {})}

    return complete_card(path, compare_json, notes, routing_evaluation, fields)


def routing_evaluation(setting: dict, seeds) -> dict:
    """One scenario's entry of a routing agent card's ``evaluation``, from a setting of ``compare
    --json`` with the agent as ``user_agent``: its mean TTFT and the best baseline row's (default or
    tuned; the bound and the agents are not baselines)."""
    rows = {r["policy"]: r["mean_ttft_s"] for r in setting["rows"]}
    # a baseline's row is NAME, or NAME (tuned) / NAME (tuned on SCENARIO) with tuned knobs
    baselines = {n: t for n, t in rows.items() if n.split(" (tuned")[0] in POLICIES["routing"]}
    best = min(baselines, key=baselines.get)
    return {"scenario": setting["scenario"], "seeds": seeds, "agent_mean_ttft_s": rows["user_agent"],
            "best_baseline": best, "best_baseline_mean_ttft_s": baselines[best],
            "ratio": rows["user_agent"] / baselines[best]}


if __name__ == "__main__":  # python -m mooncake_gym.agents.warmstart OUT [--scenarios | --sanity] [--demo-seeds N]
    import argparse

    ap = argparse.ArgumentParser(description="behaviour cloning of a size-splitting rule, then PPO (issue 13's routing agent)")
    ap.add_argument("out")
    ap.add_argument("--scenarios", action="store_true",
                    help="train on the registered routing scenarios (scenario_workloads; relative features)")
    ap.add_argument("--sanity", action="store_true", help="also train at 4-8 sessions/s (teacher kvcentric)")
    ap.add_argument("--demo-seeds", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=1000.0)
    ap.add_argument("--chunk", type=int, default=60_000)
    ap.add_argument("--select-seeds", type=int, default=3, help="selection seeds 900, 901, ...")
    ap.add_argument("--teacher", default="6,2,0", help="with --scenarios: relsplit's long_factor,long_instances,min_load")
    ap.add_argument("--only", metavar="SCENARIO", help="with --scenarios: train a per-scenario agent on this one "
                    "routing scenario alone (--envs vector envs of it)")
    ap.add_argument("--envs", type=int, default=4, help="with --only: vector envs (default 4)")
    ap.add_argument("--name", default="ppo_warmstart", help="the agent's file name (default ppo_warmstart)")
    a = ap.parse_args()
    if a.only and not a.scenarios:
        ap.error("--only: give --scenarios too (a per-scenario agent trains on a registered scenario)")
    if a.only:
        try:
            env_id = get_scenario(a.only).base_env_id
        except ValueError as e:
            ap.error(f"--only: {e}")
        if env_id != ENV_ID:
            ap.error(f"--only: expected a scenario of {ENV_ID}, got {a.only!r} (a scenario of {env_id})")
    if a.scenarios:
        f, k, load = a.teacher.split(",")
        workloads = scenario_workloads(float(f), int(k), float(load), None if a.only is None else {a.only: a.envs})
        wrappers = [RoutingRelativeFeatures]
    else:
        workloads, wrappers = issue13_workloads(a.sanity), [RoutingRuleFeatures]
    warm_start_ppo(workloads, a.out, wrappers=wrappers, timesteps=3_000_000, demo_seeds=range(a.demo_seeds),
                   select_seeds=range(900, 900 + a.select_seeds), chunk=a.chunk, bc_epochs=30,
                   time_budget_s=a.budget_s, hyperparameters={"learning_rate": 3e-5, "gamma": 0.999}, name=a.name)
