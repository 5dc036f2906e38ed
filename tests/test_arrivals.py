"""Arrival processes (``mooncake_gym.model.workload``: bursty and diurnal) and the windows of a
replayed trace, in the synthetic generator, in i.i.d. resampling and in ``PrefillRouting-v1``
(``arrivals=``, ``window_requests=``): exact values on small cases, the processes' rates on long
draws, the same numbers on both engines, the v0 numbers unchanged, and the checks of bad input."""

import hashlib
import math

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym import _engine
from mooncake_gym.model.workload import (BurstyArrivals, DiurnalArrivals, as_arrivals, resample_iid, synthetic_trace,
                                         trace_lines)

V1 = "mooncake_gym/PrefillRouting-v1"
BURSTY = {"burst_ratio": 3.0, "calm_s": 15.0, "burst_s": 5.0}
DIURNAL = {"amplitude": 0.8, "period_s": 60.0}


def digest(trace) -> str:
    return hashlib.sha256("\n".join(trace_lines(trace)).encode() + trace.arrival_s.tobytes()).hexdigest()


# -- the diurnal process -----------------------------------------------------------------------------
def test_the_diurnal_time_change_inverts_the_cumulative_rate():
    d = DiurnalArrivals(amplitude=0.5, period_s=4.0)
    # rate 1 - 0.5 cos(pi t / 2): its integral t - (1 / pi) sin(pi t / 2)
    t = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.5])
    s = np.array([0.0, 1.0 - 1.0 / math.pi, 2.0, 3.0 + 1.0 / math.pi, 4.0, 5.5 - math.sin(2.75 * math.pi) / math.pi])
    assert d.operational_time(t) == pytest.approx(s, abs=1e-15)
    assert d.real_time(s) == pytest.approx(t, abs=1e-12)
    assert d.multiplier([0.0, 1.0, 2.0]) == pytest.approx([0.5, 1.0, 1.5])
    # amplitude 0 is the identity: the Poisson arrivals unchanged, bit for bit
    s = np.cumsum(np.random.default_rng(0).exponential(1.0, 100))
    assert DiurnalArrivals(amplitude=0.0).real_time(s).tobytes() == s.tobytes()


def test_diurnal_arrivals_follow_the_sinusoid_and_keep_the_mean_rate():
    rate, period, amplitude = 10.0, 100.0, 0.5
    base = synthetic_trace(0, 4.0, duration_s=None, n_requests=300)
    t = resample_iid(base, 40_000, rate, 1, arrivals={"amplitude": amplitude, "period_s": period}).arrival_s
    assert len(t) / t[-1] == pytest.approx(rate, rel=0.02)
    phase = (t % period) / period
    trough = np.count_nonzero((phase < 0.125) | (phase >= 0.875))
    peak = np.count_nonzero((phase >= 0.375) & (phase < 0.625))
    # expected shares of a period: 1/4 -/+ amplitude sqrt(2) / (2 pi) of the mean's arrivals
    share = amplitude * math.sqrt(2.0) / (2.0 * math.pi)
    assert trough / len(t) == pytest.approx(0.25 - share, rel=0.05)
    assert peak / len(t) == pytest.approx(0.25 + share, rel=0.05)


def test_arrival_processes_move_only_the_arrivals():
    """The same requests as the Poisson draw of the seed, at other times (resampling and the generator)."""
    base = synthetic_trace(0, 4.0, duration_s=None, n_requests=300)
    plain = resample_iid(base, 500, 9.0, np.random.default_rng(5))
    for arrivals in (BURSTY, DIURNAL):
        shaped = resample_iid(base, 500, 9.0, np.random.default_rng(5), arrivals=arrivals)
        assert shaped.input_tokens.tolist() == plain.input_tokens.tolist()
        assert shaped.block_ids == plain.block_ids
        assert shaped.arrival_s.tolist() != plain.arrival_s.tolist() and np.all(np.diff(shaped.arrival_s) >= 0)
    plain = synthetic_trace(2, 5.0, duration_s=None, n_requests=400)
    shaped = synthetic_trace(2, 5.0, duration_s=None, n_requests=400, arrivals=DIURNAL)
    assert "diurnal 0.8 x 60s" in shaped.name
    assert len(shaped) == 400 and shaped.arrival_s.tolist() != plain.arrival_s.tolist()
    # the generator's sessions are the same: their first prompts, in order of session
    first = lambda tr: {s: n for s, n in zip(tr.session_ids.tolist()[::-1], tr.input_tokens.tolist()[::-1])}  # noqa: E731
    common = sorted(set(first(plain)) & set(first(shaped)))[:20]
    assert [first(plain)[s] for s in common] == [first(shaped)[s] for s in common]


