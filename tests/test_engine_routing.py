"""The native engine against the Python reference on the prefill pool's routing simulator
(docs/engine.md): the same decisions, generator draws, views, caches, per-request records and
metrics, bit for bit, on hand-made traces with values worked out from the cost model, on the
shared trace, and on hypothesis-generated traces, presets, pools and action sequences."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mooncake_gym
from mooncake_gym import _engine
from mooncake_gym._engine import routing as bridge
from mooncake_gym._engine.stepper import NativeRoutingSimulator
from mooncake_gym.baselines import make_policy
from mooncake_gym.model.costmodel import CostModel, PrefillTime
from mooncake_gym.model.presets import PRESETS, RoutingConfig
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import routing
from mooncake_gym.sim.policies import KVCentric

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

FIELDS = ("arrival_s", "input_tokens", "instance", "ttft_s", "queue_s", "transfer_s", "prefill_s", "hit_tokens",
          "fetched_tokens")
NATIVE = ("random", "load", "cache", "kvcentric")


def trace_of(rows, name="hand"):
    """A trace from (arrival_s, input_tokens, block_ids) rows."""
    return Trace([r[0] for r in rows], [r[1] for r in rows], [1] * len(rows), [list(r[2]) for r in rows], name=name)


def assert_same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    np.testing.assert_equal(a.metrics, b.metrics)  # NaN == NaN here
    assert a.policy == b.policy and a.trace_name == b.trace_name


def both(trace, name, config=None, cost=None, seed=0, **kw):
    """The run on each engine, and the policies' generators afterwards."""
    out = {}
    for engine in ("python", "native"):
        policy = make_policy("routing", name, **kw)
        out[engine] = (routing.simulate(trace, policy, config, cost, seed=seed, engine=engine),
                       policy.rng.bit_generator.state)
    return out


# --- numpy's generator ------------------------------------------------------------------------------
def test_pcg64_draws_numpys_integers_stream_and_hands_back_its_state():
    ns = [1, 2, 3, 7, 8, 2, 1, 5, 2**31 + 5, 2**32, 3] * 40
    for seed in range(4):
        g, h = np.random.default_rng(seed), np.random.default_rng(seed)
        r = _engine.native.Pcg64(bridge.rng_state(h))
        assert [r.integers(n) for n in ns] == [int(g.integers(n)) for n in ns]
        bridge.set_rng_state(h, r.state())
        assert h.bit_generator.state == g.bit_generator.state
        assert int(h.integers(1000)) == int(g.integers(1000))  # and goes on with the same stream


