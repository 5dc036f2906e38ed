"""``mooncake-gym compare``: every baseline and every trained agent on the same workloads.

All policies of a setting run on the same seeds, hence the same traces (common random numbers:
an env draws its episode's workload from ``reset(seed)``). Each cell is a mean over seeds with a
95 % confidence interval (Student's t). Beside the main metric, each row has its interquartile
mean over the seeds and the paired ratio of its mean to the best rule's (the best baseline row,
default or tuned, by the main metric) with a 95 % paired bootstrap interval
(:mod:`mooncake_gym.evaluation.statistics`): ``ratio_to_best_rule``, ``ratio_ci95`` (low, high),
``iqm``, ``iqm_ci95``, and ``best_rule`` naming the reference. Seeds ``seed_base, seed_base + 1,
...`` (default ``COMPARE_SEED_BASE``, ``DEFAULT_SEEDS`` of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mooncake_gym.agents import available, card, load_agent
from mooncake_gym.analysis.rollout import check_horizon, default_horizon, rollout_name
from mooncake_gym.baselines import ADMISSION_V1_POLICIES, POLICIES, ROUTING_POLICIES
from mooncake_gym.evaluation import problems
from mooncake_gym.evaluation.episodes import check_model_fits, evaluate, ModelPolicy, RolloutPolicy
from mooncake_gym.evaluation.scenarios import TRACE_ARGUMENTS, get_scenario, SCENARIOS
from mooncake_gym.evaluation.statistics import iqm_ci95, mean_ci95, paired_ratio_ci95
from mooncake_gym.reporting import tables as report
from mooncake_gym.sim.observation import as_observation
from mooncake_gym.reporting.plots import compare_plots

#: Evaluation seeds start here: training uses seeds below 1,000 and the callback 10,000 + seed, so
#: these episodes are never seen in training.
COMPARE_SEED_BASE = 1_000_000
#: Held-out seeds per setting by default.
DEFAULT_SEEDS = 10
#: The problem of the admission and Conductor scenarios' tables: the whole cluster
#: (``OverloadAdmission-v1``, ``Conductor-v1``), its admission baselines (``ADMISSION_V1_POLICIES``),
#: token goodput first (``report.ADMISSION_V1_COLUMNS``) and an upper bound.
ADMISSION_V1 = "admission-v1"
#: The problems agents are trained on (the v0 environments, the v1 admission problem, and routing on the
#: realistic cluster, PrefillRouting-v1).
AGENT_PROBLEMS = ("routing", "admission", ADMISSION_V1, "routing-cluster")
#: Requests per routing episode in compare (synthetic workloads).
ROUTING_EPISODE_REQUESTS = 3000
#: Requests per admission episode in compare.
ADMISSION_EPISODE_REQUESTS = 3000

def columns_of(problem: str):
    """The table columns of ``problem`` and the function turning one run's metrics into a row."""
    p = problems.get(problem)
    return p.columns, p.make_row


@dataclass
class Setting:
    """One comparison: an env id, its kwargs and a label."""

    problem: str
    label: str
    env_id: str
    env_kwargs: dict
    rows: list = field(default_factory=list)
    episodes: dict = field(default_factory=dict)
    #: the problem's bound over the same seeds (``Problem.bound``: a lower bound on mean TTFT for
    #: routing, an upper bound on token goodput for admission-v1), shown as the table's last row
    bound: dict | None = None
    #: a scenario's setting (``compare --scenario``): its name and fingerprint
    scenario: str | None = None
    fingerprint: str | None = None
    #: the trace file a scenario defined on one ran on (``Scenario.trace_check``: its path, sha256, own)
    trace: dict | None = None


