"""The problem registry (mooncake_gym.evaluation.problems): one object per problem owning its metric
and direction, table columns, bound, baselines and env ids; the other modules iterate it."""

import gymnasium as gym
import pytest

from mooncake_gym.baselines import POLICIES
from mooncake_gym.envs import (ADMISSION_ENV_ID, ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID, ROUTING_ENV_ID,
                               ROUTING_V1_ENV_ID)
from mooncake_gym.evaluation import problems
from mooncake_gym.evaluation.scenarios import SCENARIOS
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.experiments import tune

EXPECTED = {  # name: (decision, decode model, env ids, baselines, metric, goal, first metric column, bounded)
    "routing": ("routing", "reserve", (ROUTING_ENV_ID,), "routing", "mean_ttft_s", "min", "mean_ttft_s", True),
    "admission": ("admission", "reserve", (ADMISSION_ENV_ID,), "admission", "goodput", "max", "completed", False),
    "admission-v1": ("admission", "batching", (ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID), "admission-v1",
                     "token_goodput", "max", "token_goodput", True),
    "routing-cluster": ("routing", "batching", (ROUTING_V1_ENV_ID,), "routing", "mean_ttft_s", "min",
                        "mean_ttft_s", True),
    "admission-cluster": ("admission", "batching", (ADMISSION_V1_ENV_ID,), "admission", "good_requests", "max",
                          "completed", True),
}


def test_iterating_the_registry_yields_every_problem_once():
    names = [p.name for p in problems.PROBLEMS.values()]
    assert names == list(EXPECTED) and len(set(names)) == len(names)
    assert list(problems.PROBLEMS) == names and problems.DECISIONS == ("routing", "admission")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_problem_owns_its_metric_columns_bound_baselines_and_env_ids(name):
    decision, model, env_ids, baselines, metric, goal, first, bounded = EXPECTED[name]
    p = problems.get(name)
    assert (p.decision, p.decode_model, p.env_ids, p.baselines) == (decision, model, env_ids, baselines)
    assert p.env_id == env_ids[0] and all(e in gym.registry for e in env_ids)
    assert p.metric_goal() == (metric, goal) and p.metric_goals.get(metric, goal) == goal
    assert tune.TUNE_METRICS[name] == (metric, goal) and tune.METRIC_GOALS[name] == p.metric_goals
    assert p.columns[0][0] == "policy" and p.columns[1][0] == first and p.run_columns[0][0] == "policy"
    assert (p.bound is not None) == bounded
    assert list(p.policies()) == list(POLICIES[baselines])
    assert cmp.columns_of(name) == (p.columns, p.make_row)
    with pytest.raises(ValueError, match="--metric: expected one of"):
        p.metric_goal("no_such_metric")


def test_an_unknown_problem_is_named():
    with pytest.raises(ValueError, match="--env: expected one of"):
        problems.get("scheduling")


@pytest.mark.parametrize("preset, routing, admission", [
    ("lecture", "routing", "admission"), ("mooncake", "routing-cluster", "admission-cluster"),
    ("mooncake-overload", "routing-cluster", "admission-cluster"), ("h100", "routing-cluster", "admission-cluster")])
def test_the_preset_picks_the_variant_by_its_decode_model(preset, routing, admission):
    assert problems.for_preset("routing", preset).name == routing
    assert problems.for_preset("admission", preset).name == admission


def test_every_scenario_has_exactly_one_table():
    assert set(problems.SCENARIO_PROBLEMS) == {s.problem for s in SCENARIOS.values()}
    for s in SCENARIOS.values():
        tables = [p for p in problems.PROBLEMS.values() if s.problem in p.scenario_problems]
        assert tables == [problems.of_scenario(s.problem)] and s.base_env_id in tables[0].env_ids
    assert problems.scenario_table("routing").name == "routing"
    assert problems.scenario_table("admission").name == "admission-v1"
    assert problems.of_scenario("no-such-problem") is None


