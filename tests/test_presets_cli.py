"""``--preset`` on replay, overload and compare (mooncake_gym.experiments.preset_runs): ``lecture`` is the lecture's
simulators exactly; a realistic preset runs the whole cluster (conductor.simulate, the v1 envs);
options a preset does not take are one-line errors before any work."""

import json

import pytest

from mooncake_gym.sim import cluster as conductor
from mooncake_gym.sim import admission as overload
from mooncake_gym.sim import routing
from mooncake_gym.baselines import ADMISSION_POLICIES, ROUTING_POLICIES, make_policy, run_baselines
from mooncake_gym.cli import main
from mooncake_gym.envs import ADMISSION_V1_ENV_ID, ROUTING_V1_ENV_ID
from mooncake_gym.model.presets import get_preset
from mooncake_gym.reporting.tables import to_jsonable
from mooncake_gym.model.workload import read_trace, synthetic_trace, write_trace


def run_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("presets") / "small.jsonl"
    write_trace(synthetic_trace(3, rate=6.0).head(600), path)
    return str(path)


# --- lecture: the lecture's simulators, as without the option ----------------------------------------
def test_lecture_preset_is_the_routing_simulator_and_prints_the_same(capsys, small_trace):
    doc = run_json(capsys, "replay", "--trace", small_trace, "--policy", "kvcentric", "--preset", "lecture")
    expected = routing.simulate(read_trace(small_trace), make_policy("routing", "kvcentric")).metrics
    assert doc["results"]["kvcentric"] == to_jsonable(expected)
    assert "preset" not in doc and doc["config"]["ttft_slo_s"] == 5.0 and doc["config"]["cache_blocks"] == 3000


