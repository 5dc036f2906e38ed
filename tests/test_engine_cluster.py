"""The native cluster simulator against the Python reference (docs/engine.md): ``ClusterSimulator``
under the ``reserve`` decode model (the ``lecture`` preset) on the native engine makes the same
decisions and draws, shows the same views and leaves the same per-request records, load series
and metrics, bit for bit: on a hand-made trace worked out from the cost model, on the shared trace,
and on hypothesis-generated traces, clusters, routers and action sequences; and the engine switch
(what is not native runs the reference by default and is refused by name with engine='native')."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_engine_routing import traces

from mooncake_gym import _engine
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.admission import BaselineAdmission, EarlyRejection, PredictiveRejection
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.presets import PRESETS
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import cluster
from mooncake_gym.sim.cluster import ClusterAction, ClusterSimulator
from mooncake_gym.sim.metrics import COMPLETED, REFUSED_TOO_LONG, REJECTED_AFTER_PREFILL
from mooncake_gym.sim.policies import KVCentric, LeastQueue
from mooncake_gym.sim.views import Route

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

ARRAYS = ("outcome", "ttft_s", "tbt_s", "prefill_s", "prefill_instance", "decode_instance", "decode_start_s", "end_s",
          "sample_times_s", "prefill_load", "decode_load", "decode_kv_load", "good", "credited")
COUNTERS = ("completed", "completed_in_ttft_slo", "admitted", "rejected_at_arrival", "rejected_after_prefill",
            "refused_too_long", "granted", "granted_in_ttft_slo", "requests_in_prefill", "requests_in_decode",
            "wasted_prefill_s", "wasted_log", "done", "now")


def assert_same_result(a, b):
    for f in ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f
    np.testing.assert_equal(a.metrics, b.metrics)  # NaN == NaN here
    assert a.correlation == b.correlation or (np.isnan(a.correlation) and np.isnan(b.correlation))


def view_fields(v):
    """Every field of a ClusterView, the default route's and the decode side's included."""
    return (v.now, v.index, v.input_tokens, v.output_tokens, v.predicted_output_tokens, tuple(v.routing),
            v.default_route, v.prefill_instance, v.prefill_s, v.predicted_prefill_finish, v.predicted_ttft_s,
            v.decode_batch, v.decode_used_per_instance, v.decode_step_s, v.decode_step_with_s, v.mean_decode_s,
            v.decode_capacity_per_instance, v.ttft_slo_s, v.tbt_slo_s, v.mean_output_tokens,
            v.requests_in_prefill, v.requests_in_decode, v.decode_used_tokens, v.decode_pool_capacity_tokens)


def projections(sim):
    """The decode projections a predictive admission policy reads, at a few times ahead."""
    now, out = sim.now, []
    for at in (now + 0.5, now + 5.0, now + 60.0):
        for td in (sim._mean_decode_s(), 2.0):
            out += [sim.decode_token_projections(at, td), sim.decode_token_projections(at, td, 100.0),
                    sim.project_decode(at, td), sim.project_decode(at, td, 0.5), sim.project_decode(at, td, 0.9, 50.0)]
        out.append(sim.view.project_decode_step_s(at))
    return out


def counters(sim):
    return tuple(getattr(sim, c) for c in COUNTERS)


def pair(trace, preset, **options):
    py = ClusterSimulator(trace, preset, engine="python", **options)
    nat = ClusterSimulator(trace, preset, engine="native", **options)
    assert type(py) is ClusterSimulator and getattr(nat, "native", False)
    return py, nat


def drive_drawn_actions(py, nat, preset, draw, projections=projections, state=counters):
    """Steps the reference ``py`` and the engine ``nat`` to the end with the same drawn actions (admit or
    not; the default route or a drawn one, pull or not; the default decode rule or a drawn instance),
    the view read or not: the views and ``projections`` where read, and ``state`` after every step,
    are the reference's."""
    while not py.done:
        assert not nat.done
        if draw(st.booleans()):
            assert view_fields(py.view) == view_fields(nat.view)
            assert projections(py) == projections(nat)
        else:
            assert py.view.index == nat.view.index
        admit = draw(st.booleans() | st.just(True))
        route = draw(st.none() | st.builds(Route, st.integers(0, preset.n_prefill - 1), st.booleans()))
        decode = draw(st.none() | st.integers(0, preset.n_decode - 1))
        py.step(ClusterAction(admit, route, decode))
        nat.step(ClusterAction(admit, route, decode))
        assert state(py) == state(nat)
    assert nat.done and nat.view is None


