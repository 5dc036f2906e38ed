"""The Gymnasium environments (issue 5): API contracts, determinism, exactness against the simulators.

The contract tests run on every entry of ``ENV_CASES``; adding an environment is one more entry
(its id and small, fast constructor arguments). The tests after them are specific to one env:
constructor checks, rewards, info, exact values on a hand-built trace and equality of every
baseline's metrics through the env and through the simulator's ``simulate``
(``routing.simulate`` for ``PrefillRouting-v0``, ``overload.simulate`` for ``OverloadAdmission-v0``,
whose return is also checked to track goodput across the baselines).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from conftest import pickle_round_trip
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import mooncake_gym  # noqa: F401  (registers the ids)
from mooncake_gym.baselines import ADMISSION_POLICIES, ROUTING_POLICIES, make_policy
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.envs import ADMISSION_ENV_ID, ROUTING_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.sim.admission import COMPLETED, OverloadConfig, overload_workload
from mooncake_gym.sim.admission import simulate as simulate_overload
from mooncake_gym.sim.routing import Route, RoutingConfig, simulate
from mooncake_gym.model.workload import Request, Trace, read_trace, synthetic_trace, write_trace

#: (env id, constructor kwargs): small, fast settings of every environment under test.
ENV_CASES: list[tuple[str, dict]] = [
    (ROUTING_ENV_ID, {"episode_requests": 300}),
    (ADMISSION_ENV_ID, {"episode_requests": 300}),
]
env_cases = pytest.mark.parametrize("env_id, kwargs", ENV_CASES, ids=[i.split("/")[-1] for i, _ in ENV_CASES])


# -- helpers ------------------------------------------------------------------------------------
@contextlib.contextmanager
def no_warnings_we_cause():
    """Fail on any warning raised inside, except deprecations issued by third-party code about itself."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    ours = [w for w in caught
            if not (issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))
                    and "mooncake_gym" not in w.filename)]
    assert not ours, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in ours]


