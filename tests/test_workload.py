"""Workloads: Mooncake JSONL traces, validation, the synthetic generator and i.i.d. resampling."""

import json
import math

import numpy as np
import pytest

from mooncake_gym.model.workload import (
    DEFAULT_SYNTHETIC,
    LONG_PROMPT_SYNTHETIC,
    Request,
    SyntheticConfig,
    Trace,
    TraceFormatError,
    ideal_prefix_hits,
    load_workload,
    read_trace,
    resample_iid,
    synthetic_trace,
    write_trace,
)

from conftest import SHARED_TRACE


@pytest.fixture(scope="module")
def big_synthetic():
    """A large sample of the default generator: about 8,000 sessions."""
    return synthetic_trace(seed=7, rate=4.0, duration_s=2000.0)


def common_prefix(a, b) -> int:
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k


def assert_prefix_tree(block_ids):
    """Prefix-hash semantics: an id names its block together with everything before it, so every id
    has one position and one predecessor wherever it appears."""
    where = {}
    for ids in block_ids:
        assert len(set(ids)) == len(ids)
        prev = None
        for pos, b in enumerate(ids):
            assert where.setdefault(b, (pos, prev)) == (pos, prev), f"block {b} appears under two prefixes"
            prev = b


# --- the shared Mooncake trace --------------------------------------------------------------------
def test_shared_trace_reproduces_the_readme_figures(shared_trace):
    stats = shared_trace.stats()
    assert stats["requests"] == 3993
    assert round(stats["input_mean"], 1) == 15325.5
    assert round(stats["ideal_hit_ratio"], 3) == 0.651
    assert round(stats["ideal_block_hit_ratio"], 3) == 0.640
    assert stats["distinct_blocks"] == 43_924
    assert stats["duration_s"] == 1022.025
    assert stats["input_max"] == 191_378 and stats["output_max"] == 893
    assert stats["input_p50"] == 11_587 and stats["output_p50"] == 69
    assert round(stats["output_mean"], 1) == 149.1
    assert round(stats["rate_per_s"], 2) == 3.91
    assert shared_trace.arrival_s[0] == 0.0
    assert_prefix_tree(shared_trace.block_ids)


def test_shared_trace_written_back_is_byte_identical_to_the_original(shared_trace, tmp_path):
    out = tmp_path / "copy.jsonl"
    write_trace(shared_trace, out)
    assert out.read_bytes() == SHARED_TRACE.read_bytes()


# --- writing and reading --------------------------------------------------------------------------
def test_write_read_write_is_byte_identical_with_session_ids(tmp_path):
    trace = synthetic_trace(seed=3, rate=2.0, duration_s=120.0)
    assert (trace.session_ids >= 0).all()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(trace, first)
    loaded = read_trace(first)
    write_trace(loaded, second)
    assert first.read_bytes() == second.read_bytes()
    assert loaded.session_ids.tolist() == trace.session_ids.tolist()
    assert loaded.block_ids == trace.block_ids
    assert loaded.input_tokens.tolist() == trace.input_tokens.tolist()
    # arrivals are kept to the millisecond
    assert np.abs(loaded.arrival_s - trace.arrival_s).max() <= 0.0005 + 1e-12
    line = json.loads(first.read_text().splitlines()[0])
    assert list(line) == ["timestamp", "input_length", "output_length", "hash_ids", "session_id"]


def test_write_read_write_without_session_ids(tmp_path):
    trace = Trace([0.0, 0.25, 0.25, 1.5], [1, 512, 513, 0], [5, 1, 2, 3], [[7], [7], [7, 9], []])
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(trace, first)
    assert first.read_text().splitlines()[0] == '{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [7]}'
    loaded = read_trace(first)
    write_trace(loaded, second)
    assert first.read_bytes() == second.read_bytes()
    assert loaded.session_ids.tolist() == [-1] * 4
    assert loaded.arrival_s.tolist() == [0.0, 0.25, 0.25, 1.5]


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path):
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}'
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n\n" + good + "\n" + '{"timestamp": 1}' + "\n")
    with pytest.raises(TraceFormatError, match=r":4: field 'input_length' is missing"):
        read_trace(path)
    path.write_text(good + "\n\n   \n" + good + "\n")
    assert len(read_trace(path)) == 2


