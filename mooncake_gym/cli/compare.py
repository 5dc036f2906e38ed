"""``mooncake-gym compare``: every baseline and trained agent on the same workloads (the main job),
on the ``--preset``'s environments (:func:`mooncake_gym.experiments.compare.compare`) or on
named scenarios (``--scenario``)."""

from __future__ import annotations

import sys

from mooncake_gym.agents import load_user_agent
from mooncake_gym.cli.options import (PRESET_DEFAULT, TRACE_FORMAT, Command, NoEffect, decode_model, floats, opt,
                                      preset_opt, trace_format)
from mooncake_gym.evaluation.problems import DECISIONS
from mooncake_gym.evaluation.scenarios import get_scenario
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.experiments.preset_runs import compare_header
from mooncake_gym.experiments.tune import read_tuned
from mooncake_gym.model.workload import read_trace
from mooncake_gym.reporting import tables as report

_LECTURE = "reserve"  # options of the lecture's v0 environments only
OPTIONS = (
    opt("--env", choices=[*DECISIONS, "all"], default="all", help="which problem (default all)"),
    opt("--seeds", type=int, default=cmp.DEFAULT_SEEDS, limit="seeds",
        help=f"held-out seeds per setting (default {cmp.DEFAULT_SEEDS})"),
    opt("--seed-base", type=int, default=cmp.COMPARE_SEED_BASE,
        help=f"evaluate on seeds B, B+1, ... (default {cmp.COMPARE_SEED_BASE:,}, the held-out range)"),
    opt("--rates", type=floats, default=None, limit="rate", help="routing session rates (default 4,8)",
        only=(_LECTURE, "the v1 environments' workloads are set by --loads (x the measured saturation)")),
    opt("--loads", type=floats, default=None, limit="load", help="admission loads, x decode capacity (default 2)"),
    opt("--trace", default=None, help="compare on this JSONL trace (routing: replayed; admission: base)"),
    TRACE_FORMAT,
    opt("--speed", type=float, default=None, limit="speed", help="replay speed of --trace (default 1)"),
    opt("--agent", default=None, only=(_LECTURE, "the shipped and --agent agents act on the v0 environments"),
        help="also evaluate this agent of your own (a zip with its JSON card, loaded without unpickling; or an "
             "RLlib checkpoint folder, with --unsafe-pickle and the ray extra)"),
    opt("--unsafe-pickle", action="store_true",
        help="allow --agent without a card (unpickled by SB3's load) or an RLlib checkpoint (pickled) and let its card's wrapper modules be "
             "imported: BOTH CAN RUN CODE (trusted files only)"),
    opt("--threads", type=int, default=1, limit="threads",
        help="torch threads for the agents' forward passes (default 1)"),
    opt("--workers", type=int, default=1,
        help="processes running the policies' episodes (default 1; the same tables whatever their number)"),
    opt("--agent-env", choices=list(DECISIONS), default=None,
        help="the problem --agent solves (default: found from its observation and action spaces)"),
    opt("--plot-dir", default=None, only=(_LECTURE, "the plots are drawn for the lecture's simulators only"),
        help="write TTFT box plots and CDFs and admission load series here"),
    opt("--no-progress", action="store_true", help="no progress bar"),
    opt("--tuned", action="append", default=None, metavar="FILE", only=(_LECTURE, "tuned knobs come from the v0 environments"),
        help="also run the baseline of this `mooncake-gym tune` result with its tuned knobs (repeatable)"),
    opt("--scenario", default=None, metavar="NAME[,NAME...]|all",
        help="compare on named benchmark scenarios instead (docs/scenarios.md); --trace gives the trace of "
             "those that need one, the others are skipped with the reason"),
    opt("--rollout", action="append", default=None, metavar="BASE[:H]",
        help="with --scenario: also the rollout reference over baseline BASE (its --tuned knobs if given) with "
             "a look-ahead of H requests (default 128 on routing, the episode's end on admission), a "
             "non-deployable reference row (repeatable; "
             "routing scenarios with the exact observation over a routing rule, admission and Conductor "
             "scenarios over an admission rule)"),
    opt("--json", action="store_true", group="format", help="print one JSON document"),
    opt("--markdown", action="store_true", group="format", help="print Markdown tables"),
    preset_opt("the baselines on mooncake_gym/PrefillRouting-v1 and OverloadAdmission-v1, "
               "--loads applying to both problems"),
)
_FIXED = "with --scenario: a scenario fixes its workload (docs/scenarios.md)"
RULES = (
    NoEffect(("speed", "rates", "loads", "plot_dir"), lambda a: a.scenario, _FIXED),
    NoEffect(("env",), lambda a: a.scenario and a.env != "all", "with --scenario: each scenario names its problem"),
    NoEffect(("preset",), lambda a: a.scenario and a.preset != PRESET_DEFAULT,
             "with --scenario: each scenario names its cluster"),
    NoEffect(("rollout",), lambda a: not a.scenario, "without --scenario: the rollout rows are scenarios' rows"),
    NoEffect(("speed",), lambda a: not a.trace, "without --trace: it is the replay speed of a trace"),
    NoEffect(("agent_env",), lambda a: not a.agent, "without --agent"),
    NoEffect(("rates",), lambda a: a.env == "admission" or a.trace,
             "with --env admission or --trace: it sets the synthetic routing workloads"),
    # on a cluster preset --loads sets both problems' loads
    NoEffect(("loads",), lambda a: a.env == "routing" and decode_model(a) == _LECTURE,
             "with --env routing: it sets the admission workloads"),
    NoEffect(("unsafe_pickle",), lambda a: not a.agent, "without --agent: the shipped agents load without unpickling"),
    NoEffect(("no_progress",), lambda a: a.json, "with --json: --json never shows a progress bar"),
)


