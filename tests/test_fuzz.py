"""Property-based tests (hypothesis) of everything that takes input from outside: trace lines, Trace
columns, command lines, environment arguments, actions and policy answers, agent cards, tuned
files, reset options and the lab grader's submissions.

Each property: the input ends in a clear error (the project's own exception types; on the command
line one line on stderr and exit code 2) or in a valid result whose invariants hold. Command lines
run in a subprocess under a memory cap (``RLIMIT_AS``) and a time limit.

Two profiles: ``quick`` (default, derandomized: the same examples every run, well under two
minutes) and ``long`` (``MOONCAKE_FUZZ=long``, ``make fuzz``): many more examples, random seeds,
and long random runs of both environments (500,000 checked steps each) that check the simulators'
invariants at every step: each request ends exactly once, no decode instance holds more than its
capacity, the rewards add up to the episode's metrics, and the environment equals the simulator.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.model.limits import LIMITS
from mooncake_gym.sim.admission import COMPLETED, PENDING, REJECTED_AFTER_PREFILL, REJECTED_AT_ARRIVAL
from mooncake_gym.sim.admission import simulate as admission_simulate
from mooncake_gym.sim.routing import simulate as routing_simulate
from mooncake_gym.model.workload import Trace, TraceFormatError, read_trace, write_trace

PROFILE = os.environ.get("MOONCAKE_FUZZ", "quick")
if PROFILE not in ("quick", "long"):
    raise ValueError(f"MOONCAKE_FUZZ: expected 'quick' or 'long', got {PROFILE!r}")
LONG = PROFILE == "long"
_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("quick", derandomize=True, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
settings.load_profile(PROFILE)

ROUTING = "mooncake_gym/PrefillRouting-v0"
ADMISSION = "mooncake_gym/OverloadAdmission-v0"
MEMORY_CAP = 3 * 2**30  # bytes of address space for one command line
TIME_LIMIT_S = 120


def examples(quick: int, long: int):
    return settings(max_examples=long if LONG else quick)


# --- strategies ------------------------------------------------------------------------------------
#: Numbers around every boundary that matters, and beyond what int64 / float64 hold.
edge_ints = st.sampled_from([0, 1, -1, 511, 512, 513, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -2**63, 10**12,
                             10**12 + 1, 10**400, LIMITS["output_length"].hi, LIMITS["output_length"].hi + 1,
                             LIMITS["input_length"].hi + 1])
any_int = st.one_of(st.integers(-5, 5000), edge_ints)
odd_values = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from([1e300, -0.0, 0.5, 2.0]), st.text(max_size=5), st.just([]), st.just({}),
                       st.just([[[[1]]]]))
field_value = st.one_of(any_int, any_int, odd_values)
hash_ids = st.one_of(st.lists(st.integers(0, 30), max_size=6), st.lists(any_int, max_size=4), odd_values)


@st.composite
def trace_objects(draw):
    obj = {}
    for name in ("timestamp", "input_length", "output_length"):
        if draw(st.integers(0, 15)):  # mostly present
            obj[name] = draw(st.one_of(st.integers(0, 3000), field_value))
    if draw(st.integers(0, 15)):
        n_in = obj.get("input_length")
        if isinstance(n_in, int) and 0 <= n_in <= 3000 and draw(st.booleans()):  # the right length
            ids = draw(st.lists(st.integers(0, 40), min_size=-(-n_in // 512), max_size=-(-n_in // 512)))
            obj["hash_ids"] = ids
        else:
            obj["hash_ids"] = draw(hash_ids)
    if draw(st.integers(0, 3)) == 0:
        obj["session_id"] = draw(field_value)
    return obj


def as_line(obj) -> str:
    return json.dumps(obj, allow_nan=True)


@st.composite
def valid_lines(draw):
    """A few valid lines (non-decreasing timestamps, ids shared between prompts as prefixes or not),
    with at most one field of one line replaced by a fuzzed value."""
    n = draw(st.integers(1, 4))
    times = sorted(draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)))
    objs = []
    for t in times:
        n_in = draw(st.integers(0, 2000))
        ids = draw(st.lists(st.integers(0, 12), min_size=-(-n_in // 512), max_size=-(-n_in // 512), unique=True))
        objs.append({"timestamp": t, "input_length": n_in, "output_length": draw(st.integers(0, 5000)),
                     "hash_ids": ids})
    if draw(st.booleans()):
        obj = draw(st.sampled_from(objs))
        obj[draw(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "session_id"]))] = \
            draw(field_value)
    return [as_line(o) for o in objs]


trace_line = st.one_of(trace_objects().map(as_line), trace_objects().map(as_line), trace_objects().map(as_line),
                       st.text(max_size=40), st.sampled_from(["[" * 50_000, "{" * 3000 + "}" * 3000, "\x00",
                                                              '{"timestamp": 1e400}', "NaN", "[]", "1" * 5000]))


def check_trace_invariants(trace: Trace) -> None:
    n = len(trace)
    assert len(trace.input_tokens) == len(trace.output_tokens) == len(trace.block_ids) == len(trace.session_ids) == n
    a = trace.arrival_s
    assert np.all(np.isfinite(a)) and np.all(a >= 0) and np.all(np.diff(a) >= 0)
    assert trace.input_tokens.min(initial=0) >= 0 and trace.input_tokens.max(initial=0) <= LIMITS["input_length"].hi
    assert trace.output_tokens.min(initial=0) >= 0 and trace.output_tokens.max(initial=0) <= LIMITS["output_length"].hi
    parent = {}
    for ids in trace.block_ids:
        assert len(set(ids)) == len(ids)
        prev = None
        for b in ids:  # prefix semantics: an id always follows the same predecessor
            assert type(b) is int and 0 <= b <= LIMITS["hash_ids"].hi
            assert parent.setdefault(b, prev) == prev
            prev = b


# --- trace lines and columns -------------------------------------------------------------------------
@examples(300, 5000)
@given(lines=st.one_of(st.lists(trace_line, min_size=0, max_size=4), valid_lines()))
def test_fuzz_trace_lines(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("lines") / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    try:
        trace = read_trace(path)
    except TraceFormatError as e:
        assert str(e).startswith(f"{path}"), e  # names the file (and the line)
        event("refused")
        return
    event("read")
    check_trace_invariants(trace)
    out = path.with_name("again.jsonl")
    write_trace(trace, out)  # a trace that was read can be written and read back to the same bytes
    again = path.with_name("again2.jsonl")
    write_trace(read_trace(out), again)
    assert out.read_bytes() == again.read_bytes()


csv_cell = st.one_of(st.integers(-5, 3000).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                    st.sampled_from(["", "x", "2023-11-16 18:15:46.6805900", "2023-02-30 00:00:00", "1e400",
                                     "12.0", '"a,b"', "NaN"]), st.text(max_size=8))
csv_header = st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens",
                              "Timestamp,Session ID,Model,Request tokens,Response tokens",
                              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "a,b", ""])


@examples(300, 5000)
@given(header=csv_header, rows=st.lists(st.lists(csv_cell, min_size=0, max_size=6), max_size=5),
       fmt=st.sampled_from(["azure", "burstgpt", "csv:timestamp=a,input=b,output=b", "csv:timestamp=Timestamp,"
                            "input=Request tokens,output=Response tokens,session=Model,unit=ms"]),
       prefix=st.sampled_from([None, "none", "session"]))
def test_fuzz_csv_traces(tmp_path_factory, header, rows, fmt, prefix):
    """A CSV trace in any of the importers' formats is read into a valid Trace or refused with a
    TraceFormatError naming the file (a ValueError naming ``prefix`` for a rule the source cannot
    follow), never another exception."""
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_text("\n".join([header, *(",".join(r) for r in rows)]) + "\n", encoding="utf-8",
                    errors="surrogatepass")
    try:
        trace = read_trace(path, format=fmt, prefix=prefix)
    except TraceFormatError as e:
        assert str(e).startswith(f"{path}"), e
        event("refused")
        return
    except ValueError as e:
        assert str(e).startswith("prefix: "), e
        event("refused: prefix rule")
        return
    event("read")
    check_trace_invariants(trace)
    assert trace.prefix_ids in ("none", "session")


@examples(300, 3000)
@given(text=st.one_of(st.text(max_size=40), st.builds(
    lambda mode, key, value: f"{mode},{key}={value}",
    st.sampled_from(["scraped", "noisy", "approximate", "precise", "scraped+noisy", "exact"]),
    st.sampled_from(["scrape_period_s", "scrape_delay_s", "noise_sigma", "index_ttl_s", "kv_event_delay_s",
                     "routers", "inflight", "index_capacity_blocks"]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.integers(-5, 10**12).map(str),
              st.sampled_from(["true", "false", "x", ""])))))
def test_fuzz_observation_modes(text):
    """An observation mode string is an ObservationConfig or a ValueError naming the observation
    string or the setting at fault."""
    from dataclasses import fields

    from mooncake_gym.sim.observation import ObservationConfig, as_observation
    names = ("observation", *(f.name for f in fields(ObservationConfig)))
    try:
        config = as_observation(text)
    except ValueError as e:
        assert str(e).split(":")[0] in names, e
        event("refused")
        return
    event("accepted")
    if config.scrape_period_s > 0:
        assert config.scrape_delay_s / config.scrape_period_s <= 100_000


column_value = st.one_of(st.integers(-3, 3000), st.floats(allow_nan=True, allow_infinity=True), edge_ints,
                         st.sampled_from(["5", None, True]))


@examples(200, 5000)
@given(n=st.integers(0, 4), data=st.data())
def test_fuzz_trace_columns(n, data):
    cols = [data.draw(st.lists(column_value, min_size=n, max_size=n)) for _ in range(3)]
    if data.draw(st.booleans()):
        cols[0] = sorted(data.draw(st.lists(st.floats(0, 1e4), min_size=n, max_size=n)))
        cols[1] = data.draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    blocks = data.draw(st.lists(st.one_of(st.lists(st.integers(0, 20), max_size=6, unique=True), hash_ids),
                                min_size=n, max_size=n + data.draw(st.integers(0, 1))))
    try:
        trace = Trace(cols[0], cols[1], cols[2], blocks)
    except ValueError as e:
        event("refused")
        assert str(e).split(":")[0] in ("arrival_s", "input_tokens", "output_tokens", "block_ids",
                                        "Trace columns have different lengths"), e
        return
    event("built")
    check_trace_invariants(trace)


# --- policy answers and env actions ------------------------------------------------------------------------
valid_answers = st.one_of(st.booleans(), st.integers(0, 1), st.sampled_from([np.bool_(True), np.int64(0)]),
                          st.tuples(st.integers(0, 7), st.booleans()))
answers = st.one_of(st.booleans(), st.integers(-3, 12), st.floats(allow_nan=True), st.text(max_size=4), st.none(),
                    st.tuples(st.integers(-1, 9), st.one_of(st.booleans(), st.integers(-1, 2), st.text(max_size=3))),
                    st.sampled_from([np.int64(1), np.bool_(False), np.float32(1.0), np.array([1]), "reject", "no"]))


def small_trace(seed: int, n: int = 40) -> Trace:
    from mooncake_gym.model.workload import synthetic_trace

    return synthetic_trace(seed, rate=3.0, duration_s=None, n_requests=n)


@examples(100, 3000)
@given(seed=st.integers(0, 50), script=st.one_of(st.lists(answers, min_size=1, max_size=60),
                                                 st.lists(valid_answers, min_size=1, max_size=60)),
       problem=st.sampled_from(["r", "a"]))
def test_fuzz_policy_answers(seed, script, problem):
    trace = small_trace(seed)
    it = iter(script * (len(trace) // len(script) + 1))
    try:
        if problem == "r":
            result = routing_simulate(trace, lambda v: next(it))
            assert result.metrics["requests"] == len(trace)
        else:
            result = admission_simulate(trace, lambda v: next(it))
            check_admission_result(result, len(trace))
        event("valid run")
    except (TypeError, ValueError) as e:
        event("refused")
        assert str(e).startswith(("action:", "admit:")), e


@examples(100, 3000)
@given(seed=st.integers(0, 50), actions=st.lists(answers, min_size=1, max_size=40),
       env_id=st.sampled_from([ROUTING, ADMISSION]))
def test_fuzz_env_actions(seed, actions, env_id):
    env = gym.make(env_id, episode_requests=20).unwrapped
    env.reset(seed=seed)
    for a in actions:
        try:
            obs, reward, terminated, truncated, _ = env.step(a)
        except ValueError as e:
            assert str(e).startswith("action:"), e
            event("refused action")
            continue
        event("valid action")
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        if terminated:
            env.reset(seed=seed)


# --- environment arguments -------------------------------------------------------------------------------
number = st.one_of(st.sampled_from([1, 2, 3, 8, 0.5, 2.5, (1.0, 3.0)]),
                   st.sampled_from([0, 1, 2, 3, 8, 0.5, 2.5, 1e-9, 1e9, -1, math.nan, math.inf, 10**400]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none(), st.booleans())
ENV_KWARGS = {
    ROUTING: {"n_instances": number, "cache_blocks": number, "ttft_slo_s": number, "rate": number,
              "rate_range": st.one_of(st.tuples(number, number), number), "speed": number,
              "episode_requests": number, "duration_s": number, "reward": st.sampled_from(["ttft", "slo", "x", 1])},
    ADMISSION: {"load": number, "load_range": st.one_of(st.tuples(number, number), number), "n_prefill": number,
                "n_decode": number, "decode_capacity_tokens": st.one_of(number, st.sampled_from([60_000, 10**12])),
                "tbt_s": number, "ttft_slo_s": number, "oracle": st.one_of(st.booleans(), number),
                "waste_penalty": number, "episode_requests": number},
}
#: Valid values that keep an episode small (the fuzzed ones are mixed with these).
SMALL = {"episode_requests": 30, "n_instances": 4, "n_prefill": 4, "n_decode": 4, "duration_s": 20.0}


@examples(80, 2000)
@given(env_id=st.sampled_from([ROUTING, ADMISSION]), data=st.data())
def test_fuzz_env_kwargs(env_id, data):
    names = data.draw(st.lists(st.sampled_from(sorted(ENV_KWARGS[env_id])), max_size=3, unique=True))
    kwargs = {k: v for k, v in SMALL.items() if k in ENV_KWARGS[env_id]}
    kwargs.update({k: data.draw(ENV_KWARGS[env_id][k]) for k in names})
    if isinstance(kwargs.get("episode_requests"), int) and kwargs["episode_requests"] > 200:
        kwargs["episode_requests"] = 200  # valid and large: bounded by the limits, but slow for a quick test
    try:
        env = gym.make(env_id, **kwargs).unwrapped
        if env_id == ROUTING and env.workload.episode_requests is None and env.workload.duration_s > 60:
            return  # valid; long episodes are the long runs' business
        obs, _ = env.reset(seed=0)
    except (ValueError, TypeError) as e:
        event("refused")
        assert ":" in str(e) and str(e).split(":")[0].split(",")[0].strip() in {*ENV_KWARGS[env_id], *SMALL, "rate",
                                                                               "load", "rate_range", "load_range",
                                                                               "base_trace"}, e
        return
    event("valid env")
    assert env.observation_space.contains(obs)
    rng = np.random.default_rng(0)
    for _ in range(50):
        obs, reward, terminated, _, _ = env.step(int(rng.integers(env.action_space.n)))
        assert env.observation_space.contains(obs) and math.isfinite(reward)
        if terminated:
            break


# --- command lines, in a subprocess under a memory cap and a time limit ------------------------------------
cli_value = st.one_of(st.sampled_from(["0", "1", "-1", "nan", "inf", "-inf", "1e400", "1e-9", "abc", "", "2.5",
                                       "9999999999999999999999", "3", "0x10"]), st.integers(-5, 50).map(str))
CLI_COMMANDS = {
    ("trace", "stats", "synthetic"): ["--rate", "--seed"],
    ("trace", "generate"): ["--rate", "--seed", "--duration", "--requests"],
    ("replay", "--policy", "load"): ["--rate", "--seed", "--instances", "--cache-blocks", "--ttft-slo", "--speed",
                                     "--threshold", "--decode-instances"],
    ("overload", "--policy", "baseline", "--requests", "200"): ["--load", "--seed", "--ttft-slo", "--rate",
                                                                "--prefill-instances", "--decode-instances"],
    ("cache", "synthetic"): ["--rate", "--seed", "--blocks", "--gib", "--policies"],
    ("compare",): ["--seeds", "--speed", "--rates", "--loads", "--agent-env"],
    ("train", "--env", "routing"): ["--threads", "--timesteps"],
    ("bench",): ["--seconds", "--only"],
    ("lecture", "--demo", "1"): ["--plot"],
}
#: Valid values that keep a run short, used for the options not fuzzed.
CLI_SMALL = {("trace", "stats", "synthetic"): ["--rate", "0.2"], ("trace", "generate"): ["--duration", "20"],
             ("replay", "--policy", "load"): ["--rate", "0.2", "--preset", "lecture"],
             ("overload", "--policy", "baseline", "--requests", "200"): ["--preset", "lecture"],  # (the quick toy)
             ("cache", "synthetic"): ["--rate", "0.2"]}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(argv: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mooncake_gym.cli", *argv], capture_output=True, text=True,
                          timeout=TIME_LIMIT_S, preexec_fn=_limit_memory, env=env, cwd=cwd)


@examples(10, 300)
@given(command=st.sampled_from(sorted(CLI_COMMANDS)), data=st.data())
def test_fuzz_command_lines(tmp_path_factory, command, data):
    options = data.draw(st.lists(st.sampled_from(CLI_COMMANDS[command]), min_size=1, max_size=2, unique=True))
    argv = [*command, *CLI_SMALL.get(command, [])]
    for opt in options:
        argv += [opt, data.draw(cli_value)]
    if command == ("trace", "generate"):
        argv += ["-o", "out.jsonl"]
    if command[0] in ("compare", "train", "bench"):
        argv += ["--no-such-effect-check"] if data.draw(st.booleans()) else []
    expensive = command[0] in ("compare", "train", "bench")
    cwd = tmp_path_factory.mktemp("cli")
    if expensive:
        # valid values would start a long run: these commands are fuzzed for their refusals only,
        # with one invalid value appended after the fuzzed ones
        argv += ["--seeds", "0"] if command[0] == "compare" else ["--threads", "0"] if command[0] == "train" \
            else ["--seconds", "nan"]
    done = run_capped(argv, cwd)
    assert "Traceback" not in done.stderr, (argv, done.stderr)
    if expensive:
        assert done.returncode == 2, (argv, done.stderr)
    assert done.returncode in (0, 2), (argv, done.returncode, done.stderr)
    event(f"exit {done.returncode}")
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == "", (argv, done.stderr)
        assert not (cwd / "out.jsonl").exists()


# --- long random runs: the simulators' invariants at every step --------------------------------------------
def check_admission_result(result, n: int) -> None:
    m = result.metrics
    outcome = result.outcome
    assert not np.any(outcome == PENDING)  # each request ends ...
    assert (m["completed"] + m["rejected_at_arrival"] + m["rejected_after_prefill"]) == n  # ... exactly once
    completed = outcome == COMPLETED
    assert np.count_nonzero(completed) == m["completed"]
    assert np.count_nonzero(outcome == REJECTED_AT_ARRIVAL) == m["rejected_at_arrival"]
    assert np.count_nonzero(outcome == REJECTED_AFTER_PREFILL) == m["rejected_after_prefill"]
    assert np.all(np.isfinite(result.decode_start_s[completed])) and np.all(np.isnan(result.decode_start_s[~completed]))
    assert np.all(result.decode_end_s[completed] >= result.decode_start_s[completed])
    assert m["wasted_prefill_s"] == pytest.approx(float(result.prefill_s[outcome == REJECTED_AFTER_PREFILL].sum()))


def same_metrics(a: dict, b: dict) -> bool:
    """Equal metric dicts, NaN equal to NaN (an undefined correlation)."""
    nan = lambda x: isinstance(x, float) and math.isnan(x)  # noqa: E731
    return a.keys() == b.keys() and all(a[k] == b[k] or (nan(a[k]) and nan(b[k])) for k in a)


def admission_run(steps: int, seed: int) -> int:
    """Random admission decisions over episodes of varied load until ``steps`` steps; every step checks
    the decode capacity, every episode the outcomes, the reward sum and the simulator's own run."""
    env = gym.make(ADMISSION, load_range=(0.5, 4.0), episode_requests=3000).unwrapped
    rng = np.random.default_rng(seed)
    done_steps, episode = 0, 0
    cap = env.config.decode_capacity_tokens
    while done_steps < steps:
        env.reset(seed=seed * 100_000 + episode)
        p_admit = rng.uniform(0.2, 1.0)
        actions, rewards, granted, charged = [], 0.0, 0, 0.0
        while True:
            a = int(rng.random() < p_admit)
            actions.append(a)
            _, reward, terminated, _, info = env.step(a)
            rewards += reward
            granted += info["granted"]
            charged += info["doomed_s"] + info["wasted_s"]
            used = env.sim.decode_used_per_instance
            cluster = env.sim.cluster  # the tokens held are those of the requests decoding
            held = sum(cluster.trace.input_tokens[r] + cluster.trace.output_tokens[r] for r in cluster._decode_of)
            assert max(used) <= cap and min(used) >= 0 and sum(used) == held
            if terminated:
                break
        done_steps += len(actions)
        episode += 1
        result = env.sim.result("env")
        n = len(env.sim.trace)
        assert len(actions) == n
        check_admission_result(result, n)
        # rewards add up: goodput minus the penalty on every wasted or doomed prefill second
        slo = env.config.ttft_slo_s
        doomed = (result.prefill_instance >= 0) & (result.ttft_s > slo)
        wasted = result.outcome == REJECTED_AFTER_PREFILL
        expect_charged = float(result.prefill_s[doomed | wasted].sum())
        assert granted == result.metrics["goodput"]
        assert charged == pytest.approx(expect_charged, rel=1e-9, abs=1e-6)
        assert rewards == pytest.approx(granted - env.waste_penalty * charged / env.mean_prefill_s, rel=1e-9, abs=1e-6)
        # the environment equals the simulator on the same decisions
        it = iter(actions)
        again = admission_simulate(env.sim.trace, lambda v: next(it) == 1, env.config, env.cost)
        assert same_metrics(again.metrics, {**result.metrics, "policy": again.metrics["policy"]})
    return done_steps


