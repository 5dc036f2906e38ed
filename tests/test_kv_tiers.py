"""KV storage tiers as Mooncake Store has them (DRAM, an SSD tier below it, other nodes' over RDMA),
FAST'25 Figure 10's local-versus-global comparison, and randomized leaf eviction (RLT): exact
hand-made cases and the paper's conclusion on a small workload."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_gym.analysis.cache import compare_stores
from mooncake_gym.baselines import RandomRouting
from mooncake_gym.model.costmodel import NODE_TIER_BANDWIDTH, CostModel
from mooncake_gym.model.presets import SSD_TIER, ClusterPreset, RoutingConfig, get_preset
from mooncake_gym.model.workload import Trace, synthetic_trace
from mooncake_gym.sim import cluster, routing
from mooncake_gym.sim.policies import KVCentric
from mooncake_gym.sim.prefixcache import DRAM, REMOTE_DRAM, REMOTE_SSD, SSD, PrefixCache, match_tiers, pool_tiers
from mooncake_gym.sim.views import Route

KV = CostModel().model.kv_bytes_per_token  # 327,680 bytes of LLaMA2-70B KV per token
LAYERS = CostModel().model.n_layers
SSD_BW = 28e9


def overlapped(compute, load):
    """Demo 1's layer-wise overlap, written out: max + min / L."""
    return max(compute, load) + min(compute, load) / LAYERS


# --- the SSD tier: demotion, promotion, LRU eviction ---------------------------------------------------
def test_dram_evictions_are_demoted_to_the_ssd_tier_and_a_hit_there_is_promoted():
    ssd = PrefixCache(2)
    dram = PrefixCache(2, lower=ssd)
    dram.insert([1, 2])            # DRAM (LRU first): 2 1
    dram.insert([3, 4])            # 2 1 4 3 -> evicts 2, then 1, down to the SSD
    assert dram.blocks_lru_first() == [4, 3] and ssd.blocks_lru_first() == [2, 1]
    assert match_tiers(dram, [1, 2, 5]) == [SSD, SSD]
    dram.insert([1, 2])            # promoted: both leave the SSD; 4 3 2 1 -> 4, 3 demoted
    assert dram.blocks_lru_first() == [2, 1] and ssd.blocks_lru_first() == [4, 3]
    assert dram.evictions == 4 and ssd.evictions == 0


def test_the_ssd_tier_evicts_by_lru():
    ssd = PrefixCache(1)
    dram = PrefixCache(1, lower=ssd)
    dram.insert([1])
    dram.insert([2])   # 1 demoted
    dram.insert([3])   # 2 demoted, the SSD evicts 1
    assert ssd.blocks_lru_first() == [2] and ssd.evictions == 1
    assert match_tiers(dram, [1]) == [] and match_tiers(dram, [2]) == [SSD]


def test_the_global_store_sees_other_nodes_dram_then_ssd():
    a_ssd, b_ssd = PrefixCache(4), PrefixCache(4)
    a, b = PrefixCache(1, lower=a_ssd), PrefixCache(4, lower=b_ssd)
    a.insert([1])
    a.insert([2])  # a: DRAM 2, SSD 1
    b.insert([1, 3])
    pool = pool_tiers([a, b], [1, 2, 4])
    assert pool == [REMOTE_DRAM, REMOTE_DRAM]  # block 1 in b's DRAM (and a's SSD); 4 nowhere
    assert pool_tiers([a], [1, 2]) == [REMOTE_SSD, REMOTE_DRAM]
    assert match_tiers(a, [1, 2, 4], pool) == [SSD, DRAM]
    assert match_tiers(b, [1, 2, 4], pool) == [DRAM, REMOTE_DRAM]


def test_an_ssd_tier_needs_an_lru_cache_with_nothing_below():
    with pytest.raises(ValueError, match="lower"):
        PrefixCache(2, lower=PrefixCache(1, lower=PrefixCache(1)))
    with pytest.raises(ValueError, match="lower"):
        PrefixCache(2, eviction="fifo", lower=PrefixCache(1))
    with pytest.raises(ValueError, match="rng"):
        PrefixCache(2, eviction="rlt")


