"""Cache analysis: hit rate versus capacity under LRU, FIFO and Belady-optimal eviction.

Hand-made traces with exact expected hits, properties on random prefix-tree traces, the figures of
``shared/spec/mooncake.md`` on the shared Mooncake trace, and every figure of the external oracle
``kvcache-simulator`` (the Mooncake team's hit-rate tool) on a generated trace and the shared trace.
"""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_gym import cli
from mooncake_gym.analysis.cache import (
    POLICIES,
    PrefixTree,
    analyze_cache,
    blocks_to_gib,
    cache_ceiling,
    gib_to_blocks,
    parse_blocks,
    simulate_cache,
)
from mooncake_gym.model.costmodel import get_model
from mooncake_gym.sim.prefixcache import PrefixCache
from mooncake_gym.model.workload import Trace, read_trace, synthetic_trace, write_trace

from conftest import SHARED_TRACE
ORACLE_MODEL = "llama-3.1-70b"  # the oracle's id for 80 layers x 8 KV heads x 128 x BF16 = 320 KiB/token


def make_trace(requests, name="hand-made"):
    """``requests`` = [(block_ids, input_tokens)]; arrivals 0, 1, 2, ... s."""
    return Trace(list(range(len(requests))), [n for _, n in requests], [1] * len(requests),
                 [ids for ids, _ in requests], name=name)


def hits(trace, capacity, window="all"):
    """Measured hit tokens of every policy at ``capacity``, and of the infinite cache."""
    out = {p: simulate_cache(trace, capacity, p, window).hit_tokens for p in POLICIES}
    out["ceiling"] = cache_ceiling(trace, window).hit_tokens
    return out


@pytest.fixture(scope="module")
def shared_analysis(shared_trace):
    return analyze_cache(shared_trace, blocks=[1000, 3000, 10000, 30000], window="second-half")


# --- hand-made traces, exact hits ------------------------------------------------------------------
def test_last_to_first_touching_keeps_the_live_prefix():
    # capacity 3. [1,2,3], then [4], then [1,2,3] again.
    # LRU touching last to first: after request 0 the order (old -> new) is 3 2 1, so [4] evicts 3
    # and request 2 hits 1, 2. Touching first to last (order 1 2 3) would make [4] evict 1, the
    # live prefix, leaving 2 and 3 cached but unreachable: request 2 would hit nothing.
    # FIFO inserts 1 2 3 and evicts 1 for [4]: no hit. Optimal bypasses 4 (never used again).
    trace = make_trace([([1, 2, 3], 1536), ([4], 512), ([1, 2, 3], 1536)])
    assert hits(trace, 3) == {"lru": 1024, "fifo": 0, "optimal": 1536, "ceiling": 1536}
    # the same cache fed first-to-last (reversing the ids reverses the touch order) loses the prefix
    naive = PrefixCache(3)
    for ids in trace.block_ids:
        hit = naive.match(ids)
        naive.insert(list(reversed(ids)))
    assert hit == 0


@pytest.mark.parametrize("requests, capacity, expected", [
    # Belady bypass: [3] is never needed again, the cached leaves are, so 3 is not inserted.
    # LRU and FIFO evict 1 for 3, then 2 for 1: nothing hits.
    ([([1], 512), ([2], 512), ([3], 512), ([1], 512), ([2], 512)], 2,
     {"lru": 0, "fifo": 0, "optimal": 1024, "ceiling": 1024}),
    # Belady eviction: 2 is never needed again, so it goes for 3; LRU and FIFO evict 1 instead.
    ([([1], 512), ([2], 512), ([3], 512), ([3], 512), ([1], 512)], 2,
     {"lru": 512, "fifo": 512, "optimal": 1024, "ceiling": 1024}),
    # LRU renews a hit, FIFO does not: [1] hit at request 2 keeps 1 in LRU, FIFO evicts it for 3.
    ([([1], 512), ([2], 512), ([1], 512), ([3], 512), ([1], 512)], 2,
     {"lru": 1024, "fifo": 512, "optimal": 1024, "ceiling": 1024}),
    # Prefixes outlive their extensions: [1,2], [1,3] (hit 1), then [4] evicts 2 under LRU (1 was
    # renewed), and [1,3] hits both blocks. FIFO evicts 1, the oldest, stranding 3. Optimal bypasses 4.
    ([([1, 2], 1024), ([1, 3], 1024), ([4], 512), ([1, 3], 1024)], 3,
     {"lru": 512 + 1024, "fifo": 512, "optimal": 512 + 1024, "ceiling": 512 + 1024}),
])
def test_exact_hits_per_policy(requests, capacity, expected):
    assert hits(make_trace(requests), capacity) == expected