def test_a_cluster_routing_baseline_acts_on_the_cluster_view():
    policy = problems.get("routing-cluster").policy("kvcentric")
    assert isinstance(policy.policy, problems.OnRoutingView) and policy.env_kwargs == {}
    # its repr names the rule and its knobs (a card records it: expert iteration's base rule)
    assert repr(policy.policy) == "OnRoutingView(KVCentric(threshold=1))"
    relsplit = problems.get("routing-cluster").policy("relsplit", long_factor=6.0, long_instances=1)
    assert repr(relsplit.policy) == ("OnRoutingView(RelativeSizeSplit(long_factor=6.0, long_instances=1, work_weight=0, "
                                     "threshold=1, memory=1000, min_load=0))")
    oracle = problems.get("admission-v1").policy("size_oracle", "size (tuned)")
    assert oracle.name == "size (tuned)" and oracle.env_kwargs == {"oracle": True}


@pytest.mark.parametrize("name", [n for n in EXPECTED if n != "admission-v1"])
def test_compare_and_tune_draw_their_workloads_from_the_problem(name):
    p = problems.get(name)
    preset = "lecture" if p.decode_model == "reserve" else "mooncake"
    (setting, *_) = cmp.settings(preset, p.decision, rates=(4.0,), loads=(2.0,))
    assert setting.problem == name and setting.env_id == p.env_id
    assert p.workloads((4.0,), (2.0,), None, 1.0, 3000, preset)[0] == (setting.label, setting.env_kwargs)
    assert problems.get("admission-v1").workloads is None  # its workloads are the scenarios'


def test_compare_plots_draws_what_the_settings_problem_names(tmp_path):
    """compare's figures come from the registry (``Problem.plot``), not from the problem's name: the
    TTFT distribution for the lecture's routing problem, the load series for the others."""
    from types import SimpleNamespace

    import numpy as np

    from mooncake_gym.reporting.plots import compare_plots

    assert [p.name for p in problems.PROBLEMS.values() if p.plot == "ttft"] == ["routing"]
    assert {p.plot for p in problems.PROBLEMS.values()} == {"ttft", "load_series"}
    ttft = SimpleNamespace(ttft_s=np.array([0.5, 1.0, 2.0]))
    loads = SimpleNamespace(sample_times_s=[0.0, 5.0], prefill_load=[0.0, 1.0], decode_load=[0.5, 0.5])
    settings = [SimpleNamespace(problem="routing", label="r", episodes={"a": [{"result": ttft}]}),
                SimpleNamespace(problem="routing-cluster", label="c", episodes={"a": [{"result": loads}]})]
    written = compare_plots(settings, tmp_path)
    assert [w.rsplit("/", 1)[-1] for w in written] == ["01_routing_ttft_box.png", "01_routing_ttft_cdf.png",
                                                        "02_routing-cluster_load_series.png"]


def test_run_baselines_names_the_problems_it_runs_and_passes_kvcentrics_threshold():
    from mooncake_gym.baselines import SIMULATORS, make_policy, run_baselines
    from mooncake_gym.model.workload import synthetic_trace
    from mooncake_gym.sim import routing

    assert sorted(SIMULATORS) == ["admission", "routing"]
    with pytest.raises(ValueError, match=r"problem: expected one of \['admission', 'routing'\], got 'conductor'"):
        run_baselines("conductor", None)
    trace = synthetic_trace(0, 4.0, duration_s=20.0)
    got = run_baselines("routing", trace, ["cache", "kvcentric"], threshold=1.5)
    assert got["kvcentric"].metrics == routing.simulate(trace, make_policy("routing", "kvcentric", threshold=1.5)).metrics
    assert got["cache"].metrics == routing.simulate(trace, make_policy("routing", "cache")).metrics  # no knob for it


def test_an_agents_problem_is_the_registry_problem_of_its_env_id():
    from types import SimpleNamespace

    for name in cmp.AGENT_PROBLEMS:
        assert cmp.problem_of(SimpleNamespace(env_id=problems.get(name).env_id)) == name
    with pytest.raises(ValueError, match=f"trained on {CONDUCTOR_ENV_ID}, which is none of {ROUTING_ENV_ID}, "
                                         f"{ADMISSION_ENV_ID}, {ADMISSION_V1_ENV_ID}, {ROUTING_V1_ENV_ID}$"):
        cmp.problem_of(SimpleNamespace(env_id=CONDUCTOR_ENV_ID))
