"""The v1 admission objective (issue 13): token goodput without the drain, per-class acceptance, the
output-length prediction, the v1 baselines, the token-goodput bound and the admission scenarios."""

import math

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments and scenarios)
from mooncake_gym.baselines import ADMISSION_V1_POLICIES
from mooncake_gym.baselines.admission import decode_load_with
from mooncake_gym.analysis.bounds import admission_goodput_bound
from mooncake_gym.evaluation.problems import admission_bound as admission_bound_row
from mooncake_gym.sim.cluster import COMPLETED, LENGTH_CLASSES, length_class_of, simulate
from mooncake_gym.envs import ADMISSION_V1_ENV_ID, OverloadAdmissionV1Env
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.model.prediction import predict_output_tokens
from mooncake_gym.model.presets import get_preset
from mooncake_gym.reporting.tables import ADMISSION_V1_COLUMNS
from mooncake_gym.evaluation.scenarios import make, scenarios_of
from test_conductor import trace_of  # the hand-built traces of the simulator's tests

ONE = get_preset("mooncake").with_(n_prefill=1, n_decode=1)


def episode(env, trace, actions):
    """Run ``actions`` (1 admit, 0 reject) on ``trace``; (return, final info)."""
    env.reset(seed=0, options={"trace": trace})
    total = 0.0
    for a in actions:
        _, r, term, _, info = env.step(a)
        total += r
    assert term
    return total, info


# --- token goodput, the drain, per-class acceptance, on hand-built traces ---------------------------
def test_token_goodput_counts_good_requests_that_started_decoding_by_the_last_arrival():
    # the TTFT SLO (2 s) sits between the prefill of 1,000 and of 40,000 tokens: the long prompt
    # completes late; the last request (the horizon, 50 s) starts decoding after it: drain, not counted
    p1000, p40k = ONE.prefill_cost.prefill_s(1000, 0), ONE.prefill_cost.prefill_s(40000, 0)
    assert p1000 < 2.0 < p40k
    preset = ONE.with_(ttft_slo_s=2.0)
    trace = trace_of((0.0, 1000, 50), (10.0, 40000, 300), (20.0, 1000, 450), (50.0, 1000, 20))
    m = simulate(trace, preset).metrics
    assert (m["completed"], m["goodput"], m["goodput_tokens"]) == (4, 3, 50 + 450 + 20)
    assert (m["token_goodput"], m["goodput_requests"], m["drain_goodput_tokens"]) == (50 + 450, 2, 20)
    # classes: 50 and 20 short, 300 medium, 450 long; counted: 50 (short) and 450 (long)
    assert (m["accepted_short"], m["accepted_medium"], m["accepted_long"]) == (0.5, 0.0, 1.0)


def test_length_classes_and_their_boundaries():
    assert [c[0] for c in LENGTH_CLASSES] == ["short", "medium", "long"]
    assert length_class_of([1, 100, 101, 400, 401, 5000]).tolist() == [0, 0, 1, 1, 2, 2]
    m = simulate(trace_of((0.0, 1000, 50), (100.0, 1000, 20)), ONE).metrics
    assert math.isnan(m["accepted_medium"]) and math.isnan(m["accepted_long"])  # no request of the class


def test_a_policy_gains_nothing_by_queueing_work_past_the_last_arrival():
    # the second request arrives last (the horizon): admitting it adds work that only the drain serves
    env = OverloadAdmissionV1Env(preset=ONE)
    trace = trace_of((0.0, 1000, 40), (10.0, 1000, 30))
    admit_all, info_all = episode(env, trace, [1, 1])
    admit_first, info_first = episode(env, trace, [1, 0])
    m_all, m_first = info_all["metrics"], info_first["metrics"]
    assert m_all["goodput_tokens"] == 70 and m_first["goodput_tokens"] == 40  # the drain would pay 30
    assert m_all["token_goodput"] == m_first["token_goodput"] == 40
    assert admit_all == admit_first == pytest.approx(40 / env.mean_output_tokens, rel=1e-12)


def test_return_is_the_metric_on_a_full_episode():
    env = gym.make(ADMISSION_V1_ENV_ID, load=3.0, episode_requests=300).unwrapped
    m = evaluate(ADMISSION_V1_ENV_ID, ADMISSION_V1_POLICIES["baseline"](), [3], load=3.0, episode_requests=300)[0]
    expected = m["token_goodput"] / env.mean_output_tokens - 0.1 * m["wasted_prefill_s"] / env.mean_prefill_s
    assert m["return"] == pytest.approx(expected, rel=1e-9)
    assert m["drain_goodput_tokens"] > 0  # the drain exists on this episode, and is left out
    assert m["wasted_prefill_gpu_s"] == pytest.approx(8 * m["wasted_prefill_s"], rel=1e-12)