def test_fifo_readds_a_block_the_request_itself_pushed_out():
    # capacity 2, FIFO. After [26,27,47,48] the cache holds 47 48. Request [26,27,47] finds 47
    # cached, but adding 26 then 27 pushes 47 and 48 out, so 47 is added again (evicting 26): the
    # cache ends as 27 47, and [26,49] misses. (kvcache-simulator's order; adding all missing
    # blocks first and evicting afterwards would keep 26 27 and hit 26.)
    trace = make_trace([([26, 27, 47, 48], 2048), ([26, 27, 47], 1536), ([26, 49], 1024)])
    assert simulate_cache(trace, 2, "fifo").hit_tokens == 0
    cache = PrefixCache(2, eviction="fifo")
    for ids in trace.block_ids[:2]:
        cache.insert(ids)
    assert cache.blocks_lru_first() == [27, 47]


def test_partial_last_block_and_the_second_half_window():
    # tokens: a hit of k blocks counts min(k * 512, input_length); the empty request is not a request
    # (kvcache-simulator skips it), so the four others split 2 + 2.
    trace = make_trace([([], 0), ([1, 2], 700), ([3], 100), ([1, 2], 700), ([1, 2, 4], 1100)])
    r = simulate_cache(trace, 10, "lru", "second-half")
    assert (r.hit_tokens, r.total_tokens) == (700 + 1024, 1800)
    assert r.full_before_window is False  # 10 blocks never fill
    assert simulate_cache(trace, 3, "lru", "second-half").full_before_window is True
    r = simulate_cache(trace, 10, "lru", "all")
    assert (r.hit_tokens, r.total_tokens, r.full_before_window) == (1724, 2600, None)
    c = cache_ceiling(trace, "second-half")
    assert (c.hit_tokens, c.total_tokens) == (1724, 1800)


def test_blocks_are_prefix_tree_nodes_not_bare_ids():
    # Mooncake's ids are prefix hashes, so an id never follows two different prefixes. When a trace
    # breaks that, the same id after another prefix is another block (as in kvcache-simulator):
    # [2] is not a hit after [1, 2].
    trace = make_trace([([1, 2], 1024), ([2], 512), ([1, 2], 1024)])
    assert hits(trace, 10)["ceiling"] == 1024
    assert PrefixTree(trace).n_blocks == 3


def test_lru_corner_where_a_request_exceeds_the_capacity():
    # One request longer than the cache: our LRU keeps its first `capacity` blocks. (The oracle keeps
    # one fewer; see test_oracle_lru_corner_differs_as_documented.)
    trace = make_trace([([1, 2, 3], 1536)] * 3)
    assert simulate_cache(trace, 2, "lru").hit_tokens == 2 * 1024


# --- properties on random prefix-tree traces -------------------------------------------------------
@st.composite
def prefix_traces(draw):
    """Requests that walk a random prefix tree (shared prefixes are common), with partial last blocks."""
    n = draw(st.integers(2, 24))
    children: dict[int, list[int]] = {}
    next_id = 1
    reqs = []
    for _ in range(n):
        length = draw(st.integers(1, 6))
        ids, node = [], 0
        for _ in range(length):
            kids = children.setdefault(node, [])
            if kids and draw(st.booleans()):
                node = kids[draw(st.integers(0, len(kids) - 1))]
            else:
                node, next_id = next_id, next_id + 1
                kids.append(node)
            ids.append(node)
        reqs.append((ids, (length - 1) * 512 + draw(st.integers(1, 512))))
    return reqs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_traces(), st.sampled_from(["all", "second-half"]))
