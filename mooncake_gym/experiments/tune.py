"""``mooncake-gym tune``: search a baseline's knobs, or PPO's hyperparameters, on training seeds.

A baseline class publishes its knobs as ``KNOBS = {"parameter": [values, ...]}`` (the default among
them); the search space is the grid of their combinations. ``search="grid"`` tries every setting;
``search="random"`` tries ``budget`` distinct settings drawn from the grid with a seeded generator.
Each setting is scored by one objective: the mean over the workloads (``compare``'s settings) and
the training seeds of one end-of-episode metric (default ``TUNE_METRICS[problem]``: routing mean
TTFT, lower is better; admission goodput, higher is better; others in ``METRIC_GOALS``, e.g. the
admission env's ``return``: goodput minus its waste penalty). The seeds are ``0 .. seeds-1``, the range PPO training uses, disjoint
from every held-out seed (``compare``: 1,000,000 on; agent cards: 2,000,000 on; the training
callback: 10,000 on), so a tuned baseline is judged in ``compare --tuned`` on workloads its tuning
never saw.

A grid search whose best setting has a knob at the edge of its grid (its smallest or largest
value) goes on: :func:`extend_to_interior` adds the next value beyond that edge (the grid's own
step, geometric where the values are positive) and scores it with the other knobs at their best,
until the best value of every knob has a tried value on each side, or a hard limit is reached: a
value the policy refuses (``ValueError``: e.g. a weight below 0), or ``MAX_EXTENSIONS`` values added
past one edge. The document records what was added (``extended``) and each limit met (``limits``).

Backends: ``local`` runs the settings one after the other in this process; ``ray`` hands the same
objective function to Ray Tune, on a local Ray instance or on the cluster at ``address``
(``docs/scale-out.md``). Both give the same scores. ``tune_ppo`` sweeps RLlib PPO's learning rate and
discount over the same grid/random choice (Ray only).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import sys

import numpy as np

from mooncake_gym._files import check_input_file, write_atomic
from mooncake_gym.agents.rllib import ENV_IDS, init_ray, require_ray, rllib_hyperparams, train_rllib
from mooncake_gym.baselines import make_policy, POLICIES
from mooncake_gym.evaluation import problems
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.evaluation.scenarios import get_scenario
from mooncake_gym.experiments.compare import scenario_setting, tuned_name  # noqa: F401  (tuned_name: its old place)
from mooncake_gym.reporting.tables import format_table, to_jsonable

#: Training seeds start here; there are at most ``MAX_TUNE_SEEDS`` (below every held-out seed).
TUNE_SEED_BASE = 0
MAX_TUNE_SEEDS = 1000
#: The default objective of each problem: (metric of the end-of-episode metrics, "min" or "max"),
#: and every metric a search may optimise (``metric=``), with its direction (the problem registry's).
TUNE_METRICS = {p.name: (p.metric, p.goal) for p in problems.PROBLEMS.values()}
METRIC_GOALS = {p.name: p.metric_goals for p in problems.PROBLEMS.values()}
#: Requests per episode while tuning (compare's episodes are 3,000 requests long).
TUNE_EPISODE_REQUESTS = 1000
#: The PPO hyperparameters ``tune --algo ppo`` searches (RLlib's names), and its objective.
PPO_KNOBS = {"lr": [1e-4, 3e-4, 1e-3], "gamma": [0.9, 0.99]}
PPO_METRIC = ("episode_return_mean", "max")
BACKENDS = ("local", "ray")
#: At most this many values are added past one edge of a knob's grid (:func:`extend_to_interior`).
MAX_EXTENSIONS = 6
SEARCHES = ("grid", "random")


def knobs_of(problem: str, name: str) -> dict:
    """The ``KNOBS`` grid of baseline ``name`` of ``problem``; ``ValueError`` if it has none."""
    if problem not in POLICIES:
        raise ValueError(f"--env: expected one of {sorted(POLICIES)}, got {problem!r}")
    registry = POLICIES[problem]
    if name not in registry:
        raise ValueError(f"--policy: unknown {problem} policy {name!r}; expected one of {sorted(registry)}")
    knobs = getattr(registry[name], "KNOBS", None)
    if not knobs:
        tunable = sorted(n for n, f in registry.items() if getattr(f, "KNOBS", None))
        raise ValueError(f"--policy: {problem} policy {name!r} has no knobs to tune (its class defines no KNOBS); "
                         f"{problem} policies with knobs: {', '.join(tunable) or 'none'}")
    return {k: list(v) for k, v in knobs.items()}


def candidates(knobs: dict, search: str = "grid", budget: int | None = None, seed: int = 0) -> list[dict]:
    """The settings to try: every combination of ``knobs`` in grid order (``grid``), or ``budget``
    distinct ones drawn with ``numpy.random.default_rng(seed)`` (``random``, default budget: all)."""
    if search not in SEARCHES:
        raise ValueError(f"--search: expected one of {SEARCHES}, got {search!r}")
    grid = [dict(zip(knobs, values)) for values in itertools.product(*knobs.values())]
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise ValueError(f"--budget: expected an integer >= 1, got {budget!r}")
    if search == "grid":
        if budget is not None and budget < len(grid):
            raise ValueError(f"--budget: the grid {knobs} has {len(grid)} settings, more than the budget {budget}; "
                             "raise --budget or use --search random")
        return grid
    n = len(grid) if budget is None else budget
    if n > len(grid):
        raise ValueError(f"--budget: random search draws distinct settings of the grid {knobs}, which has "
                         f"{len(grid)}; got {budget}")
    picks = np.random.default_rng(seed).choice(len(grid), size=n, replace=False)
    return [grid[int(i)] for i in picks]


def _beyond(values: list, edge: str):
    """The next value past ``edge`` ("low" or "high") of the sorted numeric grid ``values``: the
    grid's ratio at that edge where both values there are > 0, else its step; integers stay
    integers (at least 1 apart)."""
    a, b = (values[1], values[0]) if edge == "low" else (values[-2], values[-1])  # b is the edge
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    nxt = b * (b / a) if a > 0 and b > 0 else b + (b - a)
    if ints:
        nxt = int(round(nxt))
        if nxt == b:
            nxt = b + (1 if b > a else -1)
        return nxt
    return float(f"{nxt:.12g}")  # 0.009, not 0.009000000000000001


def extend_to_interior(knobs: dict, results: list[dict], goal: str, score_settings, accepts,
                       max_extensions: int = MAX_EXTENSIONS) -> tuple[dict, dict]:
    """Extend a finished grid search until its best setting is interior (module docstring).

    ``knobs``: the grid (``{knob: [values]}``, numeric); ``results``: the scored settings so far
    (``{"knobs", "score"}``; appended to); ``score_settings(list of settings) -> list of scores``;
    ``accepts(setting) -> None | str`` (None: the policy takes it; else why not). Returns
    ``(extended, limits)``: the values added per knob, and per knob the hard limit met at an edge
    (the refused value and why, or that ``max_extensions`` values were added)."""
    extended: dict = {}
    limits: dict = {}
    added = {k: {"low": 0, "high": 0} for k in knobs}
    grid = {k: sorted(v) for k, v in knobs.items()}
    while True:
        best = _best(results, goal)["knobs"]
        todo = []
        for k, values in grid.items():
            if len(values) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                continue
            edge = "low" if best[k] == values[0] else "high" if best[k] == values[-1] else None
            if edge is None or (k, edge) in limits:
                continue
            if added[k][edge] >= max_extensions:
                limits[(k, edge)] = f"{max_extensions} values added past the {edge} edge"
                continue
            value = _beyond(values, edge)
            setting = {**best, k: value}
            why = accepts(setting)
            if why is not None:
                limits[(k, edge)] = f"{value!r} refused: {why}"
                continue
            todo.append((k, edge, value, setting))
        if not todo:
            break
        scores = score_settings([t[3] for t in todo])
        for (k, edge, value, setting), score in zip(todo, scores):
            results.append({"knobs": setting, "score": float(score)})
            grid[k] = sorted(grid[k] + [value])
            added[k][edge] += 1
            extended.setdefault(k, []).append(value)
    return extended, {f"{k} ({edge})": why for (k, edge), why in limits.items()}


def tune_seeds(seeds: int) -> list[int]:
    """The training seeds of a search with ``seeds`` episodes per workload."""
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_TUNE_SEEDS:
        raise ValueError(f"--seeds: expected an integer in [1, {MAX_TUNE_SEEDS}] (training seeds "
                         f"{TUNE_SEED_BASE}..{TUNE_SEED_BASE + MAX_TUNE_SEEDS - 1}), got {seeds!r}")
    return [TUNE_SEED_BASE + i for i in range(seeds)]


def workloads(problem: str, rates=(4.0, 8.0), loads=(2.0,), trace=None, speed: float = 1.0,
              episode_requests: int = TUNE_EPISODE_REQUESTS) -> list[tuple[str, dict]]:
    """``(label, env kwargs)`` of each workload a setting is scored on: ``compare``'s (``Problem.workloads``)."""
    return problems.get(problem).workloads(rates, loads, trace, speed, episode_requests, None)