def lecture(**changes):
    return PRESETS["lecture"].with_(**changes)


# --- a hand-made trace ---------------------------------------------------------------------------------
def test_reserve_cluster_worked_by_hand():
    """One prefill and one decode instance of 1,000 tokens at 0.5 s per token: r0 decodes 4 tokens
    (2 s); r1 (1,000 tokens) finds r0's 104 held at its prefill's end and is rejected after prefill;
    r2, after r0 has left, decodes 400 tokens; r3 (2,001 tokens) never fits and is refused."""
    p = lecture(n_prefill=1, n_decode=1, cache_blocks=0, decode_capacity_tokens=1000, tbt_s=0.5)
    f = CostModel().prefill_time()
    trace = Trace([0.0, 0.0, 5.0, 6.0], [100, 600, 600, 2000], [4, 400, 400, 1], [[1], [2, 3], [4, 5], [6, 7, 8, 9]],
                  name="hand")
    p0, p1, p2 = f(100, 0), f(600, 0), f(600, 0)
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, p, engine=engine, sample_period_s=1.0, warmup_s=0.0)
        view = sim.view
        while view is not None:
            view = sim.step(True)
        r = sim.result()
        assert r.outcome.tolist() == [COMPLETED, REJECTED_AFTER_PREFILL, COMPLETED, REFUSED_TOO_LONG]
        np.testing.assert_array_equal(r.ttft_s, [p0, (p0 + p1) - 0.0, (5.0 + p2) - 5.0, np.nan])
        np.testing.assert_array_equal(r.decode_start_s, [p0, np.nan, 5.0 + p2, np.nan])
        np.testing.assert_array_equal(r.end_s, [p0 + 4 * 0.5, np.nan, (5.0 + p2) + 400 * 0.5, np.nan])
        assert r.metrics["wasted_prefill_s"] == p1 and r.metrics["refused_too_long"] == 1
        # decode KV at 0..6 s (the last arrival): r0's 104 until 2 s, r2's 1,000 from 5 s + its prefill
        assert r.decode_kv_load.tolist() == [0.0, 0.104, 0.104 if p0 + 2 > 2.0 else 0.0, 0.0, 0.0, 0.0, 1.0]


def test_lecture_series_and_least_queue_worked_by_hand():
    """The lecture's load series (the share of prefill instances busy, sampled each second up to the
    last arrival, after the events at or before the sample) under least-queue routing."""
    p = lecture(n_prefill=2, n_decode=1, cache_blocks=0)
    f = CostModel().prefill_time()
    trace = Trace([0.0, 0.0, 0.0, 3.0], [30000, 20000, 100, 100], [10, 10, 10, 10], [[1], [2], [3], [4]])
    a, b, c = f(30000, 0), f(20000, 0), f(100, 0)
    assert b < a and b + c < a  # the third request joins instance 1's queue, which stays the shorter
    busy = [a, (b + c)]
    last = 0 if max(a - 3.0, 0.0) <= max(b + c - 3.0, 0.0) else 1  # the least queue at 3 s (ties: the first)
    after = list(busy)
    after[last] = max(after[last], 3.0) + c
    expected = [sum(u > s for u in busy) / 2 for s in (0.0, 1.0, 2.0)] + [sum(u > 3.0 for u in after) / 2]
    for engine in ("python", "native"):
        sim = ClusterSimulator(trace, p, router=LeastQueue(), load_series="lecture", engine=engine)
        view = sim.view
        while view is not None:
            view = sim.step(True)
        r = sim.result()
        assert r.prefill_instance.tolist() == [0, 1, 1, last]
        assert r.sample_times_s.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert r.prefill_load.tolist() == expected


