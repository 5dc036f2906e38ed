"""``mooncake-gym tune``: a baseline's knobs, or PPO's hyperparameters (Ray), on training seeds."""

from __future__ import annotations

import sys

from mooncake_gym.cli.options import JSON, TRACE_FORMAT, Command, NoEffect, floats, no_effect, opt, trace_format
from mooncake_gym.evaluation.problems import DECISIONS
from mooncake_gym.evaluation.scenarios import get_scenario
from mooncake_gym.experiments import tune
from mooncake_gym.model.workload import read_trace
from mooncake_gym.reporting import tables as report

#: the options of a baseline search (--policy) and of a PPO sweep (--algo), with their defaults
_POLICY_ONLY = {"seeds": 3, "rates": [4.0, 8.0], "loads": [2.0], "trace": None, "speed": 1.0, "metric": None}
_PPO_ONLY = {"iterations": 10, "num_env_runners": 0, "train_batch": None}

OPTIONS = (
    opt("--policy", default=None, help="the baseline whose KNOBS to search, e.g. kvcentric"),
    opt("--algo", choices=["ppo"], default=None, help="sweep RLlib PPO's hyperparameters instead (--backend ray)"),
    opt("--env", choices=list(DECISIONS), required=True, help="which problem"),
    opt("--budget", type=int, default=None,
        help="settings to try (grid: at least the grid's size; random: how many to draw; default all)"),
    opt("--search", choices=tune.SEARCHES, default="grid", help="grid (default) or random"),
    opt("--backend", choices=tune.BACKENDS, default="local", help="local loop (default) or Ray Tune"),
    opt("--address", default=None, help="ray: address of a running Ray cluster (default: start Ray locally)"),
    opt("--seeds", type=int, default=None, limit="seeds",
        help=f"training seeds per workload (default 3, at most {tune.MAX_TUNE_SEEDS})"),
    opt("--seed", type=int, default=0, limit="seed", help="seed of the random search's draw and of PPO (default 0)"),
    opt("--rates", type=floats, default=None, limit="rate", help="routing session rates (default 4,8)"),
    opt("--loads", type=floats, default=None, limit="load", help="admission loads, x decode capacity (default 2)"),
    opt("--trace", default=None, help="tune on this JSONL trace (routing: replayed; admission: base)"),
    TRACE_FORMAT,
    opt("--speed", type=float, default=None, limit="speed", help="replay speed of --trace (default 1)"),
    opt("--episode-requests", type=int, default=None,
        help=f"requests per synthetic episode (default {tune.TUNE_EPISODE_REQUESTS}; ppo: hyperparams.yml's)"),
    opt("--metric", default=None,
        help="the metric to optimise (default: routing mean_ttft_s, admission goodput; see mooncake_gym.experiments.tune)"),
    opt("--iterations", type=int, default=None, help="ppo: RLlib iterations per trial (default 10)"),
    opt("--num-env-runners", type=int, default=None, help="ppo: remote env runners per trial (default 0)"),
    opt("--train-batch", type=int, default=None, help="ppo: env steps per iteration (default: hyperparams.yml)"),
    opt("--scenario", default=None, metavar="NAME",
        help="tune on this scenario's environment (docs/scenarios.md; --trace gives its trace if it needs one)"),
    opt("--out", required=True, metavar="FILE.json", output=(".json",), help="write the result (best knobs) here"),
    JSON,
)
RULES = (
    NoEffect(tuple(_POLICY_ONLY), lambda a: a.algo is not None, "with --algo: it is an option of --policy"),
    NoEffect(tuple(_PPO_ONLY), lambda a: a.algo is None, "with --policy: it is an option of --algo"),
    NoEffect(("rates",), lambda a: a.env == "admission" or a.trace,
             "with --env admission or --trace: it sets the synthetic routing workloads"),
    NoEffect(("loads",), lambda a: a.env == "routing", "with --env routing: it sets the admission workloads"),
    NoEffect(("speed",), lambda a: not a.trace, "without --trace: it is the replay speed of a trace"),
    NoEffect(("scenario",), lambda a: a.algo is not None, "with --algo: PPO sweeps run on the problem's environment"),
)
_SCENARIO_FIXES = NoEffect(("rates", "loads", "speed", "episode_requests"), lambda a: True,
                           "with --scenario: the scenario fixes its workload (docs/scenarios.md)")


def check(args) -> None:
    """With a scenario its workload is fixed (an unknown name is named before any work); fills the
    defaults of the search's own options."""
    if args.scenario is not None:
        get_scenario(args.scenario)
        for dest in _SCENARIO_FIXES.dests:
            if getattr(args, dest) is not None:
                raise no_effect(dest, _SCENARIO_FIXES.why)
    for dest, default in (_PPO_ONLY if args.algo is not None else _POLICY_ONLY).items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    if (args.policy is None) == (args.algo is None):
        raise ValueError("tune: give exactly one of --policy NAME (a baseline's knobs) or --algo ppo")
    if args.address and args.backend == "local":
        raise ValueError("--address: for --backend ray only")
    if args.algo is not None and args.backend != "ray":
        raise ValueError("--algo ppo: PPO sweeps run on Ray Tune; add --backend ray")


def _search(args, show) -> dict:
    if args.algo is not None:
        overrides = {} if args.train_batch is None else {"train_batch_size_per_learner": args.train_batch}
        env_kwargs = {} if args.episode_requests is None else {"episode_requests": args.episode_requests}
        return tune.tune_ppo(args.env, budget=args.budget, search=args.search, iterations=args.iterations,
                             num_env_runners=args.num_env_runners, address=args.address, seed=args.seed,
                             env_kwargs=env_kwargs, overrides=overrides)
    trace = None
    if args.trace and args.scenario:
        trace = args.trace  # the scenario's required trace, by path (its fingerprint hashes the file)
    elif args.trace:
        trace = read_trace(args.trace, format=trace_format(args))
        print("note: a replayed trace is the same workload whatever the seed; for a held-out result, "
              "compare on another trace than the one tuned on", file=sys.stderr)
    return tune.tune_baseline(args.policy, args.env, budget=args.budget, search=args.search, seeds=args.seeds,
                              rates=args.rates, loads=args.loads, trace=trace, speed=args.speed,
                              episode_requests=(tune.TUNE_EPISODE_REQUESTS if args.episode_requests is None
                                                else args.episode_requests),
                              backend=args.backend, address=args.address, seed=args.seed, metric=args.metric,
                              progress=show, scenario=args.scenario)


def run(args) -> int:
    show = None if args.json else (lambda r: print(f"  {r['knobs']}: {r['score']:.4f}", file=sys.stderr, flush=True))
    doc = _search(args, show)
    tune.write_result(doc, args.out)
    if args.json:
        report.print_json(doc)
        return 0
    what = doc.get("policy") or doc["algo"]
    print(f"{what} on {doc['env']}: {len(doc['results'])} settings, {doc['metric']} ({doc['goal']})"
          + (f", training seeds {doc['seeds'][0]}..{doc['seeds'][-1]}" if "seeds" in doc else ""))
    print(tune.format_results(doc))
    for knob, values in doc.get("extended", {}).items():
        print(f"{knob}: best at the edge of its grid; extended with {values}")
    for edge, why in doc.get("limits", {}).items():
        print(f"{edge}: still at the edge, a hard limit: {why}")
    print(f"best: {doc['knobs']} ({doc['metric']} {doc['score']:.4f}); written to {args.out}")
    return 0


COMMAND = Command("tune", "search a baseline's knobs (or PPO's hyperparameters with Ray) on training seeds",
                  OPTIONS, run, check, RULES)
