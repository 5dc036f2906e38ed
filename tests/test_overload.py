"""The overload simulator, the admission baselines, the ``overload`` command and lecture demo 3."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_gym.baselines.admission import (
    ADMISSION_POLICIES,
    EarlyRejection,
    make_admission_policy,
)
from mooncake_gym.cli import main
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.admission import (
    COMPLETED,
    PENDING,
    REJECTED_AFTER_PREFILL,
    REJECTED_AT_ARRIVAL,
    OverloadConfig,
    OverloadSimulator,
    decode_capacity_rate,
    load_correlation,
    overload_workload,
    simulate,
)
from mooncake_gym.model.presets import PRESETS
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim.cluster import saturation

COST = CostModel()


def make_trace(rows) -> Trace:
    """A trace from (arrival_s, input_tokens, output_tokens) rows (block ids made up)."""
    return Trace([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                 [list(range(math.ceil(r[1] / 512))) for r in rows])


def admit_all(view) -> bool:
    return True


def run_steps(sim: OverloadSimulator, policy, check=None):
    view = sim.reset()
    while view is not None:
        if check:
            check(sim, view)
        view = sim.step(bool(policy(view)))
    return sim.result()


def decode_peaks(trace: Trace, result) -> list[int]:
    """Peak tokens held on each decode instance, rebuilt from the outcomes (ends before starts at equal times)."""
    need = (trace.input_tokens + trace.output_tokens).tolist()
    peaks = []
    for j in range(result.config.n_decode):
        events = []
        for r in np.flatnonzero(result.decode_instance == j).tolist():
            events.append((result.decode_start_s[r], 1, need[r]))
            events.append((result.decode_end_s[r], 0, -need[r]))
        used = peak = 0
        for _, _, delta in sorted(events):
            used += delta
            peak = max(peak, used)
        peaks.append(peak)
    return peaks


def check_conservation(trace: Trace, result) -> None:
    m = result.metrics
    out = result.outcome
    assert not np.any(out == PENDING)
    assert set(np.unique(out).tolist()) <= {COMPLETED, REJECTED_AT_ARRIVAL, REJECTED_AFTER_PREFILL}
    counts = [int(np.count_nonzero(out == k)) for k in (COMPLETED, REJECTED_AT_ARRIVAL, REJECTED_AFTER_PREFILL)]
    assert counts == [m["completed"], m["rejected_at_arrival"], m["rejected_after_prefill"]]
    assert sum(counts) == len(trace) == m["requests"]
    assert m["rejected"] == m["rejected_at_arrival"] + m["rejected_after_prefill"]
    assert m["admitted"] == m["completed"] + m["rejected_after_prefill"]
    wasted = result.prefill_s[out == REJECTED_AFTER_PREFILL].sum()
    assert m["wasted_prefill_s"] == pytest.approx(wasted, rel=1e-12, abs=1e-9)


# --------------------------------------------------------------------------------------------
# Configuration and input errors
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("n_prefill", 0), ("n_decode", -1), ("decode_capacity_tokens", 0), ("n_prefill", 2.5),
    ("tbt_s", 0.0), ("ttft_slo_s", -1.0), ("sample_period_s", float("nan")), ("recent_window_s", 0),
    ("warmup_s", -1.0), ("oracle", 1),
])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        OverloadConfig(**{field: value})


def test_bad_inputs():
    with pytest.raises(ValueError, match="trace"):
        OverloadSimulator([1, 2, 3])
    with pytest.raises(ValueError, match="load"):
        overload_workload(make_trace([(0.0, 1000, 10)]), 0, 10)
    with pytest.raises(ValueError, match="requests"):
        overload_workload(make_trace([(0.0, 1000, 10)]), 2.0, 0)
    with pytest.raises(ValueError, match="threshold"):
        EarlyRejection(threshold=0)
    with pytest.raises(ValueError, match="policy"):
        make_admission_policy("nope")
    with pytest.raises(ValueError, match="quantile"):
        make_admission_policy("predict_dist", quantile=1.5)
    with pytest.raises(ValueError, match="policy"):
        simulate(make_trace([(0.0, 1000, 10)]), "not callable")


def test_empty_trace_and_step_misuse():
    sim = OverloadSimulator(make_trace([]))
    assert sim.reset() is None and sim.done
    sim = OverloadSimulator(make_trace([(0.0, 1000, 10)]))
    with pytest.raises(RuntimeError):
        sim.step(True)
    sim.reset()
    assert sim.step(True) is None and sim.done
    with pytest.raises(RuntimeError):
        sim.step(True)


# --------------------------------------------------------------------------------------------
# Tiny hand-made scenarios with exact outcomes
# --------------------------------------------------------------------------------------------
def test_one_request_exact_times():
    trace = make_trace([(1.0, 4000, 20)])
    cfg = OverloadConfig(n_prefill=2, n_decode=2)
    sim = OverloadSimulator(trace, cfg)
    view = sim.reset()
    ps = COST.prefill_s(4000, 0)
    assert view.now == 1.0 and view.index == 0 and view.input_tokens == 4000
    assert view.output_tokens is None  # not an oracle
    assert view.prefill_queue_s == (0.0, 0.0) and view.prefill_instance == 0
    assert view.predicted_ttft_s == ps and view.predicted_prefill_finish == 1.0 + ps
    assert view.decode_used_tokens == 0 and view.decode_pool_capacity_tokens == 2 * 60_000
    assert sim.step(True) is None
    r = sim.result("one")
    assert r.outcome.tolist() == [COMPLETED]
    assert r.ttft_s[0] == ps
    assert r.decode_start_s[0] == 1.0 + ps
    assert r.decode_end_s[0] == 1.0 + ps + COST.decode_s(20, cfg.tbt_s)
    assert r.metrics["goodput"] == 1 and r.metrics["wasted_prefill_s"] == 0.0
    assert sim.decode_used_per_instance == [0, 0] and sim.cluster.granted == 1  # freed at its decode end


def test_oracle_shows_output_length():
    trace = make_trace([(0.0, 1000, 33)])
    assert OverloadSimulator(trace, OverloadConfig(oracle=True)).reset().output_tokens == 33
    assert OverloadSimulator(trace).reset().output_tokens is None


def test_rejected_after_prefill_wastes_exactly_its_prefill():
    # one decode instance of 1,000 tokens: A (900 tokens) decodes for 100 s; B (500 tokens) finishes
    # prefill meanwhile and finds no room.
    cfg = OverloadConfig(n_prefill=1, n_decode=1, decode_capacity_tokens=1000)
    trace = make_trace([(0.0, 800, 100), (0.01, 300, 200)])
    sim = OverloadSimulator(trace, cfg)
    r = run_steps(sim, admit_all)
    assert r.outcome.tolist() == [COMPLETED, REJECTED_AFTER_PREFILL]
    assert r.metrics["wasted_prefill_s"] == COST.prefill_s(300, 0)
    assert r.metrics["rejected_after_prefill"] == 1 and r.decode_instance[1] == -1
    assert math.isnan(r.decode_start_s[1])
    # B queued behind A on the single prefill instance
    assert r.ttft_s[1] == pytest.approx(COST.prefill_s(800, 0) + COST.prefill_s(300, 0) - 0.01)
    check_conservation(trace, r)


def test_request_too_large_for_any_instance_is_rejected_after_prefill():
    cfg = OverloadConfig(n_decode=2, decode_capacity_tokens=1000)
    r = simulate(make_trace([(0.0, 1500, 10)]), admit_all, cfg)
    assert r.outcome.tolist() == [REJECTED_AFTER_PREFILL]


def _arrival_finishing_at(target: float, prefill_s: float) -> float:
    """An arrival time t with t + prefill_s == target exactly in floating point."""
    t = target - prefill_s
    for _ in range(64):
        f = t + prefill_s
        if f == target:
            return t
        t = math.nextafter(t, math.inf if f < target else -math.inf)
    pytest.skip("no float arrival gives this exact finish")


def test_tokens_are_freed_at_exactly_the_decode_end():
    # A occupies the only decode instance until a_end; B's prefill finishes at exactly a_end: the
    # decode completion is handled first, so B gets the slot. C finishes a hair earlier and is rejected.
    cfg = OverloadConfig(n_prefill=4, n_decode=1, decode_capacity_tokens=1000)
    a_in, a_out = 700, 40
    a_end = COST.prefill_s(a_in, 0) + COST.decode_s(a_out, cfg.tbt_s)
    b_in = 600
    b_arrival = _arrival_finishing_at(a_end, COST.prefill_s(b_in, 0))
    trace = make_trace([(0.0, a_in, a_out), (b_arrival, b_in, 10)])
    r = simulate(trace, admit_all, cfg)
    assert r.decode_end_s[0] == a_end
    assert r.outcome.tolist() == [COMPLETED, COMPLETED]
    assert r.decode_start_s[1] == a_end
    early = math.nextafter(b_arrival, -math.inf)
    r2 = simulate(make_trace([(0.0, a_in, a_out), (early, b_in, 10)]), admit_all, cfg)
    assert r2.outcome.tolist() == [COMPLETED, REJECTED_AFTER_PREFILL]


def test_view_sees_completions_up_to_its_arrival_and_counters_move_between_steps():
    cfg = OverloadConfig(n_prefill=1, n_decode=1, decode_capacity_tokens=10_000)
    ps = COST.prefill_s(1000, 0)
    trace = make_trace([(0.0, 1000, 10), (ps, 1000, 10), (100.0, 1000, 10)])
    sim = OverloadSimulator(trace, cfg)
    v0 = sim.reset()
    assert sim.completed_in_slo == 0
    v1 = sim.step(True)
    # the first prefill finished exactly at the second arrival: the view already sees it in decode
    assert v1.decode_used_tokens == 1010 and v1.requests_in_decode == 1 and v1.requests_in_prefill == 0
    assert sim.completed_in_slo == 1 and v0.decode_used_tokens == 0
    v2 = sim.step(False)
    assert v2.decode_used_tokens == 0 and v2.recent_rejected == 0  # 100 s later: window of 30 s passed
    assert sim.rejected_at_arrival == 1
    sim.step(True)
    assert sim.completed_in_slo == 2 and sim.done


def test_least_queued_prefill_and_exact_ttft_prediction():
    rng = np.random.default_rng(3)
    n = 60
    rows = sorted(zip(np.cumsum(rng.exponential(0.05, n)).tolist(), rng.integers(500, 20_000, n).tolist(),
                      rng.integers(1, 300, n).tolist()))
    trace = make_trace(rows)
    sim = OverloadSimulator(trace, OverloadConfig(n_prefill=3))
    predicted = {}
    view = sim.reset()
    while view is not None:
        q = view.prefill_queue_s
        assert view.prefill_instance == q.index(min(q))
        predicted[view.index] = view.predicted_ttft_s
        view = sim.step(view.index % 3 != 1)
    r = sim.result()
    for i, ttft in predicted.items():
        if r.outcome[i] != REJECTED_AT_ARRIVAL:
            assert r.ttft_s[i] == pytest.approx(ttft, abs=1e-9)


def test_recent_window_counts():
    cfg = OverloadConfig(n_prefill=1, n_decode=1, decode_capacity_tokens=1000, recent_window_s=10.0)
    trace = make_trace([(0.0, 900, 500), (0.5, 900, 10), (1.0, 900, 10), (5.0, 100, 1), (30.0, 100, 1)])
    sim = OverloadSimulator(trace, cfg)
    v = sim.reset()
    v = sim.step(True)   # A: decodes 25 s
    v = sim.step(True)   # B: will be rejected after prefill
    v = sim.step(False)  # C: rejected at arrival
    assert v.index == 3 and v.recent_rejected == 2 and v.recent_rejected_after_prefill == 1
    assert v.recent_wasted_s == COST.prefill_s(900, 0)
    v = sim.step(True)
    assert v.index == 4 and v.recent_rejected == 0 and v.recent_wasted_s == 0.0


def test_policy_reset_gets_seeded_rng_and_runs_are_deterministic():
    class Coin:
        name = "coin"

        def reset(self, rng):
            self.rng = rng

        def __call__(self, view):
            return bool(self.rng.random() < 0.5)

    trace, _ = overload_workload(n_requests=400)
    a, b = simulate(trace, Coin(), seed=5), simulate(trace, Coin(), seed=5)
    assert a.policy == "coin"
    assert np.array_equal(a.outcome, b.outcome) and repr(a.metrics) == repr(b.metrics)
    assert not np.array_equal(a.outcome, simulate(trace, Coin(), seed=6).outcome)


# --------------------------------------------------------------------------------------------
# Capacity and conservation, on random small traces and on a real workload
# --------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.floats(0, 30), st.integers(1, 9000), st.integers(1, 400)), min_size=1, max_size=40),
    n_prefill=st.integers(1, 3), n_decode=st.integers(1, 3), cap=st.integers(2000, 20_000),
    admit_mask=st.integers(0, 2**40 - 1),
)
def test_capacity_never_exceeded_and_conservation(rows, n_prefill, n_decode, cap, admit_mask):
    trace = make_trace(sorted(rows))
    cfg = OverloadConfig(n_prefill=n_prefill, n_decode=n_decode, decode_capacity_tokens=cap)

    def check(sim, view):
        assert all(0 <= u <= cap for u in view.decode_used_per_instance)
        assert view.decode_used_tokens == sum(view.decode_used_per_instance)

    r = run_steps(OverloadSimulator(trace, cfg), lambda v: (admit_mask >> v.index) & 1, check)
    check_conservation(trace, r)
    assert max(decode_peaks(trace, r)) <= cap
    done = r.outcome == COMPLETED
    assert np.all(r.decode_start_s[done] == r.ttft_s[done] + trace.arrival_s[done])


def test_capacity_and_conservation_under_overload():
    trace, _ = overload_workload(n_requests=1500, load=3.0)
    r = simulate(trace, admit_all)
    check_conservation(trace, r)
    assert max(decode_peaks(trace, r)) <= r.config.decode_capacity_tokens
    assert r.metrics["rejected_after_prefill"] > 0


def test_projection_methods():
    cfg = OverloadConfig(n_prefill=1, n_decode=2, decode_capacity_tokens=10_000)
    trace = make_trace([(0.0, 1000, 400), (10.0, 2000, 10), (10.1, 3000, 10)])
    sim = OverloadSimulator(trace, cfg)
    sim.reset()
    v = sim.step(True)
    start = COST.prefill_s(1000, 0)  # request 0 decodes 20 s from here with 1,400 tokens on instance 0
    td = v.mean_decode_s
    assert td == pytest.approx(COST.decode_s(140, cfg.tbt_s))  # mean output (400 + 10 + 10) / 3
    assert v.now == 10.0 and start + td < v.now + 5 < start + 20
    # uniform t_d (Mooncake §7.4): counted until start + t_d, then assumed gone although still decoding
    assert v.project_decode_tokens(start + td - 1e-6) == 1400
    assert v.project_decode_tokens(v.now + 5) == 0
    assert v.project_decode(v.now + 5) == [0, 0]
    # distribution: it has decoded ~198 tokens; the only longer output is 400, so it is still there
    assert v.expected_decode_tokens(v.now + 5) == pytest.approx(1400)
    assert v.expected_decode_tokens(start + 20.1) == 0
    assert v.project_decode(v.now + 5, quantile=0.5) == [1400, 0]
    assert v.project_decode(start + 20.1, quantile=0.5) == [0, 0]
    v = sim.step(True)  # request 1 in prefill, finishing at 10 + prefill_s(2000)
    f1 = 10.0 + COST.prefill_s(2000, 0)
    assert v.project_decode_tokens(f1, decode_s=100.0) == pytest.approx(1400 + 2000 + v.mean_output_tokens)
    assert v.project_decode(f1, decode_s=100.0) == pytest.approx([1400, 2000 + v.mean_output_tokens])
    assert v.project_decode_tokens(f1 - 1e-9, decode_s=100.0) == 1400
    assert v.decode_survival(-1.0) == 1.0 and v.decode_survival(400 * cfg.tbt_s) == 0.0


# --------------------------------------------------------------------------------------------
# Lecture demo 3's conclusions on the full setting (seed 0, 6,000 requests, load 2)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo3():
    trace, sat = overload_workload()
    return trace, sat.decode_per_s, {name: simulate(trace, factory()) for name, factory in ADMISSION_POLICIES.items()}


def test_demo3_workload(demo3):
    trace, capacity, _ = demo3
    from mooncake_gym.model.workload import synthetic_trace

    base = synthetic_trace(0, rate=4.0)
    assert capacity == decode_capacity_rate(base)
    assert len(trace) == 6000
    assert trace.rate == pytest.approx(2 * capacity, rel=0.05)


def test_decode_capacity_rate_by_hand_and_beside_the_reserve_models_saturation():
    # two requests: (1000 + 10) x 10 x 0.05 = 505 and (3000 + 30) x 30 x 0.05 = 4545 token-seconds,
    # mean 2525; the pool holds 8 x 60,000 tokens: 480,000 / 2525 requests/s
    tr = make_trace([(0.0, 1000, 10), (1.0, 3000, 30)])
    assert decode_capacity_rate(tr) == 480_000 / 2525.0
    assert decode_capacity_rate(tr, PRESETS["lecture"].with_(n_decode=2, tbt_s=0.1)) == 120_000 / 5050.0
    # the reserve model's saturation is measured (whole requests packed as they come), at most the
    # closed form (tests/test_saturation_reserve.py: equal where packing leaves no room idle); these
    # short outputs leave the lecture prefill-bound: the cluster's rate is the prefill pool's
    sat = saturation(tr, "lecture")
    assert 0 < sat.decode_per_s <= decode_capacity_rate(tr)
    assert sat.bottleneck == "prefill" and sat.cluster_per_s == sat.prefill_per_s < sat.decode_per_s
    # demo 3's closed form counts every request of the mix, also one that never fits (70,010 tokens)
    big = make_trace([(0.0, 1000, 10), (1.0, 3000, 30), (2.0, 70_000, 10)])
    assert decode_capacity_rate(big) == 480_000 / ((505 + 4545 + 35_005) / 3)
    with pytest.raises(ValueError, match="reserve"):
        decode_capacity_rate(tr, "mooncake")
    # load x the decode pool's rate (demo 3: the closed form) or x the cluster's (measured, the
    # smaller of the two pools)
    few = OverloadConfig(n_prefill=1, n_decode=4).preset()
    base = make_trace([(0.1 * k, 2000 + 100 * k, 50 + k) for k in range(40)])
    s1 = saturation(base, few)
    trace, s2 = overload_workload(base, 2.0, 300, 0, few, pool="cluster")
    assert s2 == s1 and trace.rate == pytest.approx(2 * s1.cluster_per_s, rel=0.2)
    closed = decode_capacity_rate(base, few)
    for pool in ("decode", None):  # None: demo 3's definition under the reserve model
        trace, s3 = overload_workload(base, 2.0, 300, 0, few, pool=pool)
        assert s3.decode_per_s == closed and s3.prefill_per_s == s1.prefill_per_s
        assert trace.rate == pytest.approx(2 * closed, rel=0.2)


def test_demo3_conservation(demo3):
    trace, _, results = demo3
    for r in results.values():
        check_conservation(trace, r)
        assert r.metrics["goodput"] == r.metrics["completed"]  # every policy applies the TTFT check


def test_demo3_baseline_wastes_a_fifth_or_more(demo3):
    # the lecture's toy printed "about a third"; this model wastes 20-26 % of the admitted requests'
    # prefill over seeds 0-5 of the base trace (seed 0: 24 %)
    b = demo3[2]["baseline"].metrics
    assert b["rejected_after_prefill"] >= 0.2 * b["admitted"]
    assert b["mean_decode_occupancy"] > 0.8


def test_demo3_early_saves_prefill_and_completes_about_as_many(demo3):
    """Early cuts wasted prefill by 70-78 % over seeds 0-5, and completes about as many per second
    in the steady state (-1 % to +3 %): the decode pool decides completions. In total it completes
    3-6 % fewer: baseline's prefill backlog still completes about 250 requests after the last
    arrival, early's only a handful (an end effect of a finite run, asserted here too)."""
    b, e = demo3[2]["baseline"].metrics, demo3[2]["early"].metrics
    assert e["wasted_prefill_s"] <= 0.5 * b["wasted_prefill_s"]
    assert e["steady_completed_per_s"] == pytest.approx(b["steady_completed_per_s"], rel=0.05)
    assert e["completed"] >= 0.93 * b["completed"]
    assert b["completed_after_last_arrival"] >= 0.04 * b["completed"] > e["completed_after_last_arrival"]


