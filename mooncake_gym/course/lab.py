"""The course lab's exercise checks and its grading script (``docs/lab/``).

Students call :func:`check` from the lab notebooks::

    from mooncake_gym import lab
    lab.check("kv-bytes-per-token", 327_680)
    lab.check("router", my_router)          # a policy(view) -> action

It prints PASS or FAIL with a hint and returns the verdict. Every expected value is computed by the
package when the check runs (the cost model, a simulation, a baseline on the check's episodes): no
answer is stored in this file or printed, and a failing check says what to look at, not the value.
:data:`EXERCISES` lists the exercises; ``docs/lab/solutions/`` holds worked solutions.

Instructors grade a submitted policy or agent on seeds of their choosing (kept from the students)::

    python -m mooncake_gym.course.lab grade --env routing --policy my_router:route --seeds 101,202,303
    python -m mooncake_gym.course.lab grade --env admission --agent runs/lab/ppo_admission.zip --seeds 7,8

which prints the submission next to every baseline on the same episodes, and a score.

``LAB_QUICK=1`` in the environment makes the notebooks run with small parameters (the test suite
executes them that way); the checks themselves do not depend on it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mooncake_gym.course.sandbox import Limits, SandboxedPolicy, SubmissionFailed

#: True when the notebooks should run with small parameters (``LAB_QUICK=1``; the test suite sets it).
QUICK = os.environ.get("LAB_QUICK", "") not in ("", "0")

# Episodes the policy checks run on. Training uses seeds below 1,000 and compare 1,000,000 and up;
# instructors pick their own grading seeds.
ROUTING_CHECK_SEEDS = (501, 502, 503)
ADMISSION_CHECK_SEEDS = (601, 602, 603)
ROUTING_CHECK_KWARGS = {"rate": 8.0, "episode_requests": 1000}
ADMISSION_CHECK_KWARGS = {"load": 2.0, "episode_requests": 2000}
#: The problems ``grade`` grades (the lecture's two, on their v0 environments), with their default workloads.
GRADE_KWARGS = {"routing": ROUTING_CHECK_KWARGS, "admission": ADMISSION_CHECK_KWARGS}


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: ``run(answer) -> (passed, what was found)`` and a hint for a failure."""

    name: str
    notebook: str
    task: str
    hint: str
    run: Callable[[Any], tuple[bool, str]]


EXERCISES: dict[str, Exercise] = {}


def _exercise(name: str, notebook: str, task: str, hint: str):
    def register(run):
        EXERCISES[name] = Exercise(name, notebook, task, hint, run)
        return run

    return register


def check(name: str, answer) -> bool:
    """Check the answer to exercise ``name``; prints PASS or FAIL (with a hint) and returns the verdict."""
    exercise = EXERCISES.get(name)
    if exercise is None:
        raise ValueError(f"exercise: unknown name {name!r}; expected one of {sorted(EXERCISES)}")
    try:
        passed, found = exercise.run(answer)
    except _AnswerError as e:
        passed, found = False, str(e)
    print(f"{'PASS' if passed else 'FAIL'} {name}: {found}")
    if not passed:
        print(f"  hint: {exercise.hint}")
    return passed


class _AnswerError(Exception):
    """The answer has the wrong type or raised: a FAIL that says so, not a traceback from inside."""


# -- helpers ----------------------------------------------------------------------------------------
def _number(answer, what: str) -> float:
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        raise _AnswerError(f"answer: expected a number ({what}), got {answer!r}")
    value = float(answer)
    if not math.isfinite(value):
        raise _AnswerError(f"answer: expected a finite number ({what}), got {answer!r}")
    return value


def _close(answer, expected: float, what: str, rel: float = 0.0, abs_: float = 0.0) -> tuple[bool, str]:
    value = _number(answer, what)
    ok = abs(value - expected) <= max(rel * abs(expected), abs_)
    tolerance = ("exactly" if rel < 1e-6 else f"within {rel * 100:g} %") if rel else f"within {abs_:g}"
    return ok, (f"{value:g} is right ({tolerance})" if ok else f"{value:g} is not right (it must be right {tolerance})")


