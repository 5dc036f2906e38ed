"""``--preset`` on ``replay``, ``overload`` and ``compare``: the cluster presets on the command line.

The ``lecture`` preset (the default) runs the lecture's simulators (``routing``, ``overload``) and the
v0 environments, exactly as without the option. The realistic presets (``mooncake``,
``mooncake-overload``, ``h100``; ``mooncake_gym.model.presets.PRESETS``) run the whole disaggregated
cluster of :mod:`mooncake_gym.sim.cluster` instead:

- ``replay``: every routing baseline owns the prefill-instance decision of
  :func:`conductor.simulate` (admit-all, the default decode rule), on the replayed or synthetic
  trace; the table gives TTFT and TBT side by side.
- ``overload``: every admission baseline owns the admission decision (kvcentric routing, the default
  decode rule) on :func:`conductor.overload_workload`'s requests, whose arrival rate is ``load`` x
  the cluster's measured saturation throughput (:func:`conductor.saturation`).
- ``compare``: the same baselines through the v1 environments (``mooncake_gym/PrefillRouting-v1``,
  ``mooncake_gym/OverloadAdmission-v1``) on held-out seeds, mean and 95 % CI per metric, each table
  ending with a ``bound`` row (``compare.BOUNDS``): a lower bound on mean TTFT
  (``bounds.cluster_ttft_bound``), an upper bound on token goodput and good requests
  (``bounds.admission_goodput_bound``).
"""

from __future__ import annotations

from mooncake_gym.sim.policy import policy_name, reset_policy
from mooncake_gym.model.presets import PRESETS, ClusterPreset, get_preset

#: The presets the command line accepts; ``lecture`` is the default and keeps the lecture's simulators.
PRESET_NAMES = tuple(PRESETS)
LECTURE = "lecture"

#: Columns of a routing table on a cluster preset (replay, and compare's means).
CLUSTER_ROUTING_COLUMNS = [
    ("policy", "policy", None),
    ("mean_ttft_s", "mean TTFT s", ".2f"),
    ("p90_ttft_s", "P90 TTFT s", ".2f"),
    ("ttft_attainment", "TTFT<=SLO", ".3f"),
    ("mean_tbt_s", "mean TBT s", ".3f"),
    ("p90_tbt_s", "P90 TBT s", ".3f"),
    ("tbt_attainment", "TBT<=SLO", ".3f"),
    ("goodput", "goodput", ".0f"),
    ("rejected_after_prefill", "after prefill", ".0f"),
    ("hit_ratio", "hit share", ".3f"),
]

#: Columns of an admission table on a cluster preset (overload, and compare's means).
CLUSTER_ADMISSION_COLUMNS = [
    ("policy", "policy", None),
    ("completed", "completed", ".0f"),
    ("goodput", "goodput", ".0f"),
    ("rejected_at_arrival", "rejected", ".0f"),
    ("rejected_after_prefill", "after prefill", ".0f"),
    ("preempted", "preempted", ".0f"),
    ("refused_too_long", "too long", ".0f"),
    ("wasted_prefill_s", "wasted prefill s", ".0f"),
    ("ttft_attainment", "TTFT<=SLO", ".3f"),
    ("tbt_attainment", "TBT<=SLO", ".3f"),
    ("p99_tbt_s", "P99 TBT s", ".3f"),
    ("load_correlation", "P/D corr", "+.2f"),
]

#: compare's admission table on a cluster preset: the overload table with the two metrics its bound
#: row bounds (``bounds.admission_goodput_bound``: good requests that started decoding by the last
#: arrival, and their output tokens), after ``goodput`` (which also counts the drain's).
CLUSTER_COMPARE_ADMISSION_COLUMNS = [
    *CLUSTER_ADMISSION_COLUMNS[:3],
    ("token_goodput", "token goodput", ".0f"),
    ("goodput_requests", "good by horizon", ".0f"),
    *CLUSTER_ADMISSION_COLUMNS[3:],
]

#: compare's problem names on a cluster preset (``compare.columns_of`` knows their columns).
CLUSTER_PROBLEMS = {"routing": "routing-cluster", "admission": "admission-cluster"}
#: compare's default loads on a cluster preset, per problem (multiples of the measured saturation):
#: PrefillRouting-v1's default load, and the lecture's admission load.
DEFAULT_LOADS = {"routing": (0.9,), "admission": (2.0,)}