def metric_goal(problem: str, metric: str | None) -> tuple[str, str]:
    """``(metric, "min" | "max")`` of a search (``metric=None``: the problem's default)."""
    return problems.get(problem).metric_goal(metric)


def objective(problem: str, name: str, knobs: dict, seeds, settings, metric: str | None = None,
              env_id: str | None = None) -> float:
    """The score of baseline ``name`` with ``knobs``: ``metric`` (default ``TUNE_METRICS[problem]``)
    averaged over every seed of every workload in ``settings`` (``[(label, env kwargs)]``) of
    ``env_id`` (default: the problem's v0 environment; a scenario's base environment with ``--scenario``)."""
    metric, _ = metric_goal(problem, metric)
    if env_id is None:
        env_id = problems.get(problem).env_id
    policy = problems.get(problem).policy(name, **knobs)  # with the environment it needs (e.g. the oracle)
    values = []
    for _, env_kwargs in settings:
        values += [e[metric] for e in evaluate(env_id, policy, seeds, **{**env_kwargs, **policy.env_kwargs})]
    return float(np.mean(values))


def _best(results: list[dict], goal: str, hint: str = "") -> dict:
    """The first result with the best finite score (grid order breaks ties)."""
    finite = [r for r in results if math.isfinite(r["score"])]
    if not finite:
        raise ValueError(f"tune: no setting gave a finite score{hint}")
    key = (lambda r: r["score"]) if goal == "min" else (lambda r: -r["score"])
    return min(finite, key=key)