# --- generated traces, clusters and actions ------------------------------------------------------------
@st.composite
def clusters(draw):
    """A lecture-preset cluster (reserve decode) with drawn pools, caches, capacities and SLOs."""
    n_p, n_d = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    return lecture(n_prefill=n_p, n_decode=n_d, cache_blocks=draw(st.integers(0, 12)),
                   decode_capacity_tokens=draw(st.sampled_from([3000, 20000, 60000])),
                   tbt_s=draw(st.sampled_from([0.01, 0.05, 0.3])), ttft_slo_s=draw(st.sampled_from([0.5, 5.0, 30.0])))


@st.composite
def workloads(draw):
    t = draw(traces(30))
    outputs = draw(st.lists(st.integers(1, 600), min_size=len(t), max_size=len(t)))
    return Trace(t.arrival_s, t.input_tokens, outputs, t.block_ids, name="generated")


ROUTERS = {"kvcentric": KVCentric, "kvcentric2": lambda: KVCentric(threshold=2.0), "least_queue": LeastQueue,
           "random": lambda: make_policy("routing", "random"), "load": lambda: make_policy("routing", "load"),
           "cache": lambda: make_policy("routing", "cache")}


def options(draw):
    return {"load_series": draw(st.sampled_from(["slo", "lecture"])), "refuse_never_fit": draw(st.booleans()),
            "sample_period_s": draw(st.sampled_from([0.05, 1.0])), "warmup_s": draw(st.sampled_from([0.0, 1.0])),
            "seed": draw(st.integers(0, 2**32)), "oracle": draw(st.booleans())}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=workloads(), preset=clusters(), router=st.sampled_from(sorted(ROUTERS)), data=st.data())
def test_generated_action_sequences_same_views_records_and_draws(trace, preset, router, data):
    """Any actions (admit or not; the default route or a drawn one, pull or not; the default decode
    rule or a drawn instance), the default route read or not: every view and counter after every
    step, then every record, series and metric, and the router's generator, are the reference's."""
    kw = options(data.draw)
    py, nat = pair(trace, preset, router=ROUTERS[router](), **kw)
    drive_drawn_actions(py, nat, preset, data.draw)
    assert_same_result(py.result("x"), nat.result("x"))
    if router != "least_queue":
        assert py.router.rng.bit_generator.state == nat.router.rng.bit_generator.state


ADMISSION = {"all": lambda: None, "baseline": BaselineAdmission, "baseline5": lambda: BaselineAdmission(5.0),
             "early": EarlyRejection, "early08": lambda: EarlyRejection(0.8), "early15": lambda: EarlyRejection(1.5)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=workloads(), preset=clusters(), admission=st.sampled_from(sorted(ADMISSION)),
       routing=st.sampled_from([None, "kvcentric", "random", "load", "cache"]), data=st.data())
def test_generated_whole_runs_with_native_rules_same_numbers(trace, preset, admission, routing, data):
    """simulate() with the native admission rules and routing policies run whole in the engine."""
    kw = options(data.draw)
    out = {}
    for engine in ("python", "native"):
        pol = None if routing is None else make_policy("routing", routing)
        out[engine] = (cluster.simulate(trace, preset, ADMISSION[admission](), pol, engine=engine, **kw),
                       None if pol is None else pol.rng.bit_generator.state)
    assert_same_result(out["python"][0], out["native"][0])
    assert out["python"][1] == out["native"][1]


@pytest.mark.parametrize("admission", [None, BaselineAdmission(), EarlyRejection(), EarlyRejection(1.2)],
                         ids=["all", "baseline", "early", "early12"])
def test_shared_trace_x2_lecture_same_numbers(shared_trace, admission):
    trace = shared_trace.scaled(2)
    py = cluster.simulate(trace, "lecture", admission, seed=3, engine="python")
    nat = cluster.simulate(trace, "lecture", admission, seed=3, engine="native")
    assert_same_result(py, nat)
    assert nat.metrics["admitted"] > 0