# --- RLT: randomized leaf eviction -------------------------------------------------------------------
def test_rlt_never_evicts_a_block_with_a_cached_extension():
    cache = PrefixCache(2, eviction="rlt", rng=np.random.default_rng(0))
    cache.insert([1, 2, 3])  # a chain: 3 is the only leaf, so it goes whatever the draw
    assert cache.blocks_lru_first() == [1, 2] and cache.leaves() == [2] and cache.evictions == 1
    cache.insert([1, 2, 4, 5])  # 4 and 5 added, then the leaves 5 and 4 evicted in turn
    assert cache.blocks_lru_first() == [1, 2] and cache.evictions == 3
    one = PrefixCache(1, eviction="rlt", rng=np.random.default_rng(0))
    one.insert([7, 8, 9])
    assert one.blocks_lru_first() == [7] and one.leaves() == [7]


def test_rlt_draws_a_uniform_leaf_from_the_generator():
    # after [1, 2, 3] and [1, 2, 4] the tree 1 - 2 - {3, 4} has two leaves, [3, 4] in the order they
    # became leaves; the cache of 3 blocks evicts leaves[rng.integers(2)]
    for seed in range(6):
        cache = PrefixCache(3, eviction="rlt", rng=np.random.default_rng(seed))
        cache.insert([1, 2, 3])
        cache.insert([1, 2, 4])
        gone = [3, 4][int(np.random.default_rng(seed).integers(2))]
        assert sorted(cache.blocks_lru_first()) == sorted({1, 2, 3, 4} - {gone})
        assert cache.leaves() == [({3, 4} - {gone}).pop()]


def test_rlt_demotes_its_evictions_to_the_ssd_tier():
    ssd = PrefixCache(5)
    cache = PrefixCache(1, eviction="rlt", lower=ssd, rng=np.random.default_rng(0))
    cache.insert([1, 2, 3])
    assert cache.blocks_lru_first() == [1] and ssd.blocks_lru_first() == [3, 2]
    assert match_tiers(cache, [1, 2, 3, 4]) == [DRAM, SSD, SSD]


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=25),
       capacity=st.integers(1, 6), seed=st.integers(0, 100))
def test_rlt_keeps_the_cached_blocks_a_prefix_tree_and_its_leaves_exact(requests, capacity, seed):
    """Any workload of prefix-hashed ids: every cached block's prefix is cached (nothing becomes
    unreachable), and the leaves are exactly the cached blocks no cached block extends."""
    cache = PrefixCache(capacity, eviction="rlt", rng=np.random.default_rng(seed))
    for path in requests:
        ids = [hash(tuple(path[:j + 1])) for j in range(len(path))]
        cache.insert(ids)
        cached = set(cache.blocks_lru_first())
        assert len(cached) <= capacity
        for b in cached:
            parent = cache._parent[b]
            assert parent is None or parent in cached
        extended = {cache._parent[b] for b in cached}
        assert set(cache.leaves()) == cached - extended


def _trace(*requests):
    """(arrival_s, input_tokens, block ids) tuples; output 10 tokens each."""
    return Trace([r[0] for r in requests], [r[1] for r in requests], [10] * len(requests), [tuple(r[2]) for r in requests])


class Pinned:
    """Routes the k-th request to ``targets[k]`` (no pull)."""

    name = "pinned"

    def __init__(self, *targets):
        self.targets = targets

    def __call__(self, view):
        return Route(self.targets[view.index], False)


# --- the load times: an SSD hit, a remote hit --------------------------------------------------------
def test_a_block_demoted_then_hit_from_ssd_costs_its_ssd_load_overlapped_with_the_compute():
    cost = CostModel()  # the lecture's model: pure compute at 60 % MFU
    config = RoutingConfig(n_instances=1, cache_blocks=1, ssd_cache_blocks=10, ssd_read_bandwidth=SSD_BW)
    trace = _trace((0.0, 1024, [1, 2]), (100.0, 512, [3]), (200.0, 1536, [1, 2, 9]))
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)  # DRAM: 1; 2 demoted to the SSD
    sim.step(0)  # DRAM: 3; 1 demoted
    view = sim.view
    assert view.hit_tokens == (1024,) and view.hit_tier_tokens == ((0, 1024, 0, 0),)
    load = 1024 * KV / SSD_BW
    expected = overlapped(cost.compute_s(1536, 1024), load)
    assert view.prefill_s[0] == pytest.approx(expected, rel=1e-15)
    sim.step(0)
    assert sim.last["ttft_s"] == view.prefill_s[0] and sim.last["hit_tokens"] == 1024
    res = sim.result()
    assert res.metrics["ssd_hit_tokens"] == 1024 and res.metrics["dram_hit_tokens"] == 0