def tune_baseline(policy: str, env: str, budget: int | None = None, search: str = "grid", seeds: int = 3,
                  rates=(4.0, 8.0), loads=(2.0,), trace=None, speed: float = 1.0,
                  episode_requests: int = TUNE_EPISODE_REQUESTS, backend: str = "local",
                  address: str | None = None, seed: int = 0, metric: str | None = None, progress=None,
                  scenario: str | None = None) -> dict:
    """Search the knobs of baseline ``policy`` on ``env`` ('routing' or 'admission'); returns the
    document ``tune`` writes: the best ``knobs``, its ``score``, every tried setting's score
    (``results``, in the order tried), the seeds and workloads used.

    ``progress(result)`` is called after each setting (local backend) as it finishes.

    ``scenario``: tune on that scenario (:mod:`mooncake_gym.evaluation.scenarios`) instead of the synthetic
    workloads: its environment and arguments as they are (``trace`` fills its required trace; the
    rates, loads, speed and episode length are the scenario's); the document then names the scenario
    and its fingerprint, and ``compare --scenario`` shows the row as ``NAME (tuned on SCENARIO)``.
    An admission scenario is tuned as the problem of its table (``admission-v1``: the v1 baselines,
    token goodput), and the document names that problem as its ``env``."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend: expected one of {BACKENDS}, got {backend!r}")
    env_id, extra = None, {}
    if scenario is not None:
        sc = get_scenario(scenario)
        if problems.of_scenario(sc.problem).decision != env:
            raise ValueError(f"--scenario: {scenario} is a {sc.problem} scenario, but --env is {env}")
        given = sc.trace_kwargs(trace)
        if trace is not None and not given:
            raise ValueError(f"--trace: has no effect with --scenario {scenario}: it fixes its own workload")
        if sc.missing(**given):
            raise ValueError(f"--scenario: {scenario} needs --trace")
        s = scenario_setting(sc, **given)
        settings, env_id = [(s.label, s.env_kwargs)], s.env_id
        extra = {"scenario": sc.name, "fingerprint": s.fingerprint}
        env = s.problem  # an admission or Conductor scenario: the v1 admission rules, on token goodput
    else:
        settings = workloads(env, rates, loads, trace, speed, episode_requests)
    knobs = knobs_of(baselines_of(env), policy)
    settings_to_try = candidates(knobs, search, budget, seed)
    seed_list = tune_seeds(seeds)
    metric, goal = metric_goal(env, metric)
    fixed = {"problem": env, "name": policy, "seeds": seed_list, "settings": settings, "metric": metric,
             "env_id": env_id}

    def score_settings(tried: list[dict]) -> list[float]:
        if backend != "local":
            return [r["score"] for r in _ray_tune(_baseline_trial, tried, goal, address, fixed, cpus=1)]
        out = []
        for k in tried:
            out.append(objective(env, policy, k, seed_list, settings, metric, env_id))
            if progress is not None:
                progress({"knobs": k, "score": out[-1]})
        return out

    def accepts(setting: dict) -> str | None:
        try:
            make_policy(env, policy, **setting)
        except ValueError as e:
            return str(e)
        return None

    results = [{"knobs": k, "score": v} for k, v in zip(settings_to_try, score_settings(settings_to_try))]
    extended, limits = extend_to_interior(knobs, results, goal, score_settings, accepts) if search == "grid" else ({}, {})
    best = _best(results, goal)
    return {"policy": policy, "env": env, "knobs": best["knobs"], "metric": metric, "goal": goal,
            "score": best["score"], "search": search, "backend": backend, "grid": knobs, "extended": extended,
            "limits": limits, "seeds": seed_list,
            "workloads": [{"label": label, "env_kwargs": _jsonable_kwargs(kw)} for label, kw in settings],
            "results": results, **extra}


def _jsonable_kwargs(kwargs: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str, list, tuple, dict)) or v is None else str(v))
            for k, v in kwargs.items()}


def _baseline_trial(config: dict) -> dict:
    """One Ray Tune trial of a baseline search: the same :func:`objective` as the local loop."""
    fixed = config["fixed"]
    return {"score": objective(fixed["problem"], fixed["name"], config["knobs"], fixed["seeds"], fixed["settings"],
                               fixed["metric"], fixed.get("env_id"))}


def _ppo_trial(config: dict) -> dict:
    """One Ray Tune trial of a PPO sweep: ``iterations`` RLlib PPO iterations with ``knobs``; the
    score is the last iteration's mean episode return."""
    fixed = config["fixed"]
    history = train_rllib(fixed["env"], fixed["iterations"], num_env_runners=fixed["num_env_runners"],
                          seed=fixed["seed"], env_kwargs=fixed["env_kwargs"],
                          overrides={**fixed["overrides"], **config["knobs"]})
    last = history[-1]
    return {"score": last[PPO_METRIC[0]], **{k: v for k, v in last.items() if k != PPO_METRIC[0]}}


