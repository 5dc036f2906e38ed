"""The problem registry: one :class:`Problem` per table ``compare``, ``tune``, the leaderboard, the
scenarios and the command line draw. A problem owns its main metric and direction, every metric a
search may optimise, its table columns, its bound row, its baselines and its environment.

- ``routing`` and ``admission``: the lecture's toy (the ``lecture`` preset, its reserve decode model;
  ``PrefillRouting-v0``, ``OverloadAdmission-v0``).
- ``admission-v1``: the admission rules of the whole cluster (``OverloadAdmission-v1``; the table of
  the admission and Conductor scenarios, token goodput first).
- ``routing-cluster`` and ``admission-cluster``: ``replay``, ``overload`` and ``compare`` on a
  realistic preset (continuous batching; ``PrefillRouting-v1``, ``OverloadAdmission-v1``).

Iterate :data:`PROBLEMS`; :func:`for_preset` picks a decision's variant by the preset's decode model,
:func:`of_scenario` the table of a scenario's problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from mooncake_gym.analysis.bounds import admission_goodput_bound, cluster_ttft_bound, ttft_lower_bound
from mooncake_gym.baselines import POLICIES, make_policy
from mooncake_gym.envs import (ADMISSION_ENV_ID, ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID, ROUTING_ENV_ID,
                               ROUTING_V1_ENV_ID)
from mooncake_gym.evaluation.episodes import ViewPolicy
from mooncake_gym.evaluation.statistics import mean_ci95
from mooncake_gym.model.presets import get_preset
from mooncake_gym.sim.policy import feedback_of, policy_name, reset_policy

# --- table columns: (metric key, header, format spec) ------------------------------------------------
#: Columns of a routing table (lecture demo 2, replay, compare).
ROUTING_COLUMNS = [
    ("policy", "policy", None),
    ("mean_ttft_s", "mean TTFT s", ".2f"),
    ("p90_ttft_s", "P90 s", ".2f"),
    ("slo_attainment", "TTFT<=SLO", ".3f"),
    ("hit_ratio", "hit share", ".3f"),
    ("computed_mtokens", "computed Mtok", ".2f"),
    ("fetched_mtokens", "fetched Mtok", ".2f"),
]
#: Columns of an admission table (lecture demo 3, the overload command).
OVERLOAD_COLUMNS = [
    ("policy", "policy", None),
    ("completed", "completed", "d"),
    ("rejected", "rejected", "d"),
    ("rejected_after_prefill", "after prefill", "d"),
    ("wasted_prefill_s", "wasted prefill s", ".0f"),
    ("wasted_share_of_admitted", "wasted/admitted", ".3f"),
    ("mean_decode_occupancy", "decode occ", ".3f"),
    ("load_correlation", "P/D corr", "+.2f"),
    ("steady_completed_per_s", "steady done/s", ".2f"),
]
#: Columns of the admission table of ``compare`` (means over seeds: no integer formats).
ADMISSION_COLUMNS = [
    ("policy", "policy", None),
    ("completed", "completed", ".0f"),
    ("good_requests", "good requests", ".0f"),
    ("rejected", "rejected", ".0f"),
    ("rejected_after_prefill", "after prefill", ".0f"),
    ("wasted_prefill_s", "wasted prefill s", ".0f"),
    ("load_correlation", "P/D corr", "+.2f"),
]
#: Columns of the admission table of ``compare`` for the v1 environments and scenarios
#: (``OverloadAdmission-v1``, ``Conductor-v1``; means over seeds). The primary metric first: token
#: goodput (output tokens of the requests within both SLOs that started decoding by the last arrival,
#: the drain excluded), the number of those requests beside it, wasted prefill in GPU-seconds, and the
#: share of each output-length class counted (short 1-100, medium 101-400, long > 400 output tokens:
#: ``metrics.LENGTH_CLASSES``) so that refusing long requests shows. The v0 table is
#: ``ADMISSION_COLUMNS``.
ADMISSION_V1_COLUMNS = [
    ("policy", "policy", None),
    ("token_goodput", "token goodput", ".0f"),
    ("good_requests", "good requests", ".0f"),
    ("wasted_prefill_gpu_s", "wasted prefill GPU-s", ".0f"),
    ("accepted_short", "short", ".3f"),
    ("accepted_medium", "medium", ".3f"),
    ("accepted_long", "long", ".3f"),
    ("p90_tbt_s", "P90 TBT s", ".3f"),
    ("drain_token_goodput", "drain tokens (excluded)", ".0f"),
]
#: Columns of a routing table on a cluster preset (replay, and compare's means).
CLUSTER_ROUTING_COLUMNS = [
    ("policy", "policy", None),
    ("mean_ttft_s", "mean TTFT s", ".2f"),
    ("p90_ttft_s", "P90 TTFT s", ".2f"),
    ("ttft_attainment", "TTFT<=SLO", ".3f"),
    ("mean_tbt_s", "mean TBT s", ".3f"),
    ("p90_tbt_s", "P90 TBT s", ".3f"),
    ("tbt_attainment", "TBT<=SLO", ".3f"),
    ("good_requests", "good requests", ".0f"),
    ("rejected_after_prefill", "after prefill", ".0f"),
    ("hit_ratio", "hit share", ".3f"),
]
#: Columns of an admission table on a cluster preset (overload, and compare's means).
CLUSTER_ADMISSION_COLUMNS = [
    ("policy", "policy", None),
    ("completed", "completed", ".0f"),
    ("good_requests", "good requests", ".0f"),
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
#: compare's admission table on a cluster preset: the overload table with token goodput (the output
#: tokens of its good requests) after the good requests, the two metrics its bound row bounds
#: (``bounds.admission_goodput_bound``).
CLUSTER_COMPARE_ADMISSION_COLUMNS = [
    *CLUSTER_ADMISSION_COLUMNS[:3],
    ("token_goodput", "token goodput", ".0f"),
    *CLUSTER_ADMISSION_COLUMNS[3:],
]


def routing_row(policy: str, metrics: dict) -> dict:
    """A table row of routing metrics (token counts in millions)."""
    row = {"policy": policy, **{k: v for k, v in metrics.items() if not isinstance(v, list)}}
    row["computed_mtokens"] = metrics["computed_tokens"] / 1e6
    row["fetched_mtokens"] = metrics["fetched_tokens"] / 1e6
    return row


def overload_row(metrics: dict) -> dict:
    """A table row of one run's metrics (an undefined correlation prints as '-'), the lecture's
    ``goodput`` (its old name, which the v0 environments keep) as ``good_requests``."""
    row = dict(metrics)
    if "goodput" in row and "good_requests" not in row:
        row["good_requests"] = row["goodput"]
    if not math.isfinite(row.get("load_correlation", 0.0)):
        row["load_correlation"] = None
    return row


def table_row(name: str, metrics: dict) -> dict:
    """A table row of one cluster run's metrics (an undefined correlation prints as '-')."""
    row = {**metrics, "policy": name}
    corr = row.get("load_correlation")
    if corr is not None and corr != corr:  # NaN: the load series never changed
        row["load_correlation"] = None
    return row


