"""``make leaderboard`` (``python -m mooncake_gym.experiments.leaderboard --run``): the page, its tables
as data (``docs/leaderboard.json``) and the tuned knobs (``docs/leaderboard/tuned/``), the same files
whatever the number of worker processes; ``compare --workers``; the committed data's layout.
"""

import json
import math

import numpy as np
import pytest

from mooncake_gym.cli import main as cli_main
from mooncake_gym.evaluation.scenarios import SCENARIOS
from mooncake_gym.experiments import leaderboard as lb
from mooncake_gym.experiments.compare import map_jobs
from mooncake_gym.experiments.tune import read_tuned

from conftest import REPO_ROOT

#: a small leaderboard: two scenarios (one routing, one admission), two held-out seeds, two tiny searches
SMALL = dict(seeds=2, tune_seeds=1, admission_tune_seeds=1, routing="kvcentric", admission="early", budget=2,
             scenarios=["routing-sanity", "admission-load2"], agents={})


def check_layout(doc: dict, root) -> None:
    """``doc`` has the layout of ``docs/leaderboard.json`` (``leaderboard_json``), its tuned rows name
    files under ``root`` that ``compare --tuned`` accepts, and each mean is its per-seed values' mean."""
    assert doc["format"] == lb.JSON_FORMAT and isinstance(doc["command"], str)
    seeds = doc["seeds"]
    assert seeds == list(range(seeds[0], seeds[0] + len(seeds))) and seeds[0] >= 1_000_000  # held out
    assert isinstance(doc["skipped"], list) and all(isinstance(r, str) for r in doc["skipped"])
    for table in doc["scenarios"]:
        assert set(table) >= {"name", "id", "version", "fingerprint", "problem", "base_env_id", "hard", "metric",
                              "goal", "rows"}
        assert table["id"] == f"mooncake_gym/{table['name']}-v{table['version']}"
        assert isinstance(table["hard"], bool) and table["goal"] in ("min", "max")
        assert len(table["fingerprint"]) == 64 and int(table["fingerprint"], 16) >= 0
        kinds = [r["kind"] for r in table["rows"]]
        assert set(kinds) <= set(lb.ROW_KINDS) and kinds[-1] == "bound" and kinds.count("bound") == 1
        assert "rule" in kinds
        ranked = [r["mean"] for r in table["rows"][:-1] if r["mean"] is not None]
        assert ranked == sorted(ranked, reverse=table["goal"] == "max")
        for row in table["rows"]:
            assert set(row) >= {"policy", "kind", "mean", "ci95", "per_seed"}
            if row["kind"] == "bound" and row["per_seed"] is None:
                continue
            assert len(row["per_seed"]) == len(seeds)
            values = [v for v in row["per_seed"] if v is not None]
            if values:
                assert math.isclose(row["mean"], float(np.mean(values)), rel_tol=1e-12)
            if row["kind"] == "tuned rule":
                path = root / row["tuned"]
                tuned = read_tuned(path)  # compare --tuned's reader
                assert row["policy"] == f"{tuned['policy']} (tuned on {tuned['scenario']})"
                assert tuned["scenario"] == table["name"] and tuned["fingerprint"] == table["fingerprint"]
            else:
                assert "tuned" not in row


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """The small leaderboard written with one worker and with two."""
    roots = {}
    for workers in (1, 2):
        roots[workers] = tmp_path_factory.mktemp(f"workers{workers}")
        timings = lb.run(roots[workers], workers=workers, **SMALL)
        assert set(timings) == {"tune_s", "tune_cpu_s", "tables_s", "tables_cpu_s"}
    return roots


def test_the_leaderboard_writes_its_page_data_and_tuned_files(small_runs):
    root = small_runs[1]
    tuned = sorted(p.name for p in (root / lb.TUNED_DIR).iterdir())
    assert tuned == ["early-admission-load2.json", "kvcentric-routing-sanity.json"]
    doc = json.loads((root / lb.JSON_PAGE).read_text())
    check_layout(doc, root)
    assert [t["name"] for t in doc["scenarios"]] == SMALL["scenarios"] and doc["seeds"] == [1_000_000, 1_000_001]
    routing, admission = doc["scenarios"]
    assert (routing["problem"], routing["base_env_id"], routing["metric"], routing["goal"], routing["hard"]) == \
        ("routing", "mooncake_gym/PrefillRouting-v0", "mean_ttft_s", "min", False)
    assert (admission["problem"], admission["base_env_id"], admission["metric"], admission["goal"]) == \
        ("admission", "mooncake_gym/OverloadAdmission-v1", "token_goodput", "max")
    assert routing["fingerprint"] == SCENARIOS["routing-sanity"].fingerprint()
    tuned_rows = [r for t in doc["scenarios"] for r in t["rows"] if r["kind"] == "tuned rule"]
    assert sorted(r["tuned"] for r in tuned_rows) == [f"{lb.TUNED_DIR}/early-admission-load2.json",
                                                      f"{lb.TUNED_DIR}/kvcentric-routing-sanity.json"]
    # the routing bound's per-seed values are each episode's bound, at most every rule's mean TTFT on it
    bound = routing["rows"][-1]
    for row in routing["rows"][:-1]:
        assert all(b <= v for b, v in zip(bound["per_seed"], row["per_seed"]))
    # the admission bound's per-seed values too: each episode's bound on token goodput, at least every rule's
    bound = admission["rows"][-1]
    assert len(bound["per_seed"]) == len(doc["seeds"]) and bound["mean"] == pytest.approx(np.mean(bound["per_seed"]))
    for row in admission["rows"][:-1]:
        assert all(b >= v for b, v in zip(bound["per_seed"], row["per_seed"]))
    page = (root / lb.PAGE_LEADERBOARD).read_text()
    assert page.startswith("# Leaderboard") and "from docs/leaderboard/tuned/kvcentric-routing-sanity.json" in page
    for t in doc["scenarios"]:
        assert f"`{t['fingerprint']}`" in page
        for row in t["rows"][:-1]:
            assert f"| {row['policy']} |" in page