def settings(preset="lecture", env: str = "all", rates=(4.0, 8.0), loads=None, trace=None, speed: float = 1.0,
             episode_requests: int = ROUTING_EPISODE_REQUESTS) -> list[Setting]:
    """compare's settings of each problem ``env`` names ("all": every decision) on ``preset``: the
    problem's workloads (``Problem.workloads``; ``loads`` None: the problem's defaults). ``trace`` is
    replayed for routing, and is the base trace of admission only with ``env="admission"``."""
    out = []
    for decision in problems.DECISIONS:
        if env in (decision, "all"):
            p = problems.for_preset(decision, preset)
            given = trace if p.replays_trace or env == decision else None
            out += [Setting(p.name, label, p.env_id, kwargs)
                    for label, kwargs in p.workloads(rates, loads, given, speed, episode_requests, preset)]
    return out


def routing_settings(rates=(4.0, 8.0), trace=None, speed=1.0, episode_requests=ROUTING_EPISODE_REQUESTS):
    return settings("lecture", "routing", rates, None, trace, speed, episode_requests)


def admission_settings(loads=(2.0,), trace=None, episode_requests=ADMISSION_EPISODE_REQUESTS):
    return settings("lecture", "admission", None, loads, trace, 1.0, episode_requests)


def policies_for(problem: str, agents: dict, scenario: str | None = None) -> dict:
    """Every baseline of ``problem`` plus the agents (``{name: model}``) that solve it; a
    per-scenario agent (:func:`agent_scenarios`) only on ``scenario`` (a scenario's setting's name),
    a tutorial agent (``scenarios`` empty) only without one (``compare --preset``'s settings)."""
    out = problems.get(problem).policies()
    for name, (agent_problem, model) in agents.items():
        only = agent_scenarios(model)
        shown = only is None or (scenario in only if only else scenario is None)
        if agent_problem == problem and shown:
            out[name] = ModelPolicy(model, name)
    return out


def agent_scenarios(model) -> list | None:
    """The scenarios an agent is for: its card's ``scenarios``, a list of scenario names (a
    per-scenario agent: ``compare`` shows it only in their tables, and not on ``compare --preset``'s
    settings), an empty list (a tutorial agent: shown on ``compare --preset``'s settings and in no
    scenario's table, so never on the leaderboard), or None (no ``scenarios``: every setting and
    scenario it fits)."""
    only = (getattr(model, "card", None) or {}).get("scenarios")
    if only is not None and not (isinstance(only, list) and all(isinstance(n, str) for n in only)):
        raise ValueError(f"agent card: 'scenarios' must be a list of scenario names, got {only!r}")
    return only


def tuned_name(doc: dict) -> str:
    """The table row name of a tuned baseline, e.g. ``kvcentric (tuned)`` (``kvcentric (tuned on
    routing-saturated)`` when tuned on a scenario)."""
    if doc.get("scenario"):
        return f"{doc['policy']} (tuned on {doc['scenario']})"
    return f"{doc['policy']} (tuned)"


def with_tuned(policies: dict, problem: str, tuned: list) -> dict:
    """``policies`` with each tuned baseline of ``problem`` inserted right after its default row."""
    out = dict(policies)
    for doc in tuned:
        if doc["env"] != problem:
            continue
        row = (tuned_name(doc), problems.get(problem).policy(doc["policy"], tuned_name(doc), **doc["knobs"]))
        items = list(out.items())
        at = next((i + 1 for i, (name, _) in enumerate(items) if name == doc["policy"]), len(items))
        out = dict(items[:at] + [row] + items[at:])
    return out


def run_policy(setting: Setting, policy, seeds, keep_results: bool = False, threads: int | None = 1) -> list[dict]:
    """The episodes of ``policy`` on ``setting``'s environment, one per seed (its environment made
    with the setting's arguments and the ones the policy needs)."""
    return evaluate(setting.env_id, policy, seeds, keep_result=keep_results, threads=threads,
                    **{**setting.env_kwargs, **getattr(policy, "env_kwargs", {})})


