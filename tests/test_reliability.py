"""Regression tests of issue 15 (reliability), one group per root cause: unbounded inputs, numbers
the reader cannot store, degenerate workloads, coerced answers, objects that accept garbage or can
be changed by a policy, block-id semantics, late validation and CLI tracebacks. Each failed before
the fix (a hang, a MemoryError, an OverflowError/RecursionError/ZeroDivisionError traceback, a
silently coerced answer or a late error)."""

import json
import math
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.model import limits
from mooncake_gym.analysis.cache import cache_ceiling
from mooncake_gym.cli import main
from mooncake_gym.envs import common
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.sim.admission import OverloadConfig, OverloadSimulator, check_admit, overload_workload
from mooncake_gym.sim.admission import simulate as admission_simulate
from mooncake_gym.sim.routing import Route, RoutingConfig, check_route
from mooncake_gym.sim.routing import simulate as routing_simulate
from mooncake_gym.model.workload import (Trace, TraceFormatError, prefix_block_ids, read_trace, resample_iid,
                                   synthetic_trace, write_trace)

ROUTING = "mooncake_gym/PrefillRouting-v0"
ADMISSION = "mooncake_gym/OverloadAdmission-v0"


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "mooncake_gym.cli", *argv], capture_output=True, text=True,
                          timeout=120)


def one_line_error(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def tiny_trace(inputs, outputs, arrivals=None):
    n = len(inputs)
    ids, k = [], 0
    for n_in in inputs:
        m = -(-n_in // 512)
        ids.append(list(range(k, k + m)))
        k += m
    return Trace(arrivals if arrivals is not None else [float(i) for i in range(n)], inputs, outputs, ids)


# --- 1. unbounded inputs: finite ranges, loops bounded before they start ----------------------------
def test_one_range_checker_shared_by_the_environments():
    assert common.check_range is limits.check_range
    with pytest.raises(ValueError, match=r"^n_instances: expected an integer in \[1, 1024\], got 0$"):
        limits.check("n_instances", 0)
    with pytest.raises(ValueError, match="^x: expected a finite number"):
        limits.check_range("x", 10**400)  # beyond float range: a ValueError, not OverflowError
    assert limits.check("rate", 4) == 4


@pytest.mark.parametrize("kwargs, match", [
    ({"rate": math.inf}, "^rate:"),
    ({"rate": 1e9}, "^rate: expected a finite number in"),
    ({"rate": 1e5}, "^rate: this would make 6e\\+07 sessions"),
    ({"rate": 5e4, "duration_s": 1e4}, "^rate: this would make 5e\\+08 sessions"),
    ({"duration_s": 1e300}, "^duration_s:"),
    ({"duration_s": None, "n_requests": 10**9}, "^n_requests:"),
    ({"rate": 1e-6, "duration_s": None, "n_requests": 100_000}, "^rate: at 1e-06 sessions/s the trace would span"),
])
def test_generator_refuses_unbounded_work_before_drawing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_trace(0, **kwargs)


def test_resampling_and_overload_workload_are_bounded():
    base = tiny_trace([600, 100], [5, 7])
    with pytest.raises(ValueError, match="^rate:"):
        resample_iid(base, 10, math.inf)
    with pytest.raises(ValueError, match="^n_requests:"):
        resample_iid(base, 10**8, 1.0)
    with pytest.raises(ValueError, match="^load:"):
        overload_workload(base, 1e-7, 100)


def test_load_series_is_bounded_before_the_run():
    # two arrivals 10^8 s apart: 2 x 10^7 samples of 5 s, refused at construction (it looped before)
    trace = tiny_trace([512, 512], [5, 5], arrivals=[0.0, 1e8])
    with pytest.raises(ValueError, match="^trace: this would make 2e\\+07 load-series samples"):
        OverloadSimulator(trace)
    assert OverloadSimulator(trace, OverloadConfig(sample_period_s=1000.0)).reset() is not None


def test_output_lengths_are_bounded_so_the_decode_tables_are():
    with pytest.raises(ValueError, match="^output_tokens: expected integers in \\[0, 1000000\\]"):
        tiny_trace([512], [10**9])
    sim = OverloadSimulator(tiny_trace([512], [limits.MAX_OUTPUT_TOKENS]))
    assert len(sim.cluster._survival_table()) == limits.MAX_OUTPUT_TOKENS + 1  # the largest table: 8 MB of floats


def test_environment_workloads_are_bounded():
    with pytest.raises(ValueError, match="^rate: this would make"):
        gym.make(ROUTING, rate=1e4, episode_requests=None, duration_s=1e5)
    with pytest.raises(ValueError, match="^rate_range:"):
        gym.make(ROUTING, rate_range=(1.0, 1e9))
    with pytest.raises(ValueError, match="^load:"):
        gym.make(ADMISSION, load=1e-7)
    # a decode pool of one token per instance at one token per second: the episodes' arrivals would
    # span millions of seconds; refused at construction, not at the first reset (found by make fuzz)
    with pytest.raises(ValueError, match="^episode_requests: this would make .* load-series samples"):
        gym.make(ADMISSION, tbt_s=1, decode_capacity_tokens=1, episode_requests=30)


# --- 2. numbers the reader accepts but cannot store ---------------------------------------------------
@pytest.mark.parametrize("line, match", [
    ('{"timestamp": 0, "input_length": 1, "output_length": 9223372036854775808, "hash_ids": [0]}',
     ":1: field 'output_length': expected <= 1,000,000 tokens"),
    ('{"timestamp": 1%s, "input_length": 1, "output_length": 1, "hash_ids": [0]}' % ("0" * 400),
     ":1: field 'timestamp': expected <= "),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0], "session_id": 1e300}',
     ":1: field 'session_id': expected an integer, got 1e\\+300"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [9223372036854775808]}',
     ":1: field 'hash_ids': expected ids in \\[0, 9223372036854775807\\]"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-3]}',
     ":1: field 'hash_ids': expected ids in"),
    ('{"timestamp": 1%s, "input_length": 1}' % ("0" * 5000), ":1: not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, ":1: not a trace line \\(JSON nested too deeply\\)"),
])
def test_reader_turns_unstorable_numbers_into_its_own_errors(tmp_path, line, match):
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceFormatError, match=match):
        read_trace(path)


