"""Production-router baselines (mooncake_gym/baselines/production.py): each published rule on hand-built cases,
the worked examples of the routers' own docs, and deterministic runs through the simulator."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from mooncake_gym.baselines import ROUTING_POLICIES, make_policy
from mooncake_gym.baselines.production import (PRODUCTION_ROUTING_POLICIES, ActiveBlocks, AIBrixPrefixCache,
                                               ConsistentHashBoundedLoad, DynamoKV, LlmD, LlmDPrecise, LMetric,
                                               PowerOfTwoChoices, PrebleE2, SGLangCacheAware, VLLMKVAware,
                                               VLLMPrefix)
from mooncake_gym.sim.routing import RoutingConfig, RoutingSimulator, RoutingView, simulate
from mooncake_gym.model.workload import Trace, synthetic_trace

B = 512


def view(n: int = 3, input_tokens: int = 10 * B, blocks: int | None = None, now: float = 0.0, **fields) -> RoutingView:
    """A hand-built view of ``n`` idle, empty instances; ``fields`` override per-instance tuples.
    ``hit_blocks`` given alone sets ``hit_tokens`` (and the reverse)."""
    blocks = math.ceil(input_tokens / B) if blocks is None else blocks
    zeros = (0,) * n
    v = dict(now=now, index=0, input_tokens=input_tokens, output_tokens=10, block_ids=tuple(range(1, blocks + 1)),
             n_instances=n, queue_s=(0.0,) * n, prefill_s=(0.0,) * n, transfer_s=(0.0,) * n,
             pull_prefill_s=(0.0,) * n, queued_requests=zeros, queued_tokens=zeros, hit_tokens=zeros,
             hit_blocks=zeros, cache_blocks=(3000,) * n)
    for key, value in fields.items():
        v[key] = tuple(value) if isinstance(value, (list, tuple)) else value
    if "hit_blocks" in fields and "hit_tokens" not in fields:
        v["hit_tokens"] = tuple(min(k * B, input_tokens - 1) for k in v["hit_blocks"])
    if "hit_tokens" in fields and "hit_blocks" not in fields:
        v["hit_blocks"] = tuple(h // B for h in v["hit_tokens"])
    v["best_hit_tokens"] = max(v["hit_tokens"])
    v["best_instance"] = v["hit_tokens"].index(v["best_hit_tokens"]) if v["best_hit_tokens"] else -1
    return RoutingView(**v)


def seeded(policy, seed: int = 0):
    policy.reset(np.random.default_rng(seed))
    return policy


def choices(policy, v: RoutingView, seeds=range(40)) -> set[int]:
    return {seeded(policy, s)(v).instance for s in seeds}


# -- NVIDIA Dynamo -------------------------------------------------------------------------------
#: Dynamo's docs: a 10-block request; workers with 2/5/8 cached blocks (so 8/5/2 to prefill) and
#: 10/5/9 decode blocks; with overlap_score_weight 1 worker 2 is selected.
DOCS_DECODE = (10, 5, 9)


def dynamo_docs_example(**kw) -> RoutingView:
    return view(input_tokens=10 * B, hit_blocks=(2, 5, 8), **kw)


def test_dynamo_replays_the_three_worker_example_of_its_docs():
    p = seeded(DynamoKV())
    costs = p.costs(dynamo_docs_example(), DOCS_DECODE)
    assert costs == [18.0, 10.0, 11.0] and p.choose(costs) == 1


def test_dynamo_overlap_weight_active_prefill_and_request_weight():
    # weight 2: 2*8+10 = 26, 2*5+5 = 15, 2*2+9 = 13 -> worker 3
    p = seeded(DynamoKV(overlap_weight=2.0))
    assert p.choose(p.costs(dynamo_docs_example(), DOCS_DECODE)) == 2
    # 6 blocks of active prefill on worker 2: 18, 16, 11 -> worker 3
    assert DynamoKV().costs(dynamo_docs_example(queued_tokens=(0, 6 * B, 0)), DOCS_DECODE) == [18.0, 16.0, 11.0]
    # credit 0 ignores the cache (10 prefill blocks everywhere); active requests weigh in when asked
    v = dynamo_docs_example(queued_requests=(0, 3, 0))
    assert DynamoKV(credit=0.0).costs(v, DOCS_DECODE) == [20.0, 15.0, 19.0]
    assert DynamoKV(active_request_weight=1.0).costs(v, DOCS_DECODE) == [18.0, 13.0, 11.0]


def test_dynamo_temperature_samples_the_softmax_of_normalised_costs():
    costs = [18.0, 10.0, 11.0]  # p ~ exp(-(c - 10) / (8 T))
    p = seeded(DynamoKV(temperature=1.0), 7)
    counts = np.bincount([p.choose(costs) for _ in range(20000)], minlength=3) / 20000
    expected = np.exp(-(np.array(costs) - 10.0) / 8.0)
    assert np.allclose(counts, expected / expected.sum(), atol=0.01)
    # equal costs: uniform; ties at temperature 0: random among the tied
    assert choices(DynamoKV(temperature=0.5), view()) == {0, 1, 2}
    assert choices(DynamoKV(), view(hit_blocks=(4, 4, 0))) == {0, 1}


def test_active_blocks_count_shared_blocks_once_until_the_requests_finish():
    active = ActiveBlocks(2)
    active.add(view(n=2, input_tokens=4 * B, now=0.0, queue_s=(0.0, 0.0), prefill_s=(1.0, 1.0)), 0)
    active.add(view(n=2, input_tokens=4 * B, now=0.5, blocks=4, block_ids=(1, 2, 7, 8), queue_s=(0.5, 0.0),
                    prefill_s=(1.0, 1.0)), 0)  # finishes at 0.5 + 0.5 + 1 = 2
    assert active.blocks() == [6, 0]  # 1, 2, 3, 4, 7, 8
    assert active.new_blocks((1, 2, 3, 9)) == [1, 4]
    active.expire(1.0)  # the first request finished at 1.0
    assert active.blocks() == [4, 0] and active.new_blocks((1, 2, 3, 9)) == [2, 4]
    active.expire(2.0)
    assert active.blocks() == [0, 0]


def test_dynamo_decode_blocks_come_from_its_own_dispatches():
    # a 4-block request goes to an idle instance; a different 4-block prompt at t=0.1 costs 4
    # prefill blocks everywhere plus 4 decode blocks on the idle instance and 4 + 4 on the one
    # still holding the first request's blocks -> the idle one
    p = seeded(DynamoKV())
    first = p(view(n=2, input_tokens=4 * B, prefill_s=(1.0, 1.0))).instance
    busy = [0.9 if i == first else 0.0 for i in range(2)]
    other = p(view(n=2, input_tokens=4 * B, now=0.1, blocks=4, block_ids=(11, 12, 13, 14), queue_s=busy,
                   prefill_s=(1.0, 1.0))).instance
    assert other != first


# -- llm-d ---------------------------------------------------------------------------------------
def test_llmd_weighted_scorers_and_the_precise_profile():
    # 8 blocks; instance 0 holds 5 of them but has 2 waiting requests, instance 1 none and nothing
    # cached; equal KV use. default 3/2/2: 3*5/8 = 1.875 + 0 < 0 + 2 -> instance 1;
    # precise 2/1/1: 2*5/8 = 1.25 > 1 -> instance 0.
    v = view(n=2, input_tokens=8 * B, hit_blocks=(5, 0), queued_requests=(3, 1))
    kv = (0.1, 0.1)
    assert LlmD().scores(v, kv) == pytest.approx([3 * 5 / 8 + 2 * 0.9, 2 + 2 * 0.9])
    assert seeded(LlmD())._argmax(LlmD().scores(v, kv)) == 1
    assert seeded(LlmD())._argmax(LlmDPrecise().scores(v, kv)) == 0
    # through __call__ (no active blocks yet: KV use 0 everywhere)
    assert seeded(LlmD())(v).instance == 1 and seeded(LlmDPrecise())(v).instance == 0


def test_llmd_queue_and_kv_scores():
    # all queues equal: queue score 1 everywhere; KV use 0.1 / 0 / 0.5
    v = view(hit_blocks=(0, 0, 0), queued_requests=(1, 1, 1))
    assert LlmD().scores(v, (0.1, 0.0, 0.5)) == pytest.approx([2 + 2 * 0.9, 2 + 2 * 1.0, 2 + 2 * 0.5])
    # waiting = in flight - 1: (3, 2, 1) in flight -> (2, 1, 0) waiting -> scores 0, 0.5, 1
    v = view(queued_requests=(3, 2, 1))
    assert LlmD(prefix_weight=0, kv_weight=0).scores(v, (0, 0, 0)) == pytest.approx([0.0, 1.0, 2.0])
    # KV use from its own dispatches: 1,500 distinct active blocks of a 3,000-block cache = 0.5
    p = seeded(LlmD(prefix_weight=0, queue_weight=0))
    first = p(view(n=2, input_tokens=1500 * B, prefill_s=(5.0, 5.0))).instance
    assert p(view(n=2, input_tokens=B, now=1.0, blocks=1, block_ids=(99999,))).instance != first


# -- SGLang --------------------------------------------------------------------------------------
def test_sglang_balance_thresholds_then_match_rate():
    full_hit = dict(input_tokens=10 * B, hit_blocks=(10, 0, 5))
    # imbalanced: 70 - 2 = 68 > 64 and 70 > 1.5 * 2: the least loaded, whatever the cache
    assert seeded(SGLangCacheAware())(view(queued_requests=(70, 2, 5), **full_hit)).instance == 1
    # a gap of exactly 64 is not imbalanced: the best match (rate ~1 > 0.3) wins
    assert seeded(SGLangCacheAware())(view(queued_requests=(66, 2, 5), **full_hit)).instance == 0
    # 70 vs 50: gap 20 <= 64, balanced -> best match
    assert seeded(SGLangCacheAware())(view(queued_requests=(70, 50, 60), **full_hit)).instance == 0
    # best match rate 2/10 = 0.2 <= 0.3: the least loaded
    v = view(input_tokens=10 * B, hit_blocks=(2, 0, 1), queued_requests=(3, 1, 2))
    assert seeded(SGLangCacheAware())(v).instance == 1
    assert seeded(SGLangCacheAware(cache_threshold=0.1))(v).instance == 0


# -- vLLM production-stack -----------------------------------------------------------------------
def test_vllm_prefix_router_takes_the_longest_match_ignoring_load():
    v = view(hit_blocks=(3, 7, 7), queued_requests=(0, 50, 9))
    assert choices(VLLMPrefix(), v) == {1, 2}  # random among the longest
    assert choices(VLLMPrefix(), view()) == {0, 1, 2}  # no match anywhere: any endpoint
    # with a minimum match length the router falls back to the lowest QPS of its 60-s window
    p = seeded(VLLMPrefix(min_match_tokens=4 * B))
    sent = [p(view(now=float(t), hit_blocks=(3, 0, 0))).instance for t in range(3)]
    assert sorted(sent) == [0, 1, 2]  # each request went to an endpoint that had received none


def test_vllm_kvaware_threshold_and_qps_fallback():
    # ISL 5,000, threshold 2,000: a holder of >= 3,000 tokens gets it
    assert seeded(VLLMKVAware())(view(input_tokens=5000, hit_tokens=(0, 3072, 0))).instance == 1
    p = seeded(VLLMKVAware())
    # 2,560 < 3,000: lowest QPS; instance 0 got requests at t=0 and t=1, so later ones avoid it
    p(view(input_tokens=5000, now=0.0, hit_tokens=(3072, 0, 0)))
    p(view(input_tokens=5000, now=1.0, hit_tokens=(3072, 0, 0)))
    got = [p(view(input_tokens=5000, now=2.0 + t, hit_tokens=(2560, 0, 0))).instance for t in range(2)]
    assert sorted(got) == [1, 2]
    # 60 s later the requests of t=0 and t=1 have left the window: instance 0 has sent none
    assert p(view(input_tokens=5000, now=61.5, hit_tokens=(2560, 0, 0))).instance == 0


# -- AIBrix --------------------------------------------------------------------------------------
def test_aibrix_load_gate_match_order_and_std_filter():
    # running (6, 2, 1, 0): mean 2.25, sample std 2.63, limit 4.88. Matches 50 %, 50 %, 25 %, 0 %:
    # sorted (50 %, R=2), (50 %, R=6), (25 %, R=1) -> instance 1
    v = view(n=4, input_tokens=8 * B, hit_blocks=(4, 4, 2, 0), queued_requests=(6, 2, 1, 0))
    assert seeded(AIBrixPrefixCache())(v).instance == 1
    # the best match (75 %) runs 6 > 4.88: skipped for the next match
    v = view(n=4, input_tokens=8 * B, hit_blocks=(6, 2, 0, 0), queued_requests=(6, 2, 1, 0))
    assert seeded(AIBrixPrefixCache())(v).instance == 1
    # no match at all: the pod with the fewest running requests
    assert seeded(AIBrixPrefixCache())(view(n=4, queued_requests=(6, 2, 1, 0))).instance == 3
    # load gate: 20 > 2 * (mean 7.67 + 1) and 20 - 1 >= 8: only the least loaded pod (0) may be
    # matched; it holds nothing, so the least-request fallback (also 0) takes it, not the holder
    v = view(hit_blocks=(0, 8, 8), queued_requests=(1, 2, 20))
    assert seeded(AIBrixPrefixCache())(v).instance == 0
    assert seeded(AIBrixPrefixCache(imbalance_min_gap=20))(v).instance == 1


# -- Preble --------------------------------------------------------------------------------------
def test_preble_exploits_long_prefixes_explores_otherwise_and_rebalances():
    p = seeded(PrebleE2())
    # explore: no history, cost = prefill time there
    assert p(view(now=0.0, prefill_s=(0.5, 0.3, 0.4))).instance == 1  # load 1: 0.3
    # exploit: 6 of 10 blocks cached on 0 (more than the rest) -> 0, although its prefill is slower
    assert p(view(now=1.0, hit_blocks=(6, 0, 0), prefill_s=(0.9, 0.2, 0.2))).instance == 0  # load 0: 0.9
    # no longer exploited once the holder's windowed load (0.9) exceeds 1.5 x the least (0)
    assert p(view(now=2.0, hit_blocks=(6, 0, 0), prefill_s=(0.1, 0.2, 0.3))).instance == 2
    # 4 of 10 blocks: not more than the rest -> explore: loads (0.9, 0.3, 0.3) + prefill -> instance 2
    assert p(view(now=3.0, hit_blocks=(4, 0, 0), prefill_s=(0.1, 0.4, 0.25))).instance == 2
    # the window forgets: after 180 s all loads are 0 again and the prefill alone decides
    assert p(view(now=400.0, prefill_s=(0.3, 0.5, 0.4))).instance == 0


# -- LMetric, power of two choices, consistent hashing --------------------------------------------
def test_lmetric_product_of_uncached_tokens_and_batch():
    # (pending + new uncached tokens) * (pending requests + 1):
    # (1000 + 4000) * 2 = 10,000; (0 + 4000) * 4 = 16,000; (4000 + 4000 - 3072) * 1 = 4,928
    v = view(input_tokens=4000, queued_tokens=(1000, 0, 4000), queued_requests=(1, 3, 0), hit_tokens=(0, 0, 3072))
    assert seeded(LMetric())(v).instance == 2


def test_power_of_two_choices():
    v = view(n=4, queued_requests=(5, 0, 3, 9))
    assert choices(PowerOfTwoChoices(choices=4), v) == {1}  # all sampled: the least loaded
    got = choices(PowerOfTwoChoices(), v, seeds=range(200))
    assert got == {0, 1, 2}  # never 3: it loses to whichever instance it is paired with


def test_consistent_hashing_is_sticky_and_bounded():
    p = seeded(ConsistentHashBoundedLoad())
    home = p(view(n=4)).instance
    assert p(view(n=4, input_tokens=3 * B)).instance == home  # same first block, same instance
    assert {p(view(n=4, blocks=3, **{"block_ids": (b, 2, 3)})).instance for b in range(100, 140)} == {0, 1, 2, 3}
    # bounded: total load 2, capacity ceil(1.25 * 3 / 4) = 1; home is full -> the next instance
    load = [0, 0, 0, 0]
    load[home] = 2
    assert p(view(n=4, queued_requests=load)).instance != home


# -- all of them -----------------------------------------------------------------------------------
def test_registered_and_knobs_span_the_published_defaults():
    for name, cls in PRODUCTION_ROUTING_POLICIES.items():
        assert ROUTING_POLICIES[name] is cls and cls.name == name
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
        for knob, grid in getattr(cls, "KNOBS", {}).items():
            assert min(grid) <= defaults[knob] <= max(grid), (name, knob)
            for value in grid:
                assert getattr(cls(**{knob: value}), knob) == value


@pytest.mark.parametrize("cls, kwargs, param", [
    (DynamoKV, {"temperature": -1}, "temperature"),
    (DynamoKV, {"credit": 1.5}, "credit"),
    (LlmD, {"queue_weight": -1}, "queue_weight"),
    (SGLangCacheAware, {"cache_threshold": 2}, "cache_threshold"),
    (AIBrixPrefixCache, {"std_factor": -0.5}, "std_factor"),
    (PrebleE2, {"window_s": 0}, "window_s"),
    (PowerOfTwoChoices, {"choices": 0}, "choices"),
    (ConsistentHashBoundedLoad, {"balance": 0.5}, "balance"),
])
def test_bad_knobs_name_the_parameter(cls, kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}: expected"):
        cls(**kwargs)


TRACE = synthetic_trace(seed=3, rate=8.0).head(400)


@pytest.mark.parametrize("name", list(PRODUCTION_ROUTING_POLICIES))
def test_runs_deterministically_through_the_simulator(name):
    a = simulate(TRACE, make_policy("routing", name), seed=5)
    b = simulate(TRACE, make_policy("routing", name), seed=5)
    assert a.metrics["requests"] == len(TRACE)
    assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.instance, b.instance)
    assert a.metrics["fetched_tokens"] == 0  # none of them pulls


def test_view_load_fields_follow_the_instances():
    # two requests on one instance: the second arrives while the first (4 blocks, 2 cached) runs
    trace = Trace([0.0, 0.0, 100.0], [4 * B, 4 * B, 3 * B], [1, 1, 1], [(1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9)])
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2, cache_blocks=50))
    v = sim.view
    assert v.queued_tokens == (0, 0) and v.cache_blocks == (50, 50)
    v = sim.step(0)
    assert v.hit_blocks == (2, 0) and v.hit_tokens == (2 * B, 0)
    assert v.queued_requests == (1, 0) and v.queued_tokens == (4 * B, 0)
    v = sim.step(0)
    assert v.queued_requests == (0, 0) and v.queued_tokens == (0, 0)  # t=100: done