def test_pcg64_rejects_a_range_it_does_not_port():
    r = _engine.native.Pcg64(bridge.rng_state(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="n out of"):
        r.integers(0)


# --- prefill time --------------------------------------------------------------------------------
@pytest.mark.parametrize("cost", [CostModel(), CostModel.realistic(), CostModel.realistic("llama3-8b", "H800", 2),
                                  CostModel.preset(n_gpus=1, prefill_overhead_s=0.05)], ids=repr)
@pytest.mark.parametrize("tier, overlap", [("dram", True), ("dram", False), ("gpu", True), ("ssd", True)])
def test_prefill_time_is_prefilltimes_to_the_bit(cost, tier, overlap):
    f = cost.prefill_time(tier, overlap)
    fields = bridge.prefill_fields(f)
    pairs = [(1, 0), (2, 1), (512, 0), (513, 512), (8192, 0), (8193, 8192), (20000, 1536), (100000, 99999), (65536, 4096)]
    for n, h in pairs:
        assert _engine.native.prefill_s(fields, n, h) == f(n, h), (n, h)


def test_a_prefilltime_field_the_engine_does_not_know_is_named(monkeypatch):
    fields = dict(bridge.PREFILL_FIELDS)
    del fields["weights_s"]
    monkeypatch.setattr(bridge, "PREFILL_FIELDS", fields)
    with pytest.raises(ValueError, match=r"does not know: \['weights_s'\]"):
        bridge.prefill_fields(CostModel().prefill_time())
    sim = routing.RoutingSimulator(trace_of([(0.0, 100, [1])]))
    assert "weights_s" in bridge.unsupported(sim, make_policy("routing", "load"))
    with pytest.raises(ValueError, match="weights_s"):
        routing.simulate(sim.trace, make_policy("routing", "load"), engine="native")


# --- hand-made traces with worked values ------------------------------------------------------------
def test_kvcentric_on_two_instances_worked_by_hand():
    """Request 0 ties on two idle instances (drawn with the policy's generator); request 1, a long
    prompt sharing its two blocks, arrives after it and goes where they are; request 2, sharing the
    same two blocks, arrives while that instance is busy and pulls them to the idle one."""
    cost = CostModel()
    config = RoutingConfig(n_instances=2, cache_blocks=40)
    t1 = cost.prefill_s(1024, 0) + 0.01
    t2 = t1 + 0.001
    trace = trace_of([(0.0, 1024, [1, 2]), (t1, 8192, [1, 2, *range(10, 24)]), (t2, 4096, [1, 2, 3, 4, 5, 6, 7, 8])])
    first = int(np.random.default_rng(7).integers(2))  # the tie-break of request 0, seed 7
    other = 1 - first
    p0 = cost.prefill_s(1024, 0)
    p1 = cost.prefill_s(8192, 1024)  # request 1 with its two leading blocks cached
    assert p1 < cost.transfer_s(1024) + p1 < cost.prefill_s(8192, 0)  # stays on the holder
    queue2 = (t1 + p1) - t2
    pull = cost.transfer_s(1024) + cost.prefill_s(4096, 1024)
    assert pull < queue2 + cost.prefill_s(4096, 1024)  # the busy holder loses to a pull
    for engine in ("python", "native"):
        res = routing.simulate(trace, KVCentric(), config, cost, seed=7, engine=engine)
        assert res.instance.tolist() == [first, first, other]
        assert res.ttft_s.tolist() == [p0, p1, pull]
        assert res.queue_s.tolist() == [0.0, 0.0, 0.0]
        assert res.hit_tokens.tolist() == [0, 1024, 1024]
        assert res.fetched_tokens.tolist() == [0, 0, 1024]
        assert res.transfer_s.tolist() == [0.0, 0.0, cost.transfer_s(1024)]
        span = max(t1 + p1, t2 + pull)
        busy = {first: p0 + p1, other: pull}
        assert res.metrics["utilisation"] == [busy[0] / span, busy[1] / span]


def test_lru_eviction_by_hand_decides_the_hits():
    """One instance holding 3 blocks. Blocks enter last to first, so a prefix is more recent than
    its extension: [1, 2] leaves LRU order 2, 1; [3, 4] gives 2, 1, 4, 3 and evicts 2; [1, 2] then
    hits block 1 only (512 tokens), leaves 4, 3, 2, 1 and evicts 4; [3, 4] hits block 3."""
    cost = CostModel()
    config = RoutingConfig(n_instances=1, cache_blocks=3)
    trace = trace_of([(0.0, 1024, [1, 2]), (10.0, 1024, [3, 4]), (20.0, 1024, [1, 2]), (30.0, 1024, [3, 4])])
    for engine in ("python", "native"):
        res = routing.simulate(trace, make_policy("routing", "load"), config, cost, engine=engine)
        assert res.hit_tokens.tolist() == [0, 0, 512, 512]
        assert res.ttft_s.tolist() == [cost.prefill_s(1024, 0)] * 2 + [cost.prefill_s(1024, 512)] * 2
    engine = bridge.make_engine(routing.RoutingSimulator(trace, config, cost))
    orders = []
    for _ in range(4):
        engine.serve(0, False)
        orders.append(engine.cache_lru_first(0))
    assert orders == [[2, 1], [1, 4, 3], [3, 2, 1], [2, 1, 4, 3][1:]]


def test_a_pool_that_caches_nothing_is_the_lectures_queue():
    config = RoutingConfig(n_instances=2, cache_blocks=0)
    trace = trace_of([(0.0, 2000, [1, 2, 3, 4]), (0.0, 2000, [1, 2, 3, 4]), (0.1, 2000, [1, 2, 3, 4])])
    p = CostModel().prefill_s(2000, 0)
    for engine in ("python", "native"):
        res = routing.simulate(trace, make_policy("routing", "load"), config, seed=1, engine=engine)
        first = res.instance[0]
        assert res.instance.tolist() == [first, 1 - first, first] or res.instance.tolist() == [first, 1 - first, 1 - first]
        assert res.ttft_s.tolist() == [p, p, p - 0.1 + p] and res.hit_tokens.tolist() == [0, 0, 0]
    a = both(trace, "load", config, seed=1)
    assert_same(a["python"][0], a["native"][0])


def test_a_taken_trace_is_read_from_its_base_as_from_its_own_blocks():
    """Trace.take keeps its base (taken_from) and the engine renumbers the base's columns
    (trace_take) instead of hashing the ids again: the same distinct blocks, cache contents (by id),
    decisions and records as the columns made from the taken trace's own blocks, and as the reference."""
    cost = CostModel()
    config = RoutingConfig(n_instances=2, cache_blocks=3)
    base = trace_of([(0.0, 1024, [1, 2]), (1.0, 1536, [3, 4, 5]), (2.0, 1024, [1, 6]), (3.0, 512, [7])])
    taken = base.take([2, 0, 3, 2, 1, 0], arrival_s=[0.0, 0.5, 0.5, 4.0, 4.1, 9.0])
    assert taken.taken_from[0] is base and taken.taken_from[1].tolist() == [2, 0, 3, 2, 1, 0]
    own = Trace(taken.arrival_s, taken.input_tokens, taken.output_tokens, taken.block_ids, name=taken.name)
    assert own.taken_from is None
    assert bridge.native_trace(taken).n_unique == bridge.native_trace(own).n_unique == 7
    lru = []
    for t in (taken, own):
        engine = bridge.make_engine(routing.RoutingSimulator(t, config, cost))
        for k in range(len(t)):
            engine.serve(k % 2, False)
        lru.append([engine.cache_lru_first(0), engine.cache_lru_first(1)])
    # instance 0: [1, 6], [7], then [3, 4, 5] evicts them all; instance 1: [1, 2], [1, 6] (6 enters), [1, 2]
    # touches 2 then 1 (last to first)
    assert lru[0] == lru[1] == [[5, 4, 3], [6, 2, 1]]
    for name in NATIVE:
        a, b = both(taken, name, config, cost, seed=3), both(own, name, config, cost, seed=3)
        assert_same(a["python"][0], a["native"][0])
        for f in FIELDS:
            assert np.array_equal(getattr(a["native"][0], f), getattr(b["native"][0], f)), (name, f)
    taken.block_ids = [(9,)] * len(taken)  # its blocks no longer the base's: read as they are
    assert taken.taken_from is None and bridge.native_trace(taken).n_unique == 1


# --- the engine switch ------------------------------------------------------------------------------------
def test_engine_names_and_the_environment_variable(monkeypatch):
    assert mooncake_gym.engine() == "native"
    monkeypatch.setenv("MOONCAKE_GYM_ENGINE", "python")
    assert mooncake_gym.engine() == "python"
    trace = trace_of([(0.0, 600, [1, 2]), (0.1, 600, [1, 2])])
    res = routing.simulate(trace, make_policy("routing", "kvcentric"))
    assert res.hit_tokens.tolist() == [0, 599]
    monkeypatch.setenv("MOONCAKE_GYM_ENGINE", "rust")
    with pytest.raises(ValueError, match=r"MOONCAKE_GYM_ENGINE: expected one of \('native', 'python'\), got 'rust'"):
        mooncake_gym.engine()
    with pytest.raises(ValueError, match="engine: expected one of"):
        routing.simulate(trace, make_policy("routing", "load"), engine="fast")


def test_a_python_policy_runs_on_the_reference_or_is_refused_by_name():
    trace = trace_of([(0.0, 600, [1, 2]), (0.1, 600, [1, 2])])

    class Pinned(KVCentric):  # a subclass may change the rule: not native
        def __call__(self, view):
            return 1

    res = routing.simulate(trace, Pinned(), engine=None)  # the default falls back to the reference
    assert res.instance.tolist() == [1, 1]
    with pytest.raises(ValueError, match=r"'native' cannot run this: policy .*Pinned is not native "
                                         r"\(native: aibrix, cache, chbl, dynamo, kvcentric, llmd, llmd_precise, lmetric, load, "
                                         r"p2c, preble, random, relsplit, sglang, sizesplit, vllm_kvaware, vllm_prefix\)"):
        routing.simulate(trace, Pinned(), engine="native")
    with pytest.raises(ValueError, match="exact view only"):
        routing.simulate(trace, make_policy("routing", "load"), observation="scraped", engine="native")
    plain = routing.simulate(trace, lambda view: 0, engine=None)
    assert plain.instance.tolist() == [0, 0]


def test_a_production_routers_subclass_is_not_native_and_runs_the_same_as_before():
    # the production routers are native by their exact class (tests/test_engine_production.py); a
    # subclass may change the rule and runs the reference
    from mooncake_gym.baselines.production import DynamoKV

    class Dynamo(DynamoKV):
        pass

    trace = trace_of([(0.0, 600, [1, 2]), (0.1, 600, [1, 2]), (0.2, 3000, [1, 2, 3])])
    assert bridge.native_policy(Dynamo()) is None
    a = routing.simulate(trace, Dynamo(), engine=None)
    b = routing.simulate(trace, Dynamo(), engine="python")
    assert_same(a, b)


# --- the shared trace (golden-style) ----------------------------------------------------------------
@pytest.mark.parametrize("preset", ["lecture", "mooncake", "mooncake-hetero"])
def test_shared_trace_x2_same_numbers(shared_trace, preset):
    trace = shared_trace.scaled(2)
    p = PRESETS[preset]
    for name, kw in (("kvcentric", {}), ("random", {}), ("kvcentric", {"threshold": 1.5})):
        out = both(trace, name, p.routing_config(), p.prefill_cost, seed=3, **kw)
        assert_same(out["python"][0], out["native"][0])
        assert out["python"][1] == out["native"][1]
    head = trace.head(800)
    for name in ("load", "cache"):
        out = both(head, name, p.routing_config(), p.prefill_cost, seed=3)
        assert_same(out["python"][0], out["native"][0])


# --- generated traces, presets, pools and actions -----------------------------------------------------
PRESET_NAMES = ("lecture", "mooncake", "mooncake-hetero", "h100")


@st.composite
def traces(draw, max_requests=40):
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.2, 1.0, 5.0]), min_size=n, max_size=n))
    rows, t = [], 0.0
    prefixes = [[1, 2, 3], [1, 2, 7], [10, 11], [20, 21, 22, 23, 24, 25]]
    for g in gaps:
        t += g
        base = list(draw(st.sampled_from(prefixes)))
        k = draw(st.integers(0, len(base)))
        tail = draw(st.lists(st.integers(100, 130), max_size=6, unique=True))
        blocks = base[:k] + tail
        # prompts within their blocks, and long ones (several chunks of the realistic model's prefill)
        tokens = draw(st.integers(1, 512 * (len(blocks) + 1)) | st.integers(8000, 40000))
        rows.append((t, tokens, blocks))
    return trace_of(rows, name="generated")


