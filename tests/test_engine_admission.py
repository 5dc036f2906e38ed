"""``OverloadAdmission-v0`` on the native engine (``AdmissionEnv``, ``_engine/admission.hpp``) against the
Python reference (``envs/overload_admission.py`` over ``sim/admission.py`` ``LectureAdmission``): tiny
hand-made episodes with their exact observations, rewards and infos; whole episodes of both engines
compared bit for bit (observations as bytes, rewards, flags, infos with their types, final metrics,
the decision views) over seeds, loads and the env's options; generated action sequences and env
arguments; pickling, copies, rendering and the engine switch."""

from __future__ import annotations

import copy
import math
import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mooncake_gym  # noqa: F401  (registers the ids)
from mooncake_gym import _engine
from mooncake_gym._engine.cluster import NativeClusterSimulator
from mooncake_gym.envs import overload_admission
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.workload import Request, Trace
from mooncake_gym.sim.admission import ADMISSION_VIEW_FIELDS, OverloadConfig, simulate
from mooncake_gym.sim.cluster import ClusterSimulator
from test_engine_v1envs import assert_same_info, same  # values and types, NaN equal to NaN; infos with metrics

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built")

ADMISSION = "mooncake_gym/OverloadAdmission-v0"
F32 = np.float32


def assert_same_view(a, b, step) -> None:
    """Two AdmissionViews, field by field (the simulator aside), values and types."""
    assert (a is None) == (b is None), step
    if a is None:
        return
    for name in ADMISSION_VIEW_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, tuple):
            assert type(y) is tuple and len(x) == len(y) and all(same(u, v) for u, v in zip(x, y)), (step, name, x, y)
        else:
            assert same(x, y), (step, name, x, y)


def make_pair(**kwargs):
    native = gym.make(ADMISSION, engine="native", **kwargs).unwrapped
    ref = gym.make(ADMISSION, engine="python", **kwargs).unwrapped
    return native, ref


def run_both(seed, decide, options=None, views=False, **kwargs) -> dict:
    """Both engines through one whole episode with the actions ``decide(view, rng)`` gives on the
    reference's decision view, compared step by step; returns the native episode's final metrics."""
    native, ref = make_pair(**kwargs)
    (on, info_n), (orf, info_r) = native.reset(seed=seed, options=options), ref.reset(seed=seed, options=options)
    assert native._core is not None and type(native.sim.cluster) is NativeClusterSimulator
    assert ref._core is None and type(ref.sim.cluster) is ClusterSimulator
    assert on.dtype == orf.dtype == F32 and on.tobytes() == orf.tobytes()
    assert_same_info(info_n, info_r, -1)
    rng = np.random.default_rng(seed)
    step, terminated = 0, False
    while not terminated:
        if views:
            assert_same_view(native.decision_view(), ref.decision_view(), step)
        action = decide(ref.decision_view(), rng)
        on, rn, terminated, tn, info_n = native.step(action)
        orf, rr, tr, trr, info_r = ref.step(action)
        assert on.tobytes() == orf.tobytes(), (step, on, orf)
        assert type(rn) is type(rr) is float and rn == rr, (step, rn, rr)
        assert (terminated, tn) == (tr, trr)
        assert_same_info(info_n, info_r, step)
        step += 1
    assert native.decision_view() is None and ref.decision_view() is None
    return info_n["metrics"]


def admit_share(p):
    return lambda view, rng: int(rng.random() < p)


def baseline(view, rng):  # the lecture's TTFT check
    return int(view.predicted_ttft_s <= view.ttft_slo_s)


# -- tiny hand-made episodes ----------------------------------------------------------------------------
COST = CostModel.preset("llama2-70b")
P = {n: COST.prefill_s(n, 0) for n in (500, 1000, 2000)}
#: one prefill and one decode instance of 3,000 tokens: r0 (1,000 + 20 tokens) decodes for 1 s from the end
#: of its prefill; r1 (2,000 + 40) arrives halfway through r0's prefill, queues behind it and is rejected
#: after its prefill (r0 still holds 1,020 tokens); r2 (500 + 10) arrives 0.1 s after that and fits.
T1 = P[1000] / 2
T2 = P[1000] + P[2000] + 0.1
TINY = Trace.from_requests([Request(0.0, 1000, 20, ()), Request(T1, 2000, 40, ()), Request(T2, 500, 10, ())])
TINY_KW = {"trace": TINY, "n_prefill": 1, "n_decode": 1, "decode_capacity_tokens": 3000}