@pytest.mark.parametrize("command", [["replay", "--policy", "cache"], ["overload", "--policy", "early", "--requests", "300"]])
def test_the_default_preset_is_mooncake_the_faithful_cluster(capsys, small_trace, command):
    outs = []
    for argv in (["--preset", "mooncake"], []):
        assert main([*command, "--trace", small_trace, *argv]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "preset mooncake: 8 prefill + 8 decode instances" in outs[0]


def test_lecture_preset_is_the_overload_simulator(capsys):
    doc = run_json(capsys, "overload", "--requests", "800", "--policy", "early", "--preset", "lecture")
    trace, sat = overload.overload_workload(synthetic_trace(0, rate=4.0), 2.0, 800, 0, pool="decode")
    capacity = sat.decode_per_s
    expected = run_baselines("admission", trace, ["early"], overload.OverloadConfig(), seed=0)["early"].metrics
    assert doc["results"]["early"] == to_jsonable(expected)
    assert doc["decode_capacity_per_s"] == capacity and doc["config"]["ttft_slo_s"] == 30.0


# --- realistic presets: the cluster simulator ---------------------------------------------------------
def test_replay_on_a_cluster_preset_is_conductor_simulate_with_the_router(capsys, small_trace):
    doc = run_json(capsys, "replay", "--trace", small_trace, "--policy", "kvcentric", "--preset", "mooncake")
    expected = conductor.simulate(read_trace(small_trace), "mooncake", routing=make_policy("routing", "kvcentric"))
    assert doc["results"]["kvcentric"] == to_jsonable(expected.metrics)
    assert doc["preset"]["name"] == "mooncake" and doc["preset"]["ttft_slo_s"] == 30.0
    assert doc["preset"]["decode_capacity_tokens"] == get_preset("mooncake").decode_capacity_per_instance


def test_replay_on_a_cluster_preset_prints_ttft_and_tbt_per_router(capsys, small_trace):
    assert main(["replay", "--trace", small_trace, "--preset", "h100", "--instances", "4", "--ttft-slo", "10"]) == 0
    header, columns, _, *rows = capsys.readouterr().out.strip().splitlines()
    assert "preset h100: 4 prefill + 8 decode instances" in header and "TTFT SLO 10 s" in header
    assert "mean TTFT s" in columns and "mean TBT s" in columns and "TBT<=SLO" in columns
    assert [r.split()[0] for r in rows] == [*ROUTING_POLICIES, "bound"]
    # the bound row: no policy's mean TTFT is below it
    bound = float(rows[-1].split()[1])
    assert all(float(r.split()[1]) >= bound for r in rows[:-1])
    # one policy's table is its row alone (the bound is in --json)
    assert main(["replay", "--trace", small_trace, "--preset", "h100", "--policy", "kvcentric"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].split()[0] == "kvcentric"


def test_replay_json_carries_the_bound_no_policy_beats(capsys, small_trace):
    from mooncake_gym.analysis.bounds import cluster_ttft_bound, ttft_lower_bound
    from mooncake_gym.model.presets import RoutingConfig
    tr = read_trace(small_trace)
    doc = run_json(capsys, "replay", "--trace", small_trace, "--preset", "mooncake")
    assert doc["bound"]["mean_ttft_s"] == cluster_ttft_bound(tr, "mooncake").mean_ttft_s
    assert all(m["mean_ttft_s"] >= doc["bound"]["mean_ttft_s"] for m in doc["results"].values())
    doc = run_json(capsys, "replay", "--preset", "lecture", "--trace", small_trace, "--instances", "3", "--policy",
                   "kvcentric")
    assert doc["bound"]["mean_ttft_s"] == ttft_lower_bound(tr, RoutingConfig(n_instances=3)).mean_ttft_s


def test_replay_overrides_and_observation_reach_the_cluster(capsys, small_trace):
    doc = run_json(capsys, "replay", "--trace", small_trace, "--policy", "kvcentric", "--preset", "mooncake",
                   "--cache-blocks", "100", "--observation", "noisy,noise_sigma=1")
    tr = read_trace(small_trace)
    p = get_preset("mooncake").with_(cache_blocks=100)
    expected = conductor.simulate(tr, p, routing=make_policy("routing", "kvcentric"), observation="noisy,noise_sigma=1")
    assert doc["results"]["kvcentric"] == to_jsonable(expected.metrics)
    assert doc["preset"]["cache_blocks"] == 100 and doc["observation"]["mode"] == "noisy"


def test_overload_on_the_overload_preset_measures_saturation_and_early_wastes_less(capsys):
    doc = run_json(capsys, "overload", "--requests", "1500", "--preset", "mooncake-overload", "--seed", "1")
    trace, sat = conductor.overload_workload(synthetic_trace(1, rate=4.0), 2.0, 1500, 1, "mooncake-overload")
    assert doc["saturation"]["bottleneck"] == "decode" and doc["saturation"]["cluster_per_s"] == sat.cluster_per_s
    assert doc["arrival_rate_per_s"] == 2.0 * sat.cluster_per_s
    res = doc["results"]
    assert set(res) == set(ADMISSION_POLICIES)
    expected = conductor.simulate(trace, "mooncake-overload", admission=make_policy("admission", "early"), seed=1)
    assert res["early"] == to_jsonable(expected.metrics)
    assert res["baseline"]["rejected_after_prefill"] > 0
    assert res["early"]["wasted_prefill_s"] < 0.8 * res["baseline"]["wasted_prefill_s"]


def test_overload_pool_sizes_reach_the_cluster_and_its_saturation(capsys):
    doc = run_json(capsys, "overload", "--requests", "400", "--preset", "mooncake-overload", "--policy", "early",
                   "--prefill-instances", "6", "--decode-instances", "2")
    p = get_preset("mooncake-overload").with_(n_prefill=6, n_decode=2)
    trace, sat = conductor.overload_workload(synthetic_trace(0, rate=4.0), 2.0, 400, 0, p)
    expected = conductor.simulate(trace, p, admission=make_policy("admission", "early"), seed=0)
    assert doc["preset"]["n_prefill"] == 6 and doc["preset"]["n_decode"] == 2
    assert doc["saturation"] == to_jsonable(sat._asdict()) and doc["arrival_rate_per_s"] == 2.0 * sat.cluster_per_s
    assert doc["results"]["early"] == to_jsonable(expected.metrics)
    default = conductor.saturation(synthetic_trace(0, rate=4.0), "mooncake-overload")  # 16 + 1 instances
    assert sat.prefill_per_s < default.prefill_per_s and sat.decode_per_s > default.decode_per_s
    assert main(["overload", "--requests", "400", "--preset", "mooncake-overload", "--policy", "early",
                 "--prefill-instances", "6", "--decode-instances", "2"]) == 0
    assert "preset mooncake-overload: 6 prefill + 2 decode instances" in capsys.readouterr().out


def test_overload_pool_sizes_reach_the_lecture_simulator(capsys):
    doc = run_json(capsys, "overload", "--preset", "lecture", "--requests", "500", "--policy", "early",
                   "--decode-instances", "4", "--prefill-instances", "3")
    config = overload.OverloadConfig(n_prefill=3, n_decode=4)
    trace, sat = overload.overload_workload(synthetic_trace(0, rate=4.0), 2.0, 500, 0, config.preset(), pool="decode")
    capacity = sat.decode_per_s
    expected = run_baselines("admission", trace, ["early"], config, seed=0)["early"].metrics
    assert doc["config"]["n_prefill"] == 3 and doc["config"]["n_decode"] == 4
    assert doc["decode_capacity_per_s"] == capacity and doc["results"]["early"] == to_jsonable(expected)


def test_replay_decode_instances_reach_the_cluster(capsys, small_trace):
    doc = run_json(capsys, "replay", "--trace", small_trace, "--policy", "kvcentric", "--preset", "mooncake",
                   "--decode-instances", "3")
    p = get_preset("mooncake").with_(n_decode=3)
    expected = conductor.simulate(read_trace(small_trace), p, routing=make_policy("routing", "kvcentric"))
    assert doc["preset"]["n_decode"] == 3 and doc["results"]["kvcentric"] == to_jsonable(expected.metrics)


def test_compare_on_a_cluster_preset_runs_the_v1_envs(capsys):
    doc = run_json(capsys, "compare", "--preset", "mooncake-overload", "--env", "admission", "--seeds", "1",
                   "--loads", "2")
    (setting,) = doc["settings"]
    assert setting["env_id"] == ADMISSION_V1_ENV_ID and setting["env_kwargs"]["preset"] == "mooncake-overload"
    rows = {r["policy"]: r for r in setting["rows"]}
    assert set(rows) == set(ADMISSION_POLICIES)
    assert rows["early"]["wasted_prefill_s"] < rows["baseline"]["wasted_prefill_s"]
    assert setting["bound"]["policy"] == "bound"  # the table's last row: no baseline beats it
    assert setting["bound"]["token_goodput"] >= max(r["token_goodput"] for r in rows.values())


def test_compare_routing_on_a_cluster_preset_takes_loads(capsys):
    doc = run_json(capsys, "compare", "--preset", "mooncake", "--env", "routing", "--seeds", "1", "--loads", "0.5")
    (setting,) = doc["settings"]
    assert setting["env_id"] == ROUTING_V1_ENV_ID and setting["env_kwargs"]["load"] == 0.5
    rows = {r["policy"]: r for r in setting["rows"]}
    assert set(rows) == set(ROUTING_POLICIES)
    assert rows["kvcentric"]["mean_ttft_s"] < rows["random"]["mean_ttft_s"]
    assert 0 < setting["bound"]["mean_ttft_s"] <= min(r["mean_ttft_s"] for r in rows.values())


# --- bad input: named, before any work ----------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["replay", "--preset", "mooncake", "--pool", "4xH800+4xA800"], "--pool: not with --preset mooncake"),
    (["replay", "--preset", "mooncake", "--instances", "0"], "--instances"),
    (["compare", "--preset", "mooncake", "--rates", "4"], "--rates: not with --preset mooncake"),
    (["compare", "--preset", "h100", "--tuned", "x.json"], "--tuned: not with --preset h100"),
    (["compare", "--preset", "mooncake", "--plot-dir", "plots"], "--plot-dir: not with --preset mooncake"),
    (["replay", "--preset", "lecture", "--decode-instances", "2"], "--decode-instances: only with a cluster --preset"),
    (["replay", "--pool", "4xH800+4xA800"], "--pool: not with --preset mooncake"),
    (["overload", "--preset", "mooncake", "--decode-instances", "0"], "--decode-instances"),
    (["overload", "--prefill-instances", "2000"], "--prefill-instances"),
    (["overload", "--preset", "mooncake-hetero", "--prefill-instances", "4"],
     "--prefill-instances: preset mooncake-hetero's prefill pool is 4xH800+4xA800; expected 8"),
    (["replay", "--preset", "mooncake-hetero", "--instances", "6"], "--instances: preset mooncake-hetero's"),
])
def test_options_a_cluster_preset_does_not_take_are_named(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_preset_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["overload", "--preset", "tpu"])
    assert e.value.code == 2 and "--preset" in capsys.readouterr().err