def test_optimal_bounds_lru_and_fifo_and_everything_is_below_the_ceiling(reqs, window):
    trace = make_trace(reqs)
    tree = PrefixTree(trace)
    ceiling = cache_ceiling(trace, window, tree=tree).hit_tokens
    previous = {"lru": 0, "optimal": 0}
    for capacity in range(1, 12):
        r = {p: simulate_cache(trace, capacity, p, window, tree=tree).hit_tokens for p in POLICIES}
        assert r["optimal"] >= r["lru"] and r["optimal"] >= r["fifo"]
        assert max(r.values()) <= ceiling
        # LRU and optimal never lose hits with more room. FIFO can (Belady's anomaly), so it is not
        # checked here; on the shared trace it rises too (test_shared_trace_orderings).
        assert r["lru"] >= previous["lru"] and r["optimal"] >= previous["optimal"]
        previous = r
    assert simulate_cache(trace, tree.n_blocks, "lru", window, tree=tree).hit_tokens == ceiling


# --- capacities, parsing, errors ---------------------------------------------------------------------
def test_gib_and_blocks_convert_with_the_model_kv_size():
    assert gib_to_blocks(468.75, "llama2-70b") == 3000  # mooncake.md: 3,000 blocks = 468.75 GiB
    assert blocks_to_gib(3000, "llama3-70b") == 468.75
    assert gib_to_blocks(468.74, "llama2-70b") == 2999  # whole blocks only, rounded down
    assert gib_to_blocks(1, "llama3-8b") == 2**30 // (512 * get_model("llama3-8b").kv_bytes_per_token)


def test_parse_blocks_sorts_and_deduplicates():
    assert parse_blocks("30000, 1000,3000,1000") == [1000, 3000, 30000]


@pytest.mark.parametrize("kwargs, names", [
    ({"blocks": "abc"}, "blocks"),
    ({"blocks": "1000,-5"}, "blocks"),
    ({"blocks": "0"}, "blocks"),
    ({"gib": "x"}, "gib"),
    ({"gib": "0.01"}, "gib"),  # less than one block of LLaMA-70B (0.156 GiB)
    ({"blocks": "10", "gib": "1"}, "gib"),
    ({"policies": "lru,clock"}, "policies"),
    ({"window": "first-half"}, "window"),
    ({"model": "gpt-5"}, "model"),
])
def test_bad_input_names_the_parameter(kwargs, names):
    with pytest.raises(ValueError, match=names):
        analyze_cache(make_trace([([1], 512)]), **kwargs)


def test_a_trace_whose_ids_do_not_match_its_lengths_is_rejected():
    with pytest.raises(ValueError, match=r"request 1 has 1 block ids but input_length 1024 needs"):
        analyze_cache(make_trace([([1], 512), ([2], 1024)]))


def test_prefixcache_eviction_option():
    with pytest.raises(ValueError, match="eviction"):
        PrefixCache(3, eviction="clock")
    fifo = PrefixCache(3, eviction="fifo")
    fifo.insert([1, 2])
    fifo.insert([1, 3])  # 1 is not renewed
    assert fifo.blocks_lru_first() == [1, 2, 3]
    fifo.insert([4])
    assert fifo.blocks_lru_first() == [2, 3, 4] and fifo.evictions == 1
    assert PrefixCache(3).eviction == "lru"


