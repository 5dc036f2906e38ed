"""One run request by request (mooncake_gym.reporting.requests): ``replay``/``overload --per-request``
(CSV or JSONL), ``--timeline`` (Chrome trace events) and ``--plot-dir``, on tiny hand-made traces
whose numbers follow from the cost model by hand."""

import csv
import json

import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.workload import Trace, write_trace
from mooncake_gym.reporting.requests import FIELDS, LANE_STRIDE, _lanes, request_rows, timeline
from mooncake_gym.sim import cluster

# two prompts of the same two blocks at t = 0 (the second queues behind the first and hits 1,023 of
# its 1,024 tokens: a prefix hit leaves the last token to compute), then a prompt of four new blocks
TINY = Trace([0.0, 0.0, 1.0], [1024, 1024, 2048], [4, 2, 3], [[1, 2], [1, 2], [3, 4, 5, 6]], name="tiny")


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.jsonl"
    write_trace(TINY, path)
    return str(path)


def test_lecture_replay_rows_queue_hits_and_ttft_follow_the_cost_model(tmp_path, tiny, capsys):
    out = tmp_path / "requests.csv"
    assert main(["replay", "--preset", "lecture", "--trace", tiny, "--policy", "load", "--instances", "1",
                 "--per-request", str(out)]) == 0
    assert f"written: {out}" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == list(FIELDS)  # one policy: no policy column
    c = CostModel()
    first, hit, fresh = c.prefill_s(1024, 0), c.prefill_s(1024, 1023), c.prefill_s(2048, 0)
    assert [(r["request"], r["arrival_s"], r["prefill_instance"], r["hit_tokens"], r["computed_tokens"]) for r in rows] \
        == [("0", "0.0", "0", "0", "1024"), ("1", "0.0", "0", "1023", "1"), ("2", "1.0", "0", "0", "2048")]
    assert [float(r["queue_s"]) for r in rows] == [0.0, first, 0.0]  # the second waits for the first
    assert [float(r["ttft_s"]) for r in rows] == [first, first + hit, fresh]
    # no decode pool in the lecture's routing simulator: empty cells
    assert {(r["decode_instance"], r["mean_tbt_s"], r["tail_tbt_s"], r["outcome"]) for r in rows} == {("", "", "", "prefilled")}


def test_lecture_timeline_is_one_complete_event_per_prefill_in_microseconds(tmp_path, tiny):
    out = tmp_path / "timeline.json"
    assert main(["replay", "--preset", "lecture", "--trace", tiny, "--policy", "load", "--instances", "1",
                 "--timeline", str(out), "--json"]) == 0
    doc = json.loads(out.read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    c = CostModel()
    first = c.prefill_s(1024, 0)
    assert [(e["name"], e["cat"], e["pid"], e["tid"]) for e in slices] == \
        [("request 0", "prefill", 1, 0), ("request 1", "prefill", 1, 0), ("request 2", "prefill", 1, 0)]
    assert [e["ts"] for e in slices] == [0.0, first * 1e6, 1e6]  # starts after the queue
    assert [e["dur"] for e in slices] == [first * 1e6, c.prefill_s(1024, 1023) * 1e6, c.prefill_s(2048, 0) * 1e6]
    names = {(e["name"], e.get("tid")): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"
             and e["name"] != "process_sort_index"}
    assert names == {("process_name", None): "prefill pool", ("thread_name", 0): "prefill 0"}


def test_cluster_rows_are_the_cluster_results_records(tiny):
    result = cluster.simulate(TINY, "mooncake", routing=make_policy("routing", "kvcentric"))
    rows = request_rows(result, TINY)
    assert [r["outcome"] for r in rows] == ["completed"] * 3
    assert [r["hit_tokens"] for r in rows] == [0, 1023, 0] and [r["computed_tokens"] for r in rows] == [1024, 1, 2048]
    assert [r["prefill_instance"] for r in rows] == result.prefill_instance.tolist()
    assert [r["decode_instance"] for r in rows] == result.decode_instance.tolist()
    assert [r["ttft_s"] for r in rows] == result.ttft_s.tolist()
    assert [r["tail_tbt_s"] for r in rows] == result.tbt_s.tolist()
    assert [r["mean_tbt_s"] for r in rows] == result.mean_tbt_s.tolist()
    assert all(r["mean_tbt_s"] <= r["tail_tbt_s"] for r in rows)  # the tail is the slowest tenth's mean
    assert [r["queue_s"] for r in rows] == [max(0.0, t - p) for t, p in zip(result.ttft_s, result.prefill_s)]
    doc = timeline({"kvcentric": result}, TINY)
    decode = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "decode"]
    assert sorted(e["args"]["request"] for e in decode) == [0, 1, 2] and {e["pid"] for e in decode} == {2}
    for e in decode:
        i = e["args"]["request"]
        assert e["ts"] == result.decode_start_s[i] * 1e6
        assert e["dur"] == (result.end_s[i] - result.decode_start_s[i]) * 1e6
        assert e["tid"] // LANE_STRIDE == result.decode_instance[i]