def _admission_row(name: str, metrics: dict) -> dict:
    return {"policy": name, **overload_row(metrics)}


def _metrics_row(name: str, metrics: dict) -> dict:
    return {"policy": name, **metrics}


# --- bounds: function(env_id, env_kwargs, seeds) -> the table's "bound" row ----------------------------
def routing_bound(env_id: str, env_kwargs: dict, seeds) -> dict:
    """The lower bound on mean TTFT (:func:`mooncake_gym.analysis.bounds.ttft_lower_bound`) of each seed's
    episode of a routing setting, as a row: mean and 95 % CI over the seeds. On a cluster
    environment (``PrefillRouting-v1``, ``compare --preset``) it is
    :func:`mooncake_gym.analysis.bounds.cluster_ttft_bound`: over the requests the cluster prefills, as its
    mean TTFT is."""
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    try:
        values = []
        for seed in seeds:
            env.reset(seed=seed)  # the episode every policy of the setting saw with this seed
            base = env.unwrapped
            if hasattr(base, "preset"):  # a cluster environment (mooncake_gym.envs.cluster.ClusterEnv)
                values.append(cluster_ttft_bound(base.sim.trace, base.preset).mean_ttft_s)
            else:
                values.append(ttft_lower_bound(base.sim.trace, base.config, base.cost).mean_ttft_s)
    finally:
        env.close()
    mean, ci = mean_ci95(values)
    return {"policy": "bound", "episodes": len(values), "mean_ttft_s": mean, "mean_ttft_s_ci95": ci,
            "per_seed": values}


