"""``mooncake-gym sweep``: baselines over a range of loads on one cluster preset, as a table and a
figure (:func:`mooncake_gym.experiments.sweep.sweep`)."""

from __future__ import annotations

from mooncake_gym.cli.options import Command, opt, floats, trace_format, trace_opts
from mooncake_gym.experiments.preset_runs import describe
from mooncake_gym.experiments.sweep import SWEEP_LOADS, SWEEP_POLICIES, sweep
from mooncake_gym.model.presets import PRESETS, get_preset
from mooncake_gym.model.workload import load_workload
from mooncake_gym.reporting import tables as report
from mooncake_gym.reporting.plots import plot_sweep
from mooncake_gym.sim.policy import is_policy_spec, load_policy

COLUMNS = [("load", "load", ".2f"), ("policy", "policy", None), ("arrival_rate_per_s", "req/s", ".2f"),
           ("mean_ttft_s", "mean TTFT s", ".2f"), ("p99_ttft_s", "P99 TTFT s", ".2f"),
           ("ttft_attainment", "TTFT<=SLO", ".3f"), ("tbt_attainment", "TBT<=SLO", ".3f"),
           ("rejected_at_arrival", "rejected", "d"), ("rejected_after_prefill", "after prefill", "d"),
           ("good_requests", "good requests", "d"), ("token_goodput_per_s", "token goodput/s", ",.0f")]


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


OPTIONS = (
    opt("--decision", choices=list(SWEEP_POLICIES), default="routing",
        help="which decision the baselines own: routing (every request admitted) or admission (default routing)"),
    opt("--policy", default="all",
        help="baselines or your own policies (FILE.py:NAME, MODULE:NAME), comma-separated, or 'all' (default all)"),
    opt("--loads", type=floats, default=None, limit="load",
        help="loads, x the cluster's measured saturation (default 0.5,0.7,0.9,1.1 for routing, "
             "0.5,1,1.5,2,3 for admission)"),
    opt("--requests", type=int, default=2000, limit="requests", help="requests drawn per load (default 2,000)"),
    *trace_opts(rate=4.0, seed=None),
    opt("--fresh-blocks", action="store_true",
        help="each re-drawn copy of a base request gets fresh ids for the blocks it brought (see overload)"),
    opt("--preset", choices=tuple(PRESETS), default="mooncake", help="cluster preset (default mooncake)"),
    opt("--plot", default=None, help="write mean/P99 TTFT, TBT attainment and goodput against load to this PNG"),
    opt("--json", action="store_true", group="format", help="print one JSON document"),
    opt("--markdown", action="store_true", group="format", help="print a Markdown table"),
)


def check(args) -> None:
    if args.policy != "all":
        known = SWEEP_POLICIES[args.decision]
        for name in _names(args.policy):
            if is_policy_spec(name):
                load_policy(name)
            elif name not in known:
                raise ValueError(f"--policy: expected {args.decision} baselines of {list(known)} or 'all', got {name!r}")
        if len(set(_names(args.policy))) != len(_names(args.policy)):
            raise ValueError(f"--policy: a baseline is named twice in {args.policy!r}")


def run(args) -> int:
    base = load_workload(args.trace, rate=args.rate, seed=args.seed, trace_format=trace_format(args))
    loads = args.loads or list(SWEEP_LOADS[args.decision])
    names = None if args.policy == "all" else _names(args.policy)
    out = sweep(base, args.preset, args.decision, names, loads, args.requests, seed=args.seed,
                fresh_blocks=args.fresh_blocks)
    title = f"{base.name}: {args.decision} baselines on {args.preset}"
    if args.plot:
        plot_sweep(out["rows"], args.plot, title=title)
    if args.json:
        report.print_json({"base_trace": base.name, "preset": args.preset, "decision": args.decision,
                           "requests": args.requests, **out})
        return 0
    sat = out["saturation"]
    print(f"base {base.name}: {describe(get_preset(args.preset))}; measured saturation {sat['cluster_per_s']:.2f} "
          f"requests/s ({sat['bottleneck']} pool first); {args.requests:,} i.i.d. requests per load"
          + ("\n" if args.markdown else ""))
    print(report.format_table(out["rows"], COLUMNS, markdown=args.markdown))
    if args.plot:
        print(f"sweep plot written to {args.plot}")
    return 0


COMMAND = Command("sweep", "baselines over a range of loads on one cluster preset (table and plot)", OPTIONS,
                  run, check)