def test_the_v0_arrivals_and_resampling_are_unchanged():
    """Digests made with the code before the diurnal process and the v1 arguments were added."""
    t = synthetic_trace(3, 6.0, duration_s=None, n_requests=400, arrivals=BURSTY)
    assert t.name == "synthetic(rate=6, seed=3, bursty 3x 5s/15s)"
    assert digest(t) == "7345b2857cae2dc45557edd8a85e8c2f63e2dadbe50ab5a1be82ba726a46034e"
    r = resample_iid(synthetic_trace(0, 4.0), 500, 9.0, np.random.default_rng(5))
    assert hashlib.sha256(r.arrival_s.tobytes() + r.input_tokens.tobytes()).hexdigest() == \
        "d69205e9da783fdb5aa25839941ed69491cf84d83ae727e902130a418df3dc3e"


def test_bad_arrival_processes_are_named():
    assert as_arrivals({"amplitude": 0.3}) == DiurnalArrivals(amplitude=0.3)
    assert as_arrivals({}) == BurstyArrivals() and as_arrivals(None) is None
    with pytest.raises(ValueError, match="amplitude"):
        DiurnalArrivals(amplitude=1.5)
    with pytest.raises(ValueError, match="period_s"):
        as_arrivals({"period_s": 0.0})
    with pytest.raises(ValueError, match="^arrivals: expected fields of BurstyArrivals .* or of DiurnalArrivals"):
        as_arrivals({"amplitude": 0.3, "burst_ratio": 2.0})
    with pytest.raises(ValueError, match="^arrivals: expected None"):
        as_arrivals("diurnal")


# -- PrefillRouting-v1 -------------------------------------------------------------------------------
def run(env, seed, options=None):
    """Every observation, reward and info of an episode routed to the instance with the smallest
    estimated TTFT (feature 5i+3), and the episode's trace."""
    obs, info = env.reset(seed=seed, options=options)
    trace = env.unwrapped.sim.trace
    out, done = [obs.tobytes(), repr(info)], False
    while not done:
        obs, reward, done, _, info = env.step(int(np.argmin(obs[3:5 * env.unwrapped.preset.n_prefill:5])))
        out += [obs.tobytes(), repr(reward), repr(info)]
    return out, trace


def _both(**kwargs):
    return [gym.make(V1, engine=e, **kwargs) for e in ("python", "native")]


@pytest.mark.skipif(_engine.native is None, reason="the native engine is not built")
@pytest.mark.parametrize("arrivals", [BURSTY, DIURNAL])
def test_v1_arrivals_give_the_same_episode_on_both_engines(arrivals):
    python, native = _both(load=0.6, episode_requests=250, arrivals=arrivals)
    plain = gym.make(V1, load=0.6, episode_requests=250)
    a, trace = run(python, 4)
    b, trace_b = run(native, 4)
    assert a == b and native.unwrapped._core is not None and trace_b.name == trace.name
    _, poisson = run(plain, 4)
    assert trace.input_tokens.tolist() == poisson.input_tokens.tolist()  # the same requests, moved
    assert trace.arrival_s.tolist() != poisson.arrival_s.tolist()
    # the mean rate is load x saturation, whatever the process
    assert f"@ {0.6 * plain.unwrapped.saturation.cluster_per_s:.3g}/s" in trace.name


@pytest.mark.skipif(_engine.native is None, reason="the native engine is not built")
def test_v1_window_of_a_trace_on_both_engines():
    base = synthetic_trace(0, 4.0, duration_s=None, n_requests=60)
    python, native = _both(trace=base, speed=2.0, window_requests=25)
    a, trace = run(python, 9, options={"offset": 7})
    b, _ = run(native, 9, options={"offset": 7})
    assert a == b and native.unwrapped._core is not None
    assert trace.input_tokens.tolist() == base.input_tokens[7:32].tolist()
    assert trace.arrival_s.tolist() == ((base.arrival_s[7:32] - base.arrival_s[7]) / 2.0).tolist()
    firsts = set()
    for seed in range(6):  # the offset drawn from the seed: the same on both engines
        a, ta = run(python, seed)
        b, tb = run(native, seed)
        assert a == b and ta.name == tb.name
        firsts.add(ta.name)
    assert len(firsts) > 1
    with pytest.raises(ValueError, match=r"^options\['offset'\]: expected an integer in \[0, 35\]"):
        python.reset(options={"offset": 36})


def test_v1_defaults_are_unchanged_by_the_new_arguments():
    """``arrivals=None`` and ``window_requests=None`` give the episodes of the env without them."""
    a, ta = run(gym.make(V1, load=0.5, episode_requests=120), 3)
    b, tb = run(gym.make(V1, load=0.5, episode_requests=120, arrivals=None, window_requests=None), 3)
    assert a == b and ta.arrival_s.tobytes() == tb.arrival_s.tobytes()