@st.composite
def pools(draw):
    preset = PRESETS[draw(st.sampled_from(PRESET_NAMES))]
    base = preset.routing_config()
    n = draw(st.integers(1, 5))
    blocks = draw(st.one_of(st.integers(0, 12), st.lists(st.integers(0, 12), min_size=n, max_size=n).map(tuple)))
    instances = None
    if draw(st.booleans()) and preset.prefill_cost.instance.realistic:
        spec = (base.instances or (preset.prefill_cost.instance,))[0]
        other = replace(spec, gpu=draw(st.sampled_from(["H800", "A800", "H100"])), mfu=draw(st.sampled_from([0.4, 0.65])))
        instances = tuple(draw(st.sampled_from([spec, other])) for _ in range(n))
    return RoutingConfig(n_instances=n, cache_blocks=blocks, instances=instances), preset.prefill_cost


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), pool=pools(), name=st.sampled_from(NATIVE), seed=st.integers(0, 2**32),
       threshold=st.sampled_from([1.0, 1.25, 2.0, 1e9]))
def test_generated_runs_same_numbers(trace, pool, name, seed, threshold):
    config, cost = pool
    kw = {"threshold": threshold} if name == "kvcentric" else {}
    out = both(trace, name, config, cost, seed=seed, **kw)
    assert_same(out["python"][0], out["native"][0])
    assert out["python"][1] == out["native"][1]