# --- 3. degenerate workloads ---------------------------------------------------------------------------
def test_admission_env_refuses_a_base_trace_without_prompts():
    base = tiny_trace([0, 0, 0], [5, 6, 7])  # ZeroDivisionError at every step before
    with pytest.raises(ValueError, match="^base_trace: every request has input_length 0"):
        gym.make(ADMISSION, base_trace=base)


def test_degenerate_runs_have_defined_metrics():
    zeros = tiny_trace([0, 0], [0, 0])
    r = routing_simulate(zeros, lambda v: 0).metrics
    assert r["requests"] == 2 and math.isnan(r["hit_ratio"]) and r["mean_ttft_s"] == 0.0
    a = admission_simulate(zeros, lambda v: True).metrics
    assert a["completed"] == 2 and a["wasted_share_of_admitted"] == 0.0
    same_time = tiny_trace([512, 512], [3, 3], arrivals=[0.0, 0.0])
    assert math.isnan(same_time.rate) and same_time.stats()["requests"] == 2


# --- 4. answers validated, not coerced ------------------------------------------------------------------
@pytest.mark.parametrize("answer, error", [("reject", TypeError), ("no", TypeError), (-1, ValueError),
                                           (2, ValueError), (math.nan, TypeError), (None, TypeError),
                                           (0.0, TypeError), (np.array([1]), TypeError)])
def test_admission_answers_are_checked(answer, error):
    trace = tiny_trace([512, 1024], [5, 5])
    with pytest.raises(error, match="^admit: expected True or False"):
        admission_simulate(trace, lambda v: answer)
    env = gym.make(ADMISSION, base_trace=trace, episode_requests=5).unwrapped
    with pytest.raises(error, match="^admit:"):
        env.encode_action(answer)


def test_admission_accepts_bools_and_0_1_with_identical_results():
    trace, _ = overload_workload(n_requests=300)
    policy = lambda v: v.predicted_ttft_s <= v.ttft_slo_s  # noqa: E731
    base = admission_simulate(trace, policy).metrics
    for kind in (int, np.int64, np.bool_):
        m = admission_simulate(trace, lambda v, k=kind: k(policy(v))).metrics
        assert m["completed"] == base["completed"] and m["wasted_prefill_s"] == base["wasted_prefill_s"]
    assert check_admit(1) is True and check_admit(np.int8(0)) is False


@pytest.mark.parametrize("action, error", [(Route(1, "no"), TypeError), ((1, 2), TypeError), ((1, None), TypeError),
                                           (8, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError),
                                           ((1, 0, 0), ValueError)])