def routing_run(steps: int, seed: int) -> int:
    """Random routing decisions (with pulls) until ``steps`` steps; every step checks the outcome,
    every episode the reward sum and the dispatch count."""
    env = gym.make(ROUTING, rate_range=(2.0, 12.0), episode_requests=3000).unwrapped
    rng = np.random.default_rng(seed)
    done_steps, episode = 0, 0
    n_actions = env.action_space.n
    slo = env.config.ttft_slo_s
    while done_steps < steps:
        env.reset(seed=seed * 100_000 + episode)
        total, ttfts, k = 0.0, [], 0
        while True:
            _, reward, terminated, _, info = env.step(int(rng.integers(n_actions)))
            assert info["index"] == k and 0 <= info["hit_tokens"] <= info["input_tokens"]
            assert info["ttft_s"] == info["queue_s"] + info["transfer_s"] + info["prefill_s"] >= 0
            assert reward == -info["ttft_s"] / slo
            total += reward
            ttfts.append(info["ttft_s"])
            k += 1
            if terminated:
                break
        done_steps += k
        episode += 1
        m = info["metrics"]
        assert k == len(env.sim.trace) == m["requests"]  # each request dispatched exactly once
        assert total == pytest.approx(-sum(ttfts) / slo, rel=1e-12)
        assert m["mean_ttft_s"] == pytest.approx(float(np.mean(ttfts)), rel=1e-12)
    return done_steps


