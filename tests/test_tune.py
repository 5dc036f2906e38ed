"""``mooncake-gym tune`` (local backend) and ``compare --tuned``: the chosen setting is the best of
the scores it printed, every score is the policy's real mean over the training seeds, held-out seeds
are never touched, and a tuned baseline runs in compare with exactly its tuned knobs."""

import importlib.util
import inspect
import json

import numpy as np
import pytest

from mooncake_gym.experiments import tune
from mooncake_gym.agents.train import CARD_SEEDS, EVAL_SEED_BASE
from mooncake_gym.baselines import ADMISSION_POLICIES, ADMISSION_V1_POLICIES, ROUTING_POLICIES, KVCentric
from mooncake_gym.cli import main
from mooncake_gym.experiments.compare import COMPARE_SEED_BASE, Setting, run_setting, with_tuned
from mooncake_gym.envs import ROUTING_ENV_ID
from mooncake_gym.evaluation.episodes import ViewPolicy, evaluate

# tiny workloads on which the grid's scores differ
ADMISSION_ARGS = ["--policy", "early", "--env", "admission", "--episode-requests", "300", "--seeds", "2"]
ROUTING_ARGS = ["--policy", "kvcentric", "--env", "routing", "--episode-requests", "200", "--seeds", "2",
                "--rates", "12"]