def test_demo3_early_loads_swing_in_anti_phase(demo3):
    b, e = demo3[2]["baseline"], demo3[2]["early"]
    assert e.correlation < 0
    # baseline's prefill never idles in the steady state: its correlation is undefined (no anti-phase)
    assert math.isnan(b.correlation) or e.correlation < b.correlation


def test_demo3_predict_wastes_less(demo3):
    b, p = demo3[2]["baseline"].metrics, demo3[2]["predict"].metrics
    assert p["wasted_prefill_s"] < b["wasted_prefill_s"]


def test_demo3_load_series(demo3):
    r = demo3[2]["early"]
    assert r.sample_times_s[0] == 0.0 and np.all(np.diff(r.sample_times_s) == pytest.approx(5.0))
    assert r.sample_times_s[-1] <= demo3[0].arrival_s[-1]
    assert np.all((0 <= r.prefill_load) & (r.prefill_load <= 1) & (0 <= r.decode_load) & (r.decode_load <= 1))
    assert len(r.series(60.0)) == 13


def test_load_correlation_helper():
    assert load_correlation([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert math.isnan(load_correlation([1, 1, 1], [0.2, 0.5, 0.9]))


# --------------------------------------------------------------------------------------------
# Command line, lecture and plot
# --------------------------------------------------------------------------------------------
def test_overload_command_json(capsys):
    assert main(["overload", "--preset", "lecture", "--requests", "300", "--policy", "early", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["results"]) == ["early"] and doc["requests"] == 300
    assert doc["arrival_rate_per_s"] == pytest.approx(2 * doc["decode_capacity_per_s"])


def test_overload_command_table_and_errors(capsys):
    assert main(["overload", "--preset", "lecture", "--requests", "200", "--load", "1.5"]) == 0
    out = capsys.readouterr().out
    for name in ADMISSION_POLICIES:
        assert name in out
    assert main(["overload", "--load", "0"]) == 2
    assert "load" in capsys.readouterr().err


def test_lecture_demo3_with_plot(tmp_path, capsys):
    png = tmp_path / "demo3.png"
    assert main(["lecture", "--demo", "3", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "early" in out and "requests/s" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_rejects_other_formats(tmp_path):
    from mooncake_gym.reporting.plots import plot_load_series

    with pytest.raises(ValueError, match="png"):
        plot_load_series({"x": ([0, 5], [0, 1], [0, 1])}, tmp_path / "a.pdf")
    with pytest.raises(ValueError, match="series"):
        plot_load_series({}, tmp_path / "a.png")
