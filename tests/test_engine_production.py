"""The production routers of ``baselines/production.py`` on the native engine (production.hpp)
against their Python reference: the same decisions, generator draws, per-request records and
metrics, bit for bit, on hand-made traces with choices worked out by hand, on the shared trace and
on hypothesis-generated traces, pools and knobs (docs/engine.md)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mooncake_gym import _engine
from mooncake_gym._engine import routing as bridge
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.production import PRODUCTION_ROUTING_POLICIES, LMetric
from mooncake_gym.model.presets import PRESETS, RoutingConfig
from mooncake_gym.sim import routing

from test_engine_routing import assert_same, pools, trace_of, traces

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

PRODUCTION = tuple(PRODUCTION_ROUTING_POLICIES)


def run(trace, name, engine, config=None, cost=None, seed=0, qps_window_s=None, **knobs):
    """One run of ``name`` with ``knobs`` on ``engine``: the result and the policy's generator after
    (``qps_window_s``: vLLM's request-stats window, a class attribute there)."""
    policy = make_policy("routing", name, **knobs)
    if qps_window_s is not None:
        policy.window_s = qps_window_s
    result = routing.simulate(trace, policy, config, cost, seed=seed, engine=engine)
    return result, policy.rng.bit_generator.state


def assert_both_same(trace, name, config=None, cost=None, seed=0, **knobs):
    a, ga = run(trace, name, "python", config, cost, seed, **knobs)
    b, gb = run(trace, name, "native", config, cost, seed, **knobs)
    assert_same(a, b)
    assert ga == gb
    return a


def test_every_production_router_is_native_by_its_exact_class():
    assert set(bridge.PRODUCTION_KNOBS) == set(PRODUCTION)
    for name, cls in PRODUCTION_ROUTING_POLICIES.items():
        assert bridge.native_policy(cls()) == name
        for knob in bridge.PRODUCTION_KNOBS[name]:  # every knob the engine reads is the policy's
            assert isinstance(getattr(cls(), knob), (int, float))

    class Tweaked(LMetric):  # a subclass may change the rule: it stays in Python
        pass

    trace = trace_of([(0.0, 600, [1, 2]), (0.1, 600, [1, 2])])
    assert bridge.native_policy(Tweaked()) is None
    with pytest.raises(ValueError, match="Tweaked is not native"):
        routing.simulate(trace, Tweaked(), engine="native")
    assert routing.simulate(trace, Tweaked(), engine=None).instance.tolist() == \
        routing.simulate(trace, LMetric(), engine="python").instance.tolist()


# --- hand-made traces, choices worked out by hand -----------------------------------------------------
LECTURE = PRESETS["lecture"]


def test_lmetric_by_hand():
    # two idle instances tie at (0 + 1000 - 0) * 1: the first request goes where rng.integers(2) says;
    # the second (same prefix, 999 tokens cached there) scores (1000 + 1000 - 999) * 2 = 2002 there
    # against 1000 on the other instance, and goes to the other
    trace = trace_of([(0.0, 1000, [1, 2]), (0.001, 1000, [1, 2])])
    config = RoutingConfig(n_instances=2, cache_blocks=8)
    for seed in range(4):
        first = int(np.random.default_rng(seed).integers(2))
        r = assert_both_same(trace, "lmetric", config, LECTURE.prefill_cost, seed=seed)
        assert r.instance.tolist() == [first, 1 - first]


def test_sglang_by_hand():
    # request 0 ties (random); request 1 shares its two blocks: a hit of 1023 of 1024 tokens > 0.3 on
    # the holder, which takes it although busier; request 2 (new prefix) has no match: the least
    # loaded instance (the other one); with balance_abs_threshold 0 and 2 queued against 0 the load is
    # imbalanced, and request 3 (the shared prefix again) goes to the least loaded instance, not the holder
    config = RoutingConfig(n_instances=2, cache_blocks=8)
    rows = [(0.0, 1024, [1, 2]), (0.001, 1024, [1, 2]), (0.002, 600, [5, 6])]
    first = int(np.random.default_rng(0).integers(2))
    r = assert_both_same(trace_of(rows), "sglang", config, LECTURE.prefill_cost, seed=0)
    assert r.instance.tolist() == [first, first, 1 - first]
    imbalanced = trace_of(rows[:2] + [(0.002, 1024, [1, 2])])
    r = assert_both_same(imbalanced, "sglang", config, LECTURE.prefill_cost, seed=0, balance_abs_threshold=1,
                         balance_rel_threshold=1.0)
    assert r.instance.tolist() == [first, first, 1 - first]


def test_vllm_kvaware_by_hand():
    # request 1 matches 1023 tokens of 1024 >= 1024 - 2000: the holder; request 2 matches nothing: the
    # lowest QPS in the window (the other instance, with 0 requests sent); with a window of 1 ms the
    # first two requests have left it by request 3 (t = 1 s), both instances tie at 0 and it is drawn
    rows = [(0.0, 1024, [1, 2]), (0.0005, 1024, [1, 2]), (0.0008, 600, [5, 6]), (1.0, 600, [7])]
    config = RoutingConfig(n_instances=2, cache_blocks=8)
    g = np.random.default_rng(1)
    first = int(g.integers(2))  # request 0: no match anywhere, both at QPS 0
    last = int(g.integers(2))  # request 3: both at QPS 0 again
    r = assert_both_same(trace_of(rows), "vllm_kvaware", config, LECTURE.prefill_cost, seed=1, qps_window_s=0.001)
    assert r.instance.tolist() == [first, first, 1 - first, last]


def test_chbl_is_deterministic_and_bounded():
    # no draws: the generator is untouched; with balance 1 and 3 instances no instance holds more than
    # ceil((L + 1) / 3) of the busy requests at any arrival
    rows = [(0.001 * k, 2000, [k % 4 + 1]) for k in range(12)]
    config = RoutingConfig(n_instances=3, cache_blocks=8)
    r, g = run(trace_of(rows), "chbl", "native", config, LECTURE.prefill_cost, seed=0, balance=1.0)
    assert g == np.random.default_rng(0).bit_generator.state
    assert sorted(np.bincount(r.instance.astype(int), minlength=3).tolist()) == [4, 4, 4]
    assert_both_same(trace_of(rows), "chbl", config, LECTURE.prefill_cost, seed=0, balance=1.0)


def test_a_policy_with_running_state_is_refused_until_reset():
    trace = trace_of([(0.0, 600, [1, 2]), (0.1, 600, [1, 2])])
    policy = make_policy("routing", "dynamo")
    sim = routing.RoutingSimulator(trace)
    policy(sim.view)  # a decision made outside a run: the policy now holds active blocks
    assert "running state" in bridge.unsupported(sim, policy)
    policy.reset(np.random.default_rng(0))
    assert bridge.unsupported(sim, policy) is None
    assert "knob" in bridge.production_unsupported(make_policy("routing", "p2c", choices=2**60 + 1))


# --- the shared trace x2 (golden-style) --------------------------------------------------------------
@pytest.mark.parametrize("preset", ["lecture", "mooncake"])
def test_shared_trace_x2_same_numbers(shared_trace, preset):
    trace = shared_trace.scaled(2).head(3000)
    p = PRESETS[preset]
    for name in PRODUCTION:
        assert_both_same(trace, name, p.routing_config(), p.prefill_cost, seed=5)
    assert_both_same(trace, "dynamo", p.routing_config(), p.prefill_cost, seed=5, temperature=0.5)


# --- generated traces, pools and knobs -----------------------------------------------------------------
KNOBS = {
    "dynamo": {"overlap_weight": st.sampled_from([0.0, 0.25, 1.0, 2.0]) | st.floats(0, 4),
               "temperature": st.sampled_from([0.0, 0.0, 0.1, 1.0]) | st.floats(0, 2),
               "credit": st.floats(0, 1), "active_request_weight": st.sampled_from([0.0, 1.0]) | st.floats(0, 2)},
    "llmd": {k: st.sampled_from([0.0, 1.0, 2.0, 3.0]) | st.floats(0, 5) for k in ("prefix_weight", "queue_weight", "kv_weight")},
    "llmd_precise": {k: st.sampled_from([0.0, 1.0, 2.0]) | st.floats(0, 5) for k in ("prefix_weight", "queue_weight", "kv_weight")},
    "sglang": {"cache_threshold": st.sampled_from([0.0, 0.3, 1.0]) | st.floats(0, 1),
               "balance_abs_threshold": st.integers(0, 6), "balance_rel_threshold": st.floats(1, 3)},
    "vllm_prefix": {"min_match_tokens": st.sampled_from([0, 512, 2048]) | st.integers(0, 6000),
                    "window_s": st.sampled_from([60.0, 0.01, 1.0]) | st.floats(0.001, 100)},
    "vllm_kvaware": {"kv_aware_threshold": st.sampled_from([0, 2000]) | st.integers(0, 40000),
                     "window_s": st.sampled_from([60.0, 0.01, 1.0]) | st.floats(0.001, 100)},
    "aibrix": {"imbalance_factor": st.sampled_from([0.5, 2.0]) | st.floats(0.1, 4), "imbalance_min_gap": st.integers(0, 8),
               "std_factor": st.sampled_from([0.0, 1.0]) | st.floats(0, 2)},
    "preble": {"window_s": st.sampled_from([180.0, 0.05, 1.0]) | st.floats(0.001, 50),
               "rebalance_ratio": st.sampled_from([1.0, 1.5]) | st.floats(1, 4)},
    "lmetric": {},
    "p2c": {"choices": st.integers(1, 6)},
    "chbl": {"balance": st.sampled_from([1.0, 1.25]) | st.floats(1, 3), "prefix_blocks": st.integers(1, 5),
             "virtual_nodes": st.integers(1, 40)},
}


@st.composite
def routers(draw):
    name = draw(st.sampled_from(PRODUCTION))
    return name, {k: draw(s) for k, s in KNOBS[name].items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), pool=pools(), router=routers(), seed=st.integers(0, 2**32))