def test_the_leaderboard_is_the_same_with_two_workers(small_runs):
    files = {w: sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) for w, root in small_runs.items()}
    assert files[1] == files[2] and len(files[1]) == 4
    for path in files[1]:
        assert (small_runs[1] / path).read_bytes() == (small_runs[2] / path).read_bytes(), path


def test_a_tuned_file_of_the_leaderboard_is_accepted_by_compare_tuned(request, capsys):
    """A file of ``docs/leaderboard/tuned/`` (the committed ones where there are, else the small run's)
    re-runs its row with ``compare --scenario S --tuned FILE``: the same mean."""
    committed = (REPO_ROOT / lb.TUNED_DIR / "kvcentric-routing-sanity.json").is_file() and (REPO_ROOT / lb.JSON_PAGE).is_file()
    root = REPO_ROOT if committed else request.getfixturevalue("small_runs")[1]
    path = root / lb.TUNED_DIR / "kvcentric-routing-sanity.json"
    data = json.loads((root / lb.JSON_PAGE).read_text())
    table = next(t for t in data["scenarios"] if t["name"] == "routing-sanity")
    row = next(r for r in table["rows"] if r["policy"] == "kvcentric (tuned on routing-sanity)")
    seeds = len(data["seeds"])
    assert cli_main(["compare", "--scenario", "routing-sanity", "--seeds", str(seeds), "--tuned", str(path),
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    again = next(r for r in out["settings"][0]["rows"] if r["policy"] == row["policy"])
    assert again["mean_ttft_s"] == row["mean"] and out["settings"][0]["fingerprint"] == table["fingerprint"]


@pytest.mark.skipif(not (REPO_ROOT / lb.JSON_PAGE).is_file(), reason="docs/leaderboard.json not generated yet")
def test_the_committed_leaderboard_data_has_its_layout():
    doc = json.loads((REPO_ROOT / lb.JSON_PAGE).read_text())
    check_layout(doc, REPO_ROOT)
    for table in doc["scenarios"]:  # a scenario still registered as it was measured
        sc = SCENARIOS.get(table["name"])
        if sc is not None and sc.version == table["version"] and not sc.requires:
            assert table["fingerprint"] == sc.fingerprint() and table["hard"] == sc.hard
    listed = {r["tuned"] for t in doc["scenarios"] for r in t["rows"] if r["kind"] == "tuned rule"}
    assert listed == {f"{lb.TUNED_DIR}/{p.name}" for p in (REPO_ROOT / lb.TUNED_DIR).glob("*.json")}


def _square(x):
    return x * x


def test_map_jobs_keeps_the_items_order_whatever_the_workers_and_the_start_order():
    items = list(range(7))
    order = [6, 0, 5, 1, 4, 2, 3]
    assert map_jobs(_square, items) == map_jobs(_square, items, workers=2, order=order) == [i * i for i in items]
    assert map_jobs(lambda x: x + 1, items, workers=3) == [i + 1 for i in items]  # inherited, never pickled
    for bad in (0, 1.5, True, 1000):
        with pytest.raises(ValueError, match="--workers: expected an integer in"):
            map_jobs(_square, items, workers=bad)


def test_compare_refuses_bad_workers_before_any_work(capsys):
    assert cli_main(["compare", "--scenario", "routing-sanity", "--workers", "0"]) == 2
    assert "compare: error: --workers: expected an integer in [1, 256], got 0" in capsys.readouterr().err


def test_a_bound_row_gives_the_per_seed_values_of_its_problems_main_metric():
    from mooncake_gym.evaluation import problems

    admission = {"policy": "bound", "per_seed": {"token_goodput": [10.0, 12.0], "good_requests": [3, 4]}}
    assert problems.get("admission-v1").bound_per_seed(admission) == [10.0, 12.0]
    assert problems.get("admission-cluster").bound_per_seed(admission) == [3, 4]
    assert problems.get("routing-cluster").bound_per_seed({"policy": "bound", "per_seed": [0.5, 0.6]}) == [0.5, 0.6]
    assert problems.get("routing").bound_per_seed(None) is None


def test_tune_targets_give_the_trace_to_the_scenarios_drawing_from_it():
    """A scenario whose required trace is its base trace (``base_trace``: long-context) is tuned with
    ``--trace`` as one that replays it is, and left out without a trace."""
    without = lb.tune_targets("routing")
    with_trace = lb.tune_targets("routing", "t.jsonl")
    for name in ("routing-cluster-long-context", "routing-cluster-mooncake-trace", "routing-cluster-trace-window"):
        assert f"{name} --trace t.jsonl" in with_trace
        assert not any(line.split()[0] == name for line in without)
    assert "routing-cluster-saturated" in with_trace and "routing-cluster-saturated" in without
    jobs = [j for j in lb.tune_jobs("routing", "t.jsonl", "kvcentric") if j["scenario"] == "routing-cluster-long-context"]
    assert [(j["policy"], j["trace"]) for j in jobs] == [("kvcentric", "t.jsonl")]