# --- replay --tuned: a tuned baseline's row beside its default one ---------------------------------------
def test_replay_tuned_adds_the_tuned_row_after_the_default_in_every_mode(capsys, small_trace, tmp_path):
    tuned = tmp_path / "kv.json"
    tuned.write_text(json.dumps({"policy": "kvcentric", "env": "routing", "knobs": {"threshold": 4.0}}))
    doc = run_json(capsys, "replay", "--preset", "lecture", "--trace", small_trace, "--policy", "kvcentric",
                   "--tuned", str(tuned), "--observation", "exact", "--observation", "approximate")
    tr = read_trace(small_trace)
    for mode in ("exact", "approximate"):
        assert list(doc["results"][mode]) == ["kvcentric", "kvcentric (tuned)"]
        expected = routing.simulate(tr, make_policy("routing", "kvcentric", threshold=4.0), observation=mode)
        assert doc["results"][mode]["kvcentric (tuned)"] == to_jsonable(expected.metrics)
    assert doc["results"]["exact"]["kvcentric (tuned)"] != doc["results"]["exact"]["kvcentric"]
    admission = tmp_path / "early.json"
    admission.write_text(json.dumps({"policy": "early", "env": "admission", "knobs": {"threshold": 1.0}}))
    for argv, message in ((["--tuned", str(admission), "--preset", "lecture"], "tuned for admission"),
                          (["--tuned", str(tuned)], "--tuned: not with --preset mooncake")):
        assert main(["replay", "--trace", small_trace, *argv]) == 2
        assert message in capsys.readouterr().err
