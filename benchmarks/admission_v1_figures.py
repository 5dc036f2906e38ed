"""Figures of the v1 admission problem (issue 13): every v1 admission baseline at its defaults and tuned,
optionally an agent, and the token-goodput bound, on the admission scenarios; held-out seeds.

Until ``compare --scenario`` shows the v1 columns, this script prints those tables::

    .venv/bin/python benchmarks/admission_v1_figures.py tune --out tuned.json [--loads 2,3 --seeds 3 --requests 1000]
    .venv/bin/python benchmarks/admission_v1_figures.py table --tuned tuned.json [--scenarios admission-load2,admission-load3
                     --seeds 5 --agent PATH]

``tune`` grid-searches each baseline's ``KNOBS`` on training seeds 0 .. seeds-1 (as ``mooncake-gym
tune``) for token goodput, per load; ``table`` evaluates on ``compare``'s held-out seeds (1,000,000 on).
Not a speed benchmark (its name does not start with ``bench_``).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from mooncake_gym import report
from mooncake_gym.baselines import ADMISSION_V1_POLICIES
from mooncake_gym.bounds import admission_bound_row
from mooncake_gym.compare import COMPARE_SEED_BASE, mean_ci95
from mooncake_gym.envs import ADMISSION_V1_ENV_ID
from mooncake_gym.evaluation import ModelPolicy, ViewPolicy, evaluate
from mooncake_gym.scenarios import get_scenario
from mooncake_gym.tune import candidates, tune_seeds

METRIC = "token_goodput"


def env_kwargs_of(factory, base: dict) -> dict:
    """The scenario's arguments plus what the policy needs (``ENV_KWARGS``: the oracle)."""
    return {**base, **getattr(factory, "ENV_KWARGS", {})}


def tune(loads, seeds: int, requests: int) -> dict:
    out = {}
    for name, factory in ADMISSION_V1_POLICIES.items():
        if not getattr(factory, "KNOBS", None):
            continue
        for load in loads:
            kw = env_kwargs_of(factory, {"load": load, "episode_requests": requests, "prediction": True})
            best = None
            for knobs in candidates(factory.KNOBS):
                try:
                    policy = factory(**knobs)
                except ValueError:  # e.g. high < low
                    continue
                score = float(np.mean([m[METRIC] for m in evaluate(ADMISSION_V1_ENV_ID, policy, tune_seeds(seeds), **kw)]))
                if best is None or score > best[0]:
                    best = (score, knobs)
            out[f"{name}@{load:g}"] = {"policy": name, "load": load, "knobs": best[1], "train_score": best[0]}
            print(name, load, best, file=sys.stderr, flush=True)
    return out


def row_of(name: str, episodes: list[dict]) -> dict:
    row = {"policy": name}
    for key, _, _ in report.ADMISSION_V1_COLUMNS[1:]:
        row[key], row[key + "_ci95"] = mean_ci95([e[key] for e in episodes])
    return row


def format_rows(rows: list[dict]) -> str:
    cells = []
    for row in rows:
        cell = {"policy": row["policy"]}
        for key, _, fmt in report.ADMISSION_V1_COLUMNS[1:]:
            mean, ci = row.get(key, float("nan")), row.get(key + "_ci95", float("nan"))
            cell[key] = "-" if np.isnan(mean) else (format(mean, fmt) if np.isnan(ci) else f"{format(mean, fmt)} ± {format(ci, fmt)}")
        cells.append(cell)
    return report.format_table(cells, [(k, h, None) for k, h, _ in report.ADMISSION_V1_COLUMNS])


def table(scenarios, seeds: int, tuned: dict, agent: str | None) -> None:
    seed_list = [COMPARE_SEED_BASE + i for i in range(seeds)]
    for name in scenarios:
        sc = get_scenario(name)
        load = sc.kwargs.get("load")
        rows = []
        for pname, factory in ADMISSION_V1_POLICIES.items():
            kw = env_kwargs_of(factory, sc.kwargs)
            rows.append(row_of(pname, evaluate(sc.base_env_id, ViewPolicy(factory(), pname), seed_list, **kw)))
            doc = tuned.get(f"{pname}@{load:g}")
            if doc is not None:
                label = f"{pname} (tuned {doc['knobs']})"
                rows.append(row_of(label, evaluate(sc.base_env_id, ViewPolicy(factory(**doc["knobs"]), label),
                                                    seed_list, **kw)))
        if agent is not None:
            from stable_baselines3 import PPO

            model = PPO.load(agent, device="cpu")
            rows.append(row_of("ppo", evaluate(sc.base_env_id, ModelPolicy(model, "ppo"), seed_list, **sc.kwargs)))
        rows.sort(key=lambda r: -r[METRIC])
        rows.append(admission_bound_row(sc.base_env_id, sc.kwargs, seed_list))
        print(f"\n{name} (v{sc.version}, fingerprint {sc.fingerprint()[:12]}), seeds {seed_list[0]}..{seed_list[-1]}")
        print(format_rows(rows), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--out", required=True)
    t.add_argument("--loads", default="2,3")
    t.add_argument("--seeds", type=int, default=3)
    t.add_argument("--requests", type=int, default=1000)
    s = sub.add_parser("table")
    s.add_argument("--tuned")
    s.add_argument("--scenarios", default="admission-load2,admission-load3")
    s.add_argument("--seeds", type=int, default=5)
    s.add_argument("--agent")
    args = ap.parse_args(argv)
    if args.command == "tune":
        doc = tune([float(x) for x in args.loads.split(",")], args.seeds, args.requests)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    else:
        tuned = {}
        if args.tuned:
            with open(args.tuned) as f:
                tuned = json.load(f)
        table(args.scenarios.split(","), args.seeds, tuned, args.agent)


if __name__ == "__main__":
    main()