def line(**fields):
    base = {"timestamp": 10, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not _DROP})


_DROP = object()
GOOD = line(timestamp=0)

MALFORMED = [
    # (second line, field named in the message or None, a fragment of the message)
    ('{"timestamp": 10, "input_length": 1000,', None, "not valid JSON"),
    ("[1, 2, 3]", None, "expected a JSON object"),
    (line(timestamp=_DROP), "timestamp", "missing"),
    (line(input_length=_DROP), "input_length", "missing"),
    (line(output_length=_DROP), "output_length", "missing"),
    (line(hash_ids=_DROP), "hash_ids", "missing"),
    (line(timestamp=10.5), "timestamp", "expected an integer"),
    (line(input_length="1000"), "input_length", "expected an integer"),
    (line(output_length=None), "output_length", "expected an integer"),
    (line(output_length=True), "output_length", "expected an integer"),
    (line(input_length=1000.0), "input_length", "expected an integer"),
    (line(output_length=-1), "output_length", ">= 0"),
    (line(input_length=-1000), "input_length", ">= 0"),
    (line(timestamp=-1), "timestamp", ">= 0"),
    (line(hash_ids=[1]), "hash_ids", "= 2 ids, got 1"),
    (line(hash_ids=[1, 2, 3]), "hash_ids", "= 2 ids, got 3"),
    (line(hash_ids=[1, "2"]), "hash_ids", "list of integers"),
    (line(hash_ids=[1, False]), "hash_ids", "list of integers"),
    (line(hash_ids="1,2"), "hash_ids", "list of integers"),
    (line(hash_ids=[7, 7]), "hash_ids", "id 7 appears twice"),
    (line(session_id="s1"), "session_id", "expected an integer"),
]


@pytest.mark.parametrize("bad, field, fragment", MALFORMED)
def test_malformed_lines_name_file_line_and_field(tmp_path, bad, field, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + bad + "\n")
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: ")
    if field is not None:
        assert f"field '{field}'" in message
    assert fragment in message
    assert "\n" not in message


def test_timestamp_going_backwards(tmp_path):
    path = tmp_path / "back.jsonl"
    path.write_text(line(timestamp=100) + "\n" + line(timestamp=100) + "\n" + line(timestamp=99) + "\n")
    with pytest.raises(TraceFormatError, match=r":3: field 'timestamp': goes backwards \(99 < 100\)") as info:
        read_trace(path)
    assert str(path) in str(info.value)


def test_block_count_uses_the_block_size(tmp_path):
    path = tmp_path / "blocks.jsonl"
    path.write_text(line(input_length=1024, hash_ids=[1, 2]) + "\n" + line(input_length=1025, hash_ids=[1, 2]) + "\n")
    with pytest.raises(TraceFormatError, match=r":2: field 'hash_ids': expected ceil\(input_length/512\) = 3 ids"):
        read_trace(path)
    path.write_text(line(input_length=1025, hash_ids=[1]) + "\n")
    assert read_trace(path, block_tokens=2048).block_ids == [(1,)]


