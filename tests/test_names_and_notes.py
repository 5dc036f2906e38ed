"""The small things a new user trips on (issue 27, item 9): a repeated option, a scenario run on
another trace, one name per metric, and the shipped agents a table does not show."""

from pathlib import Path

import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main
from mooncake_gym.evaluation.scenarios import get_scenario
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import cluster

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "synthetic_trace.jsonl"


@pytest.mark.parametrize("argv", [["replay", "--policy", "cache", "--policy", "load"],
                                  ["overload", "--policy", "early", "--policy", "baseline"]])
def test_a_repeated_policy_is_refused_not_dropped(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "--policy: given more than once; give it once" in capsys.readouterr().err


def test_a_scenario_on_another_trace_says_so(tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    sc = get_scenario("routing-mooncake-trace")
    check = sc.trace_check(str(other))
    assert check["own"] is False and check["path"] == str(other) and len(check["sha256"]) == 64
    s = cmp.Setting("routing", "x", sc.base_env_id, {}, scenario=sc.name, trace=check)
    assert "is NOT the scenario's trace: this table is routing-mooncake-trace on another trace" in cmp.trace_line(s)
    assert cmp.settings_json([s], 1)["settings"][0]["trace"] == check
    assert get_scenario("routing-saturated").trace_check(str(other)) is None  # it reads no trace file
    if SHARED.exists():
        assert sc.trace_check(str(SHARED))["own"] is True


def test_one_name_per_metric_and_the_old_keys_as_aliases():
    # four requests: the last arrival at 1 s, so the third and fourth start decoding after it (the drain)
    trace = Trace([0.0, 0.0, 1.0, 1.0], [1024, 512, 2048, 1024], [4, 2, 3, 5],
                  [[1, 2], [3], [4, 5, 6, 7], [8, 9]], name="tiny")
    m = cluster.simulate(trace, "mooncake", routing=make_policy("routing", "kvcentric")).metrics
    assert (m["good_requests"], m["drain_good_requests"]) == (2, 2)
    assert (m["token_goodput"], m["drain_token_goodput"]) == (4 + 2, 3 + 5)
    assert m["goodput_requests"] == m["good_requests"] and m["drain_goodput_tokens"] == m["drain_token_goodput"]
    assert m["goodput"] == m["good_requests"] + m["drain_good_requests"]
    assert m["goodput_tokens"] == m["token_goodput"] + m["drain_token_goodput"]


def test_compare_names_the_shipped_agents_it_does_not_show():
    routing = cmp.Setting("routing-cluster", "routing (mooncake)", "mooncake_gym/PrefillRouting-v1", {})
    elsewhere = {e["agent"]: e for e in cmp.agents_elsewhere([routing])}
    # routing agents only: the toy's and the realistic cluster's per-scenario agents (none is in this table)
    assert set(elsewhere) == {"ppo_routing", "ppo_routing_saturated", "expert_cluster_trace", "ppo_cluster_saturated",
                              "ppo_cluster_heterogeneous", "expert_cluster_synthetic"}
    assert elsewhere["ppo_cluster_saturated"] == {
        "agent": "ppo_cluster_saturated", "trained_on": "mooncake_gym/PrefillRouting-v1 (preset mooncake)",
        "see": "mooncake-gym compare --scenario routing-cluster-saturated,routing-cluster-bursty,routing-cluster-diurnal"}
    assert elsewhere["expert_cluster_trace"]["see"] == (
        "mooncake-gym compare --scenario routing-cluster-mooncake-trace,routing-cluster-long-context,"
        "routing-cluster-trace-window")
    # the agent trained only on synthetic workloads, shown on the trace's windows first (issue 26's target there)
    assert elsewhere["expert_cluster_synthetic"]["see"] == (
        "mooncake-gym compare --scenario routing-cluster-trace-window,routing-cluster-saturated,"
        "routing-cluster-heterogeneous,routing-cluster-bursty,routing-cluster-diurnal,routing-cluster-mooncake-trace,"
        "routing-cluster-long-context")
    assert elsewhere["ppo_routing"] == {"agent": "ppo_routing",
                                        "trained_on": "mooncake_gym/PrefillRouting-v0 (the lecture's toy)",
                                        "see": "mooncake-gym compare --preset lecture"}
    assert elsewhere["ppo_routing_saturated"]["see"] == "mooncake-gym compare --scenario routing-saturated"
    admission = cmp.Setting("admission-cluster", "admission (mooncake)", "mooncake_gym/OverloadAdmission-v1", {})
    v1 = {e["agent"]: e for e in cmp.agents_elsewhere([admission])}["ppo_admission_v1"]
    assert v1["trained_on"] == "mooncake_gym/OverloadAdmission-v1 (preset mooncake-overload)"
    assert v1["see"].startswith("mooncake-gym compare --scenario admission-load") and "admission-load2" in v1["see"]
    shown = cmp.Setting("routing", "routing", "mooncake_gym/PrefillRouting-v0", {},
                        rows=[{"policy": "ppo_routing_saturated"}])
    assert [e["agent"] for e in cmp.agents_elsewhere([shown])] == [
        "ppo_routing", "expert_cluster_trace", "ppo_cluster_saturated", "ppo_cluster_heterogeneous",
        "expert_cluster_synthetic"]
    text = cmp.format_elsewhere(cmp.agents_elsewhere([shown])[:2])
    assert text.splitlines() == ["Shipped agents not in these tables (each acts on the problem it was trained on):",
                                 "- ppo_routing: trained on mooncake_gym/PrefillRouting-v0 (the lecture's toy); "
                                 "shown by `mooncake-gym compare --preset lecture`",
                                 "- expert_cluster_trace: trained on mooncake_gym/PrefillRouting-v1 (preset mooncake); "
                                 "shown by `mooncake-gym compare --scenario routing-cluster-mooncake-trace,"
                                 "routing-cluster-long-context,routing-cluster-trace-window`"]
