"""``mooncake-gym trace stats`` and ``trace generate``: inspect or write workload traces."""

from __future__ import annotations

import sys

from mooncake_gym.cli.options import JSON, Command, opt, trace_format, trace_opts
from mooncake_gym.model.traceformats import PREFIX_RULES, TRACE_FORMATS, parse_format
from mooncake_gym.model.workload import load_workload, read_trace, synthetic_trace, write_trace
from mooncake_gym.reporting import tables as report


def run_stats(args) -> int:
    stats = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args)).stats()
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


def run_convert(args) -> int:
    fmt = parse_format(args.format, args.columns)
    trace = read_trace(args.input, format=fmt, prefix=args.prefix)
    write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.1f} s) from {args.input} ({fmt}) to {args.output}; "
          f"prefix ids: {trace.prefix_ids}", file=sys.stderr)
    return 0


def check_convert(args) -> None:
    try:
        fmt = parse_format(args.format, args.columns)
    except ValueError as e:
        raise ValueError(f"--{'columns' if str(e).startswith('columns') else 'format'}: {e}") from None
    if fmt.kind == "csv" and args.columns is None and args.format == "csv":
        raise ValueError("--columns: the csv format needs its columns: --columns timestamp=COL,input=COL,output=COL")


STATS = Command("trace stats", "statistics of a trace", (*trace_opts(positional=True), JSON), run_stats)
GENERATE = Command("trace generate", "write a synthetic trace as JSONL", (
    opt("--rate", type=float, default=4.0, limit="rate", help="session arrivals per second (default 4)"),
    opt("--seed", type=int, default=0, limit="seed", help="random seed (default 0)"),
    opt("--duration", type=float, default=600.0, limit="duration_s",
        help="seconds of session arrivals (default 600)"),
    opt("--requests", type=int, default=None, limit="requests", help="cut to the first N requests"),
    opt("-o", "--output", required=True, output=(), help="output JSONL file"),
), run_generate)
CONVERT = Command("trace convert", "convert an Azure, BurstGPT or CSV trace to Mooncake's JSONL", (
    opt("input", help="the trace file to convert"),
    opt("--format", required=True, choices=[f for f in TRACE_FORMATS if f != "mooncake"] + ["mooncake"],
        help="its format: azure (TIMESTAMP,ContextTokens,GeneratedTokens), burstgpt (Timestamp,...,Request "
             "tokens,Response tokens,...), csv (with --columns), or mooncake (a JSONL, e.g. one without hash_ids)"),
    opt("--columns", default=None, metavar="timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime]",
        help="csv: the header names of its columns, and the timestamp's unit (default s)"),
    opt("--prefix", choices=list(PREFIX_RULES), default=None,
        help="how prefix block ids are made, the source having none: none (no request shares a prefix) or "
             "session (a request shares the previous request of its session's full blocks); default session "
             "where the source names sessions, else none"),
    opt("-o", "--output", required=True, output=(), help="output JSONL file (written whole or not at all)"),
), run_convert, check_convert)
#: ``trace``'s help and its subcommands
HELP = "inspect, generate or convert workload traces"
COMMANDS = (STATS, GENERATE, CONVERT)
