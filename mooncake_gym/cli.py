"""The ``mooncake-gym`` command line. Every subcommand that prints results takes ``--json``."""

from __future__ import annotations

import argparse
import sys

from . import report


def _add_trace_args(p: argparse.ArgumentParser, positional: bool = False) -> None:
    if positional:
        p.add_argument("trace", help="a Mooncake JSONL trace file, or 'synthetic'")
    else:
        p.add_argument("--trace", default="synthetic", help="a Mooncake JSONL trace file, or 'synthetic' (default)")
    p.add_argument("--rate", type=float, default=4.0, help="synthetic trace: session arrivals per second (default 4)")
    p.add_argument("--seed", type=int, default=0, help="synthetic trace: random seed (default 0)")


def _cmd_trace_stats(args) -> int:
    from .workload import load_workload

    stats = load_workload(args.trace, rate=args.rate, seed=args.seed).stats()
    if args.json:
        report.print_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:>22}: {report._cell(v, None)}")
    return 0


def _cmd_trace_generate(args) -> int:
    from .workload import synthetic_trace, write_trace

    trace = synthetic_trace(args.seed, args.rate, duration_s=args.duration, n_requests=args.requests)
    write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.1f} s) to {args.output}", file=sys.stderr)
    return 0


def _cmd_replay(args) -> int:
    from .routing import RoutingConfig, run_routing_baselines
    from .workload import load_workload

    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, speed=args.speed)
    config = RoutingConfig(n_instances=args.instances, cache_blocks=args.cache_blocks, ttft_slo_s=args.ttft_slo)
    names = None if args.policy == "all" else [args.policy]
    results = run_routing_baselines(trace, names, config, seed=args.seed, threshold=args.threshold)
    rows = [report.routing_row(name, r.metrics) for name, r in results.items()]
    if args.json:
        report.print_json({"trace": trace.name, "requests": len(trace), "rate_per_s": trace.rate,
                           "config": vars(config), "results": {n: r.metrics for n, r in results.items()}})
    else:
        print(f"{trace.name}: {len(trace)} requests, {trace.rate:.2f} requests/s; "
              f"{config.n_instances} instances x {config.cache_blocks} blocks, TTFT SLO {config.ttft_slo_s:g} s")
        print(report.format_table(rows, report.ROUTING_COLUMNS))
    return 0


def _cmd_lecture(args) -> int:
    from .lecture import run_lecture

    return run_lecture(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mooncake-gym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # --- trace -------------------------------------------------------------------------------
    p_trace = sub.add_parser("trace", help="inspect or generate workload traces")
    trace_sub = p_trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    p = trace_sub.add_parser("stats", help="statistics of a trace")
    _add_trace_args(p, positional=True)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_trace_stats)
    p = trace_sub.add_parser("generate", help="write a synthetic trace as JSONL")
    p.add_argument("--rate", type=float, default=4.0, help="session arrivals per second (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of session arrivals (default 600)")
    p.add_argument("--requests", type=int, default=None, help="cut to the first N requests")
    p.add_argument("-o", "--output", required=True, help="output JSONL file")
    p.set_defaults(func=_cmd_trace_generate)

    # --- lecture -----------------------------------------------------------------------------
    p = sub.add_parser("lecture", help="reproduce the lecture's demos (all that exist by default)")
    p.add_argument("--demo", type=int, choices=[1, 2, 3], default=None, help="run only this demo")
    p.add_argument("--plot", default=None, help="demo 3: write the load-series figure to this PNG file")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_lecture)

    # --- replay (routing) ----------------------------------------------------------------------
    from .baselines import ROUTING_POLICIES

    p = sub.add_parser("replay", help="replay a trace through the prefill-routing simulator")
    _add_trace_args(p)
    p.add_argument("--policy", default="all", choices=[*ROUTING_POLICIES, "all"],
                   help="routing baseline, or 'all' for one table of every baseline (default all)")
    p.add_argument("--instances", type=int, default=8, help="prefill instances (default 8)")
    p.add_argument("--cache-blocks", type=int, default=3000, help="local prefix-cache blocks per instance (default 3000)")
    p.add_argument("--ttft-slo", type=float, default=5.0, help="TTFT SLO in seconds (default 5)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed-up: 2 = arrivals twice as fast (default 1)")
    p.add_argument("--threshold", type=float, default=None, help="kvcentric's kvcache_balancing_threshold")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_replay)
    # --- overload (admission) ------------------------------------------------------------------
    # --- cache (hit rate versus capacity) -----------------------------------------------------
    # --- train / compare / bench ----------------------------------------------------------------
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear one-line error, no traceback
        print(f"mooncake-gym {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