def _callable(answer, what: str) -> Callable:
    if not callable(answer):
        raise _AnswerError(f"answer: expected a function ({what}), got {type(answer).__name__}")
    return answer


def _call(policy: Callable, view, what: str):
    try:
        return policy(view)
    except Exception as e:  # the student's code: report it as a failure naming the request
        raise _AnswerError(f"your {what} raised {type(e).__name__}: {e} (at request {view.index})") from e


def _means(env_id: str, policy, seeds, keys, **kwargs) -> list[float]:
    """The means over one episode per seed of the metrics ``keys`` of ``policy`` on ``env_id``."""
    from mooncake_gym.evaluation.episodes import evaluate

    try:
        runs = evaluate(env_id, policy, list(seeds), **kwargs)
    except Exception as e:  # the student's code: report it as a failure
        raise _AnswerError(f"running your policy failed: {type(e).__name__}: {e}") from e
    return [float(np.mean([r[key] for r in runs])) for key in keys]


def _routing_views(n: int = 300, seed: int = 12, rate: float = 8.0):
    """The first ``n`` decision views of a routing run driven by Algorithm 1 (busy queues, warm caches)."""
    from mooncake_gym.baselines import make_policy
    from mooncake_gym.sim.policy import reset_policy
    from mooncake_gym.sim.routing import RoutingSimulator
    from mooncake_gym.model.workload import synthetic_trace

    sim = RoutingSimulator(synthetic_trace(seed, rate))
    kvcentric = make_policy("routing", "kvcentric")
    reset_policy(kvcentric, seed)
    view = sim.view
    while view is not None and view.index < n:
        yield view
        view = sim.step(kvcentric(view))


def _admission_views(n: int = 400, seed: int = 13):
    """The first ``n`` decision views of demo 3's overload workload driven by ``baseline`` (a full decode pool)."""
    from mooncake_gym.baselines import make_policy
    from mooncake_gym.sim.admission import LectureAdmission, overload_workload

    trace, _ = overload_workload(seed=seed)
    sim = LectureAdmission(trace)
    baseline = make_policy("admission", "baseline")
    view = sim.reset()
    while view is not None and view.index < n:
        yield view
        view = sim.step(baseline(view))


def _baseline(problem: str, name: str):
    from mooncake_gym.baselines import make_policy

    return make_policy(problem, name)


# -- notebook 1: the lecture's three demos ----------------------------------------------------------
@_exercise("kv-bytes-per-token", "01_lecture_demos",
           "KV-cache bytes per token of LLaMA2-70B (BF16)",
           "K and V, for every layer, for every KV head (GQA: n_kv_heads, not n_heads), d_head values of 2 bytes; "
           "the preset's fields are in mooncake_gym.model.costmodel.get_model('llama2-70b').")
def _kv_bytes(answer):
    from mooncake_gym.model.costmodel import get_model

    return _close(answer, get_model("llama2-70b").kv_bytes_per_token, "bytes", rel=1e-9)


@_exercise("dram-speedup", "01_lecture_demos",
           "how many times faster reading one token's KV from CPU DRAM is than recomputing it "
           "(LLaMA2-70B on 8 A800)",
           "recompute time per token = prefill compute of an 8,192-token prompt / 8,192; load time = KV bytes / "
           "DRAM bandwidth; CostModel.preset('llama2-70b', 'A800', 8) has both (see demo 1's table).")
def _dram_speedup(answer):
    from mooncake_gym.model.costmodel import CostModel

    cost = CostModel.preset("llama2-70b", "A800", 8)
    return _close(answer, cost.recompute_s_per_token(8192) / cost.load_s(1, "dram"), "a ratio", rel=0.02)