def cluster_preset(name: str | ClusterPreset, n_prefill: int | None = None, cache_blocks: int | None = None,
                   ttft_slo_s: float | None = None, n_decode: int | None = None,
                   prefill_option: str = "--instances") -> ClusterPreset:
    """The preset ``name`` with the command line's overrides (None: the preset's own). A preset
    whose prefill pool lists its GPUs (``mooncake-hetero``) keeps its size: another ``n_prefill``
    is a ``ValueError`` naming ``prefill_option``."""
    p = get_preset(name)
    if n_prefill is not None and p.prefill_gpus is not None and n_prefill != p.n_prefill:
        raise ValueError(f"{prefill_option}: preset {p.name}'s prefill pool is {pool_string(p.prefill_gpus)}; "
                         f"expected {p.n_prefill} or leave it out, got {n_prefill}")
    changes = {k: v for k, v in (("n_prefill", n_prefill), ("n_decode", n_decode), ("cache_blocks", cache_blocks),
                                 ("ttft_slo_s", ttft_slo_s)) if v is not None}
    return p.with_(**changes) if changes else p


def pool_string(gpus) -> str:
    """A pool's GPUs in ``--pool``'s notation: runs of one GPU as COUNTxGPU joined by '+'
    (``("H800", "H800", "A800")`` -> ``"2xH800+1xA800"``)."""
    from itertools import groupby

    return "+".join(f"{len(list(run))}x{gpu}" for gpu, run in groupby(gpus))


def command_preset(command: str, args) -> ClusterPreset:
    """The cluster of ``replay`` or ``overload``: ``--preset`` with the command's pool, cache and SLO options."""
    if command == "replay":
        return cluster_preset(args.preset, args.instances, args.cache_blocks, args.ttft_slo, args.decode_instances)
    return cluster_preset(args.preset, args.prefill_instances, ttft_slo_s=args.ttft_slo,
                          n_decode=args.decode_instances, prefill_option="--prefill-instances")


def describe(p: ClusterPreset) -> str:
    """One line naming the preset and its cluster, for the tables' headers."""
    pool = "" if p.prefill_gpus is None else f" ({pool_string(p.prefill_gpus)})"
    return (f"preset {p.name}: {p.n_prefill} prefill{pool} + {p.n_decode} decode instances, "
            f"{p.capacity_tokens:,} KV tokens per decode instance, {p.cache_blocks} cache blocks per prefill "
            f"instance, TTFT SLO {p.ttft_slo_s:g} s, TBT SLO {p.tbt_slo_s * 1000:g} ms")


def table_row(name: str, metrics: dict) -> dict:
    """A table row of one cluster run's metrics (an undefined correlation prints as '-')."""
    row = {**metrics, "policy": name}
    corr = row.get("load_correlation")
    if corr is not None and corr != corr:  # NaN: the load series never changed
        row["load_correlation"] = None
    return row


class OnRoutingView:
    """A routing baseline acting on a :class:`~mooncake_gym.sim.cluster.ClusterView`: it answers
    with the route it picks on the view's prefill pool (``view.routing``), as
    ``conductor.simulate(routing=...)`` asks it; ``reset(rng)`` reaches the baseline."""

    def __init__(self, policy):
        self.policy = policy
        self.name = policy_name(policy)

    def reset(self, rng) -> None:
        reset_policy(self.policy, rng)

    def __call__(self, view):
        return self.policy(view.routing)


def replay(trace, preset: ClusterPreset, names, seed: int = 0, threshold: float | None = None,
           observation=None) -> dict:
    """Every routing baseline of ``names`` (None: all) owning the prefill decision on ``preset``'s
    cluster over ``trace``: ``{name: ClusterResult}`` (admit-all, the default decode rule)."""
    from mooncake_gym.baselines import ROUTING_POLICIES, make_policy
    from mooncake_gym.sim.cluster import simulate

    results = {}
    for name in list(ROUTING_POLICIES) if names is None else names:
        kwargs = {"threshold": threshold} if name == "kvcentric" and threshold is not None else {}
        results[name] = simulate(trace, preset, routing=make_policy("routing", name, **kwargs), seed=seed,
                                 observation=observation)
    return results