# --- the command line ------------------------------------------------------------------------------
def test_cli_table_json_and_plot(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(synthetic_trace(1, 4.0, duration_s=None, n_requests=200), path)
    png = tmp_path / "hit.png"
    assert cli.main(["cache", str(path), "--blocks", "100,1000", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "infinite" in out and "optimal" in out and "1,000" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert cli.main(["cache", str(path), "--gib", "156.25", "--policies", "lru,optimal",
                     "--window", "second-half", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # one JSON document and nothing else
    assert doc["window"] == "second-half" and doc["policies"] == ["lru", "optimal"]
    assert doc["warmup_requests"] == 100 and doc["points"][0]["capacity_blocks"] == 1000
    point = doc["points"][0]
    assert set(point) == {"capacity_blocks", "capacity_gib", "lru", "optimal"}
    assert point["optimal"]["hit_rate"] >= point["lru"]["hit_rate"]
    assert doc["ceiling"]["hit_rate"] >= point["optimal"]["hit_rate"]


def test_cli_synthetic_source_and_bad_blocks(capsys):
    assert cli.main(["cache", "synthetic", "--rate", "1", "--seed", "3", "--blocks", "500", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["points"][0]["capacity_blocks"] == 500
    assert cli.main(["cache", "synthetic", "--blocks", "abc"]) == 2
    err = capsys.readouterr().err
    assert "blocks" in err and "'abc'" in err and "positive integers" in err


# --- the shared Mooncake trace: the figures of mooncake.md ------------------------------------------
def test_shared_trace_lru_and_optimal_match_the_spec(shared_analysis):
    a = shared_analysis
    assert a.requests == 3993 and a.warmup_requests == 1996 and a.distinct_blocks == 43_924
    lru = dict(zip(a.capacities, a.hit_rates("lru")))
    opt = dict(zip(a.capacities, a.hit_rates("optimal")))
    assert [round(lru[c], 4) for c in (3000, 10000, 30000)] == [0.2883, 0.6036, 0.8378]
    assert round(a.ceiling.hit_rate, 4) == 0.8627
    for c, expected in ((3000, 0.5838), (10000, 0.8259), (30000, 0.8627)):
        assert abs(opt[c] - expected) < 0.005


def test_shared_trace_orderings(shared_analysis):
    a = shared_analysis
    for pt in a.points:
        r = {p: pt.results[p].hit_rate for p in POLICIES}
        assert r["optimal"] >= r["lru"] and r["optimal"] >= r["fifo"]
        assert max(r.values()) <= a.ceiling.hit_rate
        assert all(res.full_before_window for res in pt.results.values())
    for p in POLICIES:
        rates = a.hit_rates(p)
        assert all(x < y for x, y in zip(rates, rates[1:])), p


# --- the external oracle: kvcache-simulator --------------------------------------------------------
def run_oracle(trace_path, blocks, policies=POLICIES):
    """kvcache-simulator's JSON result (Python backend) at the GiB budgets that hold ``blocks``."""
    pytest.importorskip("kvcache_sim", reason="kvcache-simulator (the oracle) is not installed")
    gib_per_block = blocks_to_gib(1, "llama3-70b")  # 0.15625, exact in binary
    budgets = ",".join(repr(b * gib_per_block) for b in blocks)
    cmd = [sys.executable, "-m", "kvcache_sim", "run", "--trace", str(trace_path), "--model", ORACLE_MODEL,
           "--block-size", "512", "--budgets-gib", budgets, "--policies", ",".join(policies),
           "--backend", "python", "--no-progress", "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def assert_matches_oracle(ours, oracle, lru_from=1):
    """Every figure the oracle reports equals ours (LRU only at capacities >= ``lru_from``)."""
    assert oracle["metadata"]["bytesPerBlock"] == 512 * ours.kv_bytes_per_token
    assert oracle["metadata"]["requestCount"] == ours.requests
    assert oracle["metadata"]["warmupRequests"] == ours.warmup_requests
    assert oracle["metadata"]["uniqueBlocks"] == ours.distinct_blocks
    assert oracle["ceiling"]["hitTokens"] == ours.ceiling.hit_tokens
    assert oracle["ceiling"]["totalTokens"] == ours.ceiling.total_tokens
    reported = {pt["cacheBlocks"]: pt for pt in oracle["points"]}
    omitted = False
    for pt in ours.points:
        if omitted or pt.capacity_blocks not in reported:
            # The oracle omits the first capacity at which some policy's cache did not fill during the
            # warm-up half (or that exceeds the distinct blocks), and every larger one.
            assert pt.capacity_blocks not in reported
            if not omitted:
                assert (pt.capacity_blocks > ours.distinct_blocks
                        or any(r.full_before_window is False for r in pt.results.values()))
            omitted = True
            continue
        for policy, res in pt.results.items():
            if policy == "lru" and pt.capacity_blocks < lru_from:
                continue
            theirs = reported[pt.capacity_blocks]["results"][policy]
            assert theirs["measurementMode"] == "fixed_window" and res.full_before_window is True
            assert (res.hit_tokens, res.total_tokens) == (theirs["hitTokens"], theirs["totalTokens"]), (
                policy, pt.capacity_blocks)
            assert res.hit_rate == theirs["hitRate"]
    return len(reported)


@pytest.fixture(scope="module")
def oracle_api():
    """kvcache-simulator's Python API: (run_sweep, parse_trace_lines)."""
    pytest.importorskip("kvcache_sim", reason="kvcache-simulator (the oracle) is not installed")
    from kvcache_sim.simulator import run_sweep
    from kvcache_sim.trace import parse_trace_lines

    return run_sweep, parse_trace_lines


def run_oracle_api(oracle_api, reqs, blocks, policies=POLICIES):
    run_sweep, parse_trace_lines = oracle_api
    lines = [json.dumps({"hash_ids": list(ids), "input_length": n}) for ids, n in reqs]
    gib_per_block = blocks_to_gib(1, "llama3-70b")
    return run_sweep(parse_trace_lines(lines, block_size=512), model_id=ORACLE_MODEL,
                     budgets_gib=[b * gib_per_block for b in blocks], policies=list(policies), backend="python")


def test_oracle_agrees_on_a_generated_trace(tmp_path):
    trace = synthetic_trace(1, 4.0, duration_s=None, n_requests=400)
    path = tmp_path / "generated.jsonl"
    write_trace(trace, path)
    blocks = [200, 400, 800, 1600, 3200]
    # capacities above the longest request (116 blocks), where our LRU and the oracle's are defined alike
    assert max(len(ids) for ids in trace.block_ids) < min(blocks)
    ours = analyze_cache(read_trace(path), blocks=blocks, window="second-half")
    # 3,200 blocks did not fill during the warm-up half: the oracle omits it
    assert assert_matches_oracle(ours, run_oracle(path, blocks)) == 4
    assert ours.points[-1].results["lru"].full_before_window is False


def test_oracle_agrees_on_the_shared_trace(shared_analysis):
    oracle = run_oracle(SHARED_TRACE, shared_analysis.capacities)
    assert assert_matches_oracle(shared_analysis, oracle) == len(shared_analysis.points) == 4


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_traces())
def test_oracle_agrees_on_random_traces(oracle_api, reqs):
    # every capacity from 1 block: FIFO and optimal always agree; LRU wherever the capacity exceeds
    # the longest request (see test_oracle_lru_corner_differs_as_documented)
    blocks = list(range(1, 13))
    longest = max(len(ids) for ids, _ in reqs)
    ours = analyze_cache(make_trace(reqs), blocks=blocks, window="second-half")
    assert_matches_oracle(ours, run_oracle_api(oracle_api, reqs, blocks), lru_from=longest + 1)


def test_oracle_lru_corner_differs_as_documented(oracle_api):
    # Capacity 1, requests of two blocks: the oracle's trie LRU inserts block 1, then evicts it (the
    # only evictable leaf) to make room for block 2, finds 2's parent gone and stops, so nothing stays
    # cached. Our LRU keeps block 1. If the oracle changes this, update the module docstring.
    reqs = [([1, 2], 1024)] * 4 + [([3], 512)]
    oracle = run_oracle_api(oracle_api, reqs, [1], ["lru"])
    assert oracle["points"][0]["results"]["lru"]["hitTokens"] == 0
    assert simulate_cache(make_trace(reqs), 1, "lru", "second-half").hit_tokens == 2 * 512
    assert oracle["ceiling"]["hitTokens"] == cache_ceiling(make_trace(reqs), "second-half").hit_tokens