def test_a_hit_in_dram_and_ssd_loads_each_part_at_its_tier_bandwidth():
    cost = CostModel()
    config = RoutingConfig(n_instances=1, cache_blocks=2, ssd_cache_blocks=10, ssd_read_bandwidth=SSD_BW)
    trace = _trace((0.0, 1536, [1, 2, 3]), (100.0, 2048, [1, 2, 3, 4]))
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)  # DRAM 2, 1; block 3 (the least recent) demoted
    view = sim.view
    assert view.hit_tier_tokens == ((1024, 512, 0, 0),)
    load = 1024 * KV / NODE_TIER_BANDWIDTH["dram"] + 512 * KV / SSD_BW
    assert view.prefill_s[0] == pytest.approx(overlapped(cost.compute_s(2048, 1536), load), rel=1e-15)


def test_a_remote_hit_in_the_global_store_costs_the_rdma_copy_before_the_prefill():
    cost = CostModel()
    trace = _trace((0.0, 1024, [1, 2]), (100.0, 1536, [1, 2, 9]))
    copy = 1024 * KV / NODE_TIER_BANDWIDTH["rdma"] + cost.transfer_latency_s
    prefill = overlapped(cost.compute_s(1536, 1024), 1024 * KV / NODE_TIER_BANDWIDTH["dram"])
    for store, hit, ttft in (("global", 1024, copy + prefill), ("local", 0, overlapped(cost.compute_s(1536, 0), 0))):
        config = RoutingConfig(n_instances=2, cache_blocks=10, kv_store=store)
        res = routing.simulate(trace, Pinned(0, 1), config, cost)
        assert res.hit_tokens[1] == hit
        assert res.ttft_s[1] == pytest.approx(ttft, rel=1e-15)
    config = RoutingConfig(n_instances=2, cache_blocks=10, kv_store="global")
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)
    v = sim.view
    assert v.hit_tier_tokens == ((1024, 0, 0, 0), (0, 0, 1024, 0))
    assert v.transfer_s == (0.0, 0.0) and v.best_instance == 0
    sim.step(1)
    assert sim.last["transfer_s"] == pytest.approx(copy, rel=1e-15) and sim.last["fetched_tokens"] == 1024
    assert sim.last["ttft_s"] == v.prefill_s[1]  # the view's estimate is the dispatch's time


def test_a_remote_hit_on_another_nodes_ssd_streams_at_the_slower_of_ssd_and_nic():
    cost = CostModel()
    config = RoutingConfig(n_instances=2, cache_blocks=1, ssd_cache_blocks=4, ssd_read_bandwidth=SSD_BW,
                           kv_store="global")
    trace = _trace((0.0, 1024, [1, 2]), (100.0, 1024, [1, 2]))
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)  # node 0: DRAM 1, SSD 2
    v = sim.view
    assert v.hit_tier_tokens[1] == (0, 0, 512, 511)  # at least one token is computed: 1023 hit
    sim.step(1)
    ssd_rate = min(SSD_BW, NODE_TIER_BANDWIDTH["rdma"])
    expected = 512 * KV / NODE_TIER_BANDWIDTH["rdma"] + 511 * KV * (NODE_TIER_BANDWIDTH["rdma"] / ssd_rate) / \
        NODE_TIER_BANDWIDTH["rdma"] + cost.transfer_latency_s
    assert sim.last["transfer_s"] == pytest.approx(expected, rel=1e-12)