def test_routing_answers_are_checked(action, error):
    with pytest.raises(error, match="^action:"):
        check_route(action, 8)
    with pytest.raises(error, match="^action:"):
        routing_simulate(tiny_trace([512], [1]), lambda v: action)
    env = gym.make(ROUTING, n_instances=8).unwrapped
    with pytest.raises(error, match="^action:"):
        env.encode_action(action)


def test_evaluate_refuses_an_out_of_range_instance_as_simulate_does():
    # before: instance 9 of 8 became env action 9 = instance 1 with a pull
    with pytest.raises(ValueError, match=r"^action: instance must be in 0..7, got 9"):
        evaluate(ROUTING, lambda v: 9, seeds=[0], episode_requests=5)
    assert check_route(Route(3, np.True_), 8) == (3, True) and check_route((2, 0), 8) == (2, False)


# --- 5. objects validated at construction; views read-only ------------------------------------------------
@pytest.mark.parametrize("columns, match", [
    (([math.nan], [1], [1], [[0]]), "^arrival_s: expected finite numbers"),
    (([-1.0], [1], [1], [[0]]), "^arrival_s:"),
    (([0.0], [-5], [1], [[]]), "^input_tokens: expected integers"),
    (([0.0], [1.5], [1], [[0]]), "^input_tokens: expected a sequence of integers"),
    (([0.0], [1], [-1], [[0]]), "^output_tokens:"),
    (([0.0], [1], [1], [["5"]]), "^block_ids: request 0: expected integer ids"),
    (([0.0], [1], [1], [[1.0]]), "^block_ids: request 0: expected integer ids"),
    (([0.0], [1], [1], ["ab"]), "^block_ids: request 0: expected a sequence"),
    (([0.0], [1], [1], [[2**63]]), "^block_ids: request 0: expected ids in"),
])
def test_trace_validates_at_construction(columns, match):
    with pytest.raises(ValueError, match=match):
        Trace(*columns)
    with pytest.raises(ValueError, match="^session_ids:"):
        Trace([0.0], [1], [1], [[0]], session_ids=["a"])


def test_trace_columns_cannot_be_changed_after_validation():
    arrivals = np.array([0.0, 1.0])
    trace = Trace(arrivals, [512, 512], [5, 5], [[0], [1]])
    for column in (trace.arrival_s, trace.input_tokens, trace.output_tokens, trace.session_ids):
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 10**9
    arrivals[0] = 0.5  # the caller's own array is copied, not frozen
    assert trace.arrival_s[0] == 0.0 and trace.take([1, 0], arrival_s=[0.0, 2.0]).output_tokens.tolist() == [5, 5]


def test_write_trace_never_writes_a_line_the_reader_refuses(tmp_path):
    path = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match="no requests"):
        write_trace(Trace([], [], [], []), path)
    with pytest.raises(TraceFormatError, match=r"request 0: field 'hash_ids': expected ceil"):
        write_trace(Trace([0.0], [600], [1], [[0]]), path)  # 600 tokens need 2 block ids
    assert not path.exists()


def test_views_are_read_only():
    trace = tiny_trace([512, 1024, 700], [5, 6, 7])
    seen = []

    def rewriting_routing_policy(view):
        with pytest.raises(AttributeError):
            view.queue_s = (0.0,) * view.n_instances
        with pytest.raises(AttributeError):
            view.extra = 1
        seen.append(view)
        return 0

    routing_simulate(trace, rewriting_routing_policy)

    def rewriting_admission_policy(view):
        with pytest.raises(AttributeError):
            view.predicted_ttft_s = 0.0
        seen.append(view)
        return True

    result = admission_simulate(trace, rewriting_admission_policy)
    assert len(seen) == 6 and result.metrics["completed"] == 3
    assert "simulator" not in repr(seen[-1]) and "predicted_ttft_s=" in repr(seen[-1])