def _ray_tune(trial, settings_to_try: list[dict], goal: str, address: str | None, fixed: dict,
              cpus: int) -> list[dict]:
    """Run ``trial`` over ``settings_to_try`` with Ray Tune (one trial per setting, ``cpus`` each);
    results in the order of ``settings_to_try``."""
    import tempfile

    require_ray("--backend ray")
    from ray import tune as ray_tune

    def report(config):
        ray_tune.report(trial(config))

    init_ray(address)
    storage = tempfile.mkdtemp(prefix="mooncake-gym-tune-")
    tuner = ray_tune.Tuner(
        ray_tune.with_resources(report, {"cpu": cpus}),
        param_space={"knobs": ray_tune.grid_search(settings_to_try), "fixed": fixed},
        tune_config=ray_tune.TuneConfig(metric="score", mode=goal),
        run_config=ray_tune.RunConfig(storage_path=storage, name="tune", verbose=0),
    )
    try:
        with _stdout_to_stderr():  # Ray Tune's own messages: stdout is the result's
            grid = tuner.fit()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    errors = [r.error for r in grid if r.error is not None]
    if errors:
        raise RuntimeError(f"tune: {len(errors)} Ray Tune trial(s) failed; the first: {errors[0]}")
    by_key = {json.dumps(r.config["knobs"], sort_keys=True): r.metrics for r in grid}
    out = []
    for k in settings_to_try:
        m = by_key[json.dumps(k, sort_keys=True)]
        out.append({"knobs": k, "score": float(m["score"]),
                    **{key: m[key] for key in m if key in _TRIAL_EXTRAS}})
    return out


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send everything written to stdout, by Python or by libraries' own handlers, to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


#: Metrics of a PPO trial kept beside its score (the domain metrics of the RLlib callback).
_TRIAL_EXTRAS = ("iteration", "timesteps", "mean_ttft_s", "hit_ratio", "completed", "goodput", "wasted_prefill_s")


