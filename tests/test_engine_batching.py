"""The native cluster simulator on the realistic presets as shipped against the Python reference
(docs/engine.md): chunked prefill batching per iteration up to a token budget (``PrefillEngine``;
a request's TTFT is the estimate at dispatch until its last chunk's iteration is formed) and KV
transfers sharing the nodes' NICs (``Network``: prefix pulls between prefill nodes, prompt KV copies
to decode) give the same decisions, views, per-request records, load series and metrics, bit for
bit: on hand-made traces with values worked out from the cost model, on the shared trace x2, and on
hypothesis-generated traces, clusters and action sequences."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_engine_cluster import assert_same_result, drive_drawn_actions, pair, workloads
from test_engine_realistic import (ADMISSION, ROUTERS, batching_options, cluster_changes, counters, decode_state,
                                   long_workloads, same_whole_runs)
from test_engine_realistic import projections as batching_projections

from mooncake_gym import _engine
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.admission import BaselineAdmission, EarlyRejection
from mooncake_gym.model.costmodel import NODE_TIER_BANDWIDTH
from mooncake_gym.model.presets import PIPELINE, PRESETS, SSD_TIER
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import cluster
from mooncake_gym.sim.cluster import ClusterAction, ClusterSimulator
from mooncake_gym.sim.metrics import COMPLETED
from mooncake_gym.sim.views import Route

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

#: The shipped presets whose prefill runs the engines' mechanisms (batching, shared NICs).
ENGINE_PRESETS = sorted(n for n, p in PRESETS.items() if p.prefill_token_budget)
BW = NODE_TIER_BANDWIDTH["rdma"]
ROUTING_ARRAYS = ("arrival_s", "input_tokens", "instance", "ttft_s", "queue_s", "transfer_s", "prefill_s",
                  "hit_tokens", "fetched_tokens")


def assert_same_prefill(a, b):
    """The prefill pool's records (the real TTFTs and waits once formed) and metrics."""
    for f in ROUTING_ARRAYS:
        x, y = getattr(a.prefill_result, f), getattr(b.prefill_result, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    np.testing.assert_equal(a.prefill_result.metrics, b.prefill_result.metrics)


def both(trace, preset, actions, **options):
    """The two engines stepped through ``actions`` (one per request); their simulators."""
    sims = []
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, preset, engine=engine, **options)
        assert getattr(sim, "native", False) == (engine == "native")
        for a in actions:
            sim.step(a)
        assert sim.done
        sims.append(sim)
    return sims


def test_every_shipped_engine_preset_is_native():
    t = Trace([0.0, 1.0], [100, 200], [5, 5], [[1], [2]], name="small")
    assert {"mooncake", "mooncake-overload", "mooncake-balanced", "mooncake-overload-tight", "mooncake-hetero",
            "h100"} <= set(ENGINE_PRESETS)
    for name in ENGINE_PRESETS:
        assert PRESETS[name].shared_nics and PRESETS[name].pipeline_nodes == 1
        assert getattr(ClusterSimulator(t, name, engine="native"), "native", False)
        assert getattr(ClusterSimulator(t, name), "native", False)  # the default, where it is native


