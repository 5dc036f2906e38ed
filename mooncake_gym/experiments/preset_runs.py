"""``replay``, ``overload`` and ``compare`` on a preset (``mooncake_gym.model.presets.PRESETS``): one
path per command, the preset's decode model picking the simulator and the problem
(:func:`mooncake_gym.evaluation.problems.for_preset`). ``reserve`` (``lecture``): the lecture's
simulators (``sim.routing``, ``sim.admission``) and the v0 environments. ``batching`` (``mooncake``,
the command line's default, ``mooncake-overload``, ``h100``, ...): the whole cluster of
:mod:`mooncake_gym.sim.cluster`, the routing baselines owning the prefill decision (admit-all) or the
admission baselines the admission decision (kvcentric routing) at ``load`` x the cluster's measured
saturation, and ``compare`` on the v1 environments, each table ending with its problem's bound row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import groupby
from typing import Callable

from mooncake_gym.analysis import bounds
from mooncake_gym.baselines import ADMISSION_POLICIES, ROUTING_POLICIES, make_policy, run_baselines
from mooncake_gym.evaluation import problems
from mooncake_gym.evaluation.problems import (CLUSTER_ADMISSION_COLUMNS, CLUSTER_ROUTING_COLUMNS,  # noqa: F401
                                              OnRoutingView, table_row)  # clusterrun's names (mooncake_gym._moved)
from mooncake_gym.experiments import compare
from mooncake_gym.model.presets import PRESETS, ClusterPreset, get_preset
from mooncake_gym.sim import admission, cluster, routing

#: The presets the command line accepts (``mooncake`` by default; ``lecture`` keeps the lecture's simulators).
PRESET_NAMES = tuple(PRESETS)


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
    return "+".join(f"{len(list(run))}x{gpu}" for gpu, run in groupby(gpus))


def describe(p: ClusterPreset) -> str:
    """One line naming the preset and its cluster, for the tables' headers."""
    pool = "" if p.prefill_gpus is None else f" ({pool_string(p.prefill_gpus)})"
    return (f"preset {p.name}: {p.n_prefill} prefill{pool} + {p.n_decode} decode instances, "
            f"{p.decode_capacity_per_instance:,} KV tokens per decode instance, {p.cache_blocks} cache blocks per prefill "
            f"instance, TTFT SLO {p.ttft_slo_s:g} s, TBT SLO {p.tbt_slo_s * 1000:g} ms")


def preset_json(p: ClusterPreset) -> dict:
    """The preset's cluster in a JSON document (its name, pool sizes, KV, cache and SLOs)."""
    return {"name": p.name, "n_prefill": p.n_prefill, "prefill_gpus": p.prefill_gpus, "n_decode": p.n_decode,
            "decode_model": p.decode_model,
            "decode_capacity_tokens": p.decode_capacity_per_instance, "cache_blocks": p.cache_blocks,
            "ttft_slo_s": p.ttft_slo_s, "tbt_slo_s": p.tbt_slo_s}


def _given(**kwargs) -> dict:
    return {k: v for k, v in kwargs.items() if v is not None}


# --- replay ---------------------------------------------------------------------------------------
@dataclass
class Replay:
    """``replay``'s cluster on a preset: the problem, the JSON entry of its setup (a ``RoutingConfig``
    or a ``ClusterPreset``), its header and how to run policies on it."""

    problem: problems.Problem
    setup_json: dict
    describe: str
    #: ``simulate(trace, policy, seed, observation) -> result``: one routing policy on the cluster
    simulate: Callable
    #: ``bound(trace) -> float``: a lower bound on every routing policy's mean TTFT on ``trace``
    #: (:mod:`mooncake_gym.analysis.bounds`)
    bound: Callable

    def run(self, trace, names, seed: int, threshold: float | None, observation) -> dict:
        """Every routing baseline of ``names`` (None: all) on ``trace``, ``threshold`` kvcentric's."""
        knobs = {} if threshold is None else {"threshold": threshold}
        return {name: self.simulate(trace, make_policy("routing", name, **(knobs if name == "kvcentric" else {})),
                                    seed, observation)
                for name in (list(ROUTING_POLICIES) if names is None else names)}