@_exercise("ssd-loses", "01_lecture_demos",
           "the model of demo 1 ('llama2-70b' or 'opt-13b') whose KV is slower to read from SSD than to recompute",
           "compare the ssd column of demo 1 for both setups: a ratio below 1 means reading back loses.")
def _ssd_loses(answer):
    from mooncake_gym.model.costmodel import CostModel
    from mooncake_gym.course.lecture import DEMO1_SETUPS

    if not isinstance(answer, str):
        raise _AnswerError(f"answer: expected the name of one of demo 1's models (a string), got {answer!r}")
    losers = [model for model, gpu, n in DEMO1_SETUPS
              if CostModel.preset(model, gpu, n).recompute_s_per_token(8192) < CostModel.preset(model, gpu, n).load_s(1, "ssd")]
    ok = answer.strip().lower() in losers and len(losers) == 1
    return ok, f"{answer!r} is {'right' if ok else 'not right'}"


@_exercise("cache-hit-share", "01_lecture_demos",
           "demo 2: the hit share (hit_ratio) of the `cache` router at 8 sessions/s, seed 0",
           "run_baselines('routing', synthetic_trace(0, 8.0)) returns a result per router; read metrics['hit_ratio'] "
           "of 'cache' (a share between 0 and 1, not a percentage).")
def _cache_hit_share(answer):
    from mooncake_gym.sim.routing import simulate
    from mooncake_gym.model.workload import synthetic_trace

    expected = simulate(synthetic_trace(0, 8.0), _baseline("routing", "cache"), seed=0).metrics["hit_ratio"]
    return _close(answer, expected, "a share in [0, 1]", abs_=0.005)


@_exercise("early-waste-cut", "01_lecture_demos",
           "demo 3: by what share early rejection cuts the wasted prefill seconds of `baseline` "
           "(1 - early's / baseline's)",
           "run_baselines('admission', overload_workload()[0]) gives both; read metrics['wasted_prefill_s'] "
           "(a share between 0 and 1, not a percentage).")
def _early_waste_cut(answer):
    from mooncake_gym.sim.admission import overload_workload, simulate

    trace, _ = overload_workload()
    waste = {name: simulate(trace, _baseline("admission", name), seed=0).metrics["wasted_prefill_s"]
             for name in ("baseline", "early")}
    return _close(answer, 1.0 - waste["early"] / waste["baseline"], "a share in [0, 1]", abs_=0.01)


# -- notebook 2: your own router and admission policy -----------------------------------------------
@_exercise("best-instance", "02_your_own_policies",
           "a function view -> the instance with the smallest estimated TTFT without a pull",
           "Algorithm 1's estimate for instance i is view.ttft_s(i): queue + prefill given its local hit. "
           "Return an int index, the argmin over range(view.n_instances).")
def _best_instance(answer):
    fn = _callable(answer, "view -> instance")
    wrong, first, n = 0, None, 0
    for view in _routing_views():
        n += 1
        choice = _call(fn, view, "function")
        if isinstance(choice, bool) or not isinstance(choice, (int, np.integer)) or not 0 <= choice < view.n_instances:
            raise _AnswerError(f"answer: expected an instance index in 0..{view.n_instances - 1}, got {choice!r} "
                               f"(at request {view.index})")
        best = min(view.ttft_s(i) for i in range(view.n_instances))
        if view.ttft_s(int(choice)) > best + 1e-12:
            wrong += 1
            first = view.index if first is None else first
    if wrong:
        return False, f"{wrong} of {n} views answered with a slower instance (the first at request {first})"
    return True, f"the fastest instance on all {n} views"