def add_row(setting: Setting, name: str, policy, episodes: list[dict]) -> None:
    """Append the row of ``policy`` (its mean and CI per column over ``episodes``) to ``setting``."""
    columns, make_row = columns_of(setting.problem)
    setting.episodes[name] = episodes
    rows = [make_row(name, e) for e in episodes]
    row = {"policy": name, "episodes": len(episodes)}
    for key, _, _ in columns[1:]:
        m, ci = mean_ci95([r[key] for r in rows])
        row[key] = m
        row[f"{key}_ci95"] = ci
    row["kind"] = getattr(policy, "kind", None) or ("agent" if isinstance(policy, ModelPolicy) else "rule")
    setting.rows.append(row)


def run_setting(setting: Setting, policies: dict, seeds, keep_results: bool = False, progress=None,
                threads: int | None = 1) -> Setting:
    for name, policy in policies.items():
        add_row(setting, name, policy, run_policy(setting, policy, seeds, keep_results, threads))
        if progress is not None:
            progress.update(1)
    return setting


def add_ratios(setting: Setting) -> Setting:
    """Each row's IQM of the main metric and its paired ratio to the best rule's mean (module
    docstring); the bound's ratio too where it has per-seed values."""
    problem = problems.get(setting.problem)
    key, goal = problem.metric_goal()
    per_seed = {name: [e[key] for e in eps] for name, eps in setting.episodes.items()}
    # the rules' means from their episodes (a row names a metric by its table column, which may differ)
    means = {r["policy"]: math.fsum(per_seed[r["policy"]]) / len(per_seed[r["policy"]]) for r in setting.rows
             if r.get("kind") == "rule" and per_seed.get(r["policy"])}
    rules = [name for name, m in means.items() if not math.isnan(m)]
    if not rules:
        return setting
    best = (min if goal == "min" else max)(rules, key=means.__getitem__)
    bound = problem.bound_per_seed(setting.bound)
    for row in setting.rows + ([setting.bound] if bound is not None else []):
        values = bound if row is setting.bound else per_seed.get(row["policy"], row.get("per_seed"))
        row["best_rule"] = best
        row["ratio_to_best_rule"], row["ratio_ci95"] = paired_ratio_ci95(values, per_seed[best])
        row["iqm"], row["iqm_ci95"] = iqm_ci95(values)
    return setting


def format_setting(setting: Setting, markdown: bool = False) -> str:
    columns, _ = columns_of(setting.problem)
    ratios = any("ratio_to_best_rule" in r for r in setting.rows)
    cells = []
    rows = setting.rows
    if setting.bound is not None:  # the bound defines mean TTFT only: '-' elsewhere
        rows = rows + [{**{k: float("nan") for k, _, _ in columns[1:]},
                        **{k + "_ci95": float("nan") for k, _, _ in columns[1:]}, **setting.bound}]
    for row in rows:
        cell = {"policy": row["policy"]}
        for key, _, fmt in columns[1:]:
            mean, ci = row[key], row[key + "_ci95"]
            if math.isnan(mean):
                cell[key] = "-"  # undefined in every run (e.g. the correlation of a constant load series)
            elif math.isnan(ci):
                cell[key] = format(mean, fmt)
            else:
                cell[key] = f"{format(mean, fmt)} ± {format(ci, fmt.lstrip('+'))}"
        if ratios:
            ratio, (low, high) = row.get("ratio_to_best_rule", math.nan), row.get("ratio_ci95", (math.nan, math.nan))
            cell["ratio"] = "-" if math.isnan(ratio) else f"{ratio:.3f} [{low:.3f}, {high:.3f}]"
        cells.append(cell)
    heads = [(k, h, None) for k, h, _ in columns]
    if ratios:
        best = next(r["best_rule"] for r in setting.rows if "best_rule" in r)
        heads.insert(2, ("ratio", f"x {best} (95% CI)", None))
    return report.format_table(cells, heads, markdown=markdown)


