"""The prefill-routing simulator and its four baselines: exact small cases and the lecture's/paper's conclusions."""

import numpy as np
import pytest

from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.routing import CacheAware, KVCentric, LoadBalancing, RandomRouting
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.baselines import run_baselines
from mooncake_gym.sim.routing import Route, RoutingConfig, RoutingSimulator, simulate
from mooncake_gym.model.workload import Request, Trace, synthetic_trace

COST = CostModel()


def trace_of(*reqs):
    """Requests as (arrival_s, input_tokens, block_ids)."""
    return Trace.from_requests([Request(t, n, 10, tuple(ids)) for t, n, ids in reqs], name="tiny")


def fixed(*routes):
    """A policy that plays the given routes in order."""
    it = iter(routes)
    return lambda view: next(it)


def test_cache_keeps_blocks_across_requests():
    tr = trace_of((0.0, 1536, [1, 2, 3]), (100.0, 1536, [1, 2, 4]))
    r = simulate(tr, fixed(0, 0), RoutingConfig(n_instances=2))
    assert r.hit_tokens.tolist() == [0, 1024]
    assert r.ttft_s.tolist() == [COST.prefill_s(1536, 0), COST.prefill_s(1536, 1024)]
    assert r.metrics["hit_ratio"] == 1024 / 3072
    assert r.metrics["computed_tokens"] == 3072 - 1024


def test_fifo_queue_adds_waiting_time():
    tr = trace_of((0.0, 4096, [1] + list(range(10, 17))), (0.1, 2048, [2, 3, 4, 5]))
    r = simulate(tr, fixed(0, 0), RoutingConfig(n_instances=2))
    p1, p2 = COST.prefill_s(4096, 0), COST.prefill_s(2048, 0)
    assert r.queue_s.tolist() == [0.0, pytest.approx(p1 - 0.1, abs=1e-12)]
    assert r.ttft_s[1] == pytest.approx(p1 - 0.1 + p2, abs=1e-12)


def test_partial_last_block_and_at_least_one_token_computed():
    # the whole prompt is cached: the hit is capped at input - 1 tokens
    tr = trace_of((0.0, 700, [1, 2]), (50.0, 700, [1, 2]))
    r = simulate(tr, fixed(0, 0), RoutingConfig(n_instances=1))
    assert r.hit_tokens.tolist() == [0, 699]
    assert r.ttft_s[1] == COST.prefill_s(700, 699)


def test_pull_adds_transfer_time_and_replicates():
    tr = trace_of((0.0, 1536, [1, 2, 3]), (100.0, 1536, [1, 2, 5]), (200.0, 1536, [1, 2, 6]))
    sim = RoutingSimulator(tr, RoutingConfig(n_instances=2))
    v = sim.view
    assert v.best_hit_tokens == 0 and v.best_instance == -1
    v = sim.step(0)
    assert v.hit_tokens == (1024, 0) and v.best_hit_tokens == 1024 and v.best_instance == 0
    assert v.transfer_s == (0.0, COST.transfer_s(1024))
    assert COST.transfer_s(1024) == 1024 * 327680 / 100e9 + 1e-3
    v = sim.step(Route(1, pull=True))
    assert sim.last["ttft_s"] == COST.transfer_s(1024) + COST.prefill_s(1536, 1024)
    assert sim.last["fetched_tokens"] == 1024 and sim.last["hit_tokens"] == 1024
    # the pulled prefix now lives on instance 1 too: a later request hits it there without a pull
    assert v.hit_tokens == (1024, 1024)
    sim.step(1)
    assert sim.last["transfer_s"] == 0.0 and sim.last["hit_tokens"] == 1024
    m = sim.result().metrics
    assert m["fetched_tokens"] == 1024 and m["fetched_bytes"] == 1024 * 327680


def test_pull_without_a_longer_prefix_is_a_noop():
    tr = trace_of((0.0, 1024, [1, 2]))
    r = simulate(tr, fixed(Route(0, True)), RoutingConfig(n_instances=2))
    assert r.transfer_s.tolist() == [0.0] and r.fetched_tokens.tolist() == [0]


def test_lru_eviction_order():
    # capacity 3: [1,2] -> LRU order 2,1 ; [3] -> 2,1,3 ; [1] touches 1 -> 2,3,1 ; [4] evicts 2 -> 3,1,4
    tr = trace_of((0, 1024, [1, 2]), (10, 512, [3]), (20, 512, [1]), (30, 512, [4]), (40, 1024, [1, 2]))
    sim = RoutingSimulator(tr, RoutingConfig(n_instances=1, cache_blocks=3))
    for _ in range(4):
        sim.step(0)
    assert sim.instances[0].cache.blocks_lru_first() == [3, 1, 4]
    assert sim.view.hit_tokens == (512,)