def test_conductor_takes_an_admission_policys_bool():
    env = gym.make("mooncake_gym/Conductor-v1", episode_requests=20).unwrapped
    env.reset(seed=0)
    route = env.decision_view().default_route
    assert env.encode_action(True).tolist() == [1, route[0], int(route[1]), env.preset.n_decode]
    assert env.encode_action(False)[0] == 0


def test_token_goodput_is_the_sum_over_the_per_request_outcomes():
    env = gym.make(ADMISSION_V1_ENV_ID, load=2.0, episode_requests=300).unwrapped
    env.reset(seed=5)
    res = simulate(env.sim.trace, env.preset, admission=lambda v: v.predicted_ttft_s <= v.ttft_slo_s)
    p, out = env.preset, env.sim.trace.output_tokens
    good = ((res.outcome == COMPLETED) & (res.ttft_s <= p.ttft_slo_s) & (res.tbt_s <= p.tbt_slo_s)
            & (res.decode_start_s <= env.sim.trace.arrival_s[-1]))
    assert res.metrics["token_goodput"] == int(out[good].sum()) and res.metrics["goodput_requests"] == int(good.sum())
    assert 0 < res.metrics["goodput_requests"] < res.metrics["completed"]  # TBT misses exist under overload


# --- the prediction feature ---------------------------------------------------------------------------
def test_predictor_is_lognormal_multiplicative_error():
    out = np.array([10, 100, 1000])
    pred = predict_output_tokens(out, 0.5, np.random.default_rng(3))
    assert np.array_equal(pred, out * np.exp(0.5 * np.random.default_rng(3).standard_normal(3)))
    assert np.array_equal(predict_output_tokens(out, 0.0, np.random.default_rng(3)), out)
    with pytest.raises(ValueError, match="prediction_sigma"):
        predict_output_tokens(out, -0.1, np.random.default_rng(3))


def test_prediction_feature_exact_with_sigma_zero():
    env = OverloadAdmissionV1Env(preset=ONE, prediction=True, prediction_sigma=0.0)
    obs, _ = env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 50), (1.0, 1000, 700))})
    assert env.observation_space.shape == (5 + 2 + 4 + 3 + 1,)
    assert obs[-1] == np.float32(math.log1p(50) / math.log1p(4096))
    assert env.decision_view().predicted_output_tokens == 50.0
    obs, *_ = env.step(1)
    assert obs[-1] == np.float32(math.log1p(700) / math.log1p(4096))


def predictions(seed, **kwargs):
    env = gym.make(ADMISSION_V1_ENV_ID, episode_requests=50, prediction=True, **kwargs).unwrapped
    env.reset(seed=seed)
    return env.sim.trace, np.array(env.sim.predicted_output)


def test_prediction_is_seeded_by_the_episode_and_leaves_the_workload_alone():
    trace, a = predictions(1)
    _, b = predictions(1)
    _, c = predictions(2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    z = np.log(a / trace.output_tokens) / 0.5
    assert abs(z.mean()) < 0.5 and 0.6 < z.std() < 1.4  # standard normal errors, 50 of them
    plain = gym.make(ADMISSION_V1_ENV_ID, episode_requests=50).unwrapped
    plain.reset(seed=1)
    assert np.array_equal(plain.sim.trace.output_tokens, trace.output_tokens)
    assert np.array_equal(plain.sim.trace.arrival_s, trace.arrival_s)
    with pytest.raises(ValueError, match="prediction"):
        gym.make(ADMISSION_V1_ENV_ID, prediction=1)


# --- baselines and the bound ----------------------------------------------------------------------
def test_size_rules_need_their_length_in_the_view():
    env = gym.make(ADMISSION_V1_ENV_ID, episode_requests=50).unwrapped
    env.reset(seed=0)
    for name, need in (("size_oracle", "oracle=True"), ("context_predicted", "prediction=True")):
        with pytest.raises(ValueError, match=need):
            ADMISSION_V1_POLICIES[name]()(env.decision_view())


def test_footprint_rule_decides_by_the_footprint_when_loaded():
    rule = ADMISSION_V1_POLICIES["size_oracle"](low=0.6, high=0.9, max_footprint=50_000)
    env = OverloadAdmissionV1Env(preset=ONE.with_(decode_capacity_tokens=4000), oracle=True)
    env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 50), (0.3, 1500, 60), (0.4, 1500, 30),
                                                  (0.5, 3000, 5))})
    decisions, loads = [], []
    for _ in range(4):
        v = env.decision_view()
        loads.append(decode_load_with(v, v.input_tokens + v.output_tokens))
        decisions.append(rule(v))
        env.step(int(decisions[-1]))
    # an empty pool admits anything; loaded (0.6 < load <= 0.9): footprint 1560 x 60 = 93,600 is
    # rejected and 1530 x 30 = 45,900 admitted; over 0.9 nothing
    assert loads[0] < 0.6 < loads[1] <= 0.9 and 0.6 < loads[2] <= 0.9 and loads[3] > 0.9
    assert decisions == [True, False, True, False]