def seed_range(seeds: int, seed_base: int = COMPARE_SEED_BASE) -> list[int]:
    """The held-out seeds ``seed_base .. seed_base + seeds - 1`` (``ValueError`` naming the option)."""
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"--seeds: expected an integer >= 1, got {seeds!r}")
    if not isinstance(seed_base, int) or isinstance(seed_base, bool) or not 0 <= seed_base <= 2**31 - seeds:
        raise ValueError(f"--seed-base: expected an integer in [0, 2**31 - seeds], got {seed_base!r}")
    return [seed_base + i for i in range(seeds)]


def compare(env: str = "all", seeds: int = DEFAULT_SEEDS, rates=(4.0, 8.0), loads=None, trace=None, speed: float = 1.0,
            agents: dict | None = None, plot_dir: str | None = None, progress: bool = True,
            threads: int | None = 1, tuned: list | None = None, preset="lecture",
            seed_base: int = COMPARE_SEED_BASE, workers: int = 1) -> list[Setting]:
    """Evaluate every baseline and agent on ``preset``'s problems (:func:`settings`; ``loads`` None:
    each problem's default, 2 on the lecture's); returns the settings with their rows (mean and CI
    per metric), each table ending with its problem's bound row.

    ``agents``: ``{name: (problem, model)}``; by default every shipped agent that is present (the
    shipped agents act on the lecture's v0 environments and the v1 admission problem).
    ``threads``: torch threads for the agents (default 1; ``None`` leaves torch's setting).
    ``tuned``: results of ``mooncake-gym tune`` (:func:`mooncake_gym.experiments.tune.read_tuned`); each adds its
    baseline with the tuned knobs, as ``NAME (tuned)`` right after the default row.
    ``workers``: processes running the policies (:func:`run_plan`; the same tables whatever their number).
    """
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"--threads: expected an integer >= 1, got {threads!r}")
    if env not in (*problems.DECISIONS, "all"):
        raise ValueError(f"--env: expected routing, admission or all, got {env!r}")
    seed_list = seed_range(seeds, seed_base)
    chosen = settings(preset, env, rates, loads, trace, speed)
    if agents is None:
        agents = shipped_agents() if any(s.problem in AGENT_PROBLEMS for s in chosen) else {}
    plan = [(s, with_tuned(policies_for(s.problem, agents), s.problem, tuned or [])) for s in chosen]
    run_plan(plan, seed_list, progress, threads, keep_results=plot_dir is not None, workers=workers)
    if plot_dir is not None:
        compare_plots(chosen, plot_dir)
    return chosen


#: At most this many worker processes (``--workers``).
MAX_WORKERS = 256