def check(args) -> None:
    cmp.check_workers(args.workers)
    if args.scenario and args.scenario != "all":
        for name in args.scenario.split(","):
            get_scenario(name.strip())  # an unknown name is named before any work
    args.speed = 1.0 if args.speed is None else args.speed
    args.rollouts = [cmp.parse_rollout(r) for r in args.rollout or ()]


def _agents_and_tuned(args):
    """``--agent`` (with the shipped agents) and the ``--tuned`` documents, checked against ``--env``."""
    agents = None
    if args.agent:
        model = load_user_agent(args.agent, trusted=args.unsafe_pickle)
        problem = args.agent_env or cmp.problem_of(model)
        if args.env not in ("all", problem) and not args.scenario:
            raise ValueError(f"--agent: the agent solves {problem}, but --env is {args.env}")
        agents = {**cmp.shipped_agents(), "user_agent": (problem, model)}
    tuned = None
    if args.tuned:
        tuned = [read_tuned(path) for path in args.tuned]
        for path, doc in zip(args.tuned, tuned):
            if args.env not in ("all", doc["env"]):
                raise ValueError(f"--tuned {path}: tuned for {doc['env']}, but --env is {args.env}")
    return agents, tuned


def _run_scenarios(args, agents, tuned) -> int:
    """``compare --scenario NAME[,NAME...]|all``: one ranked table per scenario, its fingerprint above it."""
    names = "all" if args.scenario == "all" else [n.strip() for n in args.scenario.split(",") if n.strip()]
    settings, skipped = cmp.compare_scenarios(names, seeds=args.seeds, trace=args.trace, agents=agents, tuned=tuned,
                                              progress=not (args.json or args.no_progress), threads=args.threads,
                                              seed_base=args.seed_base, rollouts=args.rollouts, workers=args.workers)
    if agents and "user_agent" in agents and not any(r["policy"] == "user_agent" for s in settings for r in s.rows):
        only = cmp.agent_scenarios(agents["user_agent"][1])
        why = (f"its card's \"scenarios\" is {only}" if only is not None
               else "it solves another problem, or its spaces fit none of them")
        print(f"note: --agent: in no table of these scenarios: {why}", file=sys.stderr)
    if args.json:
        doc = cmp.settings_json(settings, args.seeds, args.seed_base)
        for s, out in zip(settings, doc["settings"]):
            out.update({"scenario": s.scenario, "fingerprint": s.fingerprint})
        doc["skipped"] = skipped
        report.print_json(doc)
        return 0
    print(cmp.scenario_tables(settings, skipped, args.seeds, args.seed_base, list(zip(args.tuned or [], tuned or [])),
                              markdown=args.markdown), end="")
    return 0


def run(args) -> int:
    agents, tuned = _agents_and_tuned(args)
    if args.scenario:
        return _run_scenarios(args, agents, tuned)
    trace = read_trace(args.trace, format=trace_format(args)) if args.trace else None
    settings = cmp.compare(args.env, args.seeds, args.rates, args.loads, trace, args.speed, agents=agents,
                           plot_dir=args.plot_dir, progress=not (args.json or args.no_progress), threads=args.threads,
                           tuned=tuned, preset=args.preset, seed_base=args.seed_base, workers=args.workers)
    elsewhere = cmp.agents_elsewhere(settings) if args.agent is None else []
    if args.json:
        report.print_json({**cmp.settings_json(settings, args.seeds, args.seed_base), "agents_elsewhere": elsewhere})
        return 0
    print(compare_header(args.preset, args.seeds, args.seed_base))
    for path, doc in zip(args.tuned or [], tuned or []):
        print(f"{doc['policy']} (tuned): {doc['knobs']} from {path}")
    for s in settings:
        print(f"\n{'### ' if args.markdown else ''}{s.label}\n")
        print(cmp.format_setting(s, markdown=args.markdown))
    if elsewhere:
        print(f"\n{cmp.format_elsewhere(elsewhere)}")
    if args.plot_dir:
        print(f"\nplots written to {args.plot_dir}")
    return 0


COMMAND = Command("compare", "every baseline and trained agent on the same workloads (the main job)", OPTIONS, run,
                  check, RULES)