def _lecture_replay(preset, n_prefill, cache_blocks, ttft_slo_s, n_decode, pool) -> Replay:
    config = routing.RoutingConfig(**_given(n_instances=n_prefill, cache_blocks=cache_blocks, ttft_slo_s=ttft_slo_s,
                                            instances=pool))
    config_json = vars(config) if config.instances is None else \
        {**vars(config), "instances": [asdict(spec) for spec in config.instances]}
    text = (f"{config.n_instances} instances{f' ({pool})' if pool else ''} x {config.cache_blocks} blocks, "
            f"TTFT SLO {config.ttft_slo_s:g} s")

    def simulate(trace, policy, seed, observation):
        return routing.simulate(trace, policy, config, seed=seed, observation=observation)

    return Replay(problems.for_preset("routing", preset), {"config": config_json}, text, simulate,
                  lambda trace: bounds.ttft_lower_bound(trace, config).mean_ttft_s)


def _cluster_replay(preset, n_prefill, cache_blocks, ttft_slo_s, n_decode, pool) -> Replay:
    p = cluster_preset(preset, n_prefill, cache_blocks, ttft_slo_s, n_decode)

    def simulate(trace, policy, seed, observation):
        return cluster.simulate(trace, p, routing=policy, seed=seed, observation=observation)

    return Replay(problems.for_preset("routing", p), {"preset": preset_json(p)}, describe(p), simulate,
                  lambda trace: bounds.cluster_ttft_bound(trace, p).mean_ttft_s)


def replay_setup(preset, n_prefill=None, cache_blocks=None, ttft_slo_s=None, n_decode=None, pool=None) -> Replay:
    """``replay``'s cluster on ``preset`` with the command line's overrides (None: the preset's or the
    lecture simulator's defaults; ``pool``: a heterogeneous prefill pool, reserve model only)."""
    build = {"reserve": _lecture_replay, "batching": _cluster_replay}[get_preset(preset).decode_model]
    return build(preset, n_prefill, cache_blocks, ttft_slo_s, n_decode, pool)


# --- overload -------------------------------------------------------------------------------------
@dataclass
class Overload:
    """``overload``'s run on a preset: the problem, the drawn trace, the JSON fields between
    ``requests`` and ``results``, the header line, the plot's title and ``{name: result}``."""

    problem: problems.Problem
    trace: object
    fields: dict
    header: str
    title: str
    results: dict


def _lecture_overload(base, preset, load, n_requests, names, seed, n_prefill, n_decode, ttft_slo_s,
                      fresh_blocks, tbt_headroom, replay_speed) -> Overload:
    config = admission.OverloadConfig(**_given(ttft_slo_s=ttft_slo_s, n_prefill=n_prefill, n_decode=n_decode))
    trace, sat, load, rate, drawn = _workload(base, config.preset(), load, n_requests, seed, "decode", False,
                                              replay_speed)
    capacity = sat.decode_per_s
    results = run_baselines("admission", trace, names, config, seed=seed)
    header = (f"base {base.name}: decode pool capacity {capacity:.2f} requests/s "
              f"({config.n_decode} x {config.decode_capacity_tokens:,} tokens, TBT {config.tbt_s:g} s); "
              f"{drawn}; {config.n_prefill} prefill instances, TTFT SLO {config.ttft_slo_s:g} s")
    fields = {"decode_capacity_per_s": capacity, "load": load, "arrival_rate_per_s": rate,
              **_replay_field(replay_speed), "config": vars(config)}
    return Overload(problems.for_preset("admission", preset), trace, fields, header,
                    f"{trace.name}: prefill and decode load", results)


def _cluster_overload(base, preset, load, n_requests, names, seed, n_prefill, n_decode, ttft_slo_s,
                      fresh_blocks, tbt_headroom, replay_speed) -> Overload:
    p = cluster_preset(preset, n_prefill, ttft_slo_s=ttft_slo_s, n_decode=n_decode,
                       prefill_option="--prefill-instances")
    trace, sat, load, rate, drawn = _workload(base, p, load, n_requests, seed, "cluster", fresh_blocks, replay_speed)
    results = {name: cluster.simulate(trace, p, admission=make_policy("admission", name), seed=seed,
                                      tbt_headroom=tbt_headroom)
               for name in (list(ADMISSION_POLICIES) if names is None else names)}
    header = (f"base {base.name}: {describe(p)}; measured saturation {sat.cluster_per_s:.2f} requests/s "
              f"({sat.bottleneck} pool first: prefill {sat.prefill_per_s:.2f}/s, decode {sat.decode_per_s:.2f}/s); "
              f"{drawn}"
              + ("; re-drawn requests get fresh blocks for what they brought" if fresh_blocks else "")
              + (f"; decode check within {1 - tbt_headroom:g} x the TBT SLO" if tbt_headroom else ""))
    fields = {"preset": preset_json(p), "saturation": sat._asdict(), "load": load, "fresh_blocks": fresh_blocks,
              "tbt_headroom": tbt_headroom, "arrival_rate_per_s": rate, **_replay_field(replay_speed)}
    return Overload(problems.for_preset("admission", p), trace, fields, header,
                    f"{trace.name} ({p.name}): prefill and decode load", results)