# --- the engine switch ------------------------------------------------------------------------------
def _small():
    return Trace([0.0, 1.0], [100, 200], [5, 5], [[1], [2]], name="small")


def test_a_cluster_that_is_not_native_runs_the_reference_or_is_refused_by_name():
    t = _small()
    tiered = PRESETS["mooncake"].with_(ssd_cache_blocks=1000)
    assert type(ClusterSimulator(t, tiered)) is ClusterSimulator  # default: the reference
    with pytest.raises(ValueError, match=r"the native engine has no SSD tier"):
        ClusterSimulator(t, tiered, engine="native")
    with pytest.raises(ValueError, match="exact view only"):
        ClusterSimulator(t, "lecture", observation="scraped", engine="native")

    class Mine:
        def __call__(self, view):
            return Route(0)

    with pytest.raises(ValueError, match="router .*Mine is not native"):
        ClusterSimulator(t, "lecture", router=Mine(), engine="native")
    sim = ClusterSimulator(t, "lecture", router=Mine())
    assert type(sim) is ClusterSimulator and sim.step(True) is not None
    assert getattr(ClusterSimulator(t, "lecture"), "native", False)  # the default, where it is native


def test_simulate_with_a_python_policy_runs_the_reference_or_is_refused_by_name():
    t = _small()
    with pytest.raises(ValueError, match="admission .*PredictiveRejection is not native"):
        cluster.simulate(t, "lecture", PredictiveRejection(), engine="native")
    py = cluster.simulate(t, "lecture", PredictiveRejection(), engine="python")
    assert_same_result(py, cluster.simulate(t, "lecture", PredictiveRejection()))
    with pytest.raises(ValueError, match="decode .* is not native"):
        cluster.simulate(t, "lecture", decode=lambda view: 0, engine="native")


def test_reset_replays_the_same_run():
    trace = Trace([0.0, 0.0, 0.5, 1.0], [3000, 3000, 1000, 600], [50, 500, 5, 5], [[1, 2], [1, 3], [1], [4]])
    sim = ClusterSimulator(trace, "lecture", router=make_policy("routing", "random"), seed=4, engine="native")
    runs = []
    for _ in range(2):
        view = sim.reset()
        while view is not None:
            view = sim.step(True)
        runs.append(sim.result())
    assert_same_result(*runs)


# --- the lecture's admission problem on the native cluster ---------------------------------------------
@pytest.mark.parametrize("name", ["baseline", "early", "predict", "predict_dist"])
def test_lecture_admission_on_the_native_cluster_same_views_and_result(name):
    """LectureAdmission (OverloadAdmission-v0's simulator) with engine='native': every view (its
    recent window and the projections the predictive rules read) and the result are the reference's."""
    from mooncake_gym.baselines.admission import ADMISSION_POLICIES
    from mooncake_gym.sim.admission import LectureAdmission, OverloadConfig, overload_workload
    trace, _ = overload_workload(n_requests=700, seed=2)
    config = OverloadConfig(sample_period_s=2.0)
    sims = [LectureAdmission(trace, config, engine=engine) for engine in ("python", "native")]
    assert getattr(sims[1].cluster, "native", False) and not getattr(sims[0].cluster, "native", False)
    policies = [ADMISSION_POLICIES[name]() for _ in sims]
    views = [s.reset() for s in sims]
    while views[0] is not None:
        assert tuple(views[0])[:-1] == tuple(views[1])[:-1]  # every field but the simulator
        answers = [p(v) for p, v in zip(policies, views)]
        assert answers[0] == answers[1]
        views = [s.step(a) for s, a in zip(sims, answers)]
        assert counters(sims[0].cluster) == counters(sims[1].cluster)
    assert views[1] is None
    a, b = (s.result(name) for s in sims)
    np.testing.assert_equal(a.metrics, b.metrics)
    for f in ("outcome", "ttft_s", "prefill_s", "prefill_instance", "decode_instance", "decode_start_s",
              "decode_end_s", "sample_times_s", "prefill_load", "decode_load"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f
    assert a.metrics["rejected"] > 0 and a.metrics["completed"] > 0