def tiny_expected(slo: float):
    """The three observations, rewards and infos of TINY with every request admitted, worked by hand."""
    env = gym.make(ADMISSION, engine="python", ttft_slo_s=slo, **TINY_KW).unwrapped
    mps, rate = env.mean_prefill_s, env.capacity_rate
    p0, p1, p2 = P[1000], P[2000], P[500]
    mean_out = (20 + 40 + 10) / 3
    log_cap = math.log1p(200_000)
    assert p1 + 0.1 + p2 < 20 * 0.05 and T2 + p2 < 0.0 + p0 + mean_out * 0.05  # r0 still there in r2's projections
    ttft1 = (p0 - T1) + p1
    doomed = ttft1 > slo
    obs = [
        # r0: an empty cluster
        [0.0, 0.0, 0.0, p0 / (1.5 * slo), 1.0, (1000 + mean_out) / 3000, math.log1p(1000) / log_cap, 0.0, 0.0,
         0.0, float(p0 > slo)],
        # r1: r0 in prefill (queue p0 - T1) and, finishing before r1's prefill ends, projected in decode then
        [0.0, (1000 + mean_out) / 3000, (1000 + mean_out) / 3000, ttft1 / (1.5 * slo), 1.0,
         (2000 + mean_out) / 3000, math.log1p(2000) / log_cap, 0.0, 0.0, 1 / 20, float(doomed)],
        # r2: r0 decoding (1,020 tokens, still there at r2's prefill end by both projections); r1 rejected
        # after prefill at p0 + p1 (in the 30-s window: one rejection, p1 s wasted)
        [1020 / 3000, 1020 / 3000, 1020 / 3000, p2 / (1.5 * slo), (3000 - 1020) / 3000, (500 + mean_out) / 3000,
         math.log1p(500) / log_cap, 1 / (30 * rate), p1 / (30 * 1), 0.0, float(p2 > slo)],
    ]
    # r0 is granted its slot at p0, between the decisions on r1 and r2; r2 after the last one (drained)
    wasted1 = 0.0 if doomed else p1
    rewards = [0.0, 1 - 0.1 * ((p1 if doomed else 0.0) + wasted1) / mps, 1.0]
    infos = [
        {"index": 0, "admitted": True, "granted": 0, "doomed_s": 0.0, "wasted_s": 0.0, "completed": 0,
         "rejected_at_arrival": 0, "rejected_after_prefill": 0},
        {"index": 1, "admitted": True, "granted": 1, "doomed_s": p1 if doomed else 0.0, "wasted_s": wasted1,
         "completed": 1, "rejected_at_arrival": 0, "rejected_after_prefill": 1},
        {"index": 2, "admitted": True, "granted": 1, "doomed_s": 0.0, "wasted_s": 0.0, "completed": 2,
         "rejected_at_arrival": 0, "rejected_after_prefill": 1},
    ]
    return [np.array(o, F32) for o in obs], rewards, infos


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("doomed", [False, True])
def test_tiny_episode_worked_by_hand(engine, doomed):
    # doomed: an SLO under r1's predicted TTFT (so r1's prefill is charged at its admission, and not again
    # when it is rejected after prefill) but over r0's and r2's
    slo = 0.9 * ((P[1000] - T1) + P[2000]) if doomed else 30.0
    assert (P[1000] - T1) + P[2000] > slo > P[1000] or not doomed
    obs, rewards, infos = tiny_expected(slo)
    env = gym.make(ADMISSION, engine=engine, ttft_slo_s=slo, **TINY_KW).unwrapped
    o, info = env.reset(seed=0)
    assert (env._core is not None) == (engine == "native")
    assert info["requests"] == 3 and math.isnan(info["load"])
    for k in range(3):
        assert o.tobytes() == obs[k].tobytes(), (k, o, obs[k])
        o, r, terminated, truncated, info = env.step(1)
        m = info.pop("metrics", None)
        assert r == rewards[k] and info == infos[k] and [type(v) for v in info.values()] == \
            [type(v) for v in infos[k].values()], (k, r, rewards[k], info, infos[k])
        assert terminated == (k == 2) and not truncated
    assert not o.any() and o.dtype == F32
    assert m["completed"] == 2 and m["goodput"] == 2 and m["rejected_after_prefill"] == 1
    assert m["wasted_prefill_s"] == P[2000]