def _view_fields(v):
    return (v.queue_s, v.hit_tokens, v.prefill_s, v.best_hit_tokens, v.transfer_s, v.pull_prefill_s, v.hit_blocks)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(30), pool=pools(), data=st.data())
def test_generated_action_sequences_same_views_caches_and_rows(trace, pool, data):
    """Any sequence of (instance, pull): the engine's view, every cache's LRU order and the rows
    follow the reference's decision by decision."""
    config, cost = pool
    sim = routing.RoutingSimulator(trace, config, cost)
    engine = bridge.make_engine(sim)
    n = config.n_instances
    while not sim.done:
        assert engine.view() == _view_fields(sim.exact_view)
        i, pull = data.draw(st.integers(0, n - 1)), data.draw(st.booleans())
        sim.dispatch(i, pull)
        engine.serve(i, pull)
        for j in range(n):
            assert engine.cache_lru_first(j) == sim.instances[j].cache.blocks_lru_first()
    assert engine.done
    assert engine.rows().tolist() == [list(map(float, r)) for r in sim._rows]
    assert engine.busy_s() == [inst.busy_s for inst in sim.instances]
    assert engine.requests() == [inst.requests for inst in sim.instances]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(30), pool=pools(), name=st.sampled_from(NATIVE), seed=st.integers(0, 1000))