def test_baselines_on_a_tiny_workload():
    # instance 0 holds a 4-block prefix and is busy; the others are idle
    doc = [1, 2, 3, 4]
    tr = trace_of((0.0, 2560, doc + [5]), (0.01, 2560, doc + [6]))
    config = RoutingConfig(n_instances=3)
    first = Route(0)

    def play(policy):
        sim = RoutingSimulator(tr, config)
        sim.step(first)
        return sim.view, policy(sim.view)

    view, route = play(LoadBalancing())
    assert route.instance in (1, 2) and not route.pull  # least queued work (tie between the idle ones)
    queue0 = COST.prefill_s(2560, 0) - 0.01
    assert view.queue_s[0] == pytest.approx(queue0)
    with_hit = queue0 + COST.prefill_s(2560, 2048)
    without = COST.prefill_s(2560, 0)
    view, route = play(CacheAware())
    assert (with_hit < without) == (route.instance == 0)
    view, route = play(KVCentric())
    pulled = COST.transfer_s(2048) + COST.prefill_s(2560, 2048)
    assert route.pull and route.instance in (1, 2)
    assert view.ttft_s(route.instance, pull=True) == pytest.approx(pulled)
    assert pulled < min(with_hit, without)


def test_kvcentric_threshold_controls_the_transfer_branch():
    doc = list(range(1, 9))
    tr = trace_of((0.0, 8 * 512, doc), (0.0, 8 * 512 + 10, doc[:6] + [20, 21, 22]), (0.01, 9 * 512, doc + [30]))
    config = RoutingConfig(n_instances=2)
    sim = RoutingSimulator(tr, config)
    sim.step(0)
    sim.step(1)  # instance 1 holds 6 blocks of the document, instance 0 all 8
    v = sim.view
    assert v.hit_tokens == (4096, 3072)
    # ratio 4096/3072 = 1.33: threshold 1.2 pulls to 1 if cheaper, threshold 2 never pulls
    assert not KVCentric(threshold=2.0)(v).pull
    r = KVCentric(threshold=1.2)(v)
    expected = [v.queue_s[0] + v.prefill_s[0], v.queue_s[1] + v.transfer_s[1] + v.pull_prefill_s[1]]
    assert r.instance == int(np.argmin(expected)) and r.pull == (r.instance == 1)


def test_random_policy_is_seeded():
    tr = synthetic_trace(3, 2.0, duration_s=60)
    a = simulate(tr, RandomRouting(), seed=5).instance
    b = simulate(tr, RandomRouting(), seed=5).instance
    c = simulate(tr, RandomRouting(), seed=6).instance
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_bad_actions_and_config_give_clear_errors():
    sim = RoutingSimulator(trace_of((0.0, 512, [1])), RoutingConfig(n_instances=2))
    with pytest.raises(ValueError, match=r"instance must be in 0\.\.1"):
        sim.step(2)
    with pytest.raises(TypeError, match="integer"):
        sim.step(1.5)
    with pytest.raises(ValueError, match="n_instances"):
        RoutingConfig(n_instances=0)
    with pytest.raises(ValueError, match="cache_blocks"):
        RoutingConfig(cache_blocks=-1)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        RoutingConfig(ttft_slo_s=0)
    with pytest.raises(ValueError, match="threshold"):
        KVCentric(threshold=0.5)
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("routing", "nope")


@pytest.fixture(scope="module")
def demo2_rate8():
    trace = synthetic_trace(0, 8.0)
    return trace, {n: r for n, r in run_baselines("routing", trace, seed=0).items()}


def test_conservation(demo2_rate8):
    trace, results = demo2_rate8
    for name, r in results.items():
        assert len(r.ttft_s) == len(trace), name
        assert r.metrics["request_share"] and sum(r.metrics["request_share"]) == pytest.approx(1.0)
        assert np.all(r.ttft_s >= r.prefill_s + r.transfer_s - 1e-12), name
        assert np.all(r.hit_tokens < r.input_tokens), name
        assert r.metrics["computed_tokens"] + r.metrics["hit_tokens"] == int(trace.input_tokens.sum())


def test_demo2_conclusions_at_rate_8(demo2_rate8):
    _, results = demo2_rate8
    m = {n: r.metrics for n, r in results.items()}
    for name in ("random", "load"):
        assert 0.20 <= m[name]["hit_ratio"] <= 0.35, name
        assert m[name]["mean_ttft_s"] >= 5 * m["cache"]["mean_ttft_s"], name
        assert m[name]["fetched_tokens"] == 0
    assert m["cache"]["hit_ratio"] >= 1.7 * m["random"]["hit_ratio"]
    assert m["cache"]["computed_tokens"] <= 0.7 * m["random"]["computed_tokens"]
    assert m["kvcentric"]["mean_ttft_s"] <= m["cache"]["mean_ttft_s"] < m["load"]["mean_ttft_s"]
    assert m["cache"]["mean_ttft_s"] < m["random"]["mean_ttft_s"]
    assert m["cache"]["fetched_tokens"] == 0 and m["kvcentric"]["fetched_tokens"] > 0


def test_shared_trace_figure8_ordering(shared_trace):
    m = {n: r.metrics for n, r in run_baselines("routing", shared_trace.scaled(2.0), seed=0).items()}
    for name, metrics in m.items():
        assert metrics["hit_ratio"] <= 0.651, name
    for name in ("cache", "kvcentric"):
        assert m[name]["hit_ratio"] >= 2 * m["random"]["hit_ratio"], name
    ttft = {n: metrics["mean_ttft_s"] for n, metrics in m.items()}
    assert ttft["kvcentric"] <= ttft["cache"] < ttft["load"] < ttft["random"]


def test_a_trace_of_the_wrong_type_is_a_clear_error():
    with pytest.raises(ValueError, match="trace: expected a mooncake_gym.model.workload.Trace, got tuple"):
        RoutingSimulator((synthetic_trace(0, 1.0, duration_s=10), 1.0))