def overload(base, preset: ClusterPreset, load: float, n_requests: int, names, seed: int = 0,
             fresh_blocks: bool = False, tbt_headroom: float = 0.0):
    """Every admission baseline of ``names`` (None: all) owning the admission decision on
    ``preset``'s cluster, over ``n_requests`` requests drawn i.i.d. from ``base`` at ``load`` x the
    cluster's measured saturation (``fresh_blocks``: see :func:`conductor.overload_workload`;
    ``tbt_headroom``: see :class:`conductor.ClusterSimulator`).
    Returns ``(trace, saturation, {name: ClusterResult})``."""
    from mooncake_gym.baselines import ADMISSION_POLICIES, make_policy
    from mooncake_gym.sim.cluster import overload_workload, simulate

    trace, sat = overload_workload(base, load, n_requests, seed, preset, fresh_blocks=fresh_blocks)
    results = {name: simulate(trace, preset, admission=make_policy("admission", name), seed=seed,
                              tbt_headroom=tbt_headroom)
               for name in (list(ADMISSION_POLICIES) if names is None else names)}
    return trace, sat, results


def compare_settings(preset: str | ClusterPreset, env: str = "all", loads=None, trace=None, speed: float = 1.0,
                     episode_requests: int = 3000) -> list:
    """compare's settings on ``preset``: ``mooncake_gym/PrefillRouting-v1`` (at each load, or
    replaying ``trace`` at ``speed``) and ``mooncake_gym/OverloadAdmission-v1`` (at each load, on
    ``trace`` as base if given). ``loads``: multiples of the measured saturation (None: per problem,
    ``DEFAULT_LOADS``)."""
    from mooncake_gym.experiments.compare import Setting
    from mooncake_gym.envs import ADMISSION_V1_ENV_ID, ROUTING_V1_ENV_ID

    name = get_preset(preset).name
    settings = []
    base = {"preset": preset, "episode_requests": episode_requests}
    if env in ("routing", "all"):
        if trace is not None:
            settings.append(Setting(CLUSTER_PROBLEMS["routing"],
                                    f"routing ({name}): trace {trace.name} at speed {speed:g}",
                                    ROUTING_V1_ENV_ID, {"preset": preset, "trace": trace, "speed": speed}))
        else:
            for load in loads or DEFAULT_LOADS["routing"]:
                settings.append(Setting(CLUSTER_PROBLEMS["routing"],
                                        f"routing ({name}): synthetic base, load {load:g}x saturation, "
                                        f"{episode_requests} i.i.d. requests",
                                        ROUTING_V1_ENV_ID, {**base, "load": float(load)}))
    if env in ("admission", "all"):
        for load in loads or DEFAULT_LOADS["admission"]:
            kw = {**base, "load": float(load)}
            src = "synthetic base"
            if trace is not None and env == "admission":
                kw["base_trace"] = trace
                src = f"base trace {trace.name}"
            settings.append(Setting(CLUSTER_PROBLEMS["admission"],
                                    f"admission ({name}): {src}, load {load:g}x saturation, "
                                    f"{episode_requests} i.i.d. requests", ADMISSION_V1_ENV_ID, kw))
    return settings


def compare_policies(problem: str) -> dict:
    """Every baseline of ``problem`` as an env policy of its v1 environment."""
    from mooncake_gym.baselines import POLICIES
    from mooncake_gym.evaluation.episodes import ViewPolicy

    if problem == CLUSTER_PROBLEMS["routing"]:
        return {name: ViewPolicy(OnRoutingView(factory()), name) for name, factory in POLICIES["routing"].items()}
    return {name: ViewPolicy(factory(), name) for name, factory in POLICIES["admission"].items()}


def columns_of_cluster(problem: str):
    """compare's table columns of a cluster problem and the function turning one run's metrics into a row."""
    if problem == CLUSTER_PROBLEMS["routing"]:
        return CLUSTER_ROUTING_COLUMNS, table_row
    return CLUSTER_COMPARE_ADMISSION_COLUMNS, table_row