def admission_bound(env_id: str, env_kwargs: dict, seeds) -> dict:
    """The row ``bound`` of an admission table: :func:`admission_goodput_bound` of each seed's
    episode of ``gym.make(env_id, **env_kwargs)`` (the episode every policy sees with that seed),
    mean and 95 % CI over the seeds in the keys of ``report.ADMISSION_V1_COLUMNS`` it bounds
    (``token_goodput``, ``good_requests``; the others are absent), and ``per_seed``, each seed's
    value of each of them (``{metric: values}``: the problems of its tables rank by one or the other,
    :meth:`Problem.bound_per_seed`)."""
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    tokens, requests = [], []
    try:
        for seed in seeds:
            env.reset(seed=seed)
            base = env.unwrapped
            b = admission_goodput_bound(base.sim.trace, base.preset)
            tokens.append(b.token_goodput)
            requests.append(b.goodput_requests)
    finally:
        env.close()
    row = {"policy": "bound", "episodes": len(tokens), "per_seed": {"token_goodput": tokens, "good_requests": requests}}
    for key, values in row["per_seed"].items():
        row[key], row[key + "_ci95"] = mean_ci95(values)
    return row


class OnRoutingView:
    """A routing baseline acting on a :class:`~mooncake_gym.sim.cluster.ClusterView`: it answers
    with the route it picks on the view's prefill pool (``view.routing``), as
    ``conductor.simulate(routing=...)`` asks it; ``reset(rng)`` reaches the baseline."""

    def __init__(self, policy):
        self.policy = policy
        self.name = policy_name(policy)
        observe = feedback_of(policy)
        if observe is not None:  # the feedback channel reaches the baseline (sim/policy.py)
            self.observe = observe

    def reset(self, rng) -> None:
        reset_policy(self.policy, rng)

    def __call__(self, view):
        return self.policy(view.routing)

    def __repr__(self) -> str:  # what a card records of it (e.g. expert iteration's base rule)
        return f"OnRoutingView({self.policy!r})"


def _as_is(policy):
    return policy


# --- workloads: function(rates, loads, trace, speed, episode_requests, preset) -> [(label, env kwargs)] ----
def _lecture_routing(rates, loads, trace, speed, n, preset) -> list:
    if trace is not None:
        return [(f"routing: trace {getattr(trace, 'name', trace)} at speed {speed:g}", {"trace": trace, "speed": speed})]
    return [(f"routing: synthetic, {rate:g} sessions/s, {n} requests", {"rate": float(rate), "episode_requests": n})
            for rate in rates or (4.0, 8.0)]


def _cluster_routing(rates, loads, trace, speed, n, preset) -> list:
    name = get_preset(preset).name
    if trace is not None:
        return [(f"routing ({name}): trace {trace.name} at speed {speed:g}",
                 {"preset": preset, "trace": trace, "speed": speed})]
    return [(f"routing ({name}): synthetic base, load {load:g}x saturation, {n} i.i.d. requests",
             {"preset": preset, "episode_requests": n, "load": float(load)}) for load in loads or (0.9,)]


def _admission(capacity: str, with_preset: bool):
    """Admission workloads: ``n`` requests drawn i.i.d. at each load x ``capacity`` from the synthetic
    base, or from ``trace``."""
    def workloads(rates, loads, trace, speed, n, preset) -> list:
        head = f"admission ({get_preset(preset).name})" if with_preset else "admission"
        out = []
        for load in loads or (2.0,):
            kw = ({"preset": preset, "episode_requests": n, "load": float(load)} if with_preset
                  else {"load": float(load), "episode_requests": n})
            src = "synthetic base"
            if trace is not None:
                kw["base_trace"] = trace
                src = f"base trace {getattr(trace, 'name', trace)}"
            out.append((f"{head}: {src}, load {load:g}x {capacity}, {n} i.i.d. requests", kw))
        return out
    return workloads