def run_tune(tmp_path, capsys, args):
    out = tmp_path / "tuned.json"
    assert main(["tune", *args, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    return out, printed


@pytest.mark.parametrize("args,best", [(ADMISSION_ARGS, max), (ROUTING_ARGS, min)])
def test_the_chosen_setting_is_the_best_of_the_printed_grid(tmp_path, capsys, args, best):
    _, doc = run_tune(tmp_path, capsys, args)
    policy = args[1]
    knobs = (ROUTING_POLICIES.get(policy) or ADMISSION_POLICIES[policy]).KNOBS
    assert [r["knobs"] for r in doc["results"]] == [{"threshold": t} for t in knobs["threshold"]]
    scores = [r["score"] for r in doc["results"]]
    assert len(set(scores)) > 1  # the workload separates the settings: the choice means something
    chosen = doc["results"][scores.index(best(scores))]
    assert doc["knobs"] == chosen["knobs"] and doc["score"] == chosen["score"]
    assert doc["seeds"] == [0, 1]


def test_each_score_is_the_mean_metric_of_that_setting_over_the_training_seeds(tmp_path, capsys):
    _, doc = run_tune(tmp_path, capsys, ROUTING_ARGS)
    for r in doc["results"][:2]:
        episodes = evaluate(ROUTING_ENV_ID, KVCentric(**r["knobs"]), [0, 1], rate=12.0, episode_requests=200)
        assert r["score"] == pytest.approx(np.mean([e["mean_ttft_s"] for e in episodes]), rel=1e-12)


def test_a_search_never_uses_a_held_out_seed(tmp_path, capsys, monkeypatch):
    seen = []

    def recording(env_id, policy, seeds, **kw):
        seen.extend(seeds)
        return evaluate(env_id, policy, seeds, **kw)

    monkeypatch.setattr(tune, "evaluate", recording)  # the evaluate that tune calls
    run_tune(tmp_path, capsys, [*ADMISSION_ARGS[:-1], "3"])
    assert seen and set(seen) == {0, 1, 2}
    # the whole range a search may use lies below every held-out range
    widest = tune.tune_seeds(tune.MAX_TUNE_SEEDS)
    assert max(widest) < min(EVAL_SEED_BASE, COMPARE_SEED_BASE, *CARD_SEEDS)
    with pytest.raises(ValueError, match="--seeds"):
        tune.tune_seeds(tune.MAX_TUNE_SEEDS + 1)


def test_random_search_draws_distinct_grid_settings_reproducibly():
    knobs = ADMISSION_POLICIES["predict_dist"].KNOBS
    a = tune.candidates(knobs, "random", budget=4, seed=7)
    assert a == tune.candidates(knobs, "random", budget=4, seed=7)
    assert len({json.dumps(k, sort_keys=True) for k in a}) == 4
    grid = tune.candidates(knobs, "grid")
    size = len(knobs["threshold"]) * len(knobs["quantile"])
    assert len(grid) == size and all(k in grid for k in a)
    assert grid[:2] == [{"threshold": knobs["threshold"][0], "quantile": q} for q in knobs["quantile"][:2]]
    with pytest.raises(ValueError, match="--budget: random search draws distinct settings"):
        tune.candidates(knobs, "random", budget=size + 1)
    with pytest.raises(ValueError, match=f"--budget: the grid .* has {size} settings"):
        tune.candidates(knobs, "grid", budget=5)


def test_every_knob_grid_holds_the_default_and_only_accepted_values():
    for registry in (ROUTING_POLICIES, ADMISSION_POLICIES):
        for name, cls in registry.items():
            knobs = getattr(cls, "KNOBS", None)
            if not knobs:
                continue
            params = inspect.signature(cls).parameters
            for param, values in knobs.items():
                assert params[param].default in values, (name, param)
            for setting in tune.candidates(knobs):
                cls(**setting)  # each grid point is a valid policy


def test_a_policy_without_knobs_is_a_clear_error(tmp_path, capsys):
    assert main(["tune", "--policy", "cache", "--env", "routing", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "--policy: routing policy 'cache' has no knobs to tune" in err and "kvcentric" in err
    assert main(["tune", "--policy", "nope", "--env", "admission", "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown admission policy 'nope'" in capsys.readouterr().err
    assert main(["tune", "--algo", "ppo", "--env", "routing", "--out", str(tmp_path / "x.json")]) == 2
    assert "--backend ray" in capsys.readouterr().err
    assert main(["tune", *ROUTING_ARGS, "--address", "127.0.0.1:6379", "--out", str(tmp_path / "x.json")]) == 2
    assert "--address: for --backend ray only" in capsys.readouterr().err
    assert main(["tune", *ROUTING_ARGS[:4], "--episode-requests", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "episode_requests: expected an integer in [1, 2000000], got 0" in capsys.readouterr().err  # limits.py
    assert main(["train", "--env", "routing", "--num-env-runners", "2", "--out", str(tmp_path)]) == 2
    assert "--num-env-runners: for --backend rllib only" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_metric_option_changes_the_objective(tmp_path, capsys):
    _, doc = run_tune(tmp_path, capsys, [*ADMISSION_ARGS, "--metric", "wasted_prefill_s"])
    assert doc["metric"] == "wasted_prefill_s" and doc["goal"] == "min"
    scores = [r["score"] for r in doc["results"]]
    assert doc["score"] == min(scores)
    assert main(["tune", *ADMISSION_ARGS, "--metric", "hit_ratio", "--out", str(tmp_path / "y.json")]) == 2
    assert "--metric: expected one of" in capsys.readouterr().err


def test_the_tuned_row_runs_the_tuned_knobs_next_to_the_default(tmp_path, capsys):
    out, doc = run_tune(tmp_path, capsys, ROUTING_ARGS)
    tuned = tune.read_tuned(out)
    assert doc["knobs"] != {"threshold": 1.0}  # the tuned setting is not the default on this workload
    policies = with_tuned({n: ViewPolicy(f(), n) for n, f in ROUTING_POLICIES.items()}, "routing", [tuned])
    names = list(ROUTING_POLICIES)  # the tuned row right after its default, the rest in order
    at = names.index("kvcentric") + 1
    assert list(policies) == names[:at] + ["kvcentric (tuned)"] + names[at:]
    seeds = [COMPARE_SEED_BASE, COMPARE_SEED_BASE + 1]
    setting = run_setting(Setting("routing", "tiny", ROUTING_ENV_ID, {"rate": 12.0, "episode_requests": 200}),
                          {k: policies[k] for k in ("kvcentric", "kvcentric (tuned)")}, seeds)
    rows = {r["policy"]: r for r in setting.rows}
    for name, threshold in (("kvcentric", 1.0), ("kvcentric (tuned)", doc["knobs"]["threshold"])):
        direct = evaluate(ROUTING_ENV_ID, KVCentric(threshold), seeds, rate=12.0, episode_requests=200)
        assert rows[name]["mean_ttft_s"] == pytest.approx(np.mean([e["mean_ttft_s"] for e in direct]), rel=1e-12)


def test_compare_tuned_rejects_a_bad_file_or_a_problem_it_does_not_run(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["compare", "--preset", "lecture", "--env", "routing", "--tuned", str(bad)]) == 2
    assert f"--tuned {bad}: not JSON (line 1" in capsys.readouterr().err
    bad.write_text(json.dumps({"policy": "kvcentric", "env": "routing", "knobs": {"threshold": 0.5}}))
    assert main(["compare", "--preset", "lecture", "--env", "routing", "--tuned", str(bad)]) == 2
    assert "threshold: expected kvcache_balancing_threshold >= 1" in capsys.readouterr().err
    bad.write_text(json.dumps({"policy": "early", "env": "admission", "knobs": {"threshold": 1.1}}))
    assert main(["compare", "--preset", "lecture", "--env", "routing", "--tuned", str(bad)]) == 2
    assert "tuned for admission, but --env is routing" in capsys.readouterr().err
    bad.write_text(json.dumps({"policy": "early", "env": "admission", "knobs": {"speed": 1}}))
    assert main(["compare", "--preset", "lecture", "--env", "admission", "--tuned", str(bad)]) == 2
    assert "speed" in capsys.readouterr().err



@pytest.mark.skipif(importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.tune") is not None,
                    reason="ray is installed here (tests/test_ray.py)")
def test_the_ray_backends_without_ray_say_what_to_install(tmp_path, capsys):
    assert main(["train", "--env", "routing", "--backend", "rllib", "--out", str(tmp_path)]) == 2
    assert "pip install 'mooncake-gym[ray]'" in capsys.readouterr().err
    assert main(["tune", *ROUTING_ARGS, "--backend", "ray", "--out", str(tmp_path / "x.json")]) == 2
    assert "pip install 'mooncake-gym[ray]'" in capsys.readouterr().err


def test_tuning_on_an_admission_scenario_uses_the_v1_rules_and_token_goodput():
    # an admission scenario is tuned as compare --scenario ranks it: the v1 admission rules
    # (problem admission-v1), token goodput, and each rule's own environment (the oracle for size_oracle)
    from mooncake_gym.evaluation.scenarios import get_scenario

    sc = get_scenario("admission-load2")
    for name, extra in (("context_predicted", {}), ("size_oracle", {"oracle": True})):
        doc = tune.tune_baseline(name, "admission", search="random", budget=1, seeds=1, scenario=sc.name)
        assert (doc["env"], doc["metric"], doc["goal"], doc["scenario"]) == ("admission-v1", "token_goodput", "max",
                                                                             sc.name)
        policy = ADMISSION_V1_POLICIES[name](**doc["knobs"])
        (episode,) = evaluate(sc.base_env_id, ViewPolicy(policy, name), [0], **{**sc.config(), **extra})
        assert doc["score"] == episode["token_goodput"]
    with pytest.raises(ValueError, match="--policy: unknown admission-v1 policy 'early_typo'"):
        tune.tune_baseline("early_typo", "admission", scenario=sc.name)


def test_a_knob_at_the_edge_of_its_grid_extends_the_grid_until_its_optimum_is_interior():
    from mooncake_gym.experiments.tune import _beyond, extend_to_interior

    def f(k):  # optimum at x = 40, beyond the grid; y's at 0.5, between two values
        return (k["x"] - 40) ** 2 + (k["y"] - 0.5) ** 2

    knobs = {"x": [1, 2, 4, 8], "y": [0.0, 1.0, 2.0]}
    results = [{"knobs": k, "score": f(k)} for k in tune.candidates(knobs)]
    calls = []

    def score(settings):
        calls.append(list(settings))
        return [f(k) for k in settings]

    extended, limits = extend_to_interior(knobs, results, "min", score,
                                          lambda k: None if k["y"] >= 0 else "y: expected >= 0")
    # x doubles past 8 until the best (32) has 64 beside it; y's best (0.0, the first of a tie) is
    # at the low edge, and -1.0 is refused: a hard limit, reported
    assert extended == {"x": [16, 32, 64]}
    assert limits == {"y (low)": "-1.0 refused: y: expected >= 0"}
    assert calls == [[{"x": 16, "y": 0.0}], [{"x": 32, "y": 0.0}], [{"x": 64, "y": 0.0}]]
    assert tune._best(results, "min")["knobs"] == {"x": 32, "y": 0.0}
    # past the maximum number of values added, the search stops and says so
    results = [{"knobs": k, "score": -k["x"]} for k in tune.candidates({"x": [1.0, 2.0]})]
    extended, limits = extend_to_interior({"x": [1.0, 2.0]}, results, "min", lambda s: [-k["x"] for k in s],
                                          lambda k: None, max_extensions=3)
    assert extended == {"x": [4.0, 8.0, 16.0]} and limits == {"x (high)": "3 values added past the high edge"}
    # the step: the edge's ratio where both values are > 0, else its difference; integers stay integers
    assert _beyond([0.0, 0.5], "high") == 1.0 and _beyond([0.0, 0.5], "low") == -0.5
    assert _beyond([1, 2, 4], "low") == 0 and _beyond([1, 2], "high") == 4 and _beyond([2, 3], "high") == 4


def test_a_tuned_file_of_a_cluster_scenario_names_its_problem_and_reads_back(tmp_path):
    """A routing-cluster scenario's result (env 'routing-cluster') is read with routing's rules, as
    tune searched them; a knob the rule does not take is refused naming the file."""
    good = tmp_path / "relsplit-routing-cluster-saturated.json"
    good.write_text(json.dumps({"policy": "relsplit", "env": "routing-cluster", "knobs": {}}))
    assert tune.read_tuned(good)["env"] == "routing-cluster"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policy": "relsplit", "env": "routing-cluster", "knobs": {"no_such_knob": 1}}))
    with pytest.raises(ValueError, match="--tuned .*bad.json"):
        tune.read_tuned(bad)