# --- hand-made traces ------------------------------------------------------------------------------------
def test_two_prompts_share_iterations_worked_by_hand():
    """One prefill instance (budget 8,192), two prompts arriving together (6,000 and 4,000 tokens): the
    first iteration takes the whole first prompt and 2,192 tokens of the second (it waits for the
    second arrival at the same time), the second iteration the remaining 1,808. Until then each TTFT is
    the estimate at dispatch (the queue ahead + its prefill time served alone)."""
    p = PRESETS["mooncake"].with_(n_prefill=1, n_decode=1, cache_blocks=0, shared_nics=False)
    f = p.prefill_cost.prefill_time()
    trace = Trace([0.0, 0.0], [6000, 4000], [2, 2], [[1, 2], [3, 4]], name="hand")
    est0, est1 = f(6000, 0), f(4000, 0)
    extra0, extra1 = (max(0.0, est - f._chunked_compute(n, 0)) for est, n in ((est0, 6000), (est1, 4000)))
    end1 = 0.0 + (f.iteration_s(f.chunk_compute_s(0, 6000) + f.chunk_compute_s(0, 2192), 8192,
                                f.chunk_attention_s(0, 6000) + f.chunk_attention_s(0, 2192)) + extra0)
    end2 = end1 + (f.iteration_s(f.chunk_compute_s(2192, 4000), 1808, f.chunk_attention_s(2192, 4000)) + extra1)
    assert end1 > est0  # the first prompt shares its iteration with the second's first chunk
    assert end2 == pytest.approx(est0 + est1, rel=1e-12)  # in all, the work of the two served alone
    out = []
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, p, engine=engine)
        v = sim.step(ClusterAction(True, Route(0), None))
        assert v.routing.queue_s == (est0,) and v.routing.queued_requests == (1,) and v.routing.queued_tokens == (6000,)
        assert sim.ttft_s[0] == est0  # the estimate: the iteration at 0 waits for the arrival at 0
        assert sim.step(ClusterAction(True, Route(0), None)) is None
        r = sim.result()
        assert r.ttft_s.tolist() == [end1, end2] and r.prefill_s.tolist() == [est0, est1]
        assert r.prefill_result.queue_s.tolist() == [max(0.0, end1 - est0), max(0.0, (end2 - 0.0 - 0.0) - est1)]
        assert r.outcome.tolist() == [COMPLETED, COMPLETED]
        out.append(r)
    assert_same_result(*out)
    assert_same_prefill(*out)


def test_a_pull_over_an_idle_nic_then_its_last_chunk_worked_by_hand():
    """Two prefill instances with caches: r0 (2,000 tokens) on instance 0 caches its blocks; r1, the
    same prompt 50 s later, goes to instance 1 and pulls the 1,999-token prefix: its bytes cross two
    idle NICs at the full RDMA bandwidth, it arrives a transfer latency after its last byte, and the
    iteration of its last token starts then. Its TTFT is that wait plus the iteration (with its load)."""
    p = PRESETS["mooncake"].with_(n_prefill=2, n_decode=1, cache_blocks=10)
    c = p.prefill_cost
    f = c.prefill_time()
    trace = Trace([0.0, 50.0], [2000, 2000], [2, 2], [[1, 2, 3, 4], [1, 2, 3, 4]], name="hand")
    est1 = f(2000, 1999)
    arrived = (50.0 + c.kv_bytes(1999) / BW) + c.transfer_latency_s
    end = arrived + (f.iteration_s(f.chunk_compute_s(1999, 2000), 1, f.chunk_attention_s(1999, 2000))
                     + (est1 - f._chunked_compute(2000, 1999)))
    sims = both(trace, p, [ClusterAction(True, Route(0), None), ClusterAction(True, Route(1, True), None)])
    for sim in sims:
        r = sim.result()
        assert r.ttft_s[1] == end - 50.0 and r.prefill_result.fetched_tokens.tolist() == [0, 1999]
        assert sim.network.transfers == 3  # the pull and the two KV copies to decode
    assert sims[0].network.bytes_sent == sims[1].network.bytes_sent
    assert_same_result(sims[0].result(), sims[1].result())
    assert_same_prefill(sims[0].result(), sims[1].result())