def check_workers(workers) -> int:
    """``workers`` if it is an integer in [1, ``MAX_WORKERS``], else ``ValueError`` naming ``--workers``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers: expected an integer in [1, {MAX_WORKERS}], got {workers!r}")
    return workers


#: the jobs of the running :func:`map_jobs` (function, items), inherited by its forked workers
_JOBS: tuple | None = None


def _run_job(i: int):
    fn, items = _JOBS
    return i, fn(items[i])


def map_jobs(fn, items: list, workers: int = 1, progress=None, order=None) -> list:
    """``[fn(item) for item in items]``, over ``workers`` processes when more than one: forked
    workers that inherit ``fn`` and ``items`` (only each item's index and its result cross a pipe,
    so an item may hold agents or closures). ``order``: the indices in the order to start them
    (longest first balances the workers); the results come back in the items' order whatever it
    is, and each item's result is what ``fn`` gives it in this process (``fn`` must not depend on
    the items run before it). ``progress.update(1)`` after each item."""
    global _JOBS
    check_workers(workers)
    order = list(range(len(items))) if order is None else list(order)
    out = [None] * len(items)
    if workers == 1 or len(items) < 2:
        for i in order:
            out[i] = fn(items[i])
            if progress is not None:
                progress.update(1)
        return out
    import multiprocessing

    _JOBS = (fn, items)
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(items))) as pool:
            for i, result in pool.imap_unordered(_run_job, order, chunksize=1):
                out[i] = result
                if progress is not None:
                    progress.update(1)
    finally:
        _JOBS = None
    return out


def run_plan(plan: list, seed_list, progress: bool, threads: int | None, keep_results: bool = False,
             workers: int = 1) -> None:
    """Run every ``(setting, policies)`` of ``plan`` on ``seed_list``, then its problem's bound
    (``Problem.bound``), with one progress bar (``progress``: True, False, or a function of the number
    of jobs giving an object with ``update(n)``); each policy (and each bound) one job of
    :func:`map_jobs` over ``workers`` processes (the same rows whatever their number)."""
    jobs = [(s, name, policy) for s, pols in plan for name, policy in pols.items()]
    jobs += [(s, None, None) for s, _ in plan if problems.get(s.problem).bound is not None]

    def run(job):
        s, name, policy = job
        if name is None:
            return problems.get(s.problem).bound(s.env_id, s.env_kwargs, seed_list)
        return run_policy(s, policy, seed_list, keep_results, threads)

    bar = None
    if callable(progress):  # a function of the number of jobs giving an object with update(n)
        results = map_jobs(run, jobs, workers, progress(len(jobs)))
    else:
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), desc="compare", unit="run", leave=False)
        try:
            results = map_jobs(run, jobs, workers, bar)
        finally:
            if bar is not None:
                bar.close()
    for (s, name, policy), result in zip(jobs, results):
        if name is None:
            s.bound = result
        else:
            add_row(s, name, policy, result)
    for s, _ in plan:
        add_ratios(s)


def scenario_setting(scenario, **given) -> Setting:
    """The comparison of one scenario (:mod:`mooncake_gym.evaluation.scenarios`): its base environment made with
    its arguments and ``given`` (e.g. ``trace``), so that agents trained on the base environment fit.
    The label names the scenario and its version; ``fingerprint`` is its sha256."""
    kwargs = scenario.config(**given)
    return Setting(problems.of_scenario(scenario.problem).name, f"{scenario.name} v{scenario.version} ({scenario.env_id})",
                   scenario.base_env_id, kwargs, scenario=scenario.name, fingerprint=scenario.fingerprint(**given))


def agents_fitting(setting: Setting, agents: dict) -> dict:
    """``{name: (problem, model)}`` of ``agents`` that solve ``setting``'s problem and fit its
    environment's spaces (the others are left out: a scenario may change the number of instances)."""
    import gymnasium as gym

    out = {}
    env = gym.make(setting.env_id, **setting.env_kwargs)
    try:
        for name, (problem, model) in agents.items():
            if problem != setting.problem:
                continue
            try:
                ModelPolicy(model, name).prepare(env)
            except ValueError:
                continue
            out[name] = (problem, model)
    finally:
        env.close()
    return out


def parse_rollout(text: str) -> tuple[str, int | None]:
    """``BASE[:H]`` of ``--rollout``: a routing baseline (routing scenarios) or an admission one
    (admission and Conductor scenarios) and the look-ahead (None where not given: the problem's
    default, :func:`~mooncake_gym.analysis.rollout.default_horizon`)."""
    base, sep, h = str(text).partition(":")
    if base not in ROUTING_POLICIES and base not in ADMISSION_V1_POLICIES:
        raise ValueError(f"--rollout: expected BASE[:H] with BASE a routing baseline ({', '.join(sorted(ROUTING_POLICIES))}) "
                         f"or an admission one ({', '.join(sorted(ADMISSION_V1_POLICIES))}), got {text!r}")
    try:
        horizon = check_horizon(int(h)) if sep else None
    except ValueError:
        raise ValueError(f"--rollout: expected BASE[:H] with H an integer in [0, 10000], got {text!r}") from None
    return base, horizon