# --- 6. block ids: one semantics (prefix hashing) everywhere ----------------------------------------------
def test_non_prefix_ids_are_normalised_the_same_for_cache_stats_and_replay(tmp_path):
    # id 2 follows 1 in the first request, then starts a prompt: under prefix hashing that is another
    # block. Before, trace stats and replay counted it a hit and cache did not.
    lines = [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
             {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [2]},
             {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [2, 7]},
             {"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = read_trace(path)
    assert trace.block_ids == [(1, 2), (8,), (8, 7), (1, 2)] and trace.renamed_blocks == 2
    stats = trace.stats()
    ceiling = cache_ceiling(trace, "all")
    one_big_cache = routing_simulate(trace, lambda v: 0, RoutingConfig(n_instances=1, cache_blocks=1000))
    assert stats["ideal_hit_ratio"] == ceiling.hit_rate == (512 + 1024) / 3584
    # the routing simulator computes at least one token of a fully cached prompt: 1024 -> 1023
    assert one_big_cache.hit_tokens.tolist() == [0, 0, 512, 1023]
    assert stats["renamed_blocks"] == 2


def test_prefix_hashed_traces_are_unchanged(shared_trace):
    synth = synthetic_trace(3, rate=2.0, duration_s=120.0)
    ids, renamed = prefix_block_ids(synth.block_ids)
    assert renamed == 0 and ids == synth.block_ids
    assert shared_trace.renamed_blocks == 0


# --- 7 and 8. the command line: checked before work, one line and exit code 2 -------------------------------
def test_compare_checks_its_arguments_before_any_work(tmp_path, monkeypatch, capsys):
    from mooncake_gym.experiments import compare as cmp

    def must_not_run(*a, **k):
        raise AssertionError("compare ran before its arguments were checked")

    monkeypatch.setattr(cmp, "compare", must_not_run)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for argv, match in [(["--plot-dir", str(a_file)], "--plot-dir: .* is not a directory"),
                        (["--speed", "-1"], "--speed: expected a finite number"),
                        (["--speed", "2"], "--speed: has no effect without --trace"),
                        (["--env", "routing", "--loads", "3"], "--loads: has no effect with --env routing"),
                        (["--env", "admission", "--rates", "3"], "--rates: has no effect"),
                        (["--seeds", "0"], "--seeds:"),
                        (["--agent-env", "routing"], "--agent-env: has no effect without --agent"),
                        (["--json", "--no-progress"], "--no-progress: has no effect with --json")]:
        assert main(["compare", "--preset", "lecture", *argv]) == 2  # the lecture's options among them
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert __import__("re").search(match, err), err


def test_arguments_without_effect_and_bad_plot_names_are_errors(tmp_path, capsys):
    for argv, match in [(["trace", "stats", str(tmp_path / "t.jsonl"), "--rate", "3"], "--rate: has no effect"),
                        (["replay", "--policy", "cache", "--threshold", "2"], "--threshold: has no effect"),
                        (["lecture", "--demo", "1", "--plot", str(tmp_path / "x.png")], "--plot: has no effect"),
                        (["overload", "--plot", str(tmp_path / "x.pdf")], "--plot: expected a file name ending in .png"),
                        (["cache", "synthetic", "--gib", "1e300"], "gib: expected")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err


def test_the_merged_branches_arguments_are_checked_before_any_work(tmp_path, capsys):
    # the options of the observation (replay), agent (train, compare) and Ray (train, tune) features
    out = str(tmp_path / "x.json")
    for argv, match in [
            (["replay", "--json", "--markdown"], "--markdown: has no effect with --json"),
            (["replay", "--preset", "lecture", "--pool", "2xH800", "--instances", "3"],
             "--instances: expected 2 (the length of --pool"),
            (["replay", "--preset", "lecture", "--pool", "2xB999"], "instances[0]:"),
            (["replay", "--observation", "stale"], "--observation stale: mode: expected"),
            (["compare", "--unsafe-pickle"], "--unsafe-pickle: has no effect without --agent"),
            (["train", "--env", "routing", "--n-envs", "0"], "--n-envs: expected an integer in [1, 256], got 0"),
            (["train", "--env", "routing", "--env-kwargs", "=3"], "--env-kwargs: expected key=value"),
            (["train", "--env", "routing", "--backend", "rllib", "--algo", "a2c"], "--algo: stable-baselines3 only"),
            (["train", "--env", "routing", "--backend", "rllib", "--timesteps", "9"], "--timesteps: stable-baselines3 only"),
            (["train", "--env", "routing", "--address", "x:1"], "--address: for --backend rllib only"),
            (["tune", "--algo", "ppo", "--backend", "ray", "--env", "routing", "--seeds", "2", "--out", out],
             "--seeds: has no effect with --algo"),
            (["tune", "--policy", "kvcentric", "--env", "routing", "--train-batch", "64", "--out", out],
             "--train-batch: has no effect with --policy"),
            (["tune", "--policy", "early", "--env", "admission", "--rates", "4", "--out", out], "--rates: has no effect"),
            (["tune", "--policy", "kvcentric", "--env", "routing", "--speed", "2", "--out", out],
             "--speed: has no effect without --trace")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "x.json").exists()


def test_trace_generate_refuses_to_write_an_empty_trace(tmp_path):
    out = tmp_path / "empty.jsonl"
    line = one_line_error(run_cli("trace", "generate", "--duration", "0.001", "-o", str(out)))
    assert "no requests" in line and not out.exists()


@pytest.mark.parametrize("argv, match", [
    (["train", "--env", "routing", "--threads", "0"], "--threads: expected an integer in [1, 256], got 0"),
    (["bench", "--seconds", "nan"], "--seconds: expected a finite number"),
    (["replay", "--rate", "inf"], "--rate: expected a finite number"),
    (["overload", "--load", "1e-7"], "--load: expected a finite number in [0.001, 1000.0]"),
    (["replay", "--no-such-option"], "unrecognized arguments: --no-such-option"),
])
def test_cli_failures_are_one_line_and_exit_2(argv, match):
    assert match in one_line_error(run_cli(*argv))


def test_every_range_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    missing = [name for name in limits.LIMITS if f"| `{name}`" not in doc]
    assert not missing, f"docs/reliability.md does not list the ranges of {missing}"


# --- files: whole or not at all; inputs that are not regular files say what they are --------------

def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    from mooncake_gym._files import replacing, write_atomic

    target = tmp_path / "out.json"
    write_atomic(target, "old\n")
    with pytest.raises(KeyboardInterrupt):
        with replacing(target) as tmp:
            tmp.write_text("half of the new")
            raise KeyboardInterrupt
    assert target.read_text() == "old\n" and list(tmp_path.iterdir()) == [target]
    write_atomic(target, b"new\n")
    assert target.read_text() == "new\n" and list(tmp_path.iterdir()) == [target]


def test_inputs_that_are_not_regular_files_say_what_they_are(tmp_path):
    from mooncake_gym.model.workload import read_trace

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, message in ((tmp_path, "is a directory, not a file"), (fifo, "is a FIFO, not a file"),
                          ("/dev/null", "is a character device, not a file")):
        with pytest.raises(ValueError, match=message):
            read_trace(path)
    with pytest.raises(FileNotFoundError, match="trace: no such file"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"block_tokens: expected an integer in \[1, 1048576\], got 0"):
        read_trace(tmp_path / "missing.jsonl", block_tokens=0)
    result = run_cli("trace", "stats", str(fifo))  # the command does not block on the FIFO
    assert result.returncode == 2 and result.stderr.strip().endswith("is a FIFO, not a file")


def test_ctrl_c_is_one_line_and_exit_code_130(monkeypatch, capsys):
    from mooncake_gym.cli import app

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "check_args", interrupted)
    assert main(["trace", "stats", "synthetic"]) == 130
    assert capsys.readouterr().err == "mooncake-gym trace: interrupted\n"


@pytest.mark.parametrize("text, message", [
    ('{"policy": "early", "env": "admission", "knobs": {"threshold": Infinity}}', "Infinity is not a JSON number"),
    ('{"policy": "early", "env": "admission", "knobs": {"threshold": true}}', "knob threshold must be a finite number"),
    ('{"policy": "early", "env": "admission", "knobs": {"threshold": "0.9"}}', "knob threshold must be a finite number"),
    ('{"policy": ["early"], "env": "admission", "knobs": {}}', "'policy' and 'env' must be strings"),
    ("[" * 100_000 + "]" * 100_000, "not a tune result"),
])
def test_a_tuned_file_is_checked_strictly(tmp_path, text, message):
    from mooncake_gym.experiments.tune import read_tuned

    path = tmp_path / "tuned.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_tuned(path)
    with pytest.raises(ValueError, match="is a directory"):
        read_tuned(tmp_path)


def test_the_leaderboard_page_refuses_a_cut_tables_file_and_keeps_the_old_page(tmp_path):
    from mooncake_gym.evaluation.scenarios import SCENARIOS
    from mooncake_gym.experiments import leaderboard

    complete = "".join(f"\n### {sc.name} v{sc.version} ({sc.env_id})\n\n| policy |\n|---|\n| bound |\n"
                       for sc in SCENARIOS.values())
    tables, page = tmp_path / "tables.md", tmp_path / "leaderboard.md"
    tables.write_text(complete)
    assert leaderboard.main(["--leaderboard", str(tables), "--out", str(page)]) == 0
    written = page.read_text()
    assert written.startswith("# Leaderboard") and complete.strip() in written
    for cut in (complete[: len(complete) // 2], complete[: complete.rindex("| bound |")]):
        tables.write_text(cut)
        with pytest.raises(SystemExit) as e:
            leaderboard.main(["--leaderboard", str(tables), "--out", str(page)])
        assert e.value.code == 2 and page.read_text() == written


ALL_ENV_IDS = ["mooncake_gym/PrefillRouting-v0", "mooncake_gym/OverloadAdmission-v0", "mooncake_gym/PrefillRouting-v1",
               "mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1"]


@pytest.mark.parametrize("env_id", ALL_ENV_IDS)
def test_a_boolean_is_not_an_action_and_an_unknown_reset_option_is_named(env_id):
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    for action in (True, False, np.bool_(True), np.array(True)):
        with pytest.raises(ValueError, match="action: expected"):
            env.step(action)
    with pytest.raises(ValueError, match=r"options: unknown key 'ofset'; this environment's reset takes trace"):
        env.reset(seed=0, options={"ofset": 3})
    with pytest.raises(ValueError, match="options: expected None or a dict"):
        env.reset(seed=0, options=[("trace", None)])
    env.reset(seed=0, options={})  # no keys: the env's own workload


def test_a_pool_is_bounded_before_it_is_expanded():
    from mooncake_gym.model.presets import parse_instances

    for pool in ("99999999999999999999xH100", "100000000xH100", "1000xH100+100xA800"):
        with pytest.raises(ValueError, match="instances: expected at most 1024 instances in all"):
            parse_instances(pool)
    with pytest.raises(ValueError, match="instances: expected at most 1024 instances, got 2,000"):
        parse_instances(["H100"] * 2000)
    assert len(parse_instances("1000xH100+24xA800")) == 1024


@pytest.mark.parametrize("text, match", [
    ("scraped,scrape_period_s=0.000001,scrape_delay_s=100", r"scrape_delay_s: this would make 1e\+08 load snapshots"),
    ("scraped,scrape_delay_s=1e300", r"scrape_delay_s: expected a finite number in \[0, 100000000.0\]"),
    ("noisy,noise_sigma=1e9", r"noise_sigma: expected a finite number in \[0, 10\]"),
    ("approximate,index_ttl_s=inf", r"index_ttl_s: expected a finite number in \[0, 100000000.0\]"),
    ("precise,kv_event_delay_s=-1", r"kv_event_delay_s: expected a finite number in \[0, 100000000.0\]"),
])
def test_observation_parameters_are_bounded_before_any_simulator_is_built(text, match):
    from mooncake_gym.sim.observation import as_observation
    with pytest.raises(ValueError, match=match):
        as_observation(text)
    # at the bounds the configuration is accepted
    as_observation("scraped,scrape_period_s=0.001,scrape_delay_s=99.999")
    as_observation("noisy,noise_sigma=10")


@pytest.mark.parametrize("argv, message", [
    (["trace", "generate", "-o", "{dir}"], "--output: '{dir}' is a directory, not a file"),
    (["trace", "generate", "-o", "{dir}/file.txt/x.jsonl"], "--output: the folder '{dir}/file.txt' is not a directory"),
    (["tune", "--policy", "kvcentric", "--env", "routing", "--out", "{dir}/best.txt"], "--out: expected a file name ending in .json"),
    (["cache", "synthetic", "--plot", "{dir}"], "--plot: expected a file name ending in .png"),
])
def test_an_output_path_that_cannot_be_written_is_named_before_any_work(tmp_path, capsys, argv, message):
    """Every file a command writes is checked before the work (``_files.check_output_file``)."""
    (tmp_path / "file.txt").write_text("")
    from mooncake_gym.cli import main

    assert main([a.format(dir=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(dir=tmp_path) in err


def test_an_atomic_write_names_its_target_not_the_temporary_file(tmp_path):
    from mooncake_gym._files import write_atomic

    with pytest.raises(ValueError, match=r"output: '.*' is a directory, not a file"):
        write_atomic(tmp_path, "x")
    with pytest.raises(ValueError, match=r"the folder '.*missing.txt' is not a directory"):
        (tmp_path / "missing.txt").write_text("")
        write_atomic(tmp_path / "missing.txt" / "a.json", "x")
    with pytest.raises(ValueError, match=r"output: no such directory '.*new'"):
        write_atomic(tmp_path / "new" / "a.json", "x")
    write_atomic(tmp_path / "a.json", "x")
    assert (tmp_path / "a.json").read_text() == "x"