@pytest.mark.parametrize("engine", ["native", "python"])
def test_tiny_rejection_at_arrival_enters_the_window(engine):
    env = gym.make(ADMISSION, engine=engine, **TINY_KW).unwrapped
    env.reset(seed=0)
    _, r, _, _, info = env.step(0)  # r0 rejected at arrival
    assert r == 0.0 and info["rejected_at_arrival"] == 1 and info["admitted"] is False
    view = env.decision_view()
    assert view.index == 1 and view.recent_rejected == 1 and view.recent_rejected_after_prefill == 0
    assert view.prefill_queue_s == (0.0,) and view.predicted_ttft_s == P[2000]
    o, _, _, _, _ = env.step(1)
    # at r2's arrival r1 has been prefilled (from T1, the queue empty) and decodes its 2,040 tokens
    assert o[7] == F32(1 / (30 * env.capacity_rate)) and o[0] == F32(2040 / 3000)


# -- whole episodes, both engines ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("load", [1.0, 2.0, 3.5])
def test_whole_episodes_bitwise_equal(seed, load):
    m = run_both(seed, admit_share(0.7), load=load, episode_requests=600, views=seed == 0)
    assert m["requests"] == 600 and m["completed"] > 0


@pytest.mark.parametrize("kwargs", [
    {},  # the default episode: 2,000 requests at load 2
    {"oracle": True, "load": 2.5, "episode_requests": 800},
    {"load_range": (1.0, 3.0), "episode_requests": 500, "waste_penalty": 0.7},
    {"n_prefill": 3, "n_decode": 2, "decode_capacity_tokens": 30_000, "tbt_s": 0.03, "ttft_slo_s": 10.0,
     "episode_requests": 700},
    {"model": "llama3-8b", "episode_requests": 400, "load": 1.5},
])
def test_whole_episodes_with_options_bitwise_equal(kwargs):
    run_both(3, admit_share(0.8), **kwargs)
    run_both(4, baseline, views=True, **kwargs)


def test_replayed_trace_and_reset_option_bitwise_equal():
    base = gym.make(ADMISSION, engine="python", episode_requests=300).unwrapped
    base.reset(seed=7)
    trace = base.sim.trace
    run_both(0, admit_share(0.5), trace=trace, speed=1.7)
    run_both(1, baseline, options={"trace": trace}, views=True, episode_requests=50)


def test_baseline_through_the_native_env_equals_simulate():
    env = gym.make(ADMISSION, engine="native", episode_requests=500).unwrapped
    env.reset(seed=11)
    trace = env.sim.trace
    terminated = False
    while not terminated:
        _, _, terminated, _, info = env.step(baseline(env.decision_view(), None))
    ref = simulate(trace, lambda v: v.predicted_ttft_s <= v.ttft_slo_s, env.config, env.cost).metrics
    for k, v in info["metrics"].items():
        if k != "policy":
            assert same(v, ref[k]), (k, v, ref[k])


def test_views_projections_equal_the_reference():
    native, ref = make_pair(episode_requests=300, load=2.5)
    native.reset(seed=5)
    ref.reset(seed=5)
    rng = np.random.default_rng(5)
    for step in range(250):
        vn, vr = native.decision_view(), ref.decision_view()
        at = vr.predicted_prefill_finish + rng.uniform(-20, 60)
        expect = ref.sim.cluster.decode_token_projections(at, vr.mean_decode_s)
        assert native._core.projections(at, vr.mean_decode_s) == expect
        assert vn.project_decode_tokens(at) == vr.project_decode_tokens(at)  # (the native cluster's, in Python)
        assert vn.expected_decode_tokens(at) == vr.expected_decode_tokens(at)
        a = int(rng.random() < 0.75)
        native.step(a)
        ref.step(a)


# -- generated action sequences and arguments ----------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n_prefill=st.integers(1, 4), n_decode=st.integers(1, 3),
       capacity=st.sampled_from([8_000, 20_000, 60_000]), tbt_s=st.sampled_from([0.01, 0.05, 0.2]),
       slo=st.sampled_from([0.5, 5.0, 30.0]), load=st.floats(0.3, 6.0), requests=st.integers(1, 80),
       oracle=st.booleans(), penalty=st.sampled_from([0.0, 0.1, 2.0]),
       actions=st.lists(st.integers(0, 1), min_size=1, max_size=80))
def test_generated_episodes_bitwise_equal(seed, n_prefill, n_decode, capacity, tbt_s, slo, load, requests, oracle,
                                          penalty, actions):
    kwargs = {"n_prefill": n_prefill, "n_decode": n_decode, "decode_capacity_tokens": capacity, "tbt_s": tbt_s,
              "ttft_slo_s": slo, "load": load, "episode_requests": requests, "oracle": oracle,
              "waste_penalty": penalty}
    k = iter(range(10**6))
    run_both(seed, lambda view, rng: actions[next(k) % len(actions)], views=True, **kwargs)


