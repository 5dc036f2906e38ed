"""``mooncake-gym trace stats`` and ``trace generate``: inspect or write workload traces."""

from __future__ import annotations

import sys

from mooncake_gym.cli.options import JSON, Command, opt, trace_opts
from mooncake_gym.model.workload import load_workload, synthetic_trace, write_trace
from mooncake_gym.reporting import tables as report


def run_stats(args) -> int:
    stats = load_workload(args.trace, rate=args.rate, seed=args.seed).stats()
    if args.json:
        report.print_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:>22}: {report.format_cell(v)}")
    return 0


def run_generate(args) -> int:
    trace = synthetic_trace(args.seed, args.rate, duration_s=args.duration, n_requests=args.requests)
    write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.1f} s) to {args.output}", file=sys.stderr)
    return 0


STATS = Command("trace stats", "statistics of a trace", (*trace_opts(positional=True), JSON), run_stats)
GENERATE = Command("trace generate", "write a synthetic trace as JSONL", (
    opt("--rate", type=float, default=4.0, limit="rate", help="session arrivals per second (default 4)"),
    opt("--seed", type=int, default=0, limit="seed", help="random seed (default 0)"),
    opt("--duration", type=float, default=600.0, limit="duration_s",
        help="seconds of session arrivals (default 600)"),
    opt("--requests", type=int, default=None, limit="requests", help="cut to the first N requests"),
    opt("-o", "--output", required=True, help="output JSONL file"),
), run_generate)
#: ``trace``'s help and its subcommands
HELP = "inspect or generate workload traces"
COMMANDS = (STATS, GENERATE)