@pytest.mark.parametrize("run", [admission_run, routing_run])
def test_random_runs_keep_the_invariants(run):
    steps = 500_000 if LONG else 3000
    assert run(steps, seed=7) >= steps


# --- agent cards, tuned files, reset options (issue 28: every size and type from a file checked) -----
def _mutate(draw, value, depth=0):
    """``value`` (a JSON document) with one field somewhere replaced by an odd or huge value."""
    if isinstance(value, dict) and value and depth < 4 and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(draw, value[key], depth + 1)}
    if isinstance(value, list) and value and depth < 4 and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return value[:i] + [_mutate(draw, value[i], depth + 1)] + value[i + 1:]
    return draw(st.one_of(field_value, st.sampled_from([[65536] * 8, [10**9], {"pi": [10**6] * 4}, "x" * 300])))


@examples(60, 1000)
@given(data=st.data())
def test_fuzz_agent_cards(tmp_path_factory, data):
    """A mutated card of a shipped agent loads (and then acts) or is one AgentFormatError, and never
    builds a network beyond the card's bound (it would be refused before)."""
    import shutil

    from mooncake_gym import agents
    from mooncake_gym.agents.agentfile import AgentFormatError, sha256_of

    name = data.draw(st.sampled_from(sorted(agents.SHIPPED)))
    path = tmp_path_factory.mktemp("card") / "a.zip"
    shutil.copy(agents.agent_dir() / f"{name}.zip", path)
    card = _mutate(data.draw, {**agents.card(name), "sha256": sha256_of(path)})
    path.with_suffix(".json").write_text(json.dumps(card, allow_nan=True))
    try:
        agent = agents.load_agent(path)
    except AgentFormatError as e:
        event(f"refused: {str(e).split(': ')[-2][-30:]}")
        return
    shape = agent.observation_space.shape
    action, _ = agent.predict(np.zeros((1, *shape), np.float32))
    assert agent.action_space.contains(int(np.asarray(action).reshape(-1)[0]))