# -- pickling, copies, rendering, the switch ---------------------------------------------------------------
@pytest.mark.parametrize("clone", [lambda e: pickle.loads(pickle.dumps(e)), copy.deepcopy])
def test_a_native_episode_pickles_and_copies_mid_episode(clone):
    env = gym.make(ADMISSION, engine="native", episode_requests=200).unwrapped
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, 200).tolist()
    for a in actions[:90]:
        env.step(a)
    twin = clone(env)
    assert twin._core is not None and twin._core is not env._core
    assert twin._obs is not env._obs
    assert_same_view(twin.decision_view(), env.decision_view(), 90)
    for step, a in enumerate(actions[90:]):
        o1, r1, t1, _, i1 = env.step(a)
        o2, r2, t2, _, i2 = twin.step(a)
        assert o1.tobytes() == o2.tobytes() and r1 == r2 and t1 == t2
        assert_same_info(i1, i2, step)
        if t1:
            break
    assert t1
    fresh = clone(gym.make(ADMISSION, engine="native").unwrapped)  # never reset
    assert fresh.sim is None and fresh.engine == "native"


@pytest.mark.parametrize("mode", ["ansi", "rgb_array"])
def test_render_on_the_native_engine_equals_the_reference(mode):
    native, ref = make_pair(episode_requests=40, render_mode=mode)
    native.reset(seed=2)
    ref.reset(seed=2)
    terminated = False
    rng = np.random.default_rng(1)
    while True:
        a, b = native.render(), ref.render()
        assert (a == b) if mode == "ansi" else (a.dtype == b.dtype and a.tobytes() == b.tobytes())
        if terminated:
            break
        action = int(rng.random() < 0.6)
        terminated = native.step(action)[2]
        ref.step(action)


def test_engine_switch_and_fallback(monkeypatch):
    assert gym.make(ADMISSION).unwrapped.engine == "native"  # the default where the engine is built
    env = gym.make(ADMISSION, engine="python").unwrapped
    env.reset(seed=0)
    assert env.engine == "python" and env._core is None and type(env.sim.cluster) is ClusterSimulator
    with pytest.raises(ValueError, match="^engine: "):
        gym.make(ADMISSION, engine="fast")
    # where the engine cannot run the env's prefill times: the default runs the reference, "native" says why
    monkeypatch.setattr(overload_admission, "prefill_disagrees", lambda prefill: "a made-up disagreement")
    assert gym.make(ADMISSION).unwrapped.engine == "python"
    with pytest.raises(ValueError, match="^engine: 'native' cannot run this environment: a made-up disagreement"):
        gym.make(ADMISSION, engine="native")


def test_stepping_errors_on_the_native_engine():
    env = gym.make(ADMISSION, engine="native", trace=TINY).unwrapped
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)
    env.reset(seed=0)
    for bad in (2, -1, 0.5, "1"):
        with pytest.raises(ValueError, match="^action: "):
            env.step(bad)
    for _ in range(3):
        env.step(np.int64(1))
    with pytest.raises(RuntimeError, match="terminated; call reset"):
        env.step(1)
    assert env.reset(seed=0)[0].tobytes() == gym.make(ADMISSION, engine="python", trace=TINY).unwrapped.reset(
        seed=0)[0].tobytes()


def test_config_of_the_engine_matches_the_reference():
    # the native core's constants are the env's and LectureAdmission's own
    env = gym.make(ADMISSION, engine="native", n_prefill=2, n_decode=3).unwrapped
    env.reset(seed=0)
    assert env.config == OverloadConfig(n_prefill=2, n_decode=3)
    assert env._core.n_obs == 11 and env.sim.cluster._cluster.used() == [0, 0, 0]


@pytest.mark.parametrize("model", ["llama2-70b", "opt-13b", "llama3-70b", "llama3-8b"])
def test_the_engines_prefill_times_are_the_pools(model):
    # the native core computes each request's prefill time itself (LectureAdmission's prefill_s, the
    # pool's uncached_prefill_s(0) on the reference)
    native, ref = make_pair(model=model, episode_requests=500)
    native.reset(seed=9)
    ref.reset(seed=9)
    expect = ref.sim.cluster.prefill.uncached_prefill_s(0)
    assert native._core.prefill_times() == expect and native.sim._prefill_times() == expect
    assert [type(x) for x in native.sim._prefill_times()] == [float] * 500
    assert native.sim.result("x").prefill_s.tobytes() == ref.sim.result("x").prefill_s.tobytes()