def test_a_pull_from_a_holder_reads_its_tiers():
    """The local store: kvcentric's pull copies the holder's blocks from its DRAM and SSD."""
    cost = CostModel()
    config = RoutingConfig(n_instances=2, cache_blocks=1, ssd_cache_blocks=4, ssd_read_bandwidth=SSD_BW)
    trace = _trace((0.0, 1536, [1, 2, 3]), (100.0, 2048, [1, 2, 3, 4]))
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)  # node 0: DRAM 1; SSD 3 2
    v = sim.view
    assert v.hit_tier_tokens == ((512, 1024, 0, 0), (0, 0, 0, 0))
    rdma = NODE_TIER_BANDWIDTH["rdma"]
    copy = 512 * KV / rdma + 1024 * KV * (rdma / SSD_BW) / rdma + cost.transfer_latency_s
    assert v.transfer_s[1] == pytest.approx(copy, rel=1e-12)
    after = overlapped(cost.compute_s(2048, 1536), 1536 * KV / NODE_TIER_BANDWIDTH["dram"])
    assert v.pull_prefill_s[1] == pytest.approx(after, rel=1e-15)


# --- the paper's conclusion on a small workload --------------------------------------------------------
def _small():
    return synthetic_trace(0, rate=2.0, duration_s=60.0)


def test_global_store_hits_at_least_as_much_as_local_and_lowers_ttft_under_the_same_routing():
    """Random routing draws the same instances in both runs (its draws do not read the state), so
    every node holds the same blocks in both and each request's global hit contains its local one."""
    trace = _small()
    cost = get_preset("mooncake").prefill_cost
    res = {}
    for store in ("local", "global"):
        config = RoutingConfig(n_instances=4, cache_blocks=200, kv_store=store)
        res[store] = routing.simulate(trace, RandomRouting(), config, cost, seed=3)
    assert (res["local"].instance == res["global"].instance).all()
    assert (res["global"].hit_tokens >= res["local"].hit_tokens).all()
    assert res["global"].metrics["hit_ratio"] > res["local"].metrics["hit_ratio"]
    assert res["global"].metrics["mean_ttft_s"] < res["local"].metrics["mean_ttft_s"]


def test_compare_stores_shows_figure_10s_conclusion_for_the_cache_aware_router():
    rows = compare_stores(_small(), "mooncake", n_prefill=4, routers=["cache"], ssd=[False, True])
    by = {(r["ssd"], r["store"]): r for r in rows}
    for ssd in (False, True):
        local, glob = by[ssd, "local"], by[ssd, "global"]
        assert glob["hit_ratio"] >= local["hit_ratio"]
        assert glob["mean_ttft_s"] < local["mean_ttft_s"]
        assert local["remote_share"] == 0.0 and glob["remote_share"] > 0.0
        assert glob["dram_share"] + glob["ssd_share"] + glob["remote_share"] == pytest.approx(glob["hit_ratio"])


# --- options on the presets and the engines --------------------------------------------------------
def test_the_store_is_an_option_of_the_preset_off_by_default():
    for name in ("lecture", "mooncake", "mooncake-overload", "h100"):
        p = get_preset(name)
        assert (p.ssd_cache_blocks, p.kv_store, p.eviction) == (0, "local", "lru")
        assert not p.routing_config().tiered
    p = get_preset("mooncake").with_(kv_store="global", eviction="rlt", **SSD_TIER)
    c = p.routing_config()
    assert (c.ssd_cache_blocks, c.ssd_read_bandwidth, c.kv_store, c.eviction) == (91_552, 28e9, "global", "rlt")
    for bad, match in ((dict(ssd_cache_blocks=-1), "ssd_cache_blocks"), (dict(kv_store="pooled"), "kv_store"),
                       (dict(eviction="lfu"), "eviction"), (dict(ssd_read_bandwidth=0), "ssd_read_bandwidth")):
        with pytest.raises(ValueError, match=match):
            ClusterPreset("x", "x", **bad)
        with pytest.raises(ValueError, match=match):
            RoutingConfig(**bad)


@pytest.mark.parametrize("changes, why", [(dict(eviction="rlt"), "rlt"), (dict(ssd_cache_blocks=8), "SSD"),
                                          (dict(kv_store="global"), "global")])
def test_the_native_engine_refuses_tiers_and_rlt_by_name_and_the_default_runs_the_reference(changes, why):
    trace = _small()
    config = RoutingConfig(n_instances=3, cache_blocks=50, **changes)
    with pytest.raises(ValueError, match=why):
        routing.simulate(trace, KVCentric(), config, engine="native")
    a = routing.simulate(trace, KVCentric(), config)
    b = routing.simulate(trace, KVCentric(), config, engine="python")
    assert a.metrics == b.metrics