tuned_doc = st.fixed_dictionaries({"policy": st.sampled_from(["early", "kvcentric", "nope"]),
                                   "env": st.sampled_from(["admission", "routing", "x"]),
                                   "knobs": st.dictionaries(st.sampled_from(["threshold", "quantile", "x"]),
                                                            field_value, max_size=2)})


@examples(150, 3000)
@given(doc=st.one_of(tuned_doc, field_value, st.text(max_size=30).map(lambda t: {"raw": t})))
def test_fuzz_tuned_files(tmp_path_factory, doc):
    """A tuned file is a result whose every knob is a finite number the policy accepts, or a ValueError."""
    from mooncake_gym.experiments.tune import read_tuned

    path = tmp_path_factory.mktemp("tuned") / "t.json"
    path.write_text(doc["raw"] if isinstance(doc, dict) and "raw" in doc else json.dumps(doc, allow_nan=True))
    try:
        got = read_tuned(path)
    except ValueError:
        return
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got["knobs"].values())


@examples(60, 1000)
@given(env_id=st.sampled_from([ROUTING, ADMISSION, "mooncake_gym/PrefillRouting-v1"]),
       options=st.one_of(st.none(), st.dictionaries(st.sampled_from(["trace", "offset", "ofset", "seed", ""]),
                                                     field_value, max_size=2), odd_values))