def _routing_check(policy, target: str, slack: float):
    """Pass if ``policy``'s mean TTFT on the check episodes is at most (1 + slack) x ``target``'s."""
    from mooncake_gym.envs import ROUTING_ENV_ID

    [mine] = _means(ROUTING_ENV_ID, policy, ROUTING_CHECK_SEEDS, ["mean_ttft_s"], **ROUTING_CHECK_KWARGS)
    [theirs] = _means(ROUTING_ENV_ID, _baseline("routing", target), ROUTING_CHECK_SEEDS, ["mean_ttft_s"],
                      **ROUTING_CHECK_KWARGS)
    ok = mine <= theirs * (1.0 + slack)
    return ok, (f"your mean TTFT over {len(ROUTING_CHECK_SEEDS)} episodes at 8 sessions/s is {mine:.3f} s: "
                + ("on target" if ok else "not yet on target"))


@_exercise("router", "02_your_own_policies",
           "a routing policy whose mean TTFT is no worse than the `cache` baseline's (Algorithm 1 without pulls)",
           "weigh the queue against the prefix hit: view.ttft_s(i) combines both. Balancing queues alone (`load`) "
           "recomputes nearly everything.")
def _router(answer):
    return _routing_check(_callable(answer, "a routing policy view -> instance"), "cache", 0.0)


@_exercise("router-pulls", "02_your_own_policies",
           "a routing policy within 5 % of Algorithm 1 (`kvcentric`) on mean TTFT",
           "consider pulling the best prefix first: view.ttft_s(i, pull=True) is the estimate after a pull, and "
           "mooncake_gym.sim.routing.Route(i, pull=True) is the action.")
def _router_pulls(answer):
    return _routing_check(_callable(answer, "a routing policy view -> instance or Route"), "kvcentric", 0.05)


@_exercise("decode-fits", "02_your_own_policies",
           "a function view -> whether the request's expected KV (input + the workload's mean output tokens) "
           "fits on the emptiest decode instance now",
           "the emptiest instance holds min(view.decode_used_per_instance) tokens of "
           "view.decode_capacity_per_instance; 'fits' means used + need <= capacity.")
def _decode_fits(answer):
    fn = _callable(answer, "view -> bool")
    wrong, first, n, fits = 0, None, 0, 0
    for view in _admission_views():
        n += 1
        said = _call(fn, view, "function")
        if not isinstance(said, (bool, np.bool_)):
            raise _AnswerError(f"answer: expected True or False, got {said!r} (at request {view.index})")
        truth = (min(view.decode_used_per_instance) + view.input_tokens + view.mean_output_tokens
                 <= view.decode_capacity_per_instance)
        fits += truth
        if bool(said) != truth:
            wrong += 1
            first = view.index if first is None else first
    if wrong:
        return False, f"{wrong} of {n} views answered wrongly (the first at request {first})"
    return True, f"right on all {n} views ({fits} fit, {n - fits} do not)"


@_exercise("admission", "02_your_own_policies",
           "an admission policy with at least the goodput of `early` and at most its wasted prefill",
           "check the TTFT SLO first (view.predicted_ttft_s), then look at the decode pool when this request will "
           "reach it, not now: view.project_decode(view.predicted_prefill_finish, ...) projects it.")
def _admission(answer):
    from mooncake_gym.envs import ADMISSION_ENV_ID

    fn = _callable(answer, "an admission policy view -> bool")

    keys = ("goodput", "wasted_prefill_s")
    goodput, wasted = _means(ADMISSION_ENV_ID, fn, ADMISSION_CHECK_SEEDS, keys, **ADMISSION_CHECK_KWARGS)
    early_goodput, early_wasted = _means(ADMISSION_ENV_ID, _baseline("admission", "early"), ADMISSION_CHECK_SEEDS,
                                         keys, **ADMISSION_CHECK_KWARGS)
    ok = goodput >= early_goodput and wasted <= early_wasted
    return ok, (f"your goodput {goodput:.0f} and wasted prefill {wasted:.0f} s per episode (load 2, "
                f"{len(ADMISSION_CHECK_SEEDS)} episodes): " + ("on target" if ok else "not yet on target"))