def test_empty_file_and_blank_file(tmp_path):
    for text in ("", "\n\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(text)
        with pytest.raises(TraceFormatError, match="no requests") as info:
            read_trace(path)
        assert str(path) in str(info.value)


def test_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"timestamp": 1, "x": "\xe9"}\n')
    with pytest.raises(TraceFormatError, match=rf"^{path}:2: not valid UTF-8"):
        read_trace(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_trace(tmp_path / "nope.jsonl")


# --- the Trace object ---------------------------------------------------------------------------
def test_trace_indexing_and_iteration():
    trace = Trace([0.0, 1.0], [600, 10], [3, 4], [[5, 6], [5]], [2, -1], name="t")
    assert trace[0] == Request(0.0, 600, 3, (5, 6), 2)
    assert list(trace)[1] == Request(1.0, 10, 4, (5,), -1)
    assert len(trace) == 2 and trace.duration_s == 1.0 and trace.rate == 1.0


def test_trace_rejects_a_request_holding_an_id_twice():
    with pytest.raises(ValueError, match=r"^block_ids: request 1 holds an id twice \(\[4, 5, 4\]\)"):
        Trace([0, 1], [512, 1536], [1, 1], [[3], [4, 5, 4]])


def test_trace_rejects_backwards_arrivals_and_ragged_columns():
    with pytest.raises(ValueError, match="arrival_s"):
        Trace([1.0, 0.5], [1, 1], [1, 1], [[0], [1]])
    with pytest.raises(ValueError, match="different lengths"):
        Trace([0.0, 1.0], [1], [1, 1], [[0], [1]])


def test_scaled_divides_arrivals_and_keeps_requests():
    trace = synthetic_trace(seed=1, rate=2.0, duration_s=60.0)
    fast = trace.scaled(4.0)
    assert np.array_equal(fast.arrival_s, trace.arrival_s / 4.0)
    assert fast.block_ids == trace.block_ids
    assert fast.input_tokens.tolist() == trace.input_tokens.tolist()
    assert fast.output_tokens.tolist() == trace.output_tokens.tolist()
    assert fast.session_ids.tolist() == trace.session_ids.tolist()
    assert fast.rate == pytest.approx(4 * trace.rate)
    assert np.array_equal(trace.scaled(1.0).arrival_s, trace.arrival_s)
    assert np.array_equal(load_workload(trace, speed=0.5).arrival_s, trace.arrival_s * 2.0)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="^speed:"):
            trace.scaled(bad)


def test_ideal_prefix_hits_by_hand():
    # r0 misses; r1 hits block 5 (512 tokens); r2 hits 5, 6 but only has 700 tokens -> capped at 700
    # (the trace README: hit tokens are capped at input_length); r3 misses at its first block.
    trace = Trace([0, 1, 2, 3], [1000, 600, 700, 512], [1, 1, 1, 1], [[5, 6], [5, 7], [5, 6], [8]])
    assert ideal_prefix_hits(trace) == (512 + 700, 1 + 2, 7)
    assert trace.stats()["ideal_hit_ratio"] == (512 + 700) / (1000 + 600 + 700 + 512)