def test_two_kv_copies_into_one_nic_share_it_worked_by_hand():
    """Two 4,000-token prompts prefilled alone on two instances end together and both go to decode
    instance 0: their copies' tails (as bytes at the RDMA rate) share its NIC at half the bandwidth
    each and join together, twice as late as alone; to two decode instances each has a NIC."""
    p = PRESETS["mooncake"].with_(n_prefill=2, n_decode=2, cache_blocks=0)
    c = p.prefill_cost
    f = c.prefill_time()
    est = f(4000, 0)
    done = 0.0 + (f.iteration_s(f.chunk_compute_s(0, 4000), 4000, f.chunk_attention_s(0, 4000))
                  + (est - f._chunked_compute(4000, 0)))
    copy = c.transfer_s(4000)
    tail = (copy - est if copy > est else 0.0) + copy / c.model.n_layers
    trace = Trace([0.0, 0.0], [4000, 4000], [3, 3], [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]])
    shared = both(trace, p, [ClusterAction(True, Route(0), 0), ClusterAction(True, Route(1), 0)])
    apart = both(trace, p, [ClusterAction(True, Route(0), 0), ClusterAction(True, Route(1), 1)])
    for sim in shared:
        assert sim.result().decode_start_s.tolist() == [done + (tail * BW) / (BW / 2)] * 2
    for sim in apart:
        assert sim.result().decode_start_s.tolist() == [done + (tail * BW) / BW] * 2
    for a, b in (shared, apart):
        assert_same_result(a.result(), b.result())


# --- the shared trace --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENGINE_PRESETS)
@pytest.mark.parametrize("admission", [None, EarlyRejection()], ids=["all", "early"])
def test_shared_trace_x2_engine_presets_same_numbers(shared_trace, name, admission):
    trace = shared_trace.scaled(2)
    py = cluster.simulate(trace, name, admission, seed=3, engine="python")
    nat = cluster.simulate(trace, name, admission, seed=3, engine="native")
    assert_same_result(py, nat)
    assert_same_prefill(py, nat)
    assert np.array_equal(py.mean_tbt_s, nat.mean_tbt_s, equal_nan=True)
    assert nat.metrics["completed"] > 0 and nat.prefill_result.metrics["fetched_tokens"] > 0


@pytest.mark.parametrize("routing", ["random", "load", "cache"])
def test_shared_trace_x2_routing_policies_same_numbers(shared_trace, routing):
    trace = shared_trace.scaled(2)
    out = {}
    for engine in ("python", "native"):
        pol = make_policy("routing", routing)
        out[engine] = (cluster.simulate(trace, "mooncake-overload", BaselineAdmission(), pol, seed=1, engine=engine),
                       pol.rng.bit_generator.state)
    assert_same_result(out["python"][0], out["native"][0])
    assert_same_prefill(out["python"][0], out["native"][0])
    assert out["python"][1] == out["native"][1]


# --- generated traces, clusters and actions ----------------------------------------------------------------
@st.composite
def engine_clusters(draw):
    """A shipped engine preset with drawn pools, caches, token budgets (small ones chunk every prompt),
    NICs shared or not, the chunked pipeline or not, decode capacities, running caps, SLOs and
    preemption modes."""
    name, changes = cluster_changes(draw, ENGINE_PRESETS)
    changes.update(prefill_token_budget=draw(st.sampled_from([256, 2048, 8192])), shared_nics=draw(st.booleans()))
    if draw(st.booleans()):  # chunked pipeline parallelism (opt-in): groups of 2-3, prompts from 0 or 4,000 tokens
        changes.update(pipeline_nodes=draw(st.integers(2, 3)), pipeline_min_tokens=draw(st.sampled_from([0, 4000])))
    return PRESETS[name].with_(**changes)


def projections(sim):
    """The decode projections a predictive admission policy reads (the batching ones and the token
    projections, which walk the prefill FIFOs in their order)."""
    now, out = sim.now, batching_projections(sim)
    for at in (now + 0.5, now + 5.0, now + 60.0):
        out += [sim.decode_token_projections(at, 2.0), sim.decode_token_projections(at, 20.0, 100.0)]
    return out


def state(sim):
    """Counters, decode instances, the requests in prefill (estimates or ends) in FIFO order, the
    NICs' totals."""
    fifo = [[(float(f), int(r)) for f, r in q] for q in sim._prefill_fifo]
    net = sim.network
    return (counters(sim), decode_state(sim), fifo, dict(sim._in_prefill),
            None if net is None else (net.bytes_sent, net.transfers))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.one_of(workloads(), long_workloads()), preset=engine_clusters(),
       router=st.sampled_from(sorted(ROUTERS)), data=st.data())