# -- notebook 3: training an agent ------------------------------------------------------------------
@_exercise("trained-router", "03_train_an_agent",
           "a trained routing agent (anything with SB3's predict) no worse than the `cache` baseline",
           "train longer (50,000 steps take well under a minute) or check that the model was trained on "
           "mooncake_gym/PrefillRouting-v0 with its default n_instances.")
def _trained_router(answer):
    if not hasattr(answer, "predict"):
        raise _AnswerError(f"answer: expected a trained model with predict(obs), got {type(answer).__name__}")
    return _routing_check(answer, "cache", 0.0)


# -- notebook 4: reading the results ----------------------------------------------------------------
@_exercise("ci95", "04_reading_results",
           "a function values -> (mean, half-width of the 95 % confidence interval of the mean), Student's t",
           "half-width = t(0.975, n - 1) x sample standard deviation (ddof=1) / sqrt(n); with 2 values "
           "t is 12.71, not 1.96.")
def _ci95(answer):
    from mooncake_gym.experiments.compare import mean_ci95

    fn = _callable(answer, "values -> (mean, half-width)")
    rng = np.random.default_rng(14)
    for n in (2, 3, 5, 10):
        values = rng.normal(1.0, 0.3, n).round(3).tolist()
        try:
            got = fn(list(values))
            mean, half = (float(x) for x in got)
        except Exception as e:  # the student's code or a wrong shape of answer
            raise _AnswerError(f"your function on {n} values: expected a pair of numbers, got "
                               f"{type(e).__name__}: {e}") from e
        want_mean, want_half = mean_ci95(values)
        if not (math.isclose(mean, want_mean, rel_tol=1e-3) and math.isclose(half, want_half, rel_tol=0.01)):
            return False, f"not right for {n} values {values}"
    return True, "right for 2, 3, 5 and 10 values"


@_exercise("p90-ttft", "04_reading_results",
           "the P90 TTFT (s) of the `kvcentric` router on the routing env at 8 sessions/s, seed 0",
           "evaluate(..., keep_result=True) keeps each episode's per-request TTFTs in result.ttft_s; "
           "np.percentile(..., 90), or the metric p90_ttft_s the episode already reports.")
def _p90(answer):
    from mooncake_gym.envs import ROUTING_ENV_ID

    [expected] = _means(ROUTING_ENV_ID, _baseline("routing", "kvcentric"), [0], ["p90_ttft_s"], rate=8.0)
    return _close(answer, expected, "seconds", rel=0.005)