def test_generated_runs_same_numbers(trace, pool, router, seed):
    config, cost = pool
    name, knobs = router
    window_s = knobs.pop("window_s", None) if name.startswith("vllm") else None  # a class attribute there
    a, ga = run(trace, name, "python", config, cost, seed, qps_window_s=window_s, **knobs)
    b, gb = run(trace, name, "native", config, cost, seed, qps_window_s=window_s, **knobs)
    assert_same(a, b)
    assert ga == gb


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), d=st.integers(1, 40), seed=st.integers(0, 2**32), draws=st.integers(0, 3))
def test_numpys_permutation_and_choice_are_ported(n, d, seed, draws):
    # through the routers that draw them: aibrix shuffles the matched instances (permutation), p2c
    # samples without replacement (choice); here the ports' draws against numpy's directly
    d = min(d, n)
    g, h = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(draws):  # a half-used 32-bit buffer carried in
        g.integers(7), h.integers(7)
    r = _engine.native.Pcg64(bridge.rng_state(h))
    assert r.permutation(n) == g.permutation(n).tolist()
    assert r.choice(n, d) == g.choice(n, size=d, replace=False).tolist()
    bridge.set_rng_state(h, r.state())
    assert h.bit_generator.state == g.bit_generator.state


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), pool=pools(), name=st.sampled_from(["dynamo", "llmd"]), seed=st.integers(0, 2**32))
def test_active_blocks_in_hash_maps_same_numbers(trace, pool, name, seed):
    # a trace with more (block, instance) cells than the flat counts hold keeps them in hash maps
    config, cost = pool
    spec_of = bridge.policy_spec

    def hashed(policy):
        spec = spec_of(policy)
        spec.active_flat_limit = 0
        return spec

    a, ga = run(trace, name, "python", config, cost, seed)
    try:
        bridge.policy_spec = hashed
        b, gb = run(trace, name, "native", config, cost, seed)
    finally:
        bridge.policy_spec = spec_of
    assert_same(a, b)
    assert ga == gb


@pytest.mark.parametrize("name", ["sglang", "aibrix", "p2c", "dynamo", "vllm_prefix"])
def test_rollout_over_a_production_router_same_on_both_engines(name):
    # a stateless router's trials run in the engine (its generator as at the decision), a router
    # holding running state (dynamo's active blocks, vLLM's window) continues it in Python
    from mooncake_gym.evaluation.episodes import RolloutPolicy, evaluate

    kw = dict(episode_requests=40, n_instances=4, rate=12)
    env = "mooncake_gym/PrefillRouting-v0"
    runs = [evaluate(env, RolloutPolicy(make_policy("routing", name), 3), [1, 2], engine=e, **kw)
            for e in ("python", "native")]
    assert runs[0] == runs[1]
