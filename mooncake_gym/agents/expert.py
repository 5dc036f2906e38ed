"""Expert iteration: the rollout reference distilled into a policy network (issue 26, item 5).

The rollout reference (:mod:`mooncake_gym.analysis.rollout`: at each decision, try every instance,
let a base rule route the next H requests on a copy of the cluster, keep the best) reads the
trace's future requests, so it cannot be deployed; a network trained to answer as it does on the
state alone can. The recipe is DAgger (Ross, Gordon, Bagnell, AISTATS 2011) with the rollout as
the expert, i.e. expert iteration (Anthony, Tian, Barber, NeurIPS 2017) without a tree search:

1. round 0: the rollout acts on ``episodes`` training episodes of the scenario; every decision's
   observation (behind the agent's wrappers) is stored with the rollout's action;
2. the SB3 policy network is fit to all the pairs so far by cross-entropy
   (:func:`mooncake_gym.agents.warmstart.clone`, the cloning machinery of the warm starts);
3. rounds 1.. : the student (the network, deterministic) acts, and each state it visits is
   labelled with the rollout's action there (the base rule sees every view once, as it would
   routing the episode), the pairs are added, the network refit;
4. after each fit the student's mean TTFT on selection seeds (900..) is measured; the best round
   is kept; optionally PPO fine-tunes it (:func:`fine_tune`, with either reward of the env).

Every seed it uses is a training seed (below 1,000): round r's episodes are seeds
``r * episodes ..``; compare's held-out seeds (1,000,000 on) are never seen. It takes any
registered routing scenario whose simulator has snapshots (``get_scenario(name).base_env_id`` and
its ``config()``), or a mix of them on one env id (``--scenario`` repeated: every round labels
episodes of each, one network is fit to all).

    python -m mooncake_gym.agents.expert OUT --scenario routing-saturated --tuned relsplit.json \\
        --horizon 128 --rounds 3 --episodes 4 --name expert_routing_saturated

writes ``OUT/NAME.zip`` and its card (teacher, budget, trained-on and never-saw seeds, history).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from mooncake_gym._files import write_atomic
from mooncake_gym.agents.agentfile import as_agent, load, save_agent, sha256_of, wrapper_spec
from mooncake_gym.agents.train import library_versions
from mooncake_gym.agents.warmstart import _wrapped, clone, mean_metric, selection_score, warm_start_ppo
from mooncake_gym.analysis.rollout import DEFAULT_HORIZON, check_horizon, best_trial, rollout_trials
from mooncake_gym.envs.wrappers import RoutingRelativeFeatures
from mooncake_gym.evaluation import problems
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.evaluation.scenarios import get_scenario, scenarios_of
from mooncake_gym.sim.policy import policy_name, reset_policy

#: The student's network (SB3 PPO's MlpPolicy, separate policy and value MLPs).
NET_ARCH = [256, 256]


def label_episode(env, base, horizon: int, seed: int, student=None):
    """One episode of ``env`` (the agent's wrappers on a routing env with snapshots), seeded
    ``seed``: per decision the observation and the rollout's env action over ``base`` with
    ``horizon``. The rollout acts unless ``student`` (an :class:`~mooncake_gym.agents.Agent`) is
    given; then the student acts and its states are labelled. Returns (observations, actions, each
    decision's trial cost per env action (s; inf where not tried), the episode's mean TTFT, the
    share of decisions where the actor agreed with the rollout)."""
    obs, _ = env.reset(seed=int(seed))
    reset_policy(base, int(seed))
    u = env.unwrapped
    n_actions = int(u.action_space.n)
    o_all, a_all, c_all, agree, done, info = [], [], [], 0, False, {}
    while not done:
        tried, costs = rollout_trials(u.sim, base, horizon)
        label = u.encode_action(tried[best_trial(costs)])
        row = np.full(n_actions, np.inf)
        for route, c in zip(tried, costs):
            a = u.encode_action(route)
            row[a] = min(row[a], c)
        c_all.append(row)
        act = label if student is None else int(student.predict(obs, deterministic=True)[0])
        o_all.append(obs)
        a_all.append(label)
        agree += act == label
        obs, _, term, trunc, info = env.step(act)
        done = term or trunc
    return (np.asarray(o_all, np.float32), np.asarray(a_all, np.int64), np.asarray(c_all),
            float(info["metrics"]["mean_ttft_s"]), agree / max(1, len(a_all)))


def soft_targets(costs: np.ndarray, tau: float) -> np.ndarray:
    """Per decision a distribution over the env actions from the trials' TTFT sums ``costs`` (inf
    where not tried): ``exp(-(cost - best) / tau)``, normalised (a trial ``tau`` seconds of TTFT
    worse than the best weighs 1/e of it)."""
    w = np.exp(-(costs - costs.min(axis=1, keepdims=True)) / tau)
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)



def scenario_mix(scenario, overrides) -> tuple[list, list, str, list]:
    """A scenario name or a list of them (a mix) with ``overrides`` (None, one dict for all, or one
    dict per scenario) as ``(names, scenarios, env id, each scenario's env kwargs)``; the scenarios
    of a mix must share one env id."""
    names = [scenario] if isinstance(scenario, str) else list(scenario)
    if not names:
        raise ValueError("scenario: expected a scenario name or a non-empty list of them, got []")
    if overrides is None or isinstance(overrides, dict):
        overrides = [overrides or {}] * len(names)
    if len(overrides) != len(names):
        raise ValueError(f"overrides: expected one dict per scenario ({len(names)}), got {len(overrides)}")
    scs = [get_scenario(n) for n in names]
    env_id = scs[0].base_env_id
    if any(s.base_env_id != env_id for s in scs):
        raise ValueError(f"scenario: expected scenarios of one env id, got {sorted({s.base_env_id for s in scs})}")
    return names, scs, env_id, [s.config(**o) for s, o in zip(scs, overrides)]

def expert_iteration(scenario, out, base, horizon: int = DEFAULT_HORIZON, rounds: int = 3, episodes: int = 4,
                     epochs: int = 30, select_seeds=range(900, 904), wrappers=(RoutingRelativeFeatures,),
                     seed: int = 0, name: str = "expert_routing", lr: float = 1e-3, net_arch=None,
                     teacher_name: str | None = None, tau: float = 0.0, overrides=None,
                     for_scenarios: list | None = None, resume: bool = False) -> dict:
    """DAgger over the rollout reference on ``scenario`` (module docstring); writes ``out/NAME.zip``
    and its card and returns the card. ``base``: the rollout's base rule (a routing rule without
    feedback); ``rounds`` >= 1 (round 0 is the rollout's own episodes), ``episodes`` per round.
    ``overrides``: env kwargs over the scenario's (its trace file, or another load: the card's
    ``trained_on`` records them); ``for_scenarios``: the card's ``scenarios`` (where ``compare``
    shows the agent; default the scenario trained on).
    ``scenario`` may be a list of scenarios of one env id (a mix; ``overrides`` then None or one dict
    per scenario): each round labels ``episodes`` episodes of each, one network is fit to all the
    pairs, and the rounds are compared by :func:`~mooncake_gym.agents.warmstart.selection_score` of
    the student's mean TTFT on each scenario against ``base``'s (the mean ratio plus 4 times every
    ratio's excess over 1), which orders a single scenario's rounds by their mean TTFT.
    ``tau`` (s): 0 fits the rollout's chosen actions; above 0 the soft targets of
    :func:`soft_targets` (every trial weighed by its TTFT sum). The pairs are kept in
    ``out/NAME-data.npz`` (observations, labels, trial costs). ``resume``: go on from a run stopped
    between rounds (``out``'s data, card and kept student, which acts in the next round), up to
    ``rounds`` in all."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    check_horizon(horizon)
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    if not (isinstance(episodes, int) and episodes >= 1):
        raise ValueError(f"episodes: expected an integer >= 1, got {episodes!r}")
    if not (isinstance(tau, (int, float)) and tau >= 0):
        raise ValueError(f"tau: expected a time >= 0 s, got {tau!r}")
    single = isinstance(scenario, str)
    names, scs, env_id, all_kwargs = scenario_mix(scenario, overrides)
    if max(select_seeds) >= 1000 or rounds * episodes > 900:
        raise ValueError("select_seeds, rounds x episodes: expert iteration uses training seeds below 1,000 only")
    torch.set_num_threads(1)
    start = time.time()
    specs = [wrapper_spec(w) for w in wrappers]
    envs = [_wrapped(k, specs, env_id) for k in all_kwargs]
    venv = DummyVecEnv([lambda: _wrapped(all_kwargs[0], specs, env_id)])
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0,
                policy_kwargs={"net_arch": list(net_arch or NET_ARCH)})
    workloads = [{"env_kwargs": k} for k in all_kwargs]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base_ttfts = [float(np.mean([e["mean_ttft_s"] for e in evaluate(env_id, base, list(select_seeds), **k)]))
                  for k in all_kwargs]
    one = (lambda x: x[0]) if single else (lambda x: x)  # (one scenario: its figures, not lists, on the card)
    obs_parts, act_parts, cost_parts, history = [], [], [], []
    best, best_round = None, -1
    if resume:
        data = np.load(out / f"{name}-data.npz")
        obs_parts, act_parts, cost_parts = [data["obs"]], [data["actions"]], [data["costs"]]
        history = json.loads((out / f"{name}.json").read_text())["training"]["history"]
        if history[-1]["labels"] != len(data["actions"]):  # (labels: every pair so far)
            raise ValueError(f"resume: {out / name}'s data and card disagree (a round was labelled but not fit)")
        # (a card of one scenario written before the scores: its ratio's score)
        score = [h["select_score"] if "select_score" in h else selection_score([h["select_ratio_to_base"]], [1.0])
                 for h in history]
        best_round = min(range(len(history)), key=score.__getitem__)
        best = score[best_round]
        model.policy.load_state_dict(load(out / f"{name}.zip").policy.state_dict())
        start -= history[-1]["wall_s"]
    for r in range(len(history), rounds):
        student = None if r == 0 else as_agent(model, env_id, specs)
        seeds = range(r * episodes, (r + 1) * episodes)
        actor_ttft, agree = [], []
        for env in envs:
            for s in seeds:
                o, a, c, ttft, ag = label_episode(env, base, horizon, s, student)
                obs_parts.append(o)
                act_parts.append(a)
                cost_parts.append(c)
                actor_ttft.append(ttft)
                agree.append(ag)
        obs, act, cost = np.concatenate(obs_parts), np.concatenate(act_parts), np.concatenate(cost_parts)
        np.savez_compressed(out / f"{name}-data.npz", obs=obs, actions=act, costs=cost)
        target = act if tau == 0 else soft_targets(cost, tau)
        fit = clone(model, obs, target, np.zeros(len(act), np.float32), epochs=epochs, lr=lr, seed=seed + r,
                    value_coef=0.0)
        sel = mean_metric(model, workloads, list(select_seeds), specs, env_id)
        score = selection_score(sel, base_ttfts)
        history.append({"round": r, "actor": "rollout" if r == 0 else "student", "seeds": [seeds.start, seeds.stop - 1],
                        "actor_mean_ttft_s": float(np.mean(actor_ttft)), "actor_agreement": float(np.mean(agree)),
                        "labels": int(len(act)), "fit": fit, "select_mean_ttft_s": one(sel),
                        "select_ratio_to_base": one([t / b for t, b in zip(sel, base_ttfts)]), "select_score": score,
                        "wall_s": round(time.time() - start, 1)})
        print(json.dumps(history[-1]), flush=True)
        if best is None or score < best:
            best, best_round = score, r
            save_agent(model, out / f"{name}.zip", env_id, specs)
        # the card after every round, so that a run stopped between rounds leaves a complete agent
        card = write_student_card(out / f"{name}.json", scs, all_kwargs, base, teacher_name or
                                  f"rollout H={horizon} over {policy_name(base)}",
                                  {"horizon": horizon, "rounds": rounds, "episodes_per_round": episodes,
                                   "epochs": epochs, "lr": lr, "tau_s": tau, "select_seeds": list(select_seeds),
                                   "base_select_mean_ttft_s": one(base_ttfts), "selected_round": best_round,
                                   "wall_time_s": round(time.time() - start, 1), "history": history},
                                  seed, overrides, for_scenarios)
    for env in envs:
        env.close()
    venv.close()
    return card


def write_student_card(path, sc, kwargs, base, teacher: str, training: dict, seed: int = 0,
                       overrides=None, for_scenarios: list | None = None) -> dict:
    """Complete the card ``path`` (written by ``save_agent`` beside the zip) of a student of
    :func:`expert_iteration` on scenario ``sc`` (made with ``kwargs``; or lists of both, a mix, with
    ``overrides`` one dict per scenario): its teacher, ``training`` (the rounds so far: ``history``,
    ``selected_round``...), what it was trained on and never saw, and the scenarios it is for
    (``for_scenarios``, default the scenarios trained on: ``compare`` shows it only there). A mix's
    card has the first scenario's ``env_kwargs`` (those the agent's env is made with to check its
    wrappers). Returns the card."""
    path = Path(path)
    scs, all_kwargs = (sc, kwargs) if isinstance(sc, (list, tuple)) else ([sc], [kwargs])
    if overrides is None or isinstance(overrides, dict):
        overrides = [overrides or {}] * len(scs)
    # (a required trace is not a change)
    changed = [{k: v for k, v in (o or {}).items() if k not in s.requires} for s, o in zip(scs, overrides)]
    labelled = len(training["history"]) * training["episodes_per_round"]
    sel = training["select_seeds"]
    card = json.loads(path.read_text())
    card.update({
        "algorithm": "PPO", "policy": "MlpPolicy", "seed": seed, "env_kwargs": all_kwargs[0],
        "training": {"method": "expert iteration: DAgger over the rollout reference, cross-entropy fits of the "
                               "policy network (mooncake_gym/agents/expert.py)",
                     "teacher": teacher, "base": repr(base), **training},
        # (a distilled student: fit to labelled decisions, no PPO step)
        "timesteps": 0, "labelled_decisions": training["history"][-1]["labels"], "wall_time_s": training["wall_time_s"],
        "trained_on": [{"scenario": s.name + (f" with {c}" if c else ""), "env_kwargs": k,
                        "seeds": f"0-{labelled - 1} (labelled), {min(sel)}-{max(sel)} (selection)"}
                       for s, k, c in zip(scs, all_kwargs, changed)],
        "never_saw": [s.name for s in scenarios_of(scs[0].problem)
                      if not any(s.name == t.name and not c for t, c in zip(scs, changed))]
        + ["seeds >= 1,000,000 (compare's held-out seeds)"],
        "scenarios": list(for_scenarios or dict.fromkeys(s.name for s in scs)),
        "threads": 1, "versions": library_versions(),
    })
    card["sha256"] = sha256_of(path.with_suffix(".zip"))
    write_atomic(path, json.dumps(card, indent=2) + "\n")
    return card


#: PPO's settings of :func:`fine_tune` (the warm starts' small steps: the policy starts good).
FINE_TUNE_HP = {"learning_rate": 3e-5, "gamma": 0.999, "clip_range": 0.1, "n_steps": 512, "batch_size": 256,
                "n_epochs": 5, "policy_kwargs": {"net_arch": NET_ARCH}}


def fine_tune(student, scenario, out, base, reward: str = "ttft", timesteps: int = 120_000,
              chunk: int = 60_000, envs: int = 4, value_episodes: int = 2, select_seeds=range(900, 904),
              time_budget_s: float = 1800.0, name: str = "expert_routing_ppo", seed: int = 0,
              overrides=None) -> dict:
    """PPO from the distilled ``student`` (an agent zip of :func:`expert_iteration`) on ``scenario``
    with the env's ``reward`` ("ttft" or "credit"), through
    :func:`~mooncake_gym.agents.warmstart.warm_start_ppo` (checkpoints chosen on ``select_seeds`` by
    the mean TTFT against ``base``'s; the student, timestep 0, unless one is better). Before PPO the
    value network is fit (the policy left as it is) to the student's discounted returns under that
    reward on ``value_episodes`` training episodes (seeds 990..) of each scenario, so both rewards
    start from a critic of their own. ``scenario`` may be a list (a mix, as in
    :func:`expert_iteration`; ``overrides`` then one dict per scenario): ``envs`` vector envs of each,
    checkpoints chosen by :func:`~mooncake_gym.agents.warmstart.selection_score`. Returns the card."""
    agent = load(student)
    names, scs, env_id, all_kwargs = scenario_mix(scenario, overrides)
    if env_id.endswith("-v0"):
        for k in all_kwargs:
            k["reward"] = reward
    elif reward != "ttft":  # PrefillRouting-v1's reward is the ttft one (-TTFT / SLO), with no choice
        raise ValueError(f"reward: {env_id} has the ttft reward only, got {reward!r}")
    gamma = FINE_TUNE_HP["gamma"]

    def init(model, specs):
        """the distilled student, its value network fit to its returns"""
        model.policy.load_state_dict(agent.policy.state_dict())
        obs_all, act_all, ret_all = [], [], []
        for kwargs in all_kwargs:
            env = _wrapped(kwargs, specs, env_id)
            for s in range(990, 990 + value_episodes):
                obs, _ = env.reset(seed=s)
                rewards, done = [], False
                while not done:
                    a = int(model.predict(obs, deterministic=True)[0])
                    obs_all.append(obs)
                    act_all.append(a)
                    obs, r, term, trunc, _ = env.step(a)
                    rewards.append(r)
                    done = term or trunc
                g, ret = 0.0, np.empty(len(rewards), np.float32)
                for t in range(len(rewards) - 1, -1, -1):
                    g = rewards[t] + gamma * g
                    ret[t] = g
                ret_all.append(ret)
            env.close()
        return clone(model, np.asarray(obs_all, np.float32), np.asarray(act_all, np.int64), np.concatenate(ret_all),
                     epochs=10, policy_coef=0.0, value_coef=1.0, seed=seed)

    workloads = [{"scenario": sc.name, "env_kwargs": kwargs, "teacher": f"(the student {Path(student).name})",
                  "envs": envs, "reference": base} for sc, kwargs in zip(scs, all_kwargs)]
    return warm_start_ppo(workloads, out, wrappers=agent.wrappers, timesteps=timesteps, select_seeds=select_seeds,
                          chunk=chunk, seed=seed, hyperparameters=FINE_TUNE_HP, time_budget_s=time_budget_s,
                          env_id=env_id, name=name, init=init)


def complete_expert_card(path, compare_jsons: list, notes: str, scenarios: list, student=None,
                         reference: str | None = None) -> dict:
    """Complete the card ``path`` of a student of :func:`expert_iteration`, or of its PPO fine-tune
    (:func:`fine_tune`, whose ``student`` card's training, trained-on and never-saw it takes): the
    ``evaluation`` per scenario of each ``compare --agent PATH --json`` output in ``compare_jsons``
    (:func:`~mooncake_gym.agents.warmstart.routing_evaluation`), ``notes``, and ``scenarios`` (where
    ``compare`` shows it); ``reference``: the name of the selection's reference rule, written over
    its repr. Returns the card."""
    from mooncake_gym.agents.warmstart import routing_evaluation

    path = Path(path)
    card = json.loads(path.read_text())
    t = card["training"]
    if student is not None:  # a fine-tune: warm_start_ppo's card, the student's record beside it
        s_card = json.loads(Path(student).with_suffix(".json").read_text())
        t["student"] = {**s_card["training"], "trained_on": s_card["trained_on"]}
        t.pop("demo_seeds", None)  # (no demonstrations: PPO starts from the student)
        for w in t["workloads"]:
            w["reference"] = reference or w["reference"]
        card.update({"env_kwargs": t["workloads"][0]["env_kwargs"], "timesteps": t["selected_timestep"],
                     "timesteps_run": t["timesteps_run"],
                     "wall_time_s": round(t["wall_time_s"] + s_card["training"]["wall_time_s"], 1),
                     "trained_on": s_card["trained_on"], "never_saw": s_card["never_saw"]})
    evaluation = []
    for doc in (json.loads(Path(p).read_text()) for p in compare_jsons):
        evaluation += [routing_evaluation(setting, doc["seeds"]) for setting in doc["settings"]]
    card.update({"notes": notes, "scenarios": list(scenarios), "evaluation": evaluation})
    write_atomic(path, json.dumps(card, indent=2) + "\n")
    return card


def parse_workload(text: str) -> tuple[str, dict]:
    """A scenario of ``--scenario``: ``NAME`` or ``NAME:KEY=VALUE:...`` (env kwargs over the
    scenario's; a VALUE that parses as JSON is that value, else the string). Returns (name, kwargs)."""
    name, *pairs = text.strip().split(":")
    get_scenario(name)  # (an unknown name: its one-line error)
    kwargs = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--scenario: expected NAME:KEY=VALUE:..., got {text!r}")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return name, kwargs


def base_rule(policy: str, tuned: str | None = None, problem: str = "routing"):
    """The rollout's base rule: routing baseline ``policy`` with the knobs of ``tune``'s result file
    ``tuned`` (whose ``policy`` and problem must be the same), else its defaults; and its row name.
    ``problem``: "routing" (PrefillRouting-v0) or "routing-cluster" (PrefillRouting-v1, where the
    rule reads the cluster view's prefill pool through the problem's adapter)."""
    knobs = {}
    if tuned is not None:
        doc = json.loads(Path(tuned).read_text())
        if doc.get("policy") != policy or doc.get("env") != problem:
            raise ValueError(f"--tuned: expected a {problem} tune result of {policy}, got "
                             f"{doc.get('env')}/{doc.get('policy')}")
        knobs = doc["knobs"]
    rule = problems.get(problem).policy(policy, **knobs).policy
    return rule, f"{policy}({', '.join(f'{k}={v}' for k, v in knobs.items())})"


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="expert iteration: distil the rollout reference into a policy network")
    ap.add_argument("out")
    ap.add_argument("--scenario", required=True, action="append",
                    help="a registered routing scenario (docs/scenarios.md); repeated, a mix of them. Each may carry "
                         "env kwargs over its own as NAME:KEY=VALUE:... (VALUE in JSON, else a string), e.g. "
                         "routing-cluster-saturated:load=0.45:base_trace=long.jsonl")
    ap.add_argument("--base", default="relsplit", help="the rollout's base rule (default relsplit)")
    ap.add_argument("--tuned", help="tune's result file with the base rule's knobs")
    ap.add_argument("--horizon", type=int, default=DEFAULT_HORIZON)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=4, help="labelled episodes per round")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--select-seeds", type=int, default=4, help="selection seeds 900, 901, ...")
    ap.add_argument("--name", default="expert_routing")
    ap.add_argument("--fine-tune", metavar="STUDENT.zip", help="instead: PPO from this distilled student (fine_tune)")
    ap.add_argument("--reward", default="ttft", choices=("ttft", "credit"),
                    help="--fine-tune: the env's reward (default ttft: PPO did better with it, docs/routing-agents.md)")
    ap.add_argument("--timesteps", type=int, default=120_000, help="--fine-tune: PPO steps")
    ap.add_argument("--chunk", type=int, default=60_000, help="--fine-tune: PPO steps between checkpoints")
    ap.add_argument("--budget-s", type=float, default=1800.0, help="--fine-tune: wall-clock budget (s)")
    ap.add_argument("--envs", type=int, default=4, help="--fine-tune: vector envs of each scenario (default 4)")
    ap.add_argument("--tau", type=float, default=0.0, help="soft targets' temperature in s of TTFT (0: the chosen actions)")
    ap.add_argument("--trace", help="the trace file of a scenario that needs one (compare --trace)")
    ap.add_argument("--load", type=float, help="train at this load instead of the scenario's (a realistic cluster's)")
    ap.add_argument("--episode-requests", type=int, help="requests per training episode instead of the scenario's")
    ap.add_argument("--resume", action="store_true", help="go on from OUT's run stopped between rounds")
    ap.add_argument("--seed", type=int, default=0, help="the network's initialisation and fits' shuffles (default 0)")
    ap.add_argument("--for", dest="for_scenarios", help="comma-separated scenarios the card names (where compare "
                    "shows the agent; default --scenario)")
    a = ap.parse_args()
    try:
        specs = [parse_workload(w) for w in a.scenario]
        common = {**({"load": a.load} if a.load is not None else {}),
                  **({"episode_requests": a.episode_requests} if a.episode_requests is not None else {})}
        overrides = [{**get_scenario(n).trace_kwargs(a.trace), **common, **o} for n, o in specs]
        names = [n for n, _ in specs]
        rule, label = base_rule(a.base, a.tuned, get_scenario(names[0]).problem)
        if a.fine_tune:
            fine_tune(a.fine_tune, names[0] if len(names) == 1 else names, a.out, rule, a.reward, a.timesteps,
                      chunk=a.chunk, envs=a.envs, name=a.name, select_seeds=range(900, 900 + a.select_seeds),
                      time_budget_s=a.budget_s, overrides=overrides[0] if len(names) == 1 else overrides,
                      seed=a.seed)
            raise SystemExit(0)
        expert_iteration(names[0] if len(names) == 1 else names, a.out, rule, a.horizon, a.rounds, a.episodes,
                         a.epochs, range(900, 900 + a.select_seeds), seed=a.seed, name=a.name,
                         teacher_name=f"rollout H={a.horizon} over {label}", tau=a.tau,
                         overrides=overrides[0] if len(names) == 1 else overrides,
                         for_scenarios=a.for_scenarios.split(",") if a.for_scenarios else None, resume=a.resume)
    except ValueError as e:
        ap.error(str(e))
