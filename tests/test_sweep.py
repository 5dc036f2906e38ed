"""``mooncake-gym sweep``: baselines over loads on one cluster preset; each point is the cluster
simulator's own run on the same i.i.d. draw."""

import json

import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main
from mooncake_gym.experiments.sweep import sweep
from mooncake_gym.model.workload import synthetic_trace
from mooncake_gym.reporting.plots import policy_styles
from mooncake_gym.sim import cluster

BASE = synthetic_trace(0, rate=2, duration_s=120)


def test_each_point_is_the_clusters_run_on_the_draw_of_its_load():
    out = sweep(BASE, "mooncake", "routing", ["kvcentric", "load"], [0.5, 1.0], 80, seed=3)
    assert [(r["load"], r["policy"]) for r in out["rows"]] == [(0.5, "kvcentric"), (0.5, "load"),
                                                               (1.0, "kvcentric"), (1.0, "load")]
    sat, reference = cluster.load_reference(BASE, "mooncake", "cluster")
    assert out["saturation"] == sat._asdict()
    trace, _ = cluster.overload_workload(BASE, 1.0, 80, 3, "mooncake", pool="cluster")
    direct = cluster.simulate(trace, "mooncake", routing=make_policy("routing", "load"), seed=3).metrics
    row = out["rows"][3]
    assert row["arrival_rate_per_s"] == reference
    assert row["mean_ttft_s"] == direct["mean_ttft_s"] and row["token_goodput"] == direct["token_goodput"]
    assert row["token_goodput_per_s"] == direct["token_goodput"] / direct["duration_s"]


def test_admission_sweep_hands_the_admission_decision_to_the_baselines():
    out = sweep(BASE, "mooncake-overload", "admission", ["baseline", "early"], [2.0], 80)
    trace, _ = cluster.overload_workload(BASE, 2.0, 80, 0, "mooncake-overload", pool="cluster")
    direct = cluster.simulate(trace, "mooncake-overload", admission=make_policy("admission", "early")).metrics
    assert out["rows"][1]["rejected_at_arrival"] == direct["rejected_at_arrival"]


@pytest.mark.parametrize("kwargs, match", [(dict(decision="placement"), "decision: expected"),
                                           (dict(names=["early"]), "policy: expected routing baselines"),
                                           (dict(loads=[0.0]), "load: expected")])
def test_bad_arguments(kwargs, match):
    args = dict(base=BASE, preset="mooncake", decision="routing", names=["kvcentric"], loads=[1.0], n_requests=10)
    with pytest.raises(ValueError, match=match):
        sweep(**{**args, **kwargs})


def test_the_command_prints_json_and_draws_the_plot(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    assert main(["sweep", "--policy", "kvcentric,random", "--loads", "0.5,1", "--requests", "40",
                 "--rate", "2", "--plot", str(png), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["preset"] == "mooncake" and len(doc["rows"]) == 4 and png.stat().st_size > 0
    assert main(["sweep", "--policy", "kvcentric,kvcentric"]) == 2
    assert "named twice" in capsys.readouterr().err
    assert main(["sweep", "--decision", "admission", "--policy", "kvcentric"]) == 2
    assert "--policy: expected admission baselines" in capsys.readouterr().err


def test_every_policy_gets_its_own_colour_and_marker():
    names = [f"p{k}" for k in range(40)]
    styles = policy_styles(names)
    pairs = {(s["color"], s["marker"]) for s in styles.values()}
    assert len({s["color"] for s in styles.values()}) == 40 and len(pairs) == 40
    assert policy_styles(["a", "b"])["a"]["color"] != policy_styles(["a", "b"])["b"]["color"]