# --- the registry ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One problem: the decision it owns (``decision``: ``routing`` or ``admission``, the name
    ``--env`` takes), on which decode model (the preset's: ``reserve`` for the lecture's toy,
    ``batching`` for a realistic cluster), its environment, baselines, metrics, columns and bound."""

    name: str
    decision: str
    decode_model: str
    env_id: str
    #: the key of ``mooncake_gym.baselines.POLICIES`` holding its baselines
    baselines: str
    #: the main metric (tune's default objective, compare's ranking) and its direction
    metric: str
    goal: str
    #: every metric a search may optimise, with its direction
    metric_goals: dict
    #: compare's table: columns of means, and the function turning one run's metrics into a row
    columns: list
    make_row: Callable
    #: the command's own table (replay, overload) of one run's metrics: columns and row function
    run_columns: list
    run_row: Callable
    #: the bound row of its tables, ``function(env_id, env_kwargs, seeds) -> row`` (None: no bound)
    bound: Callable | None = None
    #: the scenario problems (``mooncake_gym.evaluation.scenarios``) tabulated as this problem
    scenario_problems: tuple = ()
    #: its environments (the scenarios' base environments included)
    env_ids: tuple = ()
    #: wraps a baseline for its environment's view (routing on a cluster: :class:`OnRoutingView`)
    adapt: Callable = field(default=_as_is)
    #: a variant the commands run on a preset (:func:`for_preset`); admission-v1 is the scenarios' table
    preset_variant: bool = True
    #: compare's and tune's workloads, ``function(rates, loads, trace, speed, episode_requests, preset)
    #: -> [(label, env kwargs)]`` (None: only the scenarios' workloads)
    workloads: Callable | None = None
    #: ``--trace`` is replayed (routing), else it is a base trace, used with ``--env`` naming this problem only
    replays_trace: bool = False
    #: compare's figures of a setting (``reporting.plots.compare_plots``): the TTFT distribution
    #: per policy (``"ttft"``) or the first seed's load series (``"load_series"``)
    plot: str = "load_series"

    def policy(self, name: str, label: str | None = None, **knobs) -> ViewPolicy:
        """Baseline ``name`` with ``knobs``, as a row ``label`` (default ``name``); its ``env_kwargs``
        are what its environment must be made with (the factory's ``ENV_KWARGS``, e.g. ``oracle=True``
        for a rule that reads the true output length), defaults and tuned alike."""
        policy = ViewPolicy(self.adapt(make_policy(self.baselines, name, **knobs)), label or name)
        policy.env_kwargs = getattr(POLICIES[self.baselines][name], "ENV_KWARGS", {})
        return policy

    def policies(self) -> dict:
        """Every baseline at its defaults, ``{name: env policy}``."""
        return {name: self.policy(name) for name in POLICIES[self.baselines]}

    def bound_per_seed(self, row: dict | None) -> list | None:
        """The per-seed values of the main metric in the bound ``row`` (its ``per_seed``: a list, the
        one metric it bounds, or ``{metric: values}``), None where it has none."""
        values = None if row is None else row.get("per_seed")
        return values.get(self.metric) if isinstance(values, dict) else values

    def metric_goal(self, metric: str | None = None) -> tuple[str, str]:
        """``(metric, "min" | "max")`` (``metric=None``: the main metric)."""
        if metric is None:
            return self.metric, self.goal
        if metric not in self.metric_goals:
            raise ValueError(f"--metric: expected one of {sorted(self.metric_goals)} for {self.name}, got {metric!r}")
        return metric, self.metric_goals[metric]


_ROUTING_GOALS = {"mean_ttft_s": "min", "p90_ttft_s": "min", "slo_attainment": "max", "hit_ratio": "max"}
_CLUSTER_ROUTING_GOALS = {"mean_ttft_s": "min", "p90_ttft_s": "min", "ttft_attainment": "max",
                          "tbt_attainment": "max", "hit_ratio": "max"}

#: Every problem, by name, in the order the tables list them.
PROBLEMS: dict[str, Problem] = {p.name: p for p in (
    Problem("routing", "routing", "reserve", ROUTING_ENV_ID, "routing", "mean_ttft_s", "min", _ROUTING_GOALS,
            ROUTING_COLUMNS, routing_row, ROUTING_COLUMNS, routing_row, routing_bound,
            scenario_problems=("routing",), env_ids=(ROUTING_ENV_ID,), workloads=_lecture_routing,
            replays_trace=True, plot="ttft"),
    # the lecture's metric keeps its v0 name, goodput: its good requests (the table's column good_requests)
    Problem("admission", "admission", "reserve", ADMISSION_ENV_ID, "admission", "goodput", "max",
            {"goodput": "max", "completed": "max", "wasted_prefill_s": "min", "rejected_after_prefill": "min",
             "return": "max"},
            ADMISSION_COLUMNS, _admission_row, OVERLOAD_COLUMNS, lambda name, metrics: overload_row(metrics),
            env_ids=(ADMISSION_ENV_ID,), workloads=_admission("decode capacity", False)),
    Problem("admission-v1", "admission", "batching", ADMISSION_V1_ENV_ID, "admission-v1", "token_goodput", "max",
            {"token_goodput": "max", "good_requests": "max", "goodput_requests": "max", "wasted_prefill_gpu_s": "min",
             "return": "max"},
            ADMISSION_V1_COLUMNS, _metrics_row, ADMISSION_V1_COLUMNS, _metrics_row, admission_bound,
            scenario_problems=("admission", "conductor"), env_ids=(ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID),
            preset_variant=False),
    Problem("routing-cluster", "routing", "batching", ROUTING_V1_ENV_ID, "routing", "mean_ttft_s", "min",
            _CLUSTER_ROUTING_GOALS, CLUSTER_ROUTING_COLUMNS, table_row, CLUSTER_ROUTING_COLUMNS, table_row,
            routing_bound, scenario_problems=("routing-cluster",), env_ids=(ROUTING_V1_ENV_ID,), adapt=OnRoutingView,
            workloads=_cluster_routing,
            replays_trace=True),
    Problem("admission-cluster", "admission", "batching", ADMISSION_V1_ENV_ID, "admission", "good_requests", "max",
            {"good_requests": "max", "token_goodput": "max", "completed": "max", "goodput": "max",
             "goodput_requests": "max"},
            CLUSTER_COMPARE_ADMISSION_COLUMNS, table_row, CLUSTER_ADMISSION_COLUMNS, table_row, admission_bound,
            env_ids=(ADMISSION_V1_ENV_ID,), workloads=_admission("saturation", True)),
)}
#: The decisions ``--env`` names (``routing``, ``admission``).
DECISIONS = tuple(dict.fromkeys(p.decision for p in PROBLEMS.values()))


def get(name: str) -> Problem:
    """The problem called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return PROBLEMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"--env: expected one of {sorted(PROBLEMS)}, got {name!r}") from None


def for_preset(decision: str, preset) -> Problem:
    """The problem of ``decision`` on ``preset`` (a name or a ClusterPreset): the command line's
    variant, chosen by the preset's decode model (``reserve``: the lecture's v0 problem)."""
    model = get_preset(preset).decode_model
    return next(p for p in PROBLEMS.values()
                if p.preset_variant and p.decision == decision and p.decode_model == model)


def of_scenario(scenario_problem: str) -> Problem | None:
    """The problem whose table shows the scenarios of ``scenario_problem`` (None: no table yet)."""
    return next((p for p in PROBLEMS.values() if scenario_problem in p.scenario_problems), None)


def scenario_table(decision: str) -> Problem | None:
    """The problem whose table shows the scenarios of ``decision`` (``routing``: routing;
    ``admission``: admission-v1, the admission and Conductor scenarios' table)."""
    return next((p for p in PROBLEMS.values() if p.scenario_problems and p.decision == decision), None)


#: The problems a scenario may name (:mod:`mooncake_gym.evaluation.scenarios`), each tabulated by one problem.
SCENARIO_PROBLEMS = tuple(name for p in PROBLEMS.values() for name in p.scenario_problems)
