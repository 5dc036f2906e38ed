"""``mooncake-gym cache``: hit rate versus capacity of one global cache (LRU, FIFO, optimal)."""

from __future__ import annotations

import sys

from mooncake_gym.analysis.cache import (DEFAULT_BLOCKS, DEFAULT_MODEL, POLICIES, WINDOWS, analyze_cache,
                                         parse_blocks, parse_gib, parse_policies)
from mooncake_gym.cli.options import JSON, Command, opt, trace_format, trace_opts
from mooncake_gym.model.costmodel import get_model
from mooncake_gym.model.workload import load_workload
from mooncake_gym.reporting import tables as report
from mooncake_gym.reporting.plots import plot_hit_rate

OPTIONS = (
    *trace_opts(positional=True),
    opt("--blocks", default=None, group="capacity",
        help=f"comma-separated capacities in blocks (default {','.join(map(str, DEFAULT_BLOCKS))})"),
    opt("--gib", default=None, group="capacity", help="comma-separated capacities in GiB of --model's KV"),
    opt("--model", default=DEFAULT_MODEL,
        help=f"model preset for GiB figures (default {DEFAULT_MODEL}; 320 KiB of KV per token)"),
    opt("--policies", default=",".join(POLICIES), help="comma-separated subset of lru,fifo,optimal (default all)"),
    opt("--window", choices=WINDOWS, default="all",
        help="measure all requests (default), or warm on the first half and measure the second "
             "(kvcache-simulator's convention)"),
    opt("--plot", default=None, metavar="FILE.png", help="write hit rate versus capacity to this PNG file"),
    JSON,
)


def check(args) -> None:
    """The capacities, policies and model, before reading or generating a trace."""
    if args.blocks is not None:
        parse_blocks(args.blocks)
    if args.gib is not None:
        parse_gib(args.gib)
    parse_policies(args.policies)
    get_model(args.model)


def run(args) -> int:
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args))
    analysis = analyze_cache(trace, blocks=args.blocks, gib=args.gib, model=args.model, policies=args.policies,
                             window=args.window)
    if args.plot:
        plot_hit_rate(analysis, args.plot)
    if args.json:
        report.print_json(analysis.to_dict())
        return 0
    print(f"{analysis.trace_name}: {analysis.requests:,} requests, {analysis.distinct_blocks:,} distinct blocks; "
          f"window {analysis.window}: {analysis.requests - analysis.warmup_requests:,} requests measured "
          f"after {analysis.warmup_requests:,} warm-up, {analysis.measured_tokens:,} tokens")
    print(report.cache_table(analysis))
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


COMMAND = Command("cache", "hit rate versus capacity of one global cache (LRU, FIFO, optimal)", OPTIONS, run, check)