# -- grading ----------------------------------------------------------------------------------------
def load_policy(spec: str) -> Callable:
    """``module:function`` (importable, or found in the current directory) or ``path/file.py:function``."""
    if ":" not in spec:
        raise ValueError(f"--policy: expected module:function or path/file.py:function, got {spec!r}")
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ValueError(f"--policy: no file {path}")
            loader = importlib.util.spec_from_file_location(f"submission_{path.stem}", path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--policy: cannot import {module_name!r}: {e}") from e
    policy = getattr(module, attr, None)
    if not callable(policy):
        raise ValueError(f"--policy: {module_name!r} has no function {attr!r}")
    return policy


#: Most grading seeds (episodes per policy), and the largest seed.
MAX_GRADING_SEEDS = 1000
MAX_SEED = 2**32 - 1


def _seeds(text: str) -> list[int]:
    """Comma-separated grading seeds: integers in [0, 2^32 - 1], distinct, at most 1,000."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers such as 101,202, got {text!r}") from None
    if not seeds:
        raise ValueError("--seeds: expected at least one seed")
    if len(seeds) > MAX_GRADING_SEEDS:
        raise ValueError(f"--seeds: expected at most {MAX_GRADING_SEEDS} seeds, got {len(seeds)}")
    bad = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if bad:
        raise ValueError(f"--seeds: expected seeds in [0, {MAX_SEED}], got {bad[0]}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds: each seed once (an episode counted twice weighs twice), got {repeated[0]} again")
    return seeds


@dataclass(frozen=True)
class Rubric:
    """How ``grade`` scores an exercise: fixed thresholds of its problem's main metric, measured once
    (:func:`measure_rubric`, ``python -m mooncake_gym.course.lab rubric --env ENV``) on
    :data:`RUBRIC_SEEDS` with the exercise's default workload (``GRADE_KWARGS``) and written here.

    A mean ``metric`` at or better than ``full`` (the ``reference`` baseline's) scores 100, at or
    worse than ``zero`` (the ``floor`` baseline's) 0, linearly in between (``goal``: ``min`` when
    lower is better). The score depends on the submission's metric alone, never on what the
    baselines did in the same run."""

    metric: str
    goal: str
    full: float
    zero: float
    reference: str
    floor: str

    def score(self, value: float) -> float:
        """The score of a mean ``metric`` of ``value``, in [0, 100]."""
        share = (value - self.zero) / (self.full - self.zero)  # both signs of goal: full is better than zero
        return 100.0 * min(1.0, max(0.0, share))


#: The episodes the rubric's thresholds were measured on (apart from the checks' 501-603, training's
#: seeds below 1,000 and compare's from 1,000,000; graders pick their own hidden seeds).
RUBRIC_SEEDS = tuple(range(3_000_000, 3_000_010))
#: The rubric of each graded exercise, on its problem's main metric (compare ranks by it). Routing:
#: full marks at Mooncake's Algorithm 1 (kvcentric), zero at random routing. Admission: full marks at
#: the best baseline (admitting every request: on the lecture's toy at load 2 no rejection rule
#: beats it on goodput), zero at rejecting every request (goodput 0, by construction). The measured
#: figures: ``python -m mooncake_gym.course.lab rubric --env routing`` and ``--env admission``
#: (2026-12-03; docs/lab/README.md, "Grading"); tests check that the command still measures them.
RUBRIC = {
    "routing": Rubric("mean_ttft_s", "min", full=0.4320200523657727, zero=6.3723063105098685,
                      reference="kvcentric", floor="random"),
    "admission": Rubric("goodput", "max", full=1541.0, zero=0.0, reference="baseline",
                        floor="rejecting every request"),
}


def measure_rubric(env: str, names=None, seeds=RUBRIC_SEEDS) -> dict:
    """The mean of ``env``'s rubric metric for each baseline of ``names`` (default: every one) on
    ``seeds`` with the exercise's default workload: how :data:`RUBRIC`'s thresholds were measured."""
    from mooncake_gym.experiments.compare import Setting, run_setting
    from mooncake_gym.evaluation import problems

    if env not in RUBRIC:
        raise ValueError(f"--env: expected {' or '.join(RUBRIC)}, got {env!r}")
    problem = problems.get(env)
    policies = problem.policies()
    setting = Setting(env, env, problem.env_id, dict(GRADE_KWARGS[env]))
    run_setting(setting, {n: policies[n] for n in (names or policies)}, list(seeds))
    metric = RUBRIC[env].metric
    return {n: float(np.mean([e[metric] for e in episodes])) for n, episodes in setting.episodes.items()}


def grade(env: str, seeds, policy=None, agent=None, env_kwargs: dict | None = None, name: str = "submission",
          limits: Limits = Limits(), baselines=None):
    """Evaluate ``policy`` or ``agent`` (an SB3 model) next to the baselines of ``env`` ('routing' or
    'admission'; ``baselines``: their names, default every one) on ``seeds``; returns ``(setting,
    scores)`` where ``setting`` holds the table rows (compare's format, means with 95 % intervals) and
    ``scores`` maps each row to its mean return, its mean rubric metric and its score by the
    exercise's fixed :data:`RUBRIC` (None with ``env_kwargs`` that change the workload the rubric was
    measured on).

    ``policy`` is a function of the view (run here), or a submission ``module:function`` /
    ``path/file.py:function``, run in a child process within ``limits``
    (:class:`~mooncake_gym.course.sandbox.SandboxedPolicy`). A submission that fails (an error, a
    time or memory limit, a crash) gets no row; its score is 0 and ``scores[name]["failure"]`` says
    why. A sandboxed submission's ``scores[name]["confinement"]`` says what confined its file system
    (:attr:`~mooncake_gym.course.sandbox.SandboxedPolicy.confinement`: ``"landlock ABI N"`` or ``"none"``)."""
    from mooncake_gym.experiments.compare import Setting, policies_for, run_setting
    from mooncake_gym.evaluation import problems
    from mooncake_gym.evaluation.episodes import ModelPolicy, ViewPolicy

    if env not in GRADE_KWARGS:
        raise ValueError(f"--env: expected {' or '.join(GRADE_KWARGS)}, got {env!r}")
    if (policy is None) == (agent is None):
        raise ValueError("grade: give exactly one of --policy and --agent")
    kwargs = {**GRADE_KWARGS[env], **(env_kwargs or {})}
    env_id = problems.get(env).env_id
    label = f"{env}: {', '.join(f'{k}={v}' for k, v in kwargs.items())}; {len(seeds)} hidden seeds"
    setting = Setting(env, label, env_id, kwargs)
    failure, submission = None, policy
    try:
        if isinstance(policy, str):
            submission = SandboxedPolicy(policy, limits, name)  # imports it: a failure is known before the baselines run
    except SubmissionFailed as e:
        failure = str(e)
    try:
        every = policies_for(env, {})
        run_setting(setting, {n: p for n, p in every.items() if baselines is None or n in baselines}, list(seeds))
        if failure is None:
            run_setting(setting, {name: ViewPolicy(submission, name) if policy is not None else ModelPolicy(agent, name)},
                        list(seeds))
    except SubmissionFailed as e:
        failure = str(e)
    except (TypeError, ValueError) as e:  # an answer the environment refuses (the check of actions)
        if not isinstance(policy, str):
            raise
        failure = f"its answer is not an action: {e}"
    finally:
        if isinstance(submission, SandboxedPolicy):
            submission.close()
    rubric = RUBRIC[env]
    scored = kwargs == GRADE_KWARGS[env]  # the rubric's thresholds hold for the workload they were measured on
    scores = {}
    for n, episodes in setting.episodes.items():
        value = float(np.mean([e[rubric.metric] for e in episodes]))
        scores[n] = {"return": float(np.mean([e["return"] for e in episodes])), rubric.metric: value,
                     "score": rubric.score(value) if scored else None}
    if failure is not None:
        scores[name] = {"return": float("nan"), rubric.metric: float("nan"), "score": 0.0, "failure": failure}
    if isinstance(submission, SandboxedPolicy):
        scores[name]["confinement"] = submission.confinement
    return setting, scores


def format_grade(setting, scores: dict) -> str:
    from mooncake_gym.reporting import tables as report
    from mooncake_gym.experiments.compare import format_setting

    lines = [setting.label, "", format_setting(setting), ""]
    lines += [f"{n} FAILED: {s['failure']}\n" for n, s in scores.items() if "failure" in s]
    rubric = RUBRIC[setting.problem]
    rows = [{"policy": n, "return": s["return"], rubric.metric: s[rubric.metric],
             "score": "n/a" if s["score"] is None else f"{s['score']:.1f}"} for n, s in scores.items()]
    lines.append(report.format_table(rows, [("policy", "policy", None), ("return", "mean return", ".1f"),
                                            (rubric.metric, rubric.metric, ".4g"), ("score", "score", None)]))
    better = "or lower" if rubric.goal == "min" else "or higher"
    lines += ["", f"score (the rubric, docs/lab/README.md): 100 at {rubric.metric} {rubric.full:.4g} {better} "
                  f"({rubric.reference}'s), 0 at {rubric.zero:.4g} ({rubric.floor}'s), linear in between"]
    if any(s["score"] is None for s in scores.values()):
        lines.append("no score: the rubric's thresholds were measured on the default workload, not with --env-kwarg")
    for n, s in scores.items():
        if "confinement" in s:
            unconfined = " (no Landlock here: it could read what the grader's user can read)"
            lines.append(f"{n} ran in the sandbox; its file system confined by: {s['confinement']}"
                         + (unconfined if s["confinement"] == "none" else ""))
    return "\n".join(lines)


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--env-kwarg: expected key=value, got {text!r}")
    import json

    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mooncake_gym.course.lab",
                                     description="The course lab: list the exercises, or grade a submission.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the checked exercises, by notebook")
    r = sub.add_parser("rubric", help="measure the grading rubric's thresholds (every baseline on the rubric's seeds)")
    r.add_argument("--env", required=True, choices=list(RUBRIC))
    g = sub.add_parser("grade", help="evaluate a submitted policy or agent next to the baselines on hidden seeds")
    g.add_argument("--env", required=True, choices=list(GRADE_KWARGS))
    who = g.add_mutually_exclusive_group(required=True)
    who.add_argument("--policy", help="module:function or path/file.py:function, a policy(view) -> action, run in a "
                                      "child process with time and memory limits (mooncake_gym.course.sandbox)")
    who.add_argument("--agent", help="an agent zip with its JSON card (mooncake-gym train's; loaded without unpickling), "
                                     "or an RLlib checkpoint folder (with --unsafe-pickle; the ray extra)")
    g.add_argument("--unsafe-pickle", action="store_true",
                   help="allow an --agent zip without a card (unpickled by SB3's load) or an RLlib checkpoint (pickled): "
                        "it CAN RUN CODE; trusted files only")
    g.add_argument("--seeds", required=True, help="comma-separated episode seeds, e.g. 101,202 (keep them hidden)")
    g.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment argument (repeatable), e.g. rate=12 or waste_penalty=0.5")
    g.add_argument("--name", default="submission", help="the submission's row label")
    g.add_argument("--time-limit-episode", type=float, default=Limits.episode_s, metavar="S",
                   help=f"a --policy's seconds per episode (default {Limits.episode_s:g})")
    g.add_argument("--time-limit", type=float, default=Limits.total_s, metavar="S",
                   help=f"a --policy's seconds in all (default {Limits.total_s:g})")
    g.add_argument("--memory-mb", type=int, default=Limits.memory_mb, metavar="MB",
                   help=f"a --policy's memory (default {Limits.memory_mb})")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for ex in EXERCISES.values():
                print(f"{ex.notebook:24} {ex.name:20} {ex.task}")
            return 0
        if args.command == "rubric":
            rubric = RUBRIC[args.env]
            print(f"{args.env}: mean {rubric.metric} on seeds {RUBRIC_SEEDS[0]}..{RUBRIC_SEEDS[-1]}, "
                  f"{', '.join(f'{k}={v}' for k, v in GRADE_KWARGS[args.env].items())}")
            for n, value in measure_rubric(args.env).items():
                print(f"{n:12} {value!r}")
            return 0
        seeds = _seeds(args.seeds)
        env_kwargs = dict(_key_value(kv) for kv in args.env_kwarg)
        limits = Limits(args.time_limit_episode, args.time_limit, args.memory_mb)
        policy = args.policy  # run in a child process (mooncake_gym.course.sandbox)
        agent = None
        if args.agent:
            from mooncake_gym.agents import load_user_agent

            agent = load_user_agent(args.agent, trusted=args.unsafe_pickle)
        setting, scores = grade(args.env, seeds, policy, agent, env_kwargs, args.name, limits)
    except (ValueError, FileNotFoundError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's code for SIGINT
        parser.exit(130, f"{parser.prog}: interrupted\n")
    if args.json:
        from mooncake_gym.reporting import tables as report

        report.print_json({"label": setting.label, "seeds": seeds, "rows": setting.rows, "scores": scores})
    else:
        print(format_grade(setting, scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