def test_v1_workload_arguments_are_checked():
    trace = synthetic_trace(0, 4.0, duration_s=None, n_requests=30)
    cases = [({"arrivals": BURSTY, "trace": trace}, "^arrivals: shapes the arrivals of a drawn workload"),
             ({"window_requests": 10}, r"^window_requests: replays a window of a trace; give trace= too"),
             ({"window_requests": 0, "trace": trace}, "^window_requests"),
             ({"window_requests": 2.5, "trace": trace}, "^window_requests"),
             ({"arrivals": {"amplitude": 2.0}}, "amplitude"),
             ({"arrivals": [1, 2]}, "^arrivals: expected None")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            gym.make(V1, **kwargs)
    env = gym.make(V1, load=0.5, episode_requests=50)
    with pytest.raises(ValueError, match="^options: unknown key 'offset'"):
        env.reset(options={"offset": 3})


@pytest.mark.skipif(_engine.native is None, reason="the native engine is not built")
def test_v0_takes_diurnal_sessions_on_both_engines():
    """``PrefillRouting-v0``'s ``arrivals`` accepts the diurnal process too (the same generator call)."""
    runs = []
    for engine in ("python", "native"):
        env = gym.make("mooncake_gym/PrefillRouting-v0", rate=6.0, episode_requests=200, arrivals=DIURNAL, engine=engine)
        obs, _ = env.reset(seed=2)
        assert "diurnal 0.8 x 60s" in env.unwrapped.sim.trace.name and env.unwrapped.engine == engine
        assert (type(env.unwrapped.sim).__name__ == "NativeRoutingSimulator") == (engine == "native")
        out, done = [], False
        while not done:
            obs, reward, done, _, info = env.step(int(np.argmin(obs[3:40:5])))
            out += [obs.tobytes(), repr(reward), repr({k: v for k, v in info.items() if k != "action_mask"})]
        runs.append(out)
    assert runs[0] == runs[1]


# -- OverloadAdmission-v1 and Conductor-v1 take the same arguments (ClusterEnv) -------------------------
ADMISSION_V1, CONDUCTOR_V1 = "mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1"


def run_admission(env, seed, options=None):
    """Every observation, reward and info of an episode decided by Algorithm 1's TTFT check, and its trace."""
    obs, info = env.reset(seed=seed, options=options)
    u = env.unwrapped
    trace = u.sim.trace
    out, done = [obs.tobytes(), repr(info)], False
    while not done:
        view = u.decision_view()
        obs, reward, done, _, info = env.step(u.encode_action(view.predicted_ttft_s <= view.ttft_slo_s))
        out += [obs.tobytes(), repr(reward), repr(info)]
    return out, trace


@pytest.mark.skipif(_engine.native is None, reason="the native engine is not built")
@pytest.mark.parametrize("env_id", [ADMISSION_V1, CONDUCTOR_V1])
def test_admission_and_conductor_take_arrivals_and_windows_on_both_engines(env_id):
    python, native = [gym.make(env_id, engine=e, load=1.5, episode_requests=200, arrivals=DIURNAL)
                      for e in ("python", "native")]
    a, trace = run_admission(python, 4)
    b, _ = run_admission(native, 4)
    assert a == b and native.unwrapped._core is not None
    _, poisson = run_admission(gym.make(env_id, load=1.5, episode_requests=200), 4)
    assert trace.input_tokens.tolist() == poisson.input_tokens.tolist()  # the same requests, moved
    assert trace.arrival_s.tolist() != poisson.arrival_s.tolist() and "diurnal 0.8 x 60s" in trace.name
    base = synthetic_trace(0, 4.0, duration_s=None, n_requests=60)
    python, native = [gym.make(env_id, engine=e, trace=base, speed=2.0, window_requests=25) for e in ("python", "native")]
    a, trace = run_admission(python, 9, options={"offset": 7})
    b, _ = run_admission(native, 9, options={"offset": 7})
    assert a == b
    assert trace.input_tokens.tolist() == base.input_tokens[7:32].tolist()
    assert trace.arrival_s.tolist() == ((base.arrival_s[7:32] - base.arrival_s[7]) / 2.0).tolist()
    with pytest.raises(ValueError, match=r"^options\['offset'\]: expected an integer in \[0, 35\]"):
        python.reset(options={"offset": 36})
    with pytest.raises(ValueError, match=r"^window_requests: replays a window of a trace; give trace= too"):
        gym.make(env_id, window_requests=10)
    with pytest.raises(ValueError, match="^options: unknown key 'offset'"):
        gym.make(env_id, load=1.5, episode_requests=50).reset(options={"offset": 3})
    # the defaults' episodes are unchanged by the new arguments
    plain, _ = run_admission(gym.make(env_id, load=1.5, episode_requests=80), 3)
    assert plain == run_admission(gym.make(env_id, load=1.5, episode_requests=80, arrivals=None,
                                           window_requests=None), 3)[0]