def test_generated_engine_action_sequences_same_views_records_and_draws(trace, preset, router, data):
    """Any actions (admit or not; the default route or a drawn one, pull or not; the default decode rule
    or a drawn instance), the view read or not: every view field (the estimates of queued work), the
    projections, every counter, the decode instances, the prefill FIFOs and the NICs after every step,
    then every record, series and metric, the prefill pool's rows, and the router's generator."""
    kw = batching_options(data.draw)
    py, nat = pair(trace, preset, router=ROUTERS[router](), **kw)
    drive_drawn_actions(py, nat, preset, data.draw, projections, state)
    a, b = py.result("x"), nat.result("x")
    assert_same_result(a, b)
    assert_same_prefill(a, b)
    assert np.array_equal(a.mean_tbt_s, b.mean_tbt_s, equal_nan=True)
    assert state(py) == state(nat)
    if router != "least_queue":
        assert py.router.rng.bit_generator.state == nat.router.rng.bit_generator.state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.one_of(workloads(), long_workloads()), preset=engine_clusters(),
       admission=st.sampled_from(sorted(ADMISSION)), routing=st.sampled_from([None, "kvcentric", "random", "load"]),
       data=st.data())
def test_generated_engine_whole_runs_with_native_rules_same_numbers(trace, preset, admission, routing, data):
    assert_same_prefill(*same_whole_runs(trace, preset, admission, routing, **batching_options(data.draw)))


def test_a_burst_at_one_time_waits_for_every_arrival_before_its_iteration():
    """Ten prompts arriving at the same time on one instance: the iteration at that time is formed after
    the last of them is dispatched (so it holds chunks of several), on both engines."""
    trace = Trace([1.0] * 10, [3000] * 10, [4] * 10, [[k] for k in range(10)], name="burst")
    p = PRESETS["mooncake"].with_(n_prefill=1, n_decode=2)
    sims = both(trace, p, [ClusterAction(True, Route(0), None)] * 10)
    a, b = (s.result() for s in sims)
    assert_same_result(a, b)
    assert_same_prefill(a, b)
    assert len(set(a.ttft_s.tolist())) < 10  # prompts ended by one iteration share their TTFT
    assert sims[1]._cluster.prefill_runs()[0] == [math.ceil(10 * 3000 / 8192)]


# --- the switch ---------------------------------------------------------------------------------------------
def test_a_pipelined_prompt_worked_by_hand():
    """Two instances in one pipeline group (budget 8,192, prompts from 10,000 tokens): a 20,000-token
    prompt's three chunks flow through the two stages, each stage half of a chunk's iteration less the
    overhead plus the overhead, and an activation send between them; its first token comes when the
    last stage finishes the last chunk, plus the request's own time; a short prompt on the second
    instance waits for the pipeline to release it."""
    p = PRESETS["mooncake"].with_(n_prefill=2, n_decode=1, cache_blocks=0, pipeline_nodes=2,
                                  pipeline_min_tokens=10_000)
    c = p.prefill_cost
    f = c.prefill_time()
    ovh = c.instance.iteration_overhead_s
    send_per_token, latency = c.model.d_model * 2 / BW, c.transfer_latency_s
    finish = [0.0, 0.0]
    for a, b in ((0, 8192), (8192, 16384), (16384, 20000)):
        stage = (f.iteration_s(f.chunk_compute_s(a, b), b - a, f.chunk_attention_s(a, b)) - ovh) / 2 + ovh
        ready = 0.0
        for k in range(2):
            begin = ready if ready > finish[k] else finish[k]
            finish[k] = begin + stage
            ready = finish[k] + (latency + send_per_token * (b - a))
    est = f(20000, 0)
    end = finish[1] + max(0.0, est - f._chunked_compute(20000, 0))
    trace = Trace([0.0, 0.0], [20000, 1000], [2, 2], [list(range(40)), [100, 101]], name="hand")
    sims = both(trace, p, [ClusterAction(True, Route(0), None), ClusterAction(True, Route(1), None)])
    for sim in sims:
        r = sim.result()
        assert r.ttft_s[0] == end and r.ttft_s[1] > finish[1]  # the second instance is held until then
    assert sims[1]._cluster.prefill_runs()[1] == [1, 0]
    assert_same_result(sims[0].result(), sims[1].result())
    assert_same_prefill(sims[0].result(), sims[1].result())