def test_generated_decisions_one_by_one(trace, pool, name, seed):
    """The engine's policy answers the reference policy's answer on every view, with the same draws."""
    config, cost = pool
    sim = routing.RoutingSimulator(trace, config, cost)
    engine = bridge.make_engine(sim)
    policy = make_policy("routing", name)
    policy.reset(np.random.default_rng(seed))
    rng = _engine.native.Pcg64(bridge.rng_state(np.random.default_rng(seed)))
    threshold = getattr(policy, "threshold", 1.0)
    while not sim.done:
        route = policy(sim.view)
        assert engine.decide(name, threshold, rng) == (route.instance, route.pull)
        sim.dispatch(route.instance, route.pull)
        engine.serve(route.instance, route.pull)
    assert rng.state() == bridge.rng_state(policy.rng)


def test_engine_refuses_bad_input_by_name():
    sim = routing.RoutingSimulator(trace_of([(0.0, 100, [1])]))
    engine = bridge.make_engine(sim)
    with pytest.raises(ValueError, match="serve: instance out of range"):
        engine.serve(8, False)
    engine.serve(0, False)
    with pytest.raises(IndexError, match="serve: the trace is exhausted"):
        engine.serve(0, False)
    with pytest.raises(ValueError, match="policy: expected one of random, load, cache, kvcentric, sizesplit, relsplit, got best"):
        bridge.make_engine(sim).run("best", 1.0, bridge.rng_state(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="block_start: expected offsets"):
        _engine.native.Trace(np.zeros(1), np.ones(1, dtype=np.int64), np.array([0, 2]), np.array([1], dtype=np.int64))


def test_native_asked_for_where_it_is_not_built_says_how_to_build(monkeypatch):
    monkeypatch.setattr(_engine, "native", None)
    with pytest.raises(ValueError, match=r"engine: the native engine is not built here .*make install"):
        _engine.resolve("native")
    monkeypatch.setenv("MOONCAKE_GYM_ENGINE", "native")
    with pytest.raises(ValueError, match="MOONCAKE_GYM_ENGINE: the native engine is not built here"):
        _engine.engine()
    monkeypatch.delenv("MOONCAKE_GYM_ENGINE")
    assert _engine.engine() == "python" and _engine.resolve(None) == "python"


def test_the_sources_fingerprint_follows_the_cpp_files(tmp_path):
    assert _engine.sources_fingerprint(tmp_path) is None
    (tmp_path / "a.cpp").write_text("int a;\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    first = _engine.sources_fingerprint(tmp_path)
    (tmp_path / "notes.txt").write_text("changed\n")
    assert _engine.sources_fingerprint(tmp_path) == first
    (tmp_path / "b.hpp").write_text("#pragma once\n")
    assert _engine.sources_fingerprint(tmp_path) not in (None, first)


# --- the step-able interface ---------------------------------------------------------------------------
def _typed(view):
    return [(type(x).__name__, x) if not isinstance(x, tuple) else tuple((type(y).__name__, y) for y in x)
            for x in view]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(30), pool=pools(), data=st.data())
def test_native_stepper_is_the_reference_view_for_view(trace, pool, data):
    """Driven from Python with any actions and skips, the native simulator shows the reference's
    views (every field, with its type), last outcomes and result."""
    config, cost = pool
    ref = routing.RoutingSimulator(trace, config, cost)
    nat = NativeRoutingSimulator(trace, config, cost)
    n = config.n_instances
    assert _typed(nat.view) == _typed(ref.view)
    while not ref.done:
        if data.draw(st.integers(0, 9)) == 0:
            a, b = ref.skip(), nat.skip()
            assert nat.last is None and ref.last is None
        else:
            action = (data.draw(st.integers(0, n - 1)), data.draw(st.booleans()))
            a, b = ref.step(action), nat.step(action)
            assert nat.last == ref.last and [type(v) for v in nat.last.values()] == [type(v) for v in ref.last.values()]
        assert (a is None) == (b is None) and (a is None or _typed(a) == _typed(b))
    assert nat.done and nat.view is None
    assert_same(nat.result("p"), ref.result("p"))
    with pytest.raises(RuntimeError, match="the trace is exhausted"):
        nat.step(0)
    assert _typed(nat.reset()) == _typed(ref.reset())


def test_prefill_routing_v0_on_the_native_stepper_gives_the_same_episode(monkeypatch):
    import gymnasium as gym

    from mooncake_gym.envs import prefill_routing

    def episode():
        env = gym.make("mooncake_gym/PrefillRouting-v0")
        obs, info = env.reset(seed=5)
        env.action_space.seed(3)
        out = [(obs, info)]
        done = False
        while not done:
            obs, reward, done, _, info = env.step(env.action_space.sample())
            out.append((obs, reward, info))
        return out

    reference = episode()
    monkeypatch.setattr(prefill_routing, "RoutingSimulator", NativeRoutingSimulator)
    native = episode()
    assert len(native) == len(reference) > 100
    np.testing.assert_equal(native, reference)


def test_native_stepper_refuses_an_observation_mode():
    with pytest.raises(ValueError, match="observation: the native engine shows the exact view only"):
        NativeRoutingSimulator(trace_of([(0.0, 100, [1])]), observation="scraped")


def test_a_changed_prefill_formula_keeps_the_run_on_the_reference(monkeypatch):
    """The engine checks its prefill time against PrefillTime's before a run: a cost model changed
    in Python alone (here: 1 ms more per prefill) runs on the reference, and native is refused."""
    original = PrefillTime.__call__
    monkeypatch.setattr(PrefillTime, "__call__", lambda self, n, h: original(self, n, h) + 0.001)
    trace = trace_of([(0.0, 1000, [1, 2]), (0.1, 1000, [1, 2])])
    cost = CostModel()
    sim = routing.RoutingSimulator(trace, cost=cost)
    assert "disagrees with PrefillTime at (1000, 0)" in bridge.unsupported(sim, make_policy("routing", "load"))
    res = routing.simulate(trace, make_policy("routing", "load"), cost=cost)
    assert res.ttft_s[0] == original(cost.prefill_time(), 1000, 0) + 0.001
    with pytest.raises(ValueError, match="disagrees with PrefillTime"):
        routing.simulate(trace, make_policy("routing", "load"), cost=cost, engine="native")