@pytest.mark.parametrize("load", [2.0, 3.0])
def test_no_baseline_beats_the_bound(load):
    kwargs = {"load": load, "episode_requests": 300, "prediction": True, "oracle": True}
    seeds = [1_000_000, 1_000_001]
    bound = [admission_goodput_bound(*trace_and_preset(kwargs, s)) for s in seeds]
    for name, factory in ADMISSION_V1_POLICIES.items():
        for m, b in zip(evaluate(ADMISSION_V1_ENV_ID, factory(), seeds, **kwargs), bound):
            assert m["token_goodput"] <= b.token_goodput and m["goodput_requests"] <= b.goodput_requests, name
    row = admission_bound_row(ADMISSION_V1_ENV_ID, kwargs, seeds)
    assert row["token_goodput"] == pytest.approx(np.mean([b.token_goodput for b in bound]))
    assert row["per_seed"] == {"token_goodput": [b.token_goodput for b in bound],
                               "good_requests": [b.goodput_requests for b in bound]}  # each seed's, as the rules' rows
    assert {k for k, _, _ in ADMISSION_V1_COLUMNS} >= {k for k in row if k not in ("episodes", "per_seed")
                                                      and not k.endswith("_ci95")}


def trace_and_preset(kwargs, seed):
    env = gym.make(ADMISSION_V1_ENV_ID, **kwargs).unwrapped
    env.reset(seed=seed)
    return env.sim.trace, env.preset


def test_bound_on_hand_built_traces():
    # alone, a feasible request is bounded by its own output; one whose prefill alone exceeds the TTFT
    # SLO, or that arrives last (its decode cannot start by the horizon), by nothing
    preset = ONE.with_(ttft_slo_s=2.0)
    b = admission_goodput_bound(trace_of((0.0, 1000, 50), (10.0, 40000, 300), (20.0, 1000, 450), (50.0, 1000, 20)),
                                preset)
    assert (b.token_goodput, b.goodput_requests, b.feasible) == (pytest.approx(500), pytest.approx(2), 2)
    # the decode charge a1 b + c K never exceeds an iteration's time
    cost = preset.decode_cost
    a1 = (cost.decode_step_coefficients(2 << 20)[0] - cost.decode_step_coefficients(1 << 20)[0]) / (1 << 20)
    assert all(cost.decode_step_coefficients(n)[0] >= a1 * n for n in (1, 2, 10, 100, 1000, 10**4, 10**5))
    with pytest.raises(ValueError, match="preset"):
        admission_goodput_bound(trace_of((0.0, 1000, 50)), "lecture")


# --- scenarios --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", [s.name for s in scenarios_of("admission") + scenarios_of("conductor")])
def test_admission_and_conductor_scenarios_build_and_run_a_baseline(scenario):
    env = make(scenario, episode_requests=60).unwrapped
    assert env.prediction and env.prediction_sigma == 0.5
    m = evaluate(env.spec.id, ADMISSION_V1_POLICIES["early"](), [0], episode_requests=60)[0]
    assert m["requests"] == 60 and m["token_goodput"] >= 0 and m["steps"] == 60 - m["refused_too_long"]


def test_the_admission_rules_knobs_reach_the_conductors_admission_decision():
    """On conductor-mooncake every admission rule at its defaults and over its tuning grid gives the
    same goodput (docs/leaderboard.md). Not a lost knob: the env admits exactly what the rule answers,
    and a knob changes the episode once it reaches the decode load of that cluster, whose 8 decode
    instances stay below 0.28 of their KV or TBT (the grids' ``low`` starts at 0.5)."""
    from mooncake_gym.evaluation.problems import get as get_problem
    from mooncake_gym.evaluation.scenarios import get_scenario

    sc = get_scenario("conductor-mooncake")
    kw = {**sc.config(), "episode_requests": 300}
    problem = get_problem("admission-v1")
    env = gym.make(sc.base_env_id, **kw)
    env.reset(seed=0)
    u, rule, loads, done = env.unwrapped, problem.policy("context_predicted").policy, [], False
    while not done:
        view = u.decision_view()
        loads.append(decode_load_with(view, view.input_tokens + view.predicted_output_tokens))
        admit = rule(view)
        _, _, done, _, info = env.step(u.encode_action(admit))
        assert info["admitted"] == admit
    assert 0.19 < min(loads) and max(loads) < 0.28
    goodput = {}
    for low, high in ((0.7, 0.9), (0.5, 0.8), (0.2, 0.25)):
        e = evaluate(sc.base_env_id, problem.policy("context_predicted", low=low, high=high, max_footprint=4000),
                     [0], **kw)[0]
        goodput[low] = (e["token_goodput"], e["rejected_at_arrival"])
    assert goodput == {0.7: (21087, 1), 0.5: (21087, 1), 0.2: (12953, 224)}