# ------------------------------------------------------------------------------------------------
# The command line (mooncake_gym.cli hands ``--preset`` other than lecture to these)
# ------------------------------------------------------------------------------------------------
#: Per command, the options a cluster preset does not take, and why.
_LECTURE_ONLY = {
    "replay": {"pool": "a heterogeneous prefill pool is built for the lecture's routing simulator only",
               "tuned": "tuned knobs come from the v0 environments"},
    "compare": {"rates": "the v1 environments' workloads are set by --loads (x the measured saturation)",
                "agent": "the shipped and --agent agents act on the v0 environments",
                "tuned": "tuned knobs come from the v0 environments",
                "plot_dir": "the plots are drawn for the lecture's simulators only"},
}
#: Per command, the options only a cluster preset takes, and why.
_CLUSTER_ONLY = {
    "replay": {"decode_instances": "the lecture's routing simulator has no decode pool"},
    "overload": {"fresh_blocks": "the lecture's demo 3 keeps its i.i.d. draw as it is",
                 "tbt_headroom": "the lecture's decode instance has no TBT"},
}
#: The lecture's defaults of the options whose default depends on the preset.
_LECTURE_DEFAULTS = {"replay": {"ttft_slo": 5.0, "cache_blocks": 3000}, "overload": {"ttft_slo": 30.0}}


def check_preset_args(command: str, args) -> None:
    """``--preset``'s checks before any work: options a cluster preset does not take are an error
    naming them; under ``lecture`` the preset-dependent defaults are the lecture's."""
    if args.preset == LECTURE:
        for dest, why in _CLUSTER_ONLY.get(command, {}).items():
            if getattr(args, dest) not in (None, False):
                raise ValueError(f"--{dest.replace('_', '-')}: only with a cluster --preset (not lecture): {why}")
        for dest, default in _LECTURE_DEFAULTS.get(command, {}).items():
            if getattr(args, dest) is None:
                setattr(args, dest, default)
        return
    for dest, why in _LECTURE_ONLY.get(command, {}).items():
        if getattr(args, dest) not in (None, False):
            raise ValueError(f"--{dest.replace('_', '-')}: not with --preset {args.preset}: {why}")
    if command in ("replay", "overload"):
        command_preset(command, args)  # checks the overrides
    if command == "compare":  # --loads sets both problems' loads here: kept apart from the lecture's checks
        args.cluster_loads, args.loads = args.loads, None


def _print_table(rows, columns, markdown: bool) -> None:
    from mooncake_gym.reporting.tables import format_table

    print(format_table(rows, columns, markdown=markdown))


def cmd_replay(args) -> int:
    """``replay --preset NAME``: the routing baselines on the cluster (see the module docstring)."""
    from dataclasses import asdict

    from mooncake_gym.reporting import tables as report
    from mooncake_gym.sim.observation import as_observation
    from mooncake_gym.model.workload import load_workload

    p = command_preset("replay", args)
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, speed=args.speed)
    modes = args.observation or ["exact"]
    observations = [as_observation(m) for m in modes]
    names = None if args.policy == "all" else [args.policy]
    by_mode = {mode: replay(trace, p, names, seed=args.seed, threshold=args.threshold, observation=o)
               for mode, o in zip(modes, observations)}
    if args.json:
        doc = {"trace": trace.name, "requests": len(trace), "rate_per_s": trace.rate, "preset": preset_json(p)}
        if len(modes) == 1:
            doc["observation"] = asdict(observations[0])
            doc["results"] = {n: r.metrics for n, r in by_mode[modes[0]].items()}
        else:
            doc["observation"] = {mode: asdict(o) for mode, o in zip(modes, observations)}
            doc["results"] = {mode: {n: r.metrics for n, r in res.items()} for mode, res in by_mode.items()}
        report.print_json(doc)
        return 0
    columns = CLUSTER_ROUTING_COLUMNS
    if len(modes) > 1:
        columns = [columns[0], ("observation", "observation", None), *columns[1:]]
    rows = [{**table_row(name, r.metrics), "observation": mode} for mode, res in by_mode.items()
            for name, r in res.items()]
    seen = "" if len(modes) > 1 or observations[0].exact else f"; observation {modes[0]}"
    print(f"{trace.name}: {len(trace)} requests, {trace.rate:.2f} requests/s; {describe(p)}{seen}"
          + ("\n" if args.markdown else ""))
    _print_table(rows, columns, args.markdown)
    return 0