def test_fuzz_reset_options(env_id, options):
    """reset(options=...) uses every key it is given or names the one it does not know."""
    env = gym.make(env_id, episode_requests=20).unwrapped
    try:
        obs, _ = env.reset(seed=0, options=options)
    except (ValueError, TypeError, FileNotFoundError) as e:
        event(type(e).__name__)
        return
    assert env.observation_space.contains(obs)
    env.close()


# --- the lab grader's submissions ------------------------------------------------------------------
#: Pieces of a submission: at import, or in the policy's body (indented by the strategy).
_IMPORT_PIECES = ["", "import os, sys", "raise RuntimeError('at import')", "import sys\nsys.exit(3)",
                  "x = open('/etc/hostname').read()", "import numpy as np", "def helper():\n    return 1",
                  "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"]
_BODY_PIECES = ["return 0", "return True", "return -1", "return 10 ** 30", "return float('nan')", "return None",
                "return 'x' * 2000000", "return [0] * 3", "return (0, False)", "raise KeyError('k')",
                "import os\n    os._exit(5)", "import sys\n    sys.exit(0)", "return view.ttft_s(0) and 0",
                "return view.ttft_s(10 ** 9)", "return min(range(view.n_instances), key=view.ttft_s)",
                "import os\n    os.remove({victim!r})\n    return 0", "open({victim!r}, 'a').write('x')\n    return 0",
                "return [0] * (10 ** 9)", "import os\n    os.kill(os.getppid(), 9)\n    return 0"]