# --- the synthetic generator ----------------------------------------------------------------------
def test_generator_is_deterministic_per_seed():
    a = synthetic_trace(seed=11, rate=3.0, duration_s=300.0)
    b = synthetic_trace(seed=11, rate=3.0, duration_s=300.0)
    c = synthetic_trace(seed=12, rate=3.0, duration_s=300.0)
    for col in ("arrival_s", "input_tokens", "output_tokens", "session_ids"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert a.block_ids == b.block_ids
    assert len(a) != len(c) or not np.array_equal(a.input_tokens, c.input_tokens)
    assert not np.array_equal(a.arrival_s[:50], c.arrival_s[:50])


def test_generator_with_request_count_is_deterministic_and_exact():
    a = synthetic_trace(seed=5, rate=4.0, duration_s=None, n_requests=1500)
    b = synthetic_trace(seed=5, rate=4.0, duration_s=None, n_requests=1500)
    assert len(a) == 1500
    assert np.array_equal(a.arrival_s, b.arrival_s) and a.block_ids == b.block_ids
    assert "seed=5" in a.name
    short = synthetic_trace(seed=5, rate=4.0, duration_s=60.0, n_requests=100)
    assert len(short) == 100


def _same_requests(a, b):
    for col in ("arrival_s", "input_tokens", "output_tokens", "session_ids"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.block_ids == b.block_ids


@pytest.mark.parametrize("short, long", [
    ({"duration_s": None, "n_requests": 300}, {"duration_s": None, "n_requests": 2000}),  # one batch vs several
    ({"duration_s": 30.0}, {"duration_s": 400.0}),
    ({"duration_s": None, "n_requests": 50}, {"duration_s": 400.0}),
])
def test_a_shorter_trace_is_the_head_of_a_longer_one(short, long):
    # the random numbers are drawn in batches of sessions, in a fixed order: cutting a trace shorter
    # changes none of its requests (and block ids number in order of first appearance)
    a = synthetic_trace(seed=9, rate=3.0, **short)
    b = synthetic_trace(seed=9, rate=3.0, **long)
    assert 0 < len(a) < len(b)
    _same_requests(a, b.head(len(a)))
    if short.get("duration_s"):
        assert b.arrival_s[len(a)] >= short["duration_s"] > a.arrival_s[-1]


def test_generator_blocks_follow_the_trace_format(big_synthetic):
    trace = big_synthetic
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.arrival_s[-1] < 2000.0
    assert (trace.input_tokens >= 1).all() and (trace.input_tokens <= DEFAULT_SYNTHETIC.input_max).all()
    assert (trace.output_tokens >= 1).all() and (trace.output_tokens <= DEFAULT_SYNTHETIC.output_max).all()
    for n_in, ids in zip(trace.input_tokens.tolist(), trace.block_ids):
        assert len(ids) == math.ceil(n_in / 512)
    assert_prefix_tree(trace.block_ids)
    # ids are numbered in order of first appearance, as in Mooncake's traces
    seen, expected = set(), 0
    for ids in trace.block_ids:
        for b in ids:
            if b not in seen:
                assert b == expected
                seen.add(b)
                expected += 1


def test_session_prefixes_extend(big_synthetic):
    """Consecutive requests of a session share a leading run of blocks (at least the system prompt)
    and that shared run never shrinks: later requests extend the session's prefix."""
    trace = big_synthetic
    lo = DEFAULT_SYNTHETIC.system_prompt_blocks[0]
    by_session = {}
    for i, s in enumerate(trace.session_ids.tolist()):
        by_session.setdefault(s, []).append(i)
    multi = 0
    for rows in by_session.values():
        shared = [common_prefix(trace.block_ids[a], trace.block_ids[b]) for a, b in zip(rows, rows[1:])]
        assert all(k >= lo for k in shared)
        assert shared == sorted(shared)
        multi += len(rows) > 1
    assert multi > 0.3 * len(by_session)


def test_system_prompts_are_shared_across_sessions(big_synthetic):
    trace = big_synthetic
    sessions_by_first_block = {}
    for ids, s in zip(trace.block_ids, trace.session_ids.tolist()):
        sessions_by_first_block.setdefault(ids[0], set()).add(s)
    n_sessions = len(set(trace.session_ids.tolist()))
    assert len(sessions_by_first_block) <= DEFAULT_SYNTHETIC.n_system_prompts
    assert max(len(v) for v in sessions_by_first_block.values()) > 0.1 * n_sessions


def test_generator_hits_its_documented_means(big_synthetic):
    trace, c = big_synthetic, DEFAULT_SYNTHETIC
    assert trace.output_tokens.mean() == pytest.approx(c.output_mean, rel=0.05)
    sessions = len(np.unique(trace.session_ids))
    assert sessions / 2000.0 == pytest.approx(4.0, rel=0.05)
    per_session = c.document_share * c.questions_mean + (1 - c.document_share) * c.turns_mean
    assert len(trace) / sessions == pytest.approx(per_session, rel=0.05)


def test_generator_means_follow_the_config():
    config = SyntheticConfig(output_mean=60.0, document_share=1.0, questions_mean=4.0)
    trace = synthetic_trace(seed=2, rate=6.0, duration_s=1000.0, config=config)
    sessions = len(np.unique(trace.session_ids))
    assert trace.output_tokens.mean() == pytest.approx(60.0, rel=0.05)
    assert sessions / 1000.0 == pytest.approx(6.0, rel=0.05)
    assert len(trace) / sessions == pytest.approx(4.0, rel=0.06)


def test_long_prompt_generator_has_its_documented_figures():
    # LONG_PROMPT_SYNTHETIC's comment: seed 0 at 4 sessions/s for 600 s, against the public trace's published
    # statistics (mean prompt 15,326 tokens, median 11,587, p99 66,456; output mean 149, median 69)
    trace = synthetic_trace(0, 4.0, duration_s=600.0, config=LONG_PROMPT_SYNTHETIC)
    x = trace.input_tokens
    assert len(trace) == 4928 and round(float(x.mean())) == 15359
    assert np.percentile(x, [50, 90, 99]).round().tolist() == [12273.0, 27912.0, 62490.0]
    assert float(np.median(trace.output_tokens)) == 70.0 and round(float(trace.output_tokens.mean())) == 151
    hits = ideal_prefix_hits(trace)[0]
    assert round(hits / int(x.sum()), 2) == 0.56


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^rate:"):
        synthetic_trace(0, rate=0.0)
    with pytest.raises(ValueError, match="^n_requests:"):
        synthetic_trace(0, n_requests=0)
    with pytest.raises(ValueError, match="^duration_s:"):
        synthetic_trace(0, duration_s=None)
    with pytest.raises(ValueError, match="^duration_s:"):
        synthetic_trace(0, duration_s=-5.0)


# --- i.i.d. resampling --------------------------------------------------------------------------
def test_resample_iid_draws_requests_with_poisson_arrivals():
    base = synthetic_trace(seed=4, rate=2.0, duration_s=300.0)
    rate, n = 3.5, 20_000
    iid = resample_iid(base, n, rate, seed=9)
    assert len(iid) == n
    gaps = np.diff(np.concatenate([[0.0], iid.arrival_s]))
    assert (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV 1
    originals = {(r.input_tokens, r.output_tokens, r.block_ids) for r in base}
    assert all((r.input_tokens, r.output_tokens, r.block_ids) in originals for r in iid)
    # drawn with replacement from the whole trace, not a prefix of it
    assert len({r.block_ids for r in iid}) > 0.9 * len(base)
    again = resample_iid(base, n, rate, seed=9)
    assert np.array_equal(again.arrival_s, iid.arrival_s) and again.block_ids == iid.block_ids
    assert not np.array_equal(resample_iid(base, n, rate, seed=10).arrival_s, iid.arrival_s)


def test_resample_iid_rejects_bad_arguments():
    base = Trace([0.0], [1], [1], [[0]])
    with pytest.raises(ValueError, match="^n_requests:"):
        resample_iid(base, 0, 1.0)
    with pytest.raises(ValueError, match="^rate:"):
        resample_iid(base, 10, 0.0)


def test_columns_are_made_once_and_a_taken_trace_keeps_its_base_through_pickling():
    import pickle

    base = synthetic_trace(0, 4.0)
    assert base.columns()[0] is base.columns()[0]  # made once, shared by the simulators
    assert base.columns()[1] == base.input_tokens.tolist() and base.columns()[3] is base.block_ids
    drawn = resample_iid(base, 50, 2.0, 7)
    source, idx = drawn.taken_from
    assert source is base and drawn.block_ids == [base.block_ids[i] for i in idx.tolist()]
    assert not idx.flags.writeable
    copy = pickle.loads(pickle.dumps(drawn))
    assert copy._columns is None and copy.columns()[0] == drawn.columns()[0]  # the lists are not pickled
    assert copy.block_ids == drawn.block_ids and copy.taken_from[1].tolist() == idx.tolist()
    assert resample_iid(base, 50, 2.0, 7, fresh_blocks=True).taken_from is None  # new ids: not the base's blocks
    # a trace pickled before taken_from existed (its slots' state) reads as one made directly
    old = Trace.__new__(Trace)
    old.__setstate__((None, {k: getattr(base, k) for k in ("arrival_s", "input_tokens", "output_tokens", "_blocks",
                                                             "_flat", "session_ids", "name", "renamed_blocks",
                                                             "prefix_ids")}))
    assert old.taken_from is None and old.block_ids == base.block_ids and old.columns()[2] == base.columns()[2]