def cmd_overload(args) -> int:
    """``overload --preset NAME``: the admission baselines on the cluster (see the module docstring)."""
    from mooncake_gym.reporting import tables as report
    from mooncake_gym.model.workload import load_workload

    p = command_preset("overload", args)
    base = load_workload(args.trace, rate=args.rate, seed=args.seed)
    names = None if args.policy == "all" else [args.policy]
    trace, sat, results = overload(base, p, args.load, args.requests, names, seed=args.seed,
                                   fresh_blocks=args.fresh_blocks, tbt_headroom=args.tbt_headroom or 0.0)
    if args.plot:
        from mooncake_gym.reporting.plots import plot_load_series

        plot_load_series(results, args.plot, title=f"{trace.name} ({p.name}): prefill and decode load")
    if args.json:
        report.print_json({"base_trace": base.name, "trace": trace.name, "requests": len(trace),
                           "preset": preset_json(p), "saturation": sat._asdict(), "load": args.load,
                           "fresh_blocks": args.fresh_blocks, "tbt_headroom": args.tbt_headroom or 0.0,
                           "arrival_rate_per_s": args.load * sat.cluster_per_s,
                           "results": {n: r.metrics for n, r in results.items()}})
        return 0
    print(f"base {base.name}: {describe(p)}; measured saturation {sat.cluster_per_s:.2f} requests/s "
          f"({sat.bottleneck} pool first: prefill {sat.prefill_per_s:.2f}/s, decode {sat.decode_per_s:.2f}/s); "
          f"{len(trace):,} i.i.d. requests at load {args.load:g} = {args.load * sat.cluster_per_s:.2f}/s"
          + ("; re-drawn requests get fresh blocks for what they brought" if args.fresh_blocks else "")
          + (f"; decode check within {1 - args.tbt_headroom:g} x the TBT SLO" if args.tbt_headroom else ""))
    _print_table([table_row(n, r.metrics) for n, r in results.items()], CLUSTER_ADMISSION_COLUMNS, False)
    if args.plot:
        print(f"load series written to {args.plot}")
    return 0


def cmd_compare(args) -> int:
    """``compare --preset NAME``: the baselines on the v1 environments over held-out seeds."""
    from mooncake_gym.experiments import compare as cmp
    from mooncake_gym.reporting import tables as report

    trace = None
    if args.trace:
        from mooncake_gym.model.workload import read_trace

        trace = read_trace(args.trace)
    settings = compare_settings(args.preset, args.env, args.cluster_loads, trace, args.speed)
    seeds = [cmp.COMPARE_SEED_BASE + i for i in range(args.seeds)]
    plan = [(s, compare_policies(s.problem)) for s in settings]
    cmp.run_plan(plan, seeds, not (args.json or args.no_progress), args.threads)  # each table ends with its bound
    if args.json:
        report.print_json(cmp.settings_json(settings, args.seeds))
        return 0
    print(f"{describe(get_preset(args.preset))}. Mean ± 95% CI over {args.seeds} held-out seeds "
          f"({seeds[0]}..{seeds[-1]}), same workloads for every policy.")
    for s in settings:
        print(f"\n{'### ' if args.markdown else ''}{s.label}\n")
        print(cmp.format_setting(s, markdown=args.markdown))
    return 0


def preset_json(p: ClusterPreset) -> dict:
    """The preset's cluster in a JSON document (its name, pool sizes, KV, cache and SLOs)."""
    return {"name": p.name, "n_prefill": p.n_prefill, "prefill_gpus": p.prefill_gpus, "n_decode": p.n_decode,
            "decode_model": p.decode_model,
            "decode_capacity_tokens": p.capacity_tokens, "cache_blocks": p.cache_blocks,
            "ttft_slo_s": p.ttft_slo_s, "tbt_slo_s": p.tbt_slo_s}