def test_overlapping_residencies_get_lanes_so_that_slices_nest():
    # a batch: (0, 2) and (1, 3) overlap; (2, 4) starts when the first ends and takes its lane
    assert _lanes([(0.0, 2.0), (1.0, 3.0), (2.0, 4.0), (3.5, 5.0)]) == [0, 1, 0, 1]
    assert _lanes([(1.0, 3.0), (0.0, 2.0)]) == [1, 0]  # by start, whatever the order given


def test_several_policies_get_a_policy_column_and_jsonl_matches_csv(tmp_path, tiny):
    csv_path, jsonl_path = tmp_path / "r.csv", tmp_path / "r.jsonl"
    for path in (csv_path, jsonl_path):
        assert main(["overload", "--preset", "lecture", "--trace", tiny, "--replay", "--policy", "all",
                     "--per-request", str(path), "--json"]) == 0
    lines = [json.loads(line) for line in jsonl_path.read_text().splitlines()]
    table = list(csv.DictReader(csv_path.open()))
    assert [r["policy"] for r in lines] == [p for p in ("baseline", "early", "predict", "predict_dist") for _ in range(3)]
    assert list(lines[0]) == ["policy", *FIELDS] and list(table[0]) == ["policy", *FIELDS]
    for a, b in zip(lines, table):
        assert {k: "" if v is None else str(v) for k, v in a.items()} == b
    # the lecture's decode: a fixed 50 ms per token, so the mean and the tail TBT are it
    done = [r for r in lines if r["outcome"] == "completed"]
    assert done and {(r["mean_tbt_s"], r["tail_tbt_s"]) for r in done} == {(0.05, 0.05)}


def test_plot_dir_writes_the_cdfs_and_the_bars(tmp_path, tiny, capsys):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    assert main(["replay", "--trace", tiny, "--policy", "all", "--plot-dir", str(plots)]) == 0
    assert sorted(p.name for p in plots.iterdir()) == ["slo_goodput.png", "tbt_cdf.png", "ttft_cdf.png"]
    assert main(["replay", "--preset", "lecture", "--trace", tiny, "--policy", "load", "--plot-dir", str(plots / "l")]) == 0
    assert sorted(p.name for p in (plots / "l").iterdir()) == ["slo_goodput.png", "ttft_cdf.png"]  # no decode pool


@pytest.mark.parametrize("argv, message", [
    (["--per-request", "out.txt"], "--per-request: expected a file name ending in .csv or .jsonl"),
    (["--per-request", "no/such/dir/out.csv"], "--per-request: no such directory"),
    (["--timeline", "out.trace"], "--timeline: expected a file name ending in .json"),
    (["--per-request", "out.csv", "--observation", "exact", "--observation", "noisy"],
     "--per-request: with several --observation: give one"),
])
def test_bad_output_paths_are_refused_before_any_work(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "--policy", "load", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())
