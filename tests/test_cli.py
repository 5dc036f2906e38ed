"""The mooncake-gym command line: --json prints one document, generate writes a loadable trace,
bad input exits with code 2 and a one-line error."""

import json
import subprocess
import sys

import pytest

from mooncake_gym.cli import main
from mooncake_gym.model.workload import read_trace


def run_cli(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "mooncake_gym.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_trace_stats_synthetic_json_is_one_document(capsys):
    assert main(["trace", "stats", "synthetic", "--rate", "2", "--seed", "3", "--json"]) == 0
    out = capsys.readouterr().out
    stats = json.loads(out)
    for key in ("requests", "duration_s", "rate_per_s", "input_mean", "input_p50", "input_p90", "input_p99",
                "output_mean", "output_p50", "output_p90", "distinct_blocks", "ideal_hit_ratio"):
        assert key in stats, key
    assert stats["requests"] > 0 and 0 < stats["ideal_hit_ratio"] < 1


def test_trace_stats_json_through_the_module_entry_point():
    done = run_cli("trace", "stats", "synthetic", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "synthetic(rate=4, seed=0)"


def test_trace_stats_text_output(capsys):
    assert main(["trace", "stats", "synthetic", "--rate", "1"]) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "ideal_hit_ratio" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_trace_generate_writes_a_file_read_trace_loads(tmp_path, capsys):
    path = tmp_path / "gen.jsonl"
    assert main(["trace", "generate", "--rate", "2", "--seed", "5", "--duration", "90", "-o", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # the progress note goes to stderr
    trace = read_trace(path)
    assert len(trace) > 0 and trace.arrival_s[-1] < 90
    assert f"wrote {len(trace)} requests" in captured.err
    # and the stats command reads it back
    assert main(["trace", "stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == len(trace)


def test_trace_generate_request_count(tmp_path, capsys):
    path = tmp_path / "n.jsonl"
    assert main(["trace", "generate", "--requests", "250", "-o", str(path)]) == 0
    assert len(read_trace(path)) == 250


def test_lecture_demo1_json_has_the_demo1_keys(capsys):
    assert main(["lecture", "--demo", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["demo1"]
    demo = data["demo1"]
    assert set(demo) == {"per_token", "request"}
    llama, opt = demo["per_token"]
    assert llama["model"] == "LLaMA2-70B" and opt["model"] == "OPT-13B"
    for row in (llama, opt):
        for key in ("kv_bytes_per_token", "recompute_us_per_token", "dram_load_us_per_token", "dram_speedup",
                    "ssd_load_us_per_token", "ssd_speedup", "rdma_load_us_per_token", "rdma_speedup"):
            assert key in row, key
    assert llama["kv_bytes_per_token"] == 327_680
    request = demo["request"]
    assert (request["input_tokens"], request["cached_tokens"]) == (8704, 4352)
    assert [t["tier"] for t in request["tiers"]] == ["dram", "ssd", "rdma"]
    for tier in request["tiers"]:
        assert set(tier) == {"tier", "load_s", "overlap_s", "no_overlap_s"}


def test_lecture_demo1_text(capsys):
    assert main(["lecture", "--demo", "1"]) == 0
    out = capsys.readouterr().out
    assert "=== Demo 1" in out and "LLaMA2-70B" in out and "327,680" in out


def test_lecture_demo3_text_titles_it_with_the_docstring_first_line(capsys):
    assert main(["lecture", "--demo", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "=== Demo 3: early rejection under overload — Mooncake §7, Table 3 and Figure 9."
    assert any(line.startswith("- early: wasted prefill -") for line in out)


@pytest.mark.parametrize("argv", [
    ["trace", "stats", "{path}"],
    ["trace", "stats", "{path}", "--json"],
])
def test_missing_trace_file_exits_2_with_one_line_naming_the_file(tmp_path, argv):
    missing = tmp_path / "no-such-trace.jsonl"
    done = run_cli(*[a.format(path=missing) for a in argv])
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("content", [
    b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}\n',
    b"not json\n",
    b"",
    b"\xff\xfe\n",
])
def test_malformed_trace_file_exits_2_with_one_line_naming_the_file(tmp_path, content):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    done = run_cli("trace", "stats", str(bad), "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(bad) in lines[0] and "Traceback" not in done.stderr


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["trace", "stats"])
    assert info.value.code == 2
    assert main(["trace", "stats", "synthetic", "--rate", "0"]) == 2
    err = capsys.readouterr().err
    assert "rate" in err and "Traceback" not in err


def test_unwritable_output_exits_2_without_traceback(tmp_path):
    done = run_cli("trace", "generate", "--duration", "10", "-o", str(tmp_path))  # a directory
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, option", [(["replay", "--policy", "kvcentric", "--policy", "load"], "--policy"),
                                          (["overload", "--json", "--json"], "--json"),
                                          (["trace", "stats", "synthetic", "--rate", "2", "--rate", "3"], "--rate")])
def test_an_option_given_twice_is_an_error_not_the_last_one(argv, option, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"{option}: given more than once; give it once" in capsys.readouterr().err
