"""``overload --replay``: the admission baselines on a trace's own arrivals (Mooncake's Table 3 was
measured so), beside the i.i.d. draws."""

import json

import pytest

from mooncake_gym.cli import main
from mooncake_gym.experiments.preset_runs import overload_run
from mooncake_gym.model.workload import Trace, write_trace
from mooncake_gym.sim import cluster


def small_trace():
    arrivals = [0.0, 1.0, 1.5, 4.0, 6.0]
    return Trace(arrivals, [1000, 3000, 500, 2000, 800], [10, 40, 5, 20, 8],
                 [(0, 1), (0, 1, 2, 3, 4, 5), (6,), (0, 1, 7, 8), (9, 10)], name="small")


@pytest.mark.parametrize("preset, pool", [("mooncake", "cluster"), ("lecture", "decode")])
def test_replay_serves_the_traces_own_requests_at_its_arrivals(preset, pool):
    base = small_trace()
    out = overload_run(base, preset, 2.0, 100, ["baseline"], replay_speed=2.0)
    assert out.trace.arrival_s.tolist() == [0.0, 0.5, 0.75, 2.0, 3.0]
    assert out.trace.input_tokens.tolist() == base.input_tokens.tolist()
    assert out.fields["replay_speed"] == 2.0
    assert out.fields["arrival_rate_per_s"] == pytest.approx(4 / 3.0)
    sat, reference = cluster.load_reference(base, preset, pool)
    assert out.fields["load"] == pytest.approx((4 / 3.0) / reference)
    assert "5 requests replayed at x2" in out.header


def test_without_replay_the_requests_are_drawn_iid():
    out = overload_run(small_trace(), "mooncake", 2.0, 30, ["baseline"])
    assert len(out.trace) == 30 and "replay_speed" not in out.fields


def test_the_cli_replays_a_trace_file(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(small_trace(), path)
    assert main(["overload", "--preset", "mooncake", "--trace", str(path), "--replay", "--speed", "2",
                 "--policy", "baseline", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["requests"] == 5 and doc["replay_speed"] == 2.0
    assert sum(doc["results"]["baseline"][k] for k in ("completed", "rejected_at_arrival")) <= 5


@pytest.mark.parametrize("argv, option", [(["--replay", "--requests", "10"], "--requests"),
                                          (["--replay", "--load", "3"], "--load"),
                                          (["--replay", "--fresh-blocks", "--preset", "mooncake"], "--fresh-blocks"),
                                          (["--speed", "2"], "--speed")])
def test_options_without_effect_under_replay_are_refused(argv, option, capsys):
    assert main(["overload", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert option in err and "has no effect" in err