#: The problems whose scenarios the rollout reference runs on (mooncake_gym.analysis.rollout).
ROLLOUT_PROBLEMS = ("routing", "routing-cluster", "admission-v1")


def rollout_unsupported(setting: Setting, base: str | None = None) -> str | None:
    """Why the rollout reference (over baseline ``base``, if given) cannot run on ``setting`` (None: it can)."""
    if setting.problem not in ROLLOUT_PROBLEMS:
        return f"the rollout reference runs on {', '.join(ROLLOUT_PROBLEMS)} scenarios, not {setting.problem}"
    if not as_observation(setting.env_kwargs.get("observation")).exact:
        return "the rollout reference needs the exact observation (its trials read the simulator's true state)"
    own = POLICIES[problems.get(setting.problem).baselines]
    if base is not None and base not in own:
        return f"{base} is not a baseline of its problem ({setting.problem}: {', '.join(sorted(own))})"
    return None


def rollout_policies(setting: Setting, rollouts, tuned: list) -> dict:
    """The rollout reference rows (``--rollout BASE[:H]``: :class:`~mooncake_gym.evaluation.episodes.RolloutPolicy`)
    of a routing scenario's setting (the toy's or the cluster's), or of an admission or Conductor
    scenario's, on the exact observation (the trials need the simulator's snapshots and its true
    state): each over BASE (a baseline of the setting's problem) with the knobs of its tuned document
    if one is given (``tuned``), else its defaults. Elsewhere a ``ValueError`` saying why
    (:func:`rollout_unsupported`)."""
    out = {}
    problem = problems.get(setting.problem) if rollouts else None
    for base, horizon in rollouts:
        why = rollout_unsupported(setting, base)
        if why is not None:
            raise ValueError(f"--rollout: no rollout row on {setting.scenario or setting.label}: {why}")
        doc = next((d for d in tuned if d["env"] == setting.problem and d["policy"] == base), None)
        rule = problem.policy(base, **(doc["knobs"] if doc else {}))
        horizon = default_horizon(setting.problem) if horizon is None else horizon
        policy = RolloutPolicy(rule.policy, horizon, rollout_name(tuned_name(doc) if doc else base, horizon))
        policy.env_kwargs = rule.env_kwargs  # (e.g. the oracle's output length for context_oracle)
        out[policy.name] = policy
    return out


def compare_scenarios(names="all", seeds: int = DEFAULT_SEEDS, trace=None, agents: dict | None = None,
                      tuned: list | None = None, progress: bool = True, threads: int | None = 1,
                      seed_base: int = COMPARE_SEED_BASE, rollouts=(), workers: int = 1) -> tuple[list[Setting], list[str]]:
    """``compare --scenario``: every baseline at its defaults, the tuned baselines (``tuned``: the
    results of ``tune`` for this problem, on this scenario or on no scenario), the agents that fit,
    the rollout references (``rollouts``: ``[(base, horizon)]``, :func:`rollout_policies`) and the
    bound, on each scenario of ``names`` ("all" or a list of names). A scenario whose
    ``requires`` are not given (``trace``) is skipped: returns ``(settings, skipped)``, ``skipped``
    holding one reason per skipped scenario. ``workers``: processes running the policies (:func:`run_plan`)."""
    seed_list = seed_range(seeds, seed_base)
    chosen = list(SCENARIOS.values()) if names == "all" else [get_scenario(n) for n in names]
    if agents is None:
        tables = (problems.of_scenario(sc.problem) for sc in chosen)
        agents = shipped_agents({t.name for t in tables if t is not None})
    plan, skipped = [], []
    for sc in chosen:
        if problems.of_scenario(sc.problem) is None:
            skipped.append(f"{sc.name}: skipped, compare has no table for {sc.problem} scenarios yet")
            continue
        own = sc.trace_kwargs(trace)
        missing = sc.missing(**own)
        if missing:
            skipped.append(f"{sc.name}: skipped, it needs "
                           f"{', '.join(dict.fromkeys('--trace' if m in TRACE_ARGUMENTS else '--' + m for m in missing))}"
                           " (not given)")
            continue
        s = scenario_setting(sc, **own)
        s.trace = sc.trace_check(trace if own else None)
        docs = [d for d in tuned or [] if d.get("scenario") in (None, sc.name)]
        fitting = rollouts
        if rollouts and names == "all":  # (named, a rollout that cannot run is an error)
            fitting = [r for r in rollouts if rollout_unsupported(s, r[0]) is None]
            skipped += [f"{sc.name}: no rollout row over {r[0]}, {rollout_unsupported(s, r[0])}"
                        for r in rollouts if r not in fitting]
        rows = rollout_policies(s, fitting, docs)
        plan.append((s, {**with_tuned(policies_for(s.problem, agents_fitting(s, agents), sc.name), s.problem, docs),
                         **rows}))
    run_plan(plan, seed_list, progress, threads, workers=workers)
    return [s for s, _ in plan], skipped


