"""The native cluster simulator on the realistic presets' continuous-batching decode against the
Python reference (docs/engine.md): ``ClusterSimulator`` on a realistic preset with the prefill pool
of ``presets.NO_ENGINE`` (one request at a time per prefill instance, each copy with a whole NIC)
and any preemption mode makes the same decisions, shows the same views (the decode side and its
projections included) and leaves the same per-request records (TBT from the same token intervals),
load series, counters and metrics, bit for bit: on hand-made traces worked out from the cost model,
on the shared trace x2, and on hypothesis-generated traces, clusters and action sequences."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_engine_cluster import assert_same_result, drive_drawn_actions, pair, workloads
from test_engine_routing import traces

from mooncake_gym import _engine
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.admission import BaselineAdmission, EarlyRejection
from mooncake_gym.model.presets import NO_ENGINE, PRESETS
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import cluster
from mooncake_gym.sim.cluster import ClusterAction, ClusterSimulator
from mooncake_gym.sim.metrics import COMPLETED, PREEMPTED
from mooncake_gym.sim.policies import KVCentric, LeastQueue
from mooncake_gym.sim.views import Route

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

COUNTERS = ("completed", "completed_in_ttft_slo", "admitted", "rejected_at_arrival", "rejected_after_prefill",
            "refused_too_long", "granted", "granted_in_ttft_slo", "requests_in_prefill", "requests_in_decode",
            "preempted", "wasted_prefill_s", "wasted_log", "done", "now")
DECODE_STATE = ("batch", "pending_tokens", "pending_requests", "t0", "it0", "k_base", "busy_s", "preemptions",
                "preemption_stall_s", "recomputed_tokens")


def counters(sim):
    return tuple(getattr(sim, c) for c in COUNTERS)


def decode_state(sim):
    return [tuple(getattr(d, f) for f in DECODE_STATE) for d in sim.decode]


def projections(sim):
    """The batching projections a predictive admission policy reads, at a few times ahead."""
    now, out = sim.now, []
    for at in (now + 0.5, now + 5.0, now + 60.0):
        for td in (sim._mean_decode_s(), 2.0):
            out += [sim.project_decode(at, td), sim.project_decode(at, td, 0.5), sim.project_decode(at, td, 0.9, 50.0)]
        out.append(sim.view.project_decode_step_s(at))
    return out


def realistic(name="mooncake", **changes):
    return PRESETS[name].with_(**{**NO_ENGINE, **changes})


# --- hand-made traces ----------------------------------------------------------------------------------
def test_one_request_decodes_in_closed_form_worked_by_hand():
    """One prefill and one decode instance: a 1,000-token prompt with 3 output tokens. Its KV's tail
    arrives after the prefill; it then decodes 2 iterations of alpha + beta k seconds (alpha: the step
    of a batch of 1 over its 1,000 tokens, beta: one token's more); its token intervals are the first
    iteration plus the wait since its first token, then the second; TBT the slowest (ceil(10 % of 2))."""
    p = realistic(n_prefill=1, n_decode=1, cache_blocks=0)
    f = p.prefill_cost.prefill_time()
    trace = Trace([0.0], [1000], [3], [[1, 2]], name="hand")
    prefill = f(1000, 0)
    copy = p.prefill_cost.transfer_s(1000)
    tail = (copy - prefill if copy > prefill else 0.0) + copy / p.prefill_cost.model.n_layers
    join = prefill + tail
    fixed, per_key = p.decode_cost.decode_step_coefficients(1)
    alpha, beta = fixed + per_key * 1000, per_key * 1
    end = join + (2 * (alpha + beta * 0) + beta * 2 * 1 / 2)
    wait = join - (0.0 + (prefill - 0.0))
    intervals = [alpha + beta * 0 + wait, alpha + beta * 1]
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, p, engine=engine, warmup_s=0.0)
        assert getattr(sim, "native", False) == (engine == "native")
        assert sim.step(True) is None
        r = sim.result()
        assert r.outcome.tolist() == [COMPLETED]
        assert r.ttft_s.tolist() == [prefill] and r.decode_start_s.tolist() == [join] and r.end_s.tolist() == [end]
        assert r.tbt_s.tolist() == [max(intervals)]
        assert r.mean_tbt_s.tolist() == [(intervals[0] + intervals[1]) / 2]


@pytest.mark.parametrize("mode", ["abort", "recompute", "swap"])
def test_preemption_when_the_kv_runs_out_worked_by_hand(mode):
    """One decode instance of 2,100 tokens, no KV copy: r0 (1,000 + 400 tokens) joins, r1 (1,000) joins
    later; at the boundary where their contexts and the next iteration's tokens exceed the capacity,
    r1 (the most recently joined) is preempted: aborted (PREEMPTED, its prefill wasted), or re-queued
    and, once r0 has left, recomputed or swapped back in and completed."""
    p = realistic(n_prefill=2, n_decode=1, cache_blocks=0, decode_capacity_tokens=2100, preemption=mode,
                  tbt_slo_s=10.0)
    trace = Trace([0.0, 0.0], [1000, 1000], [400, 300], [[1, 2], [3, 4]], name="hand")
    out = {}
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, p, engine=engine, kv_transfer=False, refuse_never_fit=False)
        view = sim.view
        while view is not None:
            view = sim.step(ClusterAction(True, Route(view.index % 2), None))
        out[engine] = sim.result()
        r = out[engine]
        if mode == "abort":
            assert r.outcome.tolist() == [COMPLETED, PREEMPTED] and r.metrics["preempted"] == 1
            assert r.metrics["wasted_prefill_s"] == r.prefill_s[1]
        else:
            assert r.outcome.tolist() == [COMPLETED, COMPLETED] and r.metrics["preemptions"] == 1
            assert r.metrics["preemption_stall_s"] > 0 and r.end_s[1] > r.end_s[0]
            assert r.metrics["recomputed_tokens"] == (0 if mode == "swap" else 1000 + (2100 - 2000) // 2 - 1 + 1) \
                or mode == "recompute"
    assert_same_result(out["python"], out["native"])


# --- generated traces, clusters and actions ------------------------------------------------------------
@st.composite
def batching_clusters(draw):
    """A realistic preset's batching cluster with NO_ENGINE's prefill: drawn pools, caches, KV
    capacities (small ones preempt), running caps, SLOs and preemption modes."""
    name, changes = cluster_changes(draw, ["mooncake", "mooncake-hetero", "h100", "mooncake-overload"])
    return realistic(name, **changes)


def cluster_changes(draw, names):
    """A preset's name drawn from ``names`` and drawn changes of its pools (prefill GPUs for
    ``mooncake-hetero``), caches, decode capacities, running caps, SLOs and preemption mode."""
    name = draw(st.sampled_from(names))
    n_p = draw(st.integers(1, 4))
    changes = dict(n_prefill=n_p, n_decode=draw(st.integers(1, 3)), cache_blocks=draw(st.integers(0, 12)),
                   decode_capacity_tokens=draw(st.sampled_from([None, 2500, 6000, 40000])),
                   max_running=draw(st.sampled_from([None, 2, 256])),
                   ttft_slo_s=draw(st.sampled_from([0.5, 5.0, 30.0])), tbt_slo_s=draw(st.sampled_from([0.03, 0.1, 1.0])),
                   preemption=draw(st.sampled_from(["abort", "recompute", "swap"])))
    if name == "mooncake-hetero":
        changes["prefill_gpus"] = tuple(draw(st.sampled_from(["H800", "A800"])) for _ in range(n_p))
    return name, changes


def batching_options(draw):
    return {"load_series": draw(st.sampled_from(["slo", "lecture"])), "refuse_never_fit": draw(st.booleans()),
            "sample_period_s": draw(st.sampled_from([0.05, 1.0])), "warmup_s": draw(st.sampled_from([0.0, 1.0])),
            "seed": draw(st.integers(0, 2**32)), "oracle": draw(st.booleans()),
            "decode_check": draw(st.sampled_from(["tbt", "kv"])), "kv_transfer": draw(st.booleans()),
            "tbt_headroom": draw(st.sampled_from([0.0, 0.2]))}


ROUTERS = {"kvcentric": KVCentric, "least_queue": LeastQueue, "random": lambda: make_policy("routing", "random"),
           "load": lambda: make_policy("routing", "load")}


@st.composite
def long_workloads(draw):
    """Generated traces with outputs up to 3,000 tokens (long decodes: batches that grow and preempt)."""
    t = draw(traces(30))
    outputs = draw(st.lists(st.integers(1, 3000), min_size=len(t), max_size=len(t)))
    return Trace(t.arrival_s, t.input_tokens, outputs, t.block_ids, name="generated")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.one_of(workloads(), long_workloads()), preset=batching_clusters(),
       router=st.sampled_from(sorted(ROUTERS)), data=st.data())
def test_generated_batching_action_sequences_same_views_records_and_draws(trace, preset, router, data):
    """Any actions (admit or not; the default route or a drawn one; the default decode rule or a drawn
    instance), the view read or not: every view field, the batching projections, every counter and
    each decode instance's state after every step, then every record, series and metric (TBT and the
    preemption counters included), and the router's generator, are the reference's."""
    kw = batching_options(data.draw)
    py, nat = pair(trace, preset, router=ROUTERS[router](), **kw)
    drive_drawn_actions(py, nat, preset, data.draw, projections, lambda sim: (counters(sim), decode_state(sim)))
    assert_same_result(py.result("x"), nat.result("x"))
    assert np.array_equal(py.result("x").mean_tbt_s, nat.result("x").mean_tbt_s, equal_nan=True)
    if router != "least_queue":
        assert py.router.rng.bit_generator.state == nat.router.rng.bit_generator.state


ADMISSION = {"all": lambda: None, "baseline": BaselineAdmission, "early": EarlyRejection,
             "early08": lambda: EarlyRejection(0.8), "early15": lambda: EarlyRejection(1.5)}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.one_of(workloads(), long_workloads()), preset=batching_clusters(),
       admission=st.sampled_from(sorted(ADMISSION)), routing=st.sampled_from([None, "kvcentric", "random", "load"]),
       data=st.data())
def test_generated_batching_whole_runs_with_native_rules_same_numbers(trace, preset, admission, routing, data):
    same_whole_runs(trace, preset, admission, routing, **batching_options(data.draw))


def same_whole_runs(trace, preset, admission, routing, **options):
    """``cluster.simulate`` on both engines with the native rules (an ``ADMISSION`` name and a routing
    policy's name or None): the same result and routing generator afterwards; the two results."""
    out = {}
    for engine in ("python", "native"):
        pol = None if routing is None else make_policy("routing", routing)
        out[engine] = (cluster.simulate(trace, preset, ADMISSION[admission](), pol, engine=engine, **options),
                       None if pol is None else pol.rng.bit_generator.state)
    assert_same_result(out["python"][0], out["native"][0])
    assert out["python"][1] == out["native"][1]
    return out["python"][0], out["native"][0]


@pytest.mark.parametrize("name,changes", [("mooncake", {}), ("mooncake-overload", {}),
                                          ("mooncake-overload", {"preemption": "recompute"}),
                                          ("mooncake-balanced", {"preemption": "swap"}), ("mooncake-hetero", {}),
                                          ("h100", {})])
@pytest.mark.parametrize("admission", [None, EarlyRejection()], ids=["all", "early"])
def test_shared_trace_x2_realistic_without_prefill_mechanisms_same_numbers(shared_trace, name, changes, admission):
    trace = shared_trace.scaled(2)
    p = realistic(name, **changes)
    py = cluster.simulate(trace, p, admission, seed=3, engine="python")
    nat = cluster.simulate(trace, p, admission, seed=3, engine="native")
    assert_same_result(py, nat)
    assert np.array_equal(py.mean_tbt_s, nat.mean_tbt_s, equal_nan=True)
    assert nat.metrics["completed"] > 0 and not math.isnan(nat.metrics["p99_tbt_s"])


# --- the switch -------------------------------------------------------------------------------------------
def test_the_prefill_mechanisms_are_native_and_the_ssd_tier_refused_by_name():
    t = Trace([0.0, 1.0], [100, 200], [5, 5], [[1], [2]], name="small")
    assert getattr(ClusterSimulator(t, "mooncake"), "native", False)  # as shipped (tests/test_engine_batching.py)
    with pytest.raises(ValueError, match=r"the native engine has no SSD tier"):
        ClusterSimulator(t, PRESETS["mooncake"].with_(ssd_cache_blocks=1000), engine="native")
    with pytest.raises(ValueError, match="shared_nics: .*set prefill_token_budget"):  # the preset refuses it first
        PRESETS["mooncake"].with_(prefill_token_budget=0)
    assert getattr(ClusterSimulator(t, realistic()), "native", False)  # the default, where it is native