def tune_ppo(env: str, budget: int | None = None, search: str = "grid", iterations: int = 10,
             num_env_runners: int = 0, address: str | None = None, seed: int = 0, env_kwargs: dict | None = None,
             overrides: dict | None = None, knobs: dict | None = None) -> dict:
    """Sweep RLlib PPO's ``knobs`` (default ``PPO_KNOBS``) on ``env`` with Ray Tune: each trial
    trains ``iterations`` iterations from ``seed``; the best has the highest last mean episode return.
    ``overrides`` (RLlib names, e.g. ``train_batch_size``) apply to every trial."""
    if env not in ENV_IDS:
        raise ValueError(f"--env: expected one of {sorted(ENV_IDS)}, got {env!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"--iterations: expected an integer >= 1, got {iterations!r}")
    if not isinstance(num_env_runners, int) or num_env_runners < 0:
        raise ValueError(f"--num-env-runners: expected an integer >= 0, got {num_env_runners!r}")
    grid = {k: list(v) for k, v in (knobs or PPO_KNOBS).items()}
    settings_to_try = candidates(grid, search, budget, seed)
    _, env_defaults = rllib_hyperparams(env)
    fixed = {"env": env, "iterations": iterations, "num_env_runners": num_env_runners, "seed": seed,
             "env_kwargs": env_kwargs, "overrides": overrides or {}}
    metric, goal = PPO_METRIC
    results = _ray_tune(_ppo_trial, settings_to_try, goal, address, fixed, cpus=1 + num_env_runners)
    best = _best(results, goal, hint=" (no trial finished an episode in its last iteration: raise --iterations "
                                     "or --train-batch, or shorten episodes with --episode-requests)")
    return {"algo": "ppo", "env": env, "knobs": best["knobs"], "metric": metric, "goal": goal,
            "score": best["score"], "search": search, "backend": "ray", "grid": grid, "iterations": iterations,
            "seed": seed, "env_kwargs": _jsonable_kwargs({**env_defaults, **(env_kwargs or {})}),
            "overrides": overrides or {}, "results": results}


def write_result(doc: dict, path: str | os.PathLike) -> None:
    """Write a tune result as JSON (what ``compare --tuned`` reads), whole or not at all."""
    write_atomic(path, json.dumps(to_jsonable(doc), indent=2) + "\n")


def baselines_of(env: str) -> str:
    """The baselines' problem of a tune result's ``env``: a problem of the registry names its own
    (``routing-cluster``: routing's rules), a decision ('routing', 'admission', 'admission-v1') is one."""
    return problems.get(env).baselines if env in problems.PROBLEMS else env


def read_tuned(path: str | os.PathLike) -> dict:
    """A baseline tune result written by :func:`write_result`, checked: its policy exists and its
    knobs are accepted by the policy's class (``ValueError`` naming the file otherwise)."""
    check_input_file(path, f"--tuned {path}")
    if os.path.getsize(path) > 1 << 24:
        raise ValueError(f"--tuned {path}: larger than 16 MiB, not a tune result")

    def refuse(constant):  # NaN and Infinity are not JSON, and never a knob
        raise ValueError(f"--tuned {path}: {constant} is not a JSON number")

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_constant=refuse)
    except json.JSONDecodeError as e:
        raise ValueError(f"--tuned {path}: not JSON (line {e.lineno}: {e.msg})") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"--tuned {path}: not a tune result ({type(e).__name__})") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("policy", "env", "knobs")):
        raise ValueError(f"--tuned {path}: expected a baseline result of `mooncake-gym tune` "
                         "(a JSON object with 'policy', 'env' and 'knobs')")
    if not isinstance(doc["knobs"], dict):
        raise ValueError(f"--tuned {path}: 'knobs' must be an object of parameter: value, got {doc['knobs']!r}")
    if not all(isinstance(doc[k], str) for k in ("policy", "env")):
        raise ValueError(f"--tuned {path}: 'policy' and 'env' must be strings")
    for knob, value in doc["knobs"].items():  # a knob is a finite number (an integer where the grid has integers)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"--tuned {path}: knob {knob} must be a finite number, got {value!r}")
    try:
        make_policy(baselines_of(doc["env"]), doc["policy"], **doc["knobs"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"--tuned {path}: {e}") from None
    return doc


def format_results(doc: dict) -> str:
    """The tried settings and their scores as a table, best marked."""
    keys = list(doc["grid"])
    rows = [{**r["knobs"], "score": r["score"], "best": "*" if r["knobs"] == doc["knobs"] else ""}
            for r in doc["results"]]
    cols = [(k, k, None) for k in keys] + [("score", f"{doc['metric']} ({doc['goal']})", ".4f"), ("best", "", None)]
    return format_table(rows, cols)
