"""Figures of docs/routing-agents.md (issue 13's routing agents): on each setting, the routing
baselines at their defaults and tuned, the ``sizesplit`` reference rule, routing agents, and the
TTFT lower bound, on held-out seeds 1,000,000 on (``compare``'s).

    python benchmarks/routing_agents.py tune --setting saturated --out tuned_saturated.json
    python benchmarks/routing_agents.py table --setting saturated --tuned tuned_saturated.json \
        --agent PATH.zip --seeds 10

(``PATH.zip``: an agent zip with its card; the figures of attempt 6 were of ``ppo_routing_ws``, since
retired, whose zip and card are in git history before its retirement.)

``tune`` searches each of ``TUNED``'s ``KNOBS`` grids on training seeds 0, 1, 2 (the objective of
``mooncake_gym.experiments.tune``: mean TTFT over the seeds, on the setting's own env kwargs). The settings are
plain ``PrefillRouting-v0`` kwargs (``SETTINGS``) of attempts 1-6 in docs/routing-agents.md, made
before the scenario registry: this script reproduces those figures. The registered scenarios
(``mooncake_gym.evaluation.scenarios``, docs/scenarios.md) are measured with ``mooncake-gym compare --scenario``,
their baselines tuned by ``make leaderboard-tune``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import mooncake_gym  # noqa: F401  (registers the env ids)
import mooncake_gym.envs.wrappers  # noqa: F401  (the agents' wrapper module, imported before loading them)
from mooncake_gym.experiments.compare import COMPARE_SEED_BASE, mean_ci95
from mooncake_gym.envs import ROUTING_ENV_ID
from mooncake_gym.evaluation.episodes import ViewPolicy, evaluate

#: The settings, as PrefillRouting-v0 kwargs.
SETTINGS = {
    "saturated": {"rate": 12.0, "episode_requests": 3000},
    "heterogeneous": {"rate": 24.0, "episode_requests": 3000, "instances": "4xH800+4xA800"},
    "heterogeneous-12": {"rate": 12.0, "episode_requests": 3000, "instances": "4xH800+4xA800"},
    "sanity-4": {"rate": 4.0, "episode_requests": 3000},
    "sanity-8": {"rate": 8.0, "episode_requests": 3000},
}
#: The baselines tuned (the six best at their defaults on saturated and heterogeneous, 10 held-out seeds).
TUNED = ("kvcentric", "preble", "llmd_precise", "llmd", "sglang", "aibrix")
#: The reference rule's knobs per setting, chosen on training seeds (saturated: 0-4; heterogeneous:
#: 10-19; the grids are in docs/routing-agents.md).
SIZESPLIT = {"saturated": {"long_s": 1.5, "long_instances": 2, "work_weight": 0.0},
             "heterogeneous": {"long_s": 0.8, "long_instances": 1, "work_weight": 0.0}}
TUNE_SEEDS = (0, 1, 2)


def tune(setting: str) -> dict:
    from mooncake_gym.experiments.tune import candidates, knobs_of, objective

    out = {}
    for name in TUNED:
        results = [{"knobs": k, "score": objective("routing", name, k, list(TUNE_SEEDS), [(setting, SETTINGS[setting])])}
                   for k in candidates(knobs_of("routing", name))]
        out[name] = min(results, key=lambda r: r["score"])
        print(setting, name, out[name], flush=True)
    return out


def row(name: str, policy, seeds, kwargs) -> dict:
    episodes = evaluate(ROUTING_ENV_ID, policy, seeds, **kwargs)
    m, ci = mean_ci95([e["mean_ttft_s"] for e in episodes])
    return {"policy": name, "mean_ttft_s": m, "ci95": ci, "per_seed": [e["mean_ttft_s"] for e in episodes]}


def table(setting: str, tuned: dict, agents: list[str], n_seeds: int) -> list[dict]:
    import gymnasium as gym

    from mooncake_gym.agents import load_agent
    from mooncake_gym.baselines import make_policy
    from mooncake_gym.baselines.sizesplit import SizeSplit
    from mooncake_gym.analysis.bounds import ttft_lower_bound

    kwargs = SETTINGS[setting]
    seeds = [COMPARE_SEED_BASE + i for i in range(n_seeds)]
    rows = []
    for name in TUNED:
        rows.append(row(name, ViewPolicy(make_policy("routing", name)), seeds, kwargs))
        if name in tuned:
            knobs = tuned[name]["knobs"]
            rows.append({**row(f"{name} (tuned)", ViewPolicy(make_policy("routing", name, **knobs)), seeds, kwargs),
                         "knobs": knobs})
    for ref, knobs in SIZESPLIT.items():
        rows.append({**row(f"sizesplit ({ref}'s knobs)", ViewPolicy(SizeSplit(**knobs)), seeds, kwargs), "knobs": knobs})
    for path in agents:
        rows.append(row(path, load_agent(path), seeds, kwargs))
    env = gym.make(ROUTING_ENV_ID, **kwargs)
    bounds = []
    for s in seeds:
        env.reset(seed=s)
        base = env.unwrapped
        bounds.append(ttft_lower_bound(base.sim.trace, base.config, base.cost).mean_ttft_s)
    m, ci = mean_ci95(bounds)
    rows.append({"policy": "bound", "mean_ttft_s": m, "ci95": ci, "per_seed": bounds})
    best = min((r for r in rows if r["policy"].endswith("(tuned)")), key=lambda r: r["mean_ttft_s"], default=None)
    for r in rows:
        r["vs_best_tuned"] = r["mean_ttft_s"] / best["mean_ttft_s"] if best else float("nan")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("tune", "table"))
    ap.add_argument("--setting", required=True, choices=sorted(SETTINGS))
    ap.add_argument("--out", help="tune: write the tuned knobs here (JSON)")
    ap.add_argument("--tuned", help="table: the JSON written by tune")
    ap.add_argument("--agent", action="append", default=[], help="table: an agent zip with its card (repeatable)")
    ap.add_argument("--seeds", type=int, default=10, help="table: held-out seeds (default 10)")
    ap.add_argument("--json", help="table: also write the rows here")
    a = ap.parse_args()
    if a.what == "tune":
        doc = tune(a.setting)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
        return
    tuned = {}
    if a.tuned:
        try:
            with open(a.tuned) as f:
                tuned = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--tuned: cannot read {a.tuned} as the JSON written by 'tune' ({e}); run "
                     f"'python benchmarks/routing_agents.py tune --setting {a.setting} --out {a.tuned}' first")
    rows = table(a.setting, tuned, a.agent, a.seeds)
    print(f"| {a.setting} {json.dumps(SETTINGS[a.setting])} | mean TTFT (s) | x best tuned |\n|---|---|---|")
    for r in rows:
        knobs = f" {r['knobs']}" if "knobs" in r else ""
        print(f"| {r['policy']}{knobs} | {r['mean_ttft_s']:.3f} ± {r['ci95']:.3f} | {r['vs_best_tuned']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=float)
    np.seterr(all="ignore")


if __name__ == "__main__":
    main()
