"""``mooncake-gym cache``: hit rate versus capacity of one global cache (LRU, FIFO, optimal); with
``--stores``, FAST'25 Figure 10: each prefill node's own KV store against Mooncake Store's global pool."""

from __future__ import annotations

import sys

from mooncake_gym.analysis.cache import (DEFAULT_BLOCKS, DEFAULT_MODEL, FIGURE10_PREFILL_NODES, POLICIES,
                                         STORE_ROUTERS, WINDOWS, analyze_cache, compare_stores, parse_blocks,
                                         parse_gib, parse_policies)
from mooncake_gym.cli.options import JSON, Command, opt, trace_format, trace_opts
from mooncake_gym.model.costmodel import get_model
from mooncake_gym.model.presets import EVICTIONS, PRESETS
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
    opt("--policies", default=",".join(POLICIES),
        help="comma-separated subset of lru,fifo,optimal,rlt (default lru,fifo,optimal; rlt: randomized leaf eviction)"),
    opt("--window", choices=WINDOWS, default="all",
        help="measure all requests (default), or warm on the first half and measure the second "
             "(kvcache-simulator's convention)"),
    opt("--plot", default=None, metavar="FILE.png", help="write hit rate versus capacity to this PNG file"),
    opt("--stores", action="store_true",
        help="FAST'25 Figure 10: route the trace's own arrivals through --preset's prefill pool, each node "
             "reading its own DRAM (+ SSD) cache (local) or any node's over RDMA (global)"),
    opt("--preset", choices=tuple(PRESETS), default="mooncake", help="--stores: the cluster (default mooncake)"),
    opt("--prefill-nodes", type=int, default=FIGURE10_PREFILL_NODES, limit="n_instances",
        help=f"--stores: prefill nodes (default {FIGURE10_PREFILL_NODES}, as FAST'25 Figure 10)"),
    opt("--routers", default=",".join(STORE_ROUTERS),
        help=f"--stores: comma-separated routing baselines (default {','.join(STORE_ROUTERS)})"),
    opt("--eviction", choices=EVICTIONS, default="lru", help="--stores: the DRAM caches' eviction (default lru)"),
    JSON,
)


def check(args) -> None:
    """The capacities, policies and model, before reading or generating a trace."""
    if args.stores:
        for name in ("blocks", "gib", "plot"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name}: has no effect with --stores (the caches are --preset's); leave it out")
        from mooncake_gym.baselines import make_policy
        for name in args.routers.split(","):
            make_policy("routing", name.strip())
    if args.blocks is not None:
        parse_blocks(args.blocks)
    if args.gib is not None:
        parse_gib(args.gib)
    parse_policies(args.policies)
    get_model(args.model)


def run(args) -> int:
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args))
    if args.stores:
        rows = compare_stores(trace, args.preset, args.prefill_nodes, args.routers, eviction=args.eviction,
                              seed=args.seed or 0)
        if args.json:
            report.print_json(rows)
            return 0
        print(f"{getattr(trace, 'name', 'trace')}: {len(trace):,} requests on {args.prefill_nodes} prefill nodes of "
              f"{args.preset} (eviction {args.eviction})")
        print(report.format_table([{**r, "ssd": "yes" if r["ssd"] else "no"} for r in rows], STORE_COLUMNS))
        return 0
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


STORE_COLUMNS = [("ssd", "SSD tier", None), ("router", "router", None), ("store", "store", None),
                 ("hit_ratio", "hit ratio", ".4f"), ("dram_share", "own DRAM", ".4f"), ("ssd_share", "own SSD", ".4f"),
                 ("remote_share", "remote", ".4f"), ("mean_ttft_s", "mean TTFT s", ".3f"),
                 ("p90_ttft_s", "P90 TTFT s", ".3f"), ("mean_prefill_s", "mean prefill s", ".3f"),
                 ("computed_tokens", "computed tokens", ",")]

COMMAND = Command("cache", "hit rate versus capacity of one global cache (LRU, FIFO, optimal)", OPTIONS, run, check)