def test_rlt_runs_give_the_same_numbers_for_the_same_seed():
    trace = _small()
    config = RoutingConfig(n_instances=3, cache_blocks=30, eviction="rlt")
    a, b = (routing.simulate(trace, KVCentric(), config, seed=5) for _ in range(2))
    assert (a.ttft_s == b.ttft_s).all() and a.metrics == b.metrics
    lru = routing.simulate(trace, KVCentric(), RoutingConfig(n_instances=3, cache_blocks=30), seed=5)
    assert a.metrics["hit_tokens"] != lru.metrics["hit_tokens"]


def test_the_cluster_runs_the_global_store_through_the_shared_nics():
    trace = _small()
    base = get_preset("mooncake").with_(n_prefill=3, cache_blocks=100)
    out = {}
    for store in ("local", "global"):
        sim = cluster.ClusterSimulator(trace, base.with_(kv_store=store, **SSD_TIER), router=RandomRouting(), seed=1)
        while sim.view is not None:
            sim.step(True)
        out[store] = (sim.result().metrics, sim.network.transfers)
    assert out["global"][0]["hit_ratio"] > out["local"][0]["hit_ratio"]
    assert out["global"][0]["fetched_tokens"] > 0 and out["local"][0]["fetched_tokens"] == 0
    assert out["global"][1] > out["local"][1]  # the remote reads on the NICs, beside the KV copies to decode


def test_the_cache_analysis_runs_rlt_on_request_between_nothing_and_the_optimal():
    from mooncake_gym.analysis.cache import analyze_cache
    trace = _small()
    a, b = (analyze_cache(trace, blocks=[20, 60], policies="lru,rlt,optimal") for _ in range(2))
    assert a.hit_rates("rlt") == b.hit_rates("rlt")  # its draws are seeded
    for rlt, best in zip(a.hit_rates("rlt"), a.hit_rates("optimal")):
        assert 0 < rlt <= best
    assert analyze_cache(trace, blocks=[20]).policies == ("lru", "fifo", "optimal")  # not in the default set


def test_cache_stores_prints_the_comparison_and_refuses_capacities(tmp_path, capsys):
    import json

    from mooncake_gym.cli import main
    path = tmp_path / "t.jsonl"
    assert main(["trace", "generate", "--rate", "1", "--seed", "2", "--duration", "40", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["cache", str(path), "--stores", "--prefill-nodes", "3", "--routers", "random", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["ssd"], r["store"]) for r in rows] == [(False, "local"), (False, "global"), (True, "local"),
                                                      (True, "global")]
    assert rows[1]["hit_ratio"] >= rows[0]["hit_ratio"]
    assert main(["cache", str(path), "--stores", "--blocks", "100"]) == 2
    assert "--blocks: has no effect with --stores" in capsys.readouterr().err


def test_kvcentric_counts_the_ssd_load_and_prefers_the_node_holding_the_prefix_in_dram():
    cost = CostModel()
    config = RoutingConfig(n_instances=2, cache_blocks=(1, 4), ssd_cache_blocks=4, ssd_read_bandwidth=SSD_BW)
    trace = _trace((0.0, 1024, [1, 2]), (50.0, 1024, [1, 2]), (100.0, 1536, [1, 2, 3]))
    sim = routing.RoutingSimulator(trace, config, cost)
    sim.step(0)  # node 0: DRAM 1, SSD 2
    sim.step(1)  # node 1: DRAM 2 1
    v = sim.view
    assert v.hit_tier_tokens == ((512, 512, 0, 0), (1024, 0, 0, 0)) and v.queue_s == (0.0, 0.0)
    compute = cost.compute_s(1536, 1024)
    dram = NODE_TIER_BANDWIDTH["dram"]
    assert v.prefill_s[0] == pytest.approx(overlapped(compute, 512 * KV / dram + 512 * KV / SSD_BW), rel=1e-15)
    assert v.prefill_s[1] == pytest.approx(overlapped(compute, 1024 * KV / dram), rel=1e-15)
    assert v.prefill_s[0] > v.prefill_s[1]
    assert KVCentric()(v) == Route(1, False)