@examples(6, 60)
@given(head=st.lists(st.sampled_from(_IMPORT_PIECES), max_size=2), body=st.sampled_from(_BODY_PIECES),
       name=st.sampled_from(["route", "route", "other"]))
def test_fuzz_lab_submissions(tmp_path_factory, head, body, name):
    """A submission ends as an action or as a graded failure with its reason (``SubmissionFailed``),
    never as another exception or as the grader's exit; the grader's files stay as they were."""
    from mooncake_gym.course.sandbox import Limits, SandboxedPolicy, SubmissionFailed, landlock_abi
    from mooncake_gym.model.workload import synthetic_trace
    from mooncake_gym.sim.routing import RoutingSimulator

    folder = tmp_path_factory.mktemp("submission")
    victim = folder / "grader-owned.txt"
    victim.write_text("kept")
    source = "\n".join(head) + f"\ndef {name}(view):\n    " + body.format(victim=str(victim)) + "\n"
    (folder / "s.py").write_text(source)
    view = RoutingSimulator(synthetic_trace(0, 4.0).head(10)).reset()
    outcome = None
    try:
        with SandboxedPolicy(f"{folder / 's.py'}:route", Limits(episode_s=30, total_s=60, memory_mb=256)) as policy:
            outcome = policy(view)
    except SubmissionFailed as e:
        assert str(e), "a failure has a reason"
        event(f"failed: {str(e).split(':')[0]}")
    else:
        event("answered")
        assert outcome is not None or body == "return None"
    if landlock_abi():  # confined: nothing outside the scratch folder changed
        assert victim.read_text() == "kept"
    elif victim.exists():  # RLIMIT_FSIZE alone: nothing appended
        assert victim.read_text() == "kept"
