"""Mooncake v3 §7.4's prediction-based early rejection on the cluster: the decode pool projected to
the moment a request's prefill would finish, and its predicted TBT compared with the SLO."""


import pytest
from helpers import trace_of

from mooncake_gym.baselines import make_policy
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.presets import get_preset
from mooncake_gym.sim.cluster import ClusterSimulator, simulate

COST = CostModel.realistic()
ONE = get_preset("mooncake").with_(n_prefill=1, n_decode=1)


def second_arrival(preset=ONE, first=(0.0, 1000, 5000)):
    """A long-decoding request (by default 1,000 prompt tokens, 5,000 out), then at 3 s one of 2,000
    tokens: the view at the second arrival, the first decoding."""
    sim = ClusterSimulator(trace_of(first, (3.0, 2000, 10)), preset, kv_transfer=False)
    sim.step(True)
    return sim.view


def test_the_projected_tbt_counts_the_requests_still_decoding_then():
    v = second_arrival()
    at = v.predicted_prefill_finish
    assert at > v.now and v.decode_batch == (1,)
    used_now = v.decode_used_per_instance[0]
    fixed, per_token = COST.decode_step_coefficients(2)
    # t_d long: the first request still decodes when the second's prefill ends (tokens kept as now)
    assert v.project_decode_step_s(at, decode_s=1e6) == [pytest.approx(fixed + per_token * (used_now + 2000),
                                                                       rel=1e-12)]
    # t_d short: it is assumed gone by then, and the request decodes alone
    fixed1, per_token1 = COST.decode_step_coefficients(1)
    assert v.project_decode_step_s(at, decode_s=1e-3) == [pytest.approx(fixed1 + per_token1 * 2000, rel=1e-12)]


def test_an_instance_whose_kv_would_not_hold_the_request_is_none():
    small = ONE.with_(decode_capacity_tokens=6000)
    v = second_arrival(small, first=(0.0, 5000, 500))  # fits alone (5,500); with the second's 2,000 it does not
    assert v.decode_batch == (1,)
    assert v.project_decode_step_s(v.predicted_prefill_finish, decode_s=1e6) == [None]


def test_predict_rejects_on_the_predicted_tbt_not_on_kv():
    v = second_arrival()
    at = v.predicted_prefill_finish
    with_first = v.project_decode_step_s(at, decode_s=1e6)[0]
    alone = v.project_decode_step_s(at, decode_s=1e-3)[0]
    assert alone < with_first
    # an SLO between the two: the paper's rule admits only if it expects the first request to be gone
    slo = (alone + with_first) / 2
    tight = ONE.with_(tbt_slo_s=slo)
    v = second_arrival(tight)
    assert make_policy("admission", "predict", decode_s=1e6)(v) is False
    assert make_policy("admission", "predict", decode_s=1e-3)(v) is True
    assert make_policy("admission", "baseline")(v) is True


def test_the_reserve_model_has_no_tbt_projection_and_keeps_the_kv_rule():
    tr = trace_of((0.0, 1000, 50), (0.5, 2000, 10))
    sim = ClusterSimulator(tr, "lecture")
    sim.step(True)
    assert sim.view.project_decode_step_s(sim.view.predicted_prefill_finish) is None


def test_predict_differs_from_baseline_where_decode_binds():
    """The bug this replaces: on a preset where the TBT binds and KV never does, a KV-only rule
    admitted exactly what ``baseline`` admits."""
    from mooncake_gym.sim.cluster import overload_workload
    preset = get_preset("mooncake-overload")
    tr, _ = overload_workload(load=3.0, n_requests=600, seed=0, preset=preset)
    base = simulate(tr, preset, make_policy("admission", "baseline"))
    pred = simulate(tr, preset, make_policy("admission", "predict"))
    assert (pred.outcome != base.outcome).any()
    assert pred.metrics["rejected_at_arrival"] > base.metrics["rejected_at_arrival"]
    assert pred.metrics["rejected_after_prefill"] < base.metrics["rejected_after_prefill"]