def overload_run(base, preset, load: float, n_requests: int, names, seed: int = 0, n_prefill=None, n_decode=None,
                 ttft_slo_s=None, fresh_blocks: bool = False, tbt_headroom: float = 0.0,
                 replay_speed: float | None = None) -> Overload:
    """``overload`` on ``preset``: the admission baselines of ``names`` (None: all) on ``n_requests``
    requests drawn i.i.d. from ``base`` at ``load`` x the decode pool's capacity (reserve model) or
    the cluster's measured saturation (batching; ``fresh_blocks`` and ``tbt_headroom`` apply there).
    With ``replay_speed`` the trace's own requests and arrivals are replayed instead, ``replay_speed``
    times as fast (Mooncake's Table 3: its trace at 2x), and ``load`` and ``n_requests`` are unused;
    the load reported is the replay's mean arrival rate over the same reference rate."""
    build = {"reserve": _lecture_overload, "batching": _cluster_overload}[get_preset(preset).decode_model]
    return build(base, preset, load, n_requests, names, seed, n_prefill, n_decode, ttft_slo_s, fresh_blocks,
                 tbt_headroom, replay_speed)


def _workload(base, p: ClusterPreset, load: float, n_requests: int, seed: int, pool: str, fresh_blocks: bool,
              replay_speed: float | None) -> tuple:
    """``(trace, saturation, load, arrival rate, description)`` of ``overload``'s workload on ``p``:
    ``n_requests`` i.i.d. draws at ``load`` x ``pool``'s reference rate
    (:func:`mooncake_gym.sim.cluster.load_reference`), or ``base`` replayed at ``replay_speed``."""
    if replay_speed is None:
        trace, sat = cluster.overload_workload(base, load, n_requests, seed, p, fresh_blocks=fresh_blocks, pool=pool)
        rate = load * (sat.cluster_per_s if pool == "cluster" else sat.decode_per_s)
        return trace, sat, load, rate, f"{len(trace):,} i.i.d. requests at load {load:g} = {rate:.2f}/s"
    sat, reference = cluster.load_reference(base, p, pool)
    trace = base.scaled(replay_speed)
    rate = trace.rate
    return (trace, sat, rate / reference, rate,
            f"its {len(trace):,} requests replayed at x{replay_speed:g}: {rate:.2f}/s = load {rate / reference:.2f}")


def _replay_field(replay_speed: float | None) -> dict:
    return {} if replay_speed is None else {"replay_speed": replay_speed}


def check_overrides(preset, **overrides) -> None:
    """The command line's overrides checked on a cluster ``preset`` before any work (e.g. the size of
    a fixed heterogeneous pool; :func:`cluster_preset`'s arguments)."""
    if get_preset(preset).decode_model != "reserve":
        cluster_preset(preset, **overrides)


# --- compare --------------------------------------------------------------------------------------
def compare_settings(preset: str | ClusterPreset, env: str = "all", loads=None, trace=None, speed: float = 1.0,
                     episode_requests: int = 3000) -> list:
    """compare's settings on a cluster ``preset``: ``mooncake_gym/PrefillRouting-v1`` (at each load,
    or replaying ``trace`` at ``speed``) and ``mooncake_gym/OverloadAdmission-v1`` (at each load, on
    ``trace`` as base with ``env="admission"``). ``loads``: multiples of the measured saturation
    (None: per problem, PrefillRouting-v1's default load 0.9 and the lecture's admission load 2)."""
    return compare.settings(preset, env, None, loads, trace, speed, episode_requests)


def compare_header(preset, seeds: int, first: int = compare.COMPARE_SEED_BASE) -> str:
    """The line above ``compare``'s tables on ``preset``: the seeds (and the cluster of a cluster preset)."""
    last = first + seeds - 1
    if get_preset(preset).decode_model != "reserve":
        return (f"{describe(get_preset(preset))}. Mean ± 95% CI over {seeds} held-out seeds ({first}..{last}), "
                "same workloads for every policy.")
    if seeds == 1:
        return f"One held-out seed ({first}), same workload for every policy: no confidence interval."
    return f"Mean ± 95% CI over {seeds} held-out seeds ({first}..{last}), same workloads for every policy."