def same(a, b) -> bool:
    """Exact, recursive equality of trajectories (arrays by dtype, shape and bytes; NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # an undefined metric (NaN) in the same place
    return type(a) is type(b) and a == b


def actions_for(env, n: int, seed: int = 123) -> list[int]:
    return np.random.default_rng(seed).integers(0, env.action_space.n, size=n).tolist()


def rollout(env, actions, seed: int) -> list:
    """Reset with ``seed``, play ``actions``; every ended episode is reset with the next seed."""
    obs, info = env.reset(seed=seed)
    out = [("reset", obs, info)]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out.append(("step", obs, reward, terminated, truncated, info))
        if terminated or truncated:
            seed += 1
            obs, info = env.reset(seed=seed)
            out.append(("reset", obs, info))
    return out


# -- the contract of every environment ----------------------------------------------------------
@env_cases
def test_both_checkers_pass_without_warnings(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    with no_warnings_we_cause():
        gym_check_env(env.unwrapped)
    with no_warnings_we_cause():
        sb3_check_env(gym.make(env_id, **kwargs).unwrapped, warn=True)


@env_cases
def test_same_seed_and_actions_give_identical_trajectories(env_id, kwargs):
    a, b = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    actions = actions_for(a, 2000)
    ta, tb = rollout(a, actions, seed=11), rollout(b, actions, seed=11)
    assert sum(r[0] == "reset" for r in ta) >= 3  # episodes ended and were reset with the next seed
    assert same(ta, tb)
    for rec in ta:
        obs = rec[1]
        assert a.observation_space.contains(obs)
        if rec[0] == "step":
            assert type(rec[2]) is float and type(rec[3]) is bool and type(rec[4]) is bool
    # observations are the caller's: the env does not overwrite earlier ones
    assert not np.shares_memory(ta[1][1], ta[2][1])
    assert ta[1][1].flags.writeable and ta[1][1].dtype == np.float32
    # and the seed matters
    assert not same(rollout(gym.make(env_id, **kwargs), actions[:50], seed=12), ta[:51])


@env_cases
def test_pickle_round_trip_mid_episode(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    actions = actions_for(env, 900, seed=5)
    env.reset(seed=3)
    for a in actions[:137]:
        env.step(a)
    clone = pickle_round_trip(env)
    if clone is None:  # the compiled core: the limit asserted there
        return
    ends = 0
    for a in actions[137:]:
        ra, rb = env.step(a), clone.step(a)
        assert same(ra, rb)
        if ra[2] or ra[3]:
            ends += 1
            # no seed: the next episode comes from the pickled np_random state
            assert same(env.reset(), clone.reset())
    assert ends >= 1


def _vec_rollout(env_id, kwargs, mode, steps=400):
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode, **kwargs)
    try:
        obs, _ = envs.reset(seed=0)
        actions = np.random.default_rng(9).integers(0, envs.single_action_space.n, size=(steps, 2))
        out = [obs]
        for act in actions:
            obs, reward, terminated, truncated, info = envs.step(act)
            assert obs.shape == (2,) + envs.single_observation_space.shape and obs.dtype == np.float32
            assert all(envs.single_observation_space.contains(o) for o in obs)
            assert reward.shape == (2,) and np.isfinite(reward).all()
            for i in np.flatnonzero(terminated | truncated):
                assert info["_metrics"][i]  # the final info's metrics reach the vector env's info
            out.append((obs, reward, terminated, truncated))
        return actions, out
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
@env_cases
def test_vector_envs_run(env_id, kwargs, mode):
    actions, out = _vec_rollout(env_id, kwargs, mode)
    ended = np.array([o[2] | o[3] for o in out[1:]])
    assert ended.any(axis=0).all()  # both sub-envs finished an episode and were autoreset
    if mode == "async":
        _, reference = _vec_rollout(env_id, kwargs, "sync")
        assert all(same(x, y) for x, y in zip(out, reference))
    else:
        # sub-env 0 was reset with seed 0: up to its first episode end it is the single env
        single = gym.make(env_id, **kwargs)
        obs, _ = single.reset(seed=0)
        assert same(obs, out[0][0])
        for act, (vobs, vrew, vterm, _) in zip(actions, out[1:]):
            obs, reward, terminated, _, _ = single.step(int(act[0]))
            assert same(obs, vobs[0]) and reward == vrew[0]
            if terminated:
                break


@env_cases
def test_sb3_dummy_vec_env_runs(env_id, kwargs):
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: gym.make(env_id, **kwargs)] * 2)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (2,) + venv.observation_space.shape
    rng = np.random.default_rng(2)
    done_seen = 0
    for _ in range(400):
        obs, rewards, dones, infos = venv.step(rng.integers(0, venv.action_space.n, size=2))
        assert np.isfinite(rewards).all()
        for i in np.flatnonzero(dones):
            done_seen += 1
            assert venv.observation_space.contains(infos[i]["terminal_observation"])
            assert "metrics" in infos[i]
    assert done_seen >= 2
    venv.close()


@env_cases
def test_every_action_in_the_space_is_legal(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    for a in range(env.action_space.n):
        env.reset(seed=a)
        for k in range(25):  # the same action again and again, so queues and caches build up
            action = (a, np.int64(a), np.int32(a), np.array(a))[k % 4]
            obs, reward, terminated, _, _ = env.step(action)
            assert env.observation_space.contains(obs) and math.isfinite(reward)
            if terminated:
                env.reset(seed=a)


@env_cases
def test_wrong_or_out_of_space_action_raises_value_error(env_id, kwargs):
    env, reference = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    n = env.action_space.n
    env.reset(seed=4)
    reference.reset(seed=4)
    for bad in (-1, n, n + 7, 1.0, np.float64(0.0), "0", None, [0], np.array([0]), np.array(0.5)):
        with pytest.raises(ValueError, match=r"\baction\b"):
            env.step(bad)
    # the rejected actions did not advance the episode
    assert same(env.step(1), reference.step(1))


@env_cases
def test_final_info_carries_the_metrics(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    env.reset(seed=8)
    steps = 0
    for a in actions_for(env, 100_000):
        _, _, terminated, truncated, info = env.step(a)
        steps += 1
        if terminated or truncated:
            break
        assert "metrics" not in info
    assert terminated and not truncated
    assert isinstance(info["metrics"], dict) and info["metrics"]
    with pytest.raises(RuntimeError, match="reset"):
        env.unwrapped.step(0)


@env_cases
def test_render_rgb_array_draws_a_picture_at_a_fixed_size(env_id, kwargs):
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    first = env.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    assert first.min() < 100 < 250 <= first.max()  # dark labels on a white ground
    frames = [first]
    for k, a in enumerate(actions_for(env, 200)):
        _, _, terminated, _, _ = env.step(a)
        if k % 40 == 39 or terminated:  # drawing takes milliseconds: a few frames
            frames.append(env.render())
        if terminated:
            break
    assert {f.shape for f in frames} == {first.shape}  # one size: the frames make a video
    assert not np.array_equal(frames[0], frames[-1])


@env_cases
def test_stable_baselines3_make_vec_env_defaults_work(env_id, kwargs):
    # make_vec_env asks for render_mode="rgb_array" unless told otherwise
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(env_id, n_envs=2, seed=0, env_kwargs=kwargs)
    venv.reset()
    venv.step(np.array([venv.action_space.sample() for _ in range(2)]))
    frames = venv.get_images()
    assert len(frames) == 2 and all(f.ndim == 3 for f in frames)
    venv.close()


@env_cases
def test_render_ansi_returns_text(env_id, kwargs):
    env = gym.make(env_id, render_mode="ansi", **kwargs)
    env.reset(seed=0)
    first = env.render()
    assert isinstance(first, str) and first.strip()
    for a in actions_for(env, 20):
        env.step(a)
    later = env.render()
    assert isinstance(later, str) and later != first


@env_cases
def test_ppo_smoke(env_id, kwargs):
    torch = pytest.importorskip("torch")
    from stable_baselines3 import PPO

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = PPO("MlpPolicy", gym.make(env_id, **kwargs), n_steps=500, batch_size=100, n_epochs=2, seed=0,
                    device="cpu", verbose=0)
        model.learn(total_timesteps=2000)
        assert model.num_timesteps >= 2000
        one_by_one = [evaluate(env_id, model, seeds=[s], **kwargs)[0] for s in (0, 1)]
        lockstep = evaluate(env_id, model, seeds=[0, 1], **kwargs)
    finally:
        torch.set_num_threads(threads)
    assert same(lockstep, one_by_one)
    assert all(m["steps"] > 0 and math.isfinite(m["return"]) for m in lockstep)


# -- PrefillRouting-v0 -------------------------------------------------------------------------
COST = CostModel.preset("llama2-70b")
SMALL = {"episode_requests": 300}
#: a loaded cluster (rate 8 sessions/s on 8 instances), on which the baselines differ
COMPARISON_TRACE = synthetic_trace(5, rate=8.0, duration_s=None, n_requests=400)


@pytest.mark.filterwarnings("ignore:.*render_mode='video'.*:UserWarning")  # gym.make's own warning
@pytest.mark.parametrize("kwargs, name", [
    ({"n_instances": 0}, "n_instances"),
    ({"n_instances": 1025}, "n_instances"),
    ({"n_instances": 2.0}, "n_instances"),
    ({"cache_blocks": -1}, "cache_blocks"),
    ({"ttft_slo_s": 0}, "ttft_slo_s"),
    ({"ttft_slo_s": math.inf}, "ttft_slo_s"),
    ({"reward": "x"}, "reward"),
    ({"rate": -1}, "rate"),
    ({"rate": 0}, "rate"),
    ({"rate": math.inf}, "rate"),  # would make the generator loop forever
    ({"rate": 2.0, "rate_range": (1.0, 3.0)}, "rate, rate_range"),
    ({"rate_range": (3.0, 1.0)}, "rate_range"),
    ({"rate_range": (0.0, 1.0)}, "rate_range"),
    ({"rate_range": (1.0,)}, "rate_range"),
    ({"rate_range": 5}, "rate_range"),
    ({"rate_range": ("a", "b")}, "rate_range"),
    ({"rate_range": (1.0, math.inf)}, "rate_range"),
    ({"speed": 0}, "speed"),
    ({"episode_requests": 0}, "episode_requests"),
    ({"episode_requests": 2.5}, "episode_requests"),
    ({"duration_s": 0}, "duration_s"),
    ({"trace": 42}, "trace"),
    ({"model": "no-such-model"}, "model"),
    ({"render_mode": "video"}, "render_mode"),
])
def test_invalid_constructor_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: ") as err:
        gym.make(ROUTING_ENV_ID, **kwargs)
    assert "expected" in str(err.value) or "not both" in str(err.value)  # and says what is allowed


@pytest.mark.parametrize("reward", ["ttft", "slo"])
def test_rewards_and_step_info(reward):
    slo = 2.0  # a short SLO at a high rate, so that some requests meet it and some miss it
    env = gym.make(ROUTING_ENV_ID, rate=8.0, ttft_slo_s=slo, reward=reward, **SMALL)
    env.reset(seed=1)
    rewards, ttfts, hits, steps = [], [], [], 0
    for a in actions_for(env, 10_000, seed=1):
        _, r, terminated, _, info = env.step(a)
        steps += 1
        ttft = info["ttft_s"]
        assert ttft == info["queue_s"] + info["transfer_s"] + info["prefill_s"]
        assert 0 <= info["hit_tokens"] < info["input_tokens"]
        assert r == (-ttft / slo if reward == "ttft" else float(ttft <= slo))
        rewards.append(r)
        ttfts.append(ttft)
        hits.append(info["hit_tokens"])
        if terminated:
            break
    m = info["metrics"]
    assert m["requests"] == steps == 300
    assert m["hit_tokens"] == sum(hits) and m["mean_ttft_s"] == pytest.approx(np.mean(ttfts), rel=1e-12)
    if reward == "slo":
        assert set(rewards) == {0.0, 1.0}
        assert sum(rewards) == round(m["slo_attainment"] * steps)
    else:
        assert sum(rewards) == pytest.approx(-sum(ttfts) / slo, rel=1e-12)


def test_reward_kind_does_not_change_the_dynamics():
    a = gym.make(ROUTING_ENV_ID, reward="ttft", **SMALL)
    b = gym.make(ROUTING_ENV_ID, reward="slo", **SMALL)
    actions = actions_for(a, 400)
    ta, tb = rollout(a, actions, seed=2), rollout(b, actions, seed=2)
    strip = lambda t: [(r[0], r[1]) + ((r[-1],) if r[0] == "step" else ()) for r in t]  # noqa: E731
    assert same(strip(ta), strip(tb))


def tiny_trace() -> Trace:
    return Trace.from_requests([
        Request(0.0, 1536, 10, (1, 2, 3)),
        Request(0.01, 1536, 10, (1, 2, 5)),  # shares blocks 1, 2 with the first request
        Request(10.0, 1024, 10, (1, 9)),  # everything idle again; block 1 is everywhere
    ], name="tiny")


def test_exact_observations_and_rewards_on_a_tiny_trace():
    slo = 1.0
    env = gym.make(ROUTING_ENV_ID, n_instances=2, cache_blocks=16, ttft_slo_s=slo, trace=tiny_trace())

    def T(s):  # the documented time scaling
        return min(1.0, math.log1p(s / 0.1) / math.log1p(10 * slo / 0.1))

    length = lambda n: math.log1p(n) / math.log1p(200_000)  # noqa: E731
    p0, p_hit, tr = COST.prefill_s(1536, 0), COST.prefill_s(1536, 1024), COST.transfer_s(1024)
    p2 = COST.prefill_s(1024, 512)

    obs, info = env.reset(seed=0)
    assert obs.shape == (12,) and info["requests"] == 3
    np.testing.assert_allclose(obs, [0, 0, 0, T(p0), T(p0)] * 2 + [length(1536), 0], rtol=0, atol=1e-6)

    obs, r, terminated, _, info = env.step(0)  # instance 0, no pull
    assert r == pytest.approx(-p0 / slo, rel=1e-12) and not terminated
    assert (info["instance"], info["pull"], info["hit_tokens"]) == (0, False, 0)
    q = p0 - 0.01  # instance 0 is still busy with the first request
    ttft0, ttft1, pull1 = q + p_hit, p0, tr + p_hit
    np.testing.assert_allclose(obs, [T(q), 1 / 50, 2 / 3, T(ttft0), T(ttft0),
                                     0, 0, 0, T(ttft1), T(pull1),
                                     length(1536), 2 / 3], rtol=0, atol=1e-6)
    assert env.unwrapped.encode_action(Route(1, True)) == 3

    obs, r, terminated, _, info = env.step(3)  # instance 1 after pulling blocks 1, 2 from instance 0
    assert r == pytest.approx(-(tr + p_hit) / slo, rel=1e-12) and not terminated
    assert (info["instance"], info["pull"], info["hit_tokens"], info["fetched_tokens"]) == (1, True, 1024, 1024)
    np.testing.assert_allclose(obs, [0, 0, 0.5, T(p2), T(p2)] * 2 + [length(1024), 0.5], rtol=0, atol=1e-6)

    obs, r, terminated, _, info = env.step(1)
    assert terminated and r == pytest.approx(-p2 / slo, rel=1e-12)
    assert not obs.any()
    m = info["metrics"]
    assert (m["requests"], m["hit_tokens"], m["fetched_tokens"], m["input_tokens"]) == (3, 1536, 1024, 4096)
    assert m["mean_ttft_s"] == pytest.approx((p0 + tr + p_hit + p2) / 3, rel=1e-12)
    assert m["request_share"] == [1 / 3, 2 / 3]


def test_reset_options_trace_replays_one_episode():
    env = gym.make(ROUTING_ENV_ID, **SMALL)
    _, info = env.reset(seed=0, options={"trace": tiny_trace()})
    assert info["requests"] == 3
    _, info = env.reset(seed=0)
    assert info["requests"] == 300


def test_without_pull():
    env = gym.make(ROUTING_ENV_ID, n_instances=4, allow_pull=False, **SMALL)
    assert env.action_space == gym.spaces.Discrete(4)
    assert env.unwrapped.encode_action(Route(2, True)) == 2
    with no_warnings_we_cause():
        gym_check_env(env.unwrapped)
    env.reset(seed=0)
    for a in actions_for(env, 200):
        obs, _, terminated, _, info = env.step(a)
        assert not info["pull"]
        assert obs.shape == (4 * 5 + 2,)


def test_rate_range_draws_a_rate_per_episode():
    env = gym.make(ROUTING_ENV_ID, rate_range=(1.0, 16.0), episode_requests=60)
    rates = [env.reset(seed=s)[1]["rate_per_s"] for s in range(4)]
    assert len(set(rates)) == 4
    assert rates[2] == env.reset(seed=2)[1]["rate_per_s"]


def test_routing_baselines_differ_on_the_comparison_trace():
    # guards the next test against a trace on which every policy would trivially agree
    results = {name: simulate(COMPARISON_TRACE, make_policy("routing", name), seed=0).metrics
               for name in ROUTING_POLICIES}
    assert len({m["mean_ttft_s"] for m in results.values()}) == len(results)
    assert results["kvcentric"]["fetched_tokens"] > 0


@pytest.mark.parametrize("name", list(ROUTING_POLICIES))
def test_baseline_through_env_gives_exactly_the_simulator_metrics(name):
    seeds = [0, 1]
    through_env = evaluate(ROUTING_ENV_ID, make_policy("routing", name), seeds, trace=COMPARISON_TRACE)
    for seed, got in zip(seeds, through_env):
        direct = simulate(COMPARISON_TRACE, make_policy("routing", name), RoutingConfig(), COST, seed=seed)
        ret = 0.0
        for t in direct.ttft_s.tolist():
            ret += -t / RoutingConfig().ttft_slo_s
        assert got.pop("return") == ret
        assert got.pop("steps") == len(COMPARISON_TRACE) and got.pop("seed") == seed
        assert got == direct.metrics


def test_trace_path_and_speed(tmp_path):
    path = tmp_path / "tiny.jsonl"
    write_trace(COMPARISON_TRACE.head(120), path)
    got = evaluate(ROUTING_ENV_ID, make_policy("routing", "cache"), [3], trace=str(path), speed=2.0)[0]
    direct = simulate(read_trace(path).scaled(2.0), make_policy("routing", "cache"), seed=3).metrics
    assert {k: v for k, v in got.items() if k not in ("return", "steps", "seed")} == direct


# -- OverloadAdmission-v0 ------------------------------------------------------------------------
ADMISSION_SMALL = {"episode_requests": 300}
#: 1,500 demo-3 requests at twice the decode capacity (a base trace other than the env's own): long
#: enough to pass the 30-s warm-up, and the admission baselines differ on it
ADMISSION_TRACE = overload_workload(None, 2.0, 1500, seed=5)[0]


@pytest.mark.filterwarnings("ignore:.*render_mode='video'.*:UserWarning")  # gym.make's own warning
@pytest.mark.parametrize("kwargs, name", [
    ({"load": 0}, "load"),
    ({"load": -1.0}, "load"),
    ({"load": math.inf}, "load"),
    ({"load": math.nan}, "load"),
    ({"load": "2"}, "load"),
    ({"load": 2.0, "load_range": (1.0, 3.0)}, "load, load_range"),
    ({"load_range": 5}, "load_range"),
    ({"load_range": ("a", "b")}, "load_range"),
    ({"load_range": (3.0, 1.0)}, "load_range"),
    ({"load_range": (0.0, 1.0)}, "load_range"),
    ({"load_range": (1.0,)}, "load_range"),
    ({"load_range": (1.0, math.inf)}, "load_range"),
    ({"load_range": np.array(2.0)}, "load_range"),
    ({"episode_requests": 0}, "episode_requests"),
    ({"episode_requests": 2.5}, "episode_requests"),
    ({"waste_penalty": -1}, "waste_penalty"),
    ({"waste_penalty": math.inf}, "waste_penalty"),
    ({"speed": 0}, "speed"),
    ({"oracle": "yes"}, "oracle"),
    ({"oracle": 1}, "oracle"),
    ({"n_prefill": 0}, "n_prefill"),
    ({"n_decode": 0}, "n_decode"),
    ({"n_decode": 2.0}, "n_decode"),
    ({"decode_capacity_tokens": 0}, "decode_capacity_tokens"),
    ({"tbt_s": 0}, "tbt_s"),
    ({"ttft_slo_s": 0}, "ttft_slo_s"),
    ({"ttft_slo_s": math.inf}, "ttft_slo_s"),
    ({"base_trace": 42}, "base_trace"),
    ({"base_trace": Trace.from_requests([])}, "base_trace"),
    ({"trace": [1, 2]}, "trace"),
    ({"model": "no-such-model"}, "model"),
    ({"render_mode": "video"}, "render_mode"),
])
def test_admission_invalid_constructor_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: ") as err:
        gym.make(ADMISSION_ENV_ID, **kwargs)
    assert "expected" in str(err.value) or "not both" in str(err.value)  # and says what is allowed


def test_admission_observation_shape_and_oracle_feature():
    plain = gym.make(ADMISSION_ENV_ID, **ADMISSION_SMALL)
    oracle = gym.make(ADMISSION_ENV_ID, oracle=True, **ADMISSION_SMALL)
    assert plain.observation_space.shape == (11,) and oracle.observation_space.shape == (12,)
    with no_warnings_we_cause():
        gym_check_env(oracle.unwrapped)
    # the oracle feature is output / 4096, clipped at 1; it changes nothing else
    trace = Trace.from_requests([Request(0.1 * k, 1000, out, ()) for k, out in enumerate((1, 1000, 4096, 5000, 30))])
    for options in (None, {"trace": trace}):
        obs_p, _ = plain.reset(seed=1, options=options)
        obs_o, _ = oracle.reset(seed=1, options=options)
        seen = []
        for a in actions_for(plain, 400, seed=4):
            view = oracle.unwrapped.decision_view()
            assert obs_o.shape == (12,) and obs_p.shape == (11,)
            assert same(obs_o[:11], obs_p)
            assert obs_o[11] == np.float32(min(1.0, view.output_tokens / 4096))
            seen.append(obs_o[11])
            obs_p, _, terminated, _, _ = plain.step(a)
            obs_o, _, _, _, _ = oracle.step(a)
            if terminated:
                break
        assert not obs_o.any()
    assert seen == [np.float32(x) for x in (1 / 4096, 1000 / 4096, 1.0, 1.0, 30 / 4096)]  # the last episode's


def test_admission_reward_is_grants_minus_weighted_waste():
    wp, slo = 0.3, 4.0  # a tight SLO: the random admissions below often queue beyond it (doomed)
    env = gym.make(ADMISSION_ENV_ID, load=3.0, waste_penalty=wp, ttft_slo_s=slo, **ADMISSION_SMALL)
    mean_prefill_s = env.unwrapped.mean_prefill_s
    base = env.unwrapped.base
    assert mean_prefill_s == pytest.approx(np.mean([COST.prefill_s(n, 0) for n in base.input_tokens.tolist()]),
                                           rel=1e-12)
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        rewards, granted, doomed, wasted = [], 0, 0.0, 0.0
        rng = np.random.default_rng(seed)
        while True:  # admit 90 %: decode overflows and prefill queues, so every term happens
            view = env.unwrapped.decision_view()
            assert obs[10] == (1.0 if view.predicted_ttft_s > slo else 0.0)  # the prefill-check feature
            obs, r, terminated, _, info = env.step(int(rng.random() < 0.9))
            assert r == info["granted"] - wp * (info["doomed_s"] + info["wasted_s"]) / mean_prefill_s
            assert info["granted"] >= 0 and info["wasted_s"] >= 0.0
            assert info["doomed_s"] == (view.prefill_s if info["admitted"] and view.predicted_ttft_s > slo else 0.0)
            rewards.append(r)
            granted += info["granted"]
            doomed += info["doomed_s"]
            wasted += info["wasted_s"]
            if terminated:
                break
        m = info["metrics"]
        res = env.unwrapped.sim.result()
        late = np.isfinite(res.ttft_s) & (res.ttft_s > slo)  # admitted, and doomed at admission
        doomed_kept = res.prefill_s[late & (res.outcome == COMPLETED)].sum()
        assert m["rejected_after_prefill"] > 0 and m["goodput"] > 0 and len(rewards) == 300
        assert doomed > 0 and doomed_kept > 0 and doomed == pytest.approx(res.prefill_s[late].sum(), rel=1e-12)
        assert granted == m["goodput"]
        assert doomed + wasted == pytest.approx(m["wasted_prefill_s"] + doomed_kept, rel=1e-12)
        assert (info["completed"], info["rejected_at_arrival"], info["rejected_after_prefill"]) == \
            (m["completed"], m["rejected_at_arrival"], m["rejected_after_prefill"])
        expected = m["goodput"] - wp * (m["wasted_prefill_s"] + doomed_kept) / mean_prefill_s
        assert math.fsum(rewards) == pytest.approx(expected, rel=1e-9)


def test_admission_baselines_differ_on_the_comparison_trace():
    # guards the next test against a trace on which every policy would trivially agree
    results = {name: simulate_overload(ADMISSION_TRACE, make_policy("admission", name), OverloadConfig(), COST).metrics
               for name in ADMISSION_POLICIES}
    assert len({m["goodput"] for m in results.values()}) == len(results)
    assert len({m["wasted_prefill_s"] for m in results.values()}) == len(results)
    corr = [m["load_correlation"] for m in results.values()]
    assert any(math.isnan(c) for c in corr) and any(math.isfinite(c) for c in corr)  # NaN is compared too


@pytest.mark.parametrize("name", list(ADMISSION_POLICIES))
def test_admission_baseline_through_env_gives_exactly_the_simulator_metrics(name):
    seeds = [0, 1]
    env_kwargs = {"trace": ADMISSION_TRACE, "waste_penalty": 0.2}
    through_env = evaluate(ADMISSION_ENV_ID, make_policy("admission", name), seeds, **env_kwargs)
    mean_prefill_s = gym.make(ADMISSION_ENV_ID, **env_kwargs).unwrapped.mean_prefill_s
    for seed, got in zip(seeds, through_env):
        direct = simulate_overload(ADMISSION_TRACE, make_policy("admission", name), OverloadConfig(), COST, seed=seed)
        assert got.pop("steps") == len(ADMISSION_TRACE) and got.pop("seed") == seed
        assert got.pop("return") == pytest.approx(
            direct.metrics["goodput"] - 0.2 * direct.metrics["wasted_prefill_s"] / mean_prefill_s, rel=1e-9)
        assert got.pop("policy") == "env" and direct.metrics["policy"] == name
        assert same(got, {k: v for k, v in direct.metrics.items() if k != "policy"})


def _always_admit(view):
    return True


def _always_reject(view):
    return False


def test_admission_return_tracks_goodput():
    """At load 2 with the default waste penalty, over the same 5 seeds of the default 2,000-request
    episode: the return is goodput minus the waste term, and that term costs each of the four
    baselines at most 6 % of its goodput (here 0.7-5 %). So every pair of the six policies (the four
    baselines, always-admit, always-reject) whose mean goodputs differ by more than 5 % of the
    larger is ranked by the return as by goodput. Closer pairs are ranked by waste as well, by
    design: with these seeds predict completes 2.5 % more than early but wastes 3.5 times its
    prefill, and its return is the lower."""
    policies = {name: make_policy("admission", name) for name in ADMISSION_POLICIES}
    policies.update(always_admit=_always_admit, always_reject=_always_reject)
    seeds = range(5)
    goodput, ret = {}, {}
    for name, policy in policies.items():
        runs = evaluate(ADMISSION_ENV_ID, policy, seeds, load=2.0)
        goodput[name] = np.mean([m["goodput"] for m in runs])
        ret[name] = np.mean([m["return"] for m in runs])
    for name in ADMISSION_POLICIES:
        assert 0 < goodput[name] - ret[name] <= 0.06 * goodput[name], (name, goodput, ret)
    compared = 0
    for p in policies:
        for q in policies:
            if goodput[p] > goodput[q] and goodput[p] - goodput[q] > 0.05 * goodput[p]:
                compared += 1
                assert ret[p] > ret[q], (p, q, goodput, ret)
    assert compared >= 10  # of the 15 pairs: the assertion above is not vacuous
    assert goodput["always_reject"] == ret["always_reject"] == 0.0


def tiny_admission_trace() -> Trace:
    return Trace.from_requests([
        Request(0.0, 2048, 100, ()),  # gets the only decode slot
        Request(0.001, 2048, 100, ()),  # prefilled after it, finds no room: its prefill is wasted
        Request(5.0, 1024, 10, ()),  # rejected at arrival
        Request(6.0, 1024, 10, ()),  # admitted: completes in the drain after the last decision
    ], name="tiny")


def test_admission_exact_observations_and_rewards_on_a_tiny_trace():
    trace = tiny_admission_trace()
    cap, slo, tbt, wp = 3000, 2.0, 0.01, 0.5
    env = gym.make(ADMISSION_ENV_ID, n_prefill=1, n_decode=1, decode_capacity_tokens=cap, tbt_s=tbt,
                   ttft_slo_s=slo, waste_penalty=wp, base_trace=trace, trace=trace, render_mode="ansi")
    p, q = COST.prefill_s(2048, 0), COST.prefill_s(1024, 0)
    mean_prefill = (2 * p + 2 * q) / 4
    mean_out = (100 + 100 + 10 + 10) / 4  # 55 tokens, decoding 0.55 s
    capacity_rate = cap / np.mean([2148 * 100 * tbt, 2148 * 100 * tbt, 1034 * 10 * tbt, 1034 * 10 * tbt])
    assert env.unwrapped.mean_prefill_s == pytest.approx(mean_prefill, rel=1e-12)
    assert env.unwrapped.capacity_rate == pytest.approx(capacity_rate, rel=1e-12)
    length = lambda n: math.log1p(n) / math.log1p(200_000)  # noqa: E731
    need = lambda n: (n + mean_out) / cap  # noqa: E731  (one decode instance: per-instance capacity = cap)

    obs, info = env.reset(seed=0)
    assert info["requests"] == 4 and math.isnan(info["load"])
    np.testing.assert_allclose(obs, [0, 0, 0, p / (1.5 * slo), 1, need(2048), length(2048), 0, 0, 0, 0],
                               rtol=0, atol=1e-6)

    obs, r, terminated, _, info = env.step(1)
    assert (r, terminated, info["granted"], info["wasted_s"]) == (0.0, False, 0, 0.0)
    # request 1 would finish prefill at 2p; request 0 (finishing at p, decoding the mean 0.55 s > p)
    # is then projected in decode; under the output distribution it is still there with
    # P(output > (2p - p) / tbt) = P(output > 19) = 1/2
    assert int(p / tbt) == 19
    np.testing.assert_allclose(obs, [0, need(2048), need(2048) / 2, (2 * p - 0.001) / (1.5 * slo), 1, need(2048),
                                     length(2048), 0, 0, 1 / 20, 0], rtol=0, atol=1e-6)

    obs, r, terminated, _, info = env.step(1)  # by t = 5: request 0 granted, request 1 wasted
    assert (info["granted"], info["completed"], info["rejected_after_prefill"]) == (1, 1, 1)
    assert info["wasted_s"] == pytest.approx(p, rel=1e-12)
    assert r == pytest.approx(1 - wp * p / mean_prefill, rel=1e-12) and not terminated
    recent = lambda k: k / (30 * capacity_rate)  # noqa: E731
    np.testing.assert_allclose(obs, [0, 0, 0, q / (1.5 * slo), 1, need(1024), length(1024), recent(1), p / 30, 0, 0],
                               rtol=0, atol=1e-6)

    obs, r, terminated, _, info = env.step(0)  # rejected: nothing happens before t = 6
    assert (r, terminated, info["granted"], info["rejected_at_arrival"]) == (0.0, False, 0, 1)
    np.testing.assert_allclose(obs, [0, 0, 0, q / (1.5 * slo), 1, need(1024), length(1024), recent(2), p / 30, 0, 0],
                               rtol=0, atol=1e-6)
    picture = env.render()
    assert "request 3" in picture and "decode [0]" in picture

    obs, r, terminated, _, info = env.step(1)  # the last decision: drained, granted in this step
    assert terminated and r == 1.0 and not obs.any()
    m = info["metrics"]
    assert (m["requests"], m["completed"], m["goodput"], m["rejected_at_arrival"], m["rejected_after_prefill"],
            m["admitted"]) == (4, 2, 2, 1, 1, 3)
    assert m["wasted_prefill_s"] == pytest.approx(p, rel=1e-12)
    assert m["mean_ttft_s"] == pytest.approx((p + q) / 2, rel=1e-12)
    assert env.render().startswith("done: completed 2, rejected 1 at arrival and 1 after prefill")


def test_admission_load_range_draws_a_load_per_episode():
    env = gym.make(ADMISSION_ENV_ID, load_range=(0.5, 4.0), episode_requests=60)
    infos = [env.reset(seed=s)[1] for s in range(4)]
    loads = [i["load"] for i in infos]
    assert len(set(loads)) == 4 and all(0.5 <= x <= 4.0 for x in loads)
    assert loads[2] == env.reset(seed=2)[1]["load"]
    assert all(i["requests"] == 60 for i in infos)
    # the load sets the arrival rate: the episode's trace spans fewer seconds at a higher load
    spans = {}
    for s, load in enumerate(loads):
        env.reset(seed=s)
        spans[load] = env.unwrapped.sim.trace.arrival_s[-1]
    assert spans[max(loads)] < spans[min(loads)]
    assert gym.make(ADMISSION_ENV_ID, episode_requests=60).reset(seed=0)[1]["load"] == 2.0  # the default


def test_admission_reset_options_trace_and_speed():
    env = gym.make(ADMISSION_ENV_ID, speed=2.0, **ADMISSION_SMALL)
    _, info = env.reset(seed=0, options={"trace": tiny_admission_trace()})
    assert info["requests"] == 4 and math.isnan(info["load"])
    assert env.unwrapped.sim.trace.arrival_s.tolist() == [0.0, 0.0005, 2.5, 3.0]
    _, info = env.reset(seed=0)
    assert info["requests"] == 300 and info["load"] == 2.0


def test_a_trace_file_is_read_once_while_unchanged(tmp_path):
    """compare and tune make many envs on one trace file: they share one read, until the file changes."""
    import os

    from mooncake_gym.envs.common import as_trace

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n')
    first = as_trace("trace", path)
    assert as_trace("trace", str(path)) is first
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 5, "input_length": 100, "output_length": 3, "hash_ids": [1]}\n')
    os.utime(path, ns=(1, 1))
    second = as_trace("trace", path)
    assert second is not first and len(second) == 2 and second.input_tokens.tolist() == [600, 100]
    with pytest.raises(Exception, match="missing.jsonl"):
        as_trace("trace", tmp_path / "missing.jsonl")