@pytest.mark.parametrize("name", ["mooncake", "mooncake-hetero"])
def test_shared_trace_x2_with_the_pipeline_same_numbers(shared_trace, name):
    trace = shared_trace.scaled(2)
    p = PRESETS[name].with_(**PIPELINE)
    py = cluster.simulate(trace, p, EarlyRejection(), seed=3, engine="python")
    nat = cluster.simulate(trace, p, EarlyRejection(), seed=3, engine="native")
    assert_same_result(py, nat)
    assert_same_prefill(py, nat)


def test_the_ssd_tier_is_refused_by_name_and_runs_the_reference():
    t = Trace([0.0, 1.0], [100, 200], [5, 5], [[1], [2]], name="small")
    p = PRESETS["mooncake"].with_(**SSD_TIER)
    with pytest.raises(ValueError, match=r"the native engine has no SSD tier"):
        ClusterSimulator(t, p, engine="native")
    assert type(ClusterSimulator(t, p)) is ClusterSimulator  # the default: the reference
    py = cluster.simulate(t, p, engine="python")
    assert_same_result(py, cluster.simulate(t, p))


def test_a_router_native_only_in_the_routing_simulator_runs_the_reference_or_is_refused_by_name():
    """sizesplit and relsplit are native in the routing simulator, not in the cluster (their running
    state): as the cluster's router or simulate's routing policy they run on the reference by default."""
    t = Trace([0.0, 1.0], [100, 200], [5, 5], [[1], [2]], name="small")
    for name in ("sizesplit", "relsplit"):
        with pytest.raises(ValueError, match=f"router .*{'RelativeSizeSplit' if name == 'relsplit' else 'SizeSplit'} "
                                             "is not native"):
            ClusterSimulator(t, "mooncake", router=make_policy("routing", name), engine="native")
        sim = ClusterSimulator(t, "mooncake", router=make_policy("routing", name))
        assert type(sim) is ClusterSimulator and sim.step(True) is not None
        with pytest.raises(ValueError, match="routing .* is not native"):
            cluster.simulate(t, "mooncake", routing=make_policy("routing", name), engine="native")
        py = cluster.simulate(t, "mooncake", routing=make_policy("routing", name), engine="python")
        assert_same_result(py, cluster.simulate(t, "mooncake", routing=make_policy("routing", name)))


def test_reset_replays_the_same_run_with_batching_and_nics():
    trace = Trace([0.0, 0.0, 0.5, 1.0, 1.0], [9000, 3000, 1000, 20000, 600], [50, 500, 5, 5, 40],
                  [[1, 2], [1, 3], [1], [1, 2, 4], [5]], name="hand")
    p = PRESETS["mooncake"].with_(n_prefill=2, n_decode=2, cache_blocks=8, prefill_token_budget=2048)
    sim = ClusterSimulator(trace, p, router=make_policy("routing", "random"), seed=4, engine="native")
    runs = []
    for _ in range(2):
        view = sim.reset()
        while view is not None:
            view = sim.step(ClusterAction(True, Route(view.index % 2, True), None))
        runs.append(sim.result())
    assert_same_result(*runs)
    assert_same_prefill(*runs)
    py = ClusterSimulator(trace, p, router=make_policy("routing", "random"), seed=4, engine="python")
    view = py.view
    while view is not None:
        view = py.step(ClusterAction(True, Route(view.index % 2, True), None))
    assert_same_result(py.result(), runs[0])
    assert runs[0].prefill_result.metrics["fetched_tokens"] > 0
