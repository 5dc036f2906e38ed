"""``mooncake-gym replay``: the routing baselines on a trace, on the ``--preset``'s cluster
(:func:`mooncake_gym.experiments.preset_runs.replay_setup`: the lecture's routing simulator, or the
whole cluster of a realistic preset)."""

from __future__ import annotations

from dataclasses import asdict

from mooncake_gym.baselines import ROUTING_POLICIES
from mooncake_gym.cli.options import (JSON, RUN_OUTPUTS, Command, NoEffect, check_policy, opt,
                                      policy_opt, preset_opt, trace_format, trace_opts)
from mooncake_gym.experiments.compare import with_tuned
from mooncake_gym.experiments.preset_runs import check_overrides, replay_setup
from mooncake_gym.experiments.tune import read_tuned
from mooncake_gym.model.workload import load_workload
from mooncake_gym.reporting import tables as report
from mooncake_gym.reporting.requests import write_run_outputs
from mooncake_gym.sim.observation import as_observation
from mooncake_gym.sim.routing import parse_instances

_LECTURE = ("reserve",)  # options of the lecture's routing simulator only
_CLUSTER = ("batching",)

OPTIONS = (
    *trace_opts(rate=4.0, seed=None),
    policy_opt(ROUTING_POLICIES, "routing"),
    opt("--instances", type=int, default=None, limit="n_instances",
        help="prefill instances (default 8, or --pool's or the --preset's)"),
    opt("--decode-instances", type=int, default=None, limit="n_decode",
        only=(*_CLUSTER, "the lecture's routing simulator has no decode pool"),
        help="cluster presets: decode instances (default the --preset's)"),
    opt("--pool", default=None, metavar="4xH800+4xA800",
        only=(*_LECTURE, "a heterogeneous prefill pool is built for the lecture's routing simulator only"),
        help="a heterogeneous pool: COUNTxGPU joined by '+' (GPUs: A100, A800, H100, H800)"),
    opt("--observation", action="append", default=None, metavar="MODE[,FIELD=VALUE...]",
        help="what the router sees: exact (default), or scraped, approximate|precise, noisy joined by "
             "'+', with ObservationConfig fields, e.g. 'scraped+noisy,scrape_delay_s=0.5'; repeat it "
             "for one table of every mode (JSON: results keyed by mode)"),
    opt("--markdown", action="store_true", help="print a Markdown table"),
    opt("--cache-blocks", type=int, default=None, limit="cache_blocks",
        help="local prefix-cache blocks per instance (default 3000, or the --preset's)"),
    opt("--ttft-slo", type=float, default=None, limit="ttft_slo_s",
        help="TTFT SLO in seconds (default 5, or the --preset's)"),
    opt("--speed", type=float, default=1.0, limit="speed",
        help="replay speed-up: 2 = arrivals twice as fast (default 1)"),
    opt("--threshold", type=float, default=None, limit="threshold", help="kvcentric's kvcache_balancing_threshold"),
    opt("--tuned", action="append", default=None, metavar="FILE",
        only=(*_LECTURE, "tuned knobs come from the v0 environments"),
        help="also run the baseline of this `mooncake-gym tune --env routing` result with its tuned knobs, "
             "as 'NAME (tuned)' (repeatable)"),
    JSON,
    preset_opt("the routing baselines own the prefill decision of the whole cluster (conductor.simulate; TTFT and TBT)"),
    *RUN_OUTPUTS,
)
RULES = (
    NoEffect(("threshold",), lambda a: a.policy not in ("kvcentric", "all"),
             lambda a: f"with --policy {a.policy}: it is kvcentric's"),
    NoEffect(("markdown",), lambda a: a.json, "with --json: --json prints one JSON document"),
)
_ONE_MODE = "with several --observation: give one, the per-request outputs are of one run per policy"


def check(args) -> None:
    check_policy(args)
    for dest, flag in (("per_request", "--per-request"), ("plot_dir", "--plot-dir"), ("timeline", "--timeline")):
        if getattr(args, dest) is not None and len(args.observation or ()) > 1:
            raise ValueError(f"{flag}: {_ONE_MODE}")
    if args.pool is not None:
        n = len(parse_instances(args.pool))
        if args.instances is not None and args.instances != n:
            raise ValueError(f"--instances: expected {n} (the length of --pool {args.pool}) or leave it out, "
                             f"got {args.instances}")
    for mode in args.observation or ():
        try:
            as_observation(mode)  # a bad mode or setting is named before the trace is read
        except ValueError as e:
            raise ValueError(f"--observation {mode}: {e}") from None
    args.tuned_docs = [read_tuned(path) for path in args.tuned or ()]
    for path, doc in zip(args.tuned or (), args.tuned_docs):
        if doc["env"] != "routing":
            raise ValueError(f"--tuned {path}: tuned for {doc['env']}, but replay routes")
    check_overrides(args.preset, n_prefill=args.instances, cache_blocks=args.cache_blocks, ttft_slo_s=args.ttft_slo,
                    n_decode=args.decode_instances)


def run(args) -> int:
    setup = replay_setup(args.preset, args.instances, args.cache_blocks, args.ttft_slo, args.decode_instances,
                         args.pool)
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args),
                          speed=args.speed)
    modes = args.observation or ["exact"]
    observations = [as_observation(m) for m in modes]
    names = None if args.policy == "all" else [args.policy]
    by_mode = {}
    for mode, observation in zip(modes, observations):
        runs = setup.run(trace, names, args.seed, args.threshold, observation)
        # each tuned baseline right after its default row, under every observation mode
        by_mode[mode] = {name: runs[name] if policy is None else
                         setup.simulate(trace, policy.policy, args.seed, observation)
                         for name, policy in with_tuned(dict.fromkeys(runs), "routing", args.tuned_docs).items()}
    bound = setup.bound(trace)  # what no routing policy beats
    written = write_run_outputs(by_mode[modes[0]], trace, args.per_request, args.plot_dir, args.timeline,
                                title=f"{trace.name}: {setup.describe}")
    if args.json:
        doc = {"trace": trace.name, "requests": len(trace), "rate_per_s": trace.rate, **setup.setup_json,
               "bound": {"mean_ttft_s": bound}}
        if len(modes) == 1:
            doc["observation"] = asdict(observations[0])
            doc["results"] = {n: r.metrics for n, r in by_mode[modes[0]].items()}
        else:  # one entry per --observation
            doc["observation"] = {mode: asdict(o) for mode, o in zip(modes, observations)}
            doc["results"] = {mode: {n: r.metrics for n, r in res.items()} for mode, res in by_mode.items()}
        report.print_json({**doc, **({"written": written} if written else {})})
        return 0
    columns = setup.problem.run_columns
    if len(modes) > 1:
        columns = [columns[0], ("observation", "observation", None), *columns[1:]]
    rows = [{**setup.problem.run_row(name, r.metrics), "observation": mode}
            for mode, res in by_mode.items() for name, r in res.items()]
    if args.policy == "all":  # the table of every policy ends with what none of them beats
        rows.append({"policy": "bound", "mean_ttft_s": bound})
    seen = "" if len(modes) > 1 or observations[0].exact else f"; observation {modes[0]}"
    print(f"{trace.name}: {len(trace)} requests, {trace.rate:.2f} requests/s; {setup.describe}{seen}"
          + ("\n" if args.markdown else ""))
    print(report.format_table(rows, columns, markdown=args.markdown))
    for path in written:
        print(f"written: {path}")
    return 0


COMMAND = Command("replay", "replay a trace through the prefill-routing simulator", OPTIONS, run, check, RULES)