def scenario_tables(settings: list[Setting], skipped: list[str], seeds: int, seed_base: int = COMPARE_SEED_BASE,
                    tuned: list = (), markdown: bool = False) -> str:
    """What ``compare --scenario`` prints: a header, the tuned knobs (``tuned``: ``[(path, document)]``),
    then per scenario its label, fingerprint, trace line and ranked table; the skipped scenarios last."""
    seed_list = seed_range(seeds, seed_base)
    out = [f"Mean ± 95% CI over {seeds} held-out seed{'s' if seeds > 1 else ''} "
           f"({seed_list[0]}..{seed_list[-1]}), same workloads for every policy; ranked by the problem's main metric; "
           f"x BEST: the paired ratio of means to the best rule's, 95% bootstrap CI."]
    for path, doc in tuned:
        out.append(f"{doc['policy']} (tuned{' on ' + doc['scenario'] if doc.get('scenario') else ''}): {doc['knobs']} from {path}")
    md = "`" if markdown else ""
    for s in settings:
        out.append(f"\n{'### ' if markdown else ''}{s.label}\n")
        out.append(f"fingerprint: {md}{s.fingerprint}{md}\n")
        if trace_line(s):
            out.append(f"{trace_line(s)}\n")
        out.append(format_setting(ranked(s), markdown=markdown))
    out += [f"\n{reason}" for reason in skipped]
    return "\n".join(out) + "\n"


def ranked(setting: Setting) -> Setting:
    """``setting`` with its rows sorted best first by the problem's main metric (``tune``'s default
    objective); the bound stays the last row."""
    key, goal = problems.get(setting.problem).metric_goal()
    sign = 1.0 if goal == "min" else -1.0
    rows = sorted(setting.rows, key=lambda r: (math.isnan(r[key]), sign * r[key] if not math.isnan(r[key]) else 0.0))
    return Setting(setting.problem, setting.label, setting.env_id, setting.env_kwargs, rows, setting.episodes,
                   setting.bound, setting.scenario, setting.fingerprint, setting.trace)


def problem_of(model) -> str:
    """The problem of ``model``: its card's env id, else the default environment whose observation
    and action spaces it has."""
    import gymnasium as gym

    env_id = getattr(model, "env_id", None)
    env_ids = {name: problems.get(name).env_id for name in AGENT_PROBLEMS}
    for name, problem_env_id in env_ids.items():
        if env_id == problem_env_id:
            return name
    if env_id is not None:
        raise ValueError(f"--agent: it was trained on {env_id}, which is none of {', '.join(env_ids.values())}")
    fits = []
    for problem in (name for name in AGENT_PROBLEMS if problems.get(name).decode_model == "reserve"):  # v0's envs
        env = gym.make(env_ids[problem])
        try:
            check_model_fits(model, env)
            fits.append(problem)
        except ValueError:
            pass
        finally:
            env.close()
    if len(fits) != 1:
        raise ValueError(f"--agent: its spaces ({model.observation_space}, {model.action_space}) fit "
                         f"{'both' if fits else 'neither'} of the default environments; say which with --agent-env")
    return fits[0]


