"""``mooncake-gym overload``: the admission baselines under overload (Mooncake §7, lecture demo 3),
on the ``--preset``'s cluster (:func:`mooncake_gym.experiments.preset_runs.overload_run`)."""

from __future__ import annotations

from mooncake_gym.baselines import ADMISSION_POLICIES
from mooncake_gym.cli.options import (JSON, RUN_OUTPUTS, TRACE_FORMAT, Command, NoEffect, check_policy,
                                      opt, policy_opt, preset_opt, trace_format)
from mooncake_gym.experiments.preset_runs import check_overrides, overload_run
from mooncake_gym.model.workload import load_workload
from mooncake_gym.reporting import tables as report
from mooncake_gym.reporting.plots import plot_load_series
from mooncake_gym.reporting.requests import write_run_outputs
from mooncake_gym.sim.admission import DEMO3_BASE_RATE, DEMO3_LOAD, DEMO3_REQUESTS

OPTIONS = (
    policy_opt(ADMISSION_POLICIES, "admission"),
    opt("--trace", default="synthetic",
        help="base trace: a Mooncake JSONL file, or 'synthetic' (default); requests are drawn from it i.i.d. "
             "(or, with --replay, replayed)"),
    TRACE_FORMAT,
    opt("--replay", action="store_true",
        help="replay the trace's own requests at their own arrival times (as Mooncake's Table 3 was measured) "
             "instead of i.i.d. draws"),
    opt("--speed", type=float, default=None, limit="speed",
        help="with --replay: replay the trace this many times as fast (default 1)"),
    opt("--rate", type=float, default=None, limit="rate", synthetic=DEMO3_BASE_RATE,
        help=f"synthetic base trace: session arrivals per second (default {DEMO3_BASE_RATE:g})"),
    opt("--seed", type=int, default=0, limit="seed",
        help="seed of the synthetic base trace and of the i.i.d. draw (default 0)"),
    opt("--requests", type=int, default=None, limit="requests",
        help=f"requests drawn (default {DEMO3_REQUESTS:,})"),
    opt("--load", type=float, default=None, limit="load",
        help=f"arrival rate as a multiple of the decode pool's capacity (default {DEMO3_LOAD:g})"),
    opt("--ttft-slo", type=float, default=None, limit="ttft_slo_s",
        help="TTFT SLO in seconds (default 30, or the --preset's)"),
    opt("--prefill-instances", type=int, default=None, limit="n_prefill",
        help="prefill instances (default 8, or the --preset's)"),
    opt("--decode-instances", type=int, default=None, limit="n_decode",
        help="decode instances (default 8, or the --preset's)"),
    opt("--plot", default=None, help="write the load series of the policies run to this PNG file"),
    JSON,
    opt("--fresh-blocks", action="store_true", only=("batching", "the lecture's demo 3 keeps its i.i.d. draw as it is"),
        help="cluster presets: each re-drawn copy of a base request gets fresh ids for the blocks it "
             "brought into the base trace, so a long draw reuses only what each request reused there"),
    opt("--tbt-headroom", type=float, default=None, only=("batching", "the lecture's decode instance has no TBT"),
        help="cluster presets: the share of the TBT SLO the decode instances' admission check keeps "
             "free, in [0, 1) (default 0: a request joins if the next iteration fits the SLO)"),
    preset_opt("the admission baselines own the admission decision of the whole cluster, --load "
               "being a multiple of its measured saturation throughput"),
    *RUN_OUTPUTS,
)


RULES = (
    NoEffect(("requests", "load", "fresh_blocks"), lambda a: a.replay,
             "with --replay: the trace's own requests and arrivals are replayed"),
    NoEffect(("speed",), lambda a: not a.replay, "without --replay: it is the replay speed of the trace"),
)


def check(args) -> None:
    check_policy(args)
    check_overrides(args.preset, n_prefill=args.prefill_instances, ttft_slo_s=args.ttft_slo,
                    n_decode=args.decode_instances, prefill_option="--prefill-instances")


def run(args) -> int:
    base = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args))
    names = None if args.policy == "all" else [args.policy]
    load = DEMO3_LOAD if args.load is None else args.load
    n_requests = DEMO3_REQUESTS if args.requests is None else args.requests
    speed = (1.0 if args.speed is None else args.speed) if args.replay else None
    out = overload_run(base, args.preset, load, n_requests, names, seed=args.seed,
                       n_prefill=args.prefill_instances, n_decode=args.decode_instances, ttft_slo_s=args.ttft_slo,
                       fresh_blocks=args.fresh_blocks, tbt_headroom=args.tbt_headroom or 0.0, replay_speed=speed)
    if args.plot:
        plot_load_series(out.results, args.plot, title=out.title)
    written = write_run_outputs(out.results, out.trace, args.per_request, args.plot_dir, args.timeline,
                                title=out.title.split(":")[0])
    if args.json:
        report.print_json({"base_trace": base.name, "trace": out.trace.name, "requests": len(out.trace), **out.fields,
                           "results": {n: r.metrics for n, r in out.results.items()},
                           **({"written": written} if written else {})})
        return 0
    print(out.header)
    print(report.format_table([out.problem.run_row(n, r.metrics) for n, r in out.results.items()],
                              out.problem.run_columns))
    if args.plot:
        print(f"load series written to {args.plot}")
    for path in written:
        print(f"written: {path}")
    return 0


COMMAND = Command("overload", "admission baselines under overload (Mooncake §7, lecture demo 3)", OPTIONS, run, check,
                  RULES)