def shipped_agents(of_problems=None) -> dict:
    """``{name: (problem, agent)}`` of the shipped agents present (sha256 verified, loaded without
    unpickling); with ``of_problems``, only those of these problems (the others are not loaded)."""
    return {name: (problem, load_agent(name)) for name, problem in available().items()
            if of_problems is None or problem in of_problems}


def agents_elsewhere(settings: list[Setting]) -> list[dict]:
    """The shipped agents present that no table of ``settings`` shows (of the decisions they show),
    each with what it was trained
    on (its card's env id and preset) and the command that shows it on that problem: ``{"agent",
    "trained_on", "see"}``. An agent of the lecture's toy (a v0 environment) acts on that problem's
    observation and actions, so it is never shown on a realistic cluster."""
    shown = {r["policy"] for s in settings for r in s.rows}
    decisions = {problems.get(s.problem).decision for s in settings}
    out = []
    for name, problem in available().items():
        if name in shown or problems.get(problem).decision not in decisions:
            continue
        c = card(name)
        env_id, kwargs = c["env_id"], c.get("env_kwargs") or {}
        if c.get("scenarios"):
            see = f"mooncake-gym compare --scenario {','.join(c['scenarios'])}"
        elif env_id.endswith("-v0") or c.get("scenarios") == []:  # a tutorial agent: on no scenario's table
            see = f"mooncake-gym compare --preset {'lecture' if env_id.endswith('-v0') else kwargs.get('preset', 'mooncake')}"
        else:
            same = [sc.name for sc in SCENARIOS.values() if sc.base_env_id == env_id and not sc.requires
                    and sc.config().get("preset") == kwargs.get("preset")]
            see = f"mooncake-gym compare --scenario {','.join(same)}" if same else ""
        where = "the lecture's toy" if env_id.endswith("-v0") else f"preset {kwargs.get('preset', 'mooncake')}"
        out.append({"agent": name, "trained_on": f"{env_id} ({where})", "see": see})
    return out


def format_elsewhere(elsewhere: list[dict]) -> str:
    """:func:`agents_elsewhere` as lines under the tables (empty if every agent was shown)."""
    if not elsewhere:
        return ""
    lines = ["Shipped agents not in these tables (each acts on the problem it was trained on):"]
    lines += [f"- {e['agent']}: trained on {e['trained_on']}" + (f"; shown by `{e['see']}`" if e["see"] else "")
              for e in elsewhere]
    return "\n".join(lines)


def trace_line(setting: Setting) -> str | None:
    """The line under a scenario's fingerprint naming the trace file it ran on, and whether that is
    the scenario's own (None: it reads none)."""
    t = setting.trace
    if t is None:
        return None
    if t["own"]:
        return f"trace: {t['path']} (sha256 {t['sha256'][:12]}...), the scenario's own"
    return (f"trace: {t['path']} (sha256 {t['sha256'][:12]}...) is NOT the scenario's trace: this table is "
            f"{setting.scenario} on another trace, a different problem (compare it only with tables of the same "
            f"fingerprint)")


def settings_json(settings: list[Setting], seeds: int, seed_base: int = COMPARE_SEED_BASE) -> dict:
    return {"seeds": seed_range(seeds, seed_base),
            "settings": [{"problem": s.problem, "label": s.label, "env_id": s.env_id,
                          "env_kwargs": {k: (v if isinstance(v, (int, float, str)) else str(v))
                                         for k, v in s.env_kwargs.items()},
                          "rows": s.rows, **({"bound": s.bound} if s.bound is not None else {}),
                          **({"scenario": s.scenario} if s.scenario is not None else {}),
                          **({"trace": s.trace} if s.trace is not None else {})}
                         for s in settings]}
