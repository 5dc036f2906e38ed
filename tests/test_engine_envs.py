"""PrefillRouting-v0 on the native engine against the reference (docs/engine.md): the same
episodes, observation for observation (bit for bit), reward for reward and info for info, on
hand-made and hypothesis-generated traces, pools and action sequences; snapshots; the vector
environments (Gymnasium's and stable-baselines3's) against Gymnasium's SyncVectorEnv; native
sizesplit and relsplit against the Python rules."""

import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mooncake_gym  # noqa: F401
from mooncake_gym import _engine
from mooncake_gym._engine.stepper import NativeRoutingSimulator
from mooncake_gym.baselines.sizesplit import RelativeSizeSplit, SizeSplit
from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv
from mooncake_gym.envs.vector import BatchedVectorEnv, SB3VecEnv
from mooncake_gym.model.costmodel import MODELS
from mooncake_gym.model.presets import RoutingConfig
from mooncake_gym.sim import routing
from test_engine_routing import assert_same, pools, trace_of, traces

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

ENV_ID = "mooncake_gym/PrefillRouting-v0"


def episode(env, actions, seed=5, options=None):
    """reset, then the actions (cyclically) to the episode's end: every returned value."""
    obs, info = env.reset(seed=seed, options=options)
    out = [("reset", obs, info)]
    k, done = 0, False
    while not done:
        obs, reward, done, truncated, info = env.step(actions[k % len(actions)])
        k += 1
        out.append(("step", obs, reward, done, truncated, info))
    return out


def assert_same_episode(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0] == y[0]
        assert x[1].dtype == y[1].dtype == np.float32 and x[1].tobytes() == y[1].tobytes()  # bit for bit
        for u, v in zip(x[2:], y[2:]):
            assert type(u) is type(v)
        np.testing.assert_equal(x[2:], y[2:])
        info_a, info_b = x[-1], y[-1]
        assert list(info_a) == list(info_b)
        for key in info_a:
            assert type(info_a[key]) is type(info_b[key]), key
            if isinstance(info_a[key], np.ndarray):
                assert info_a[key].dtype == info_b[key].dtype, key


def both(kwargs, actions, **episode_kw):
    envs = {e: PrefillRoutingEnv(engine=e, **kwargs) for e in ("python", "native")}
    assert envs["native"]._core is None and envs["native"].engine == "native" and envs["python"].engine == "python"
    out = {e: episode(env, actions, **episode_kw) for e, env in envs.items()}
    assert envs["native"]._core is not None and isinstance(envs["native"].sim, NativeRoutingSimulator)
    return out["python"], out["native"], envs


@pytest.mark.parametrize("kwargs", [
    {"episode_requests": 300},
    {"episode_requests": 200, "allow_pull": False},
    {"episode_requests": 200, "reward": "slo", "ttft_slo_s": 0.5},
    {"episode_requests": 200, "instances": "4xH800+4xA800", "rate": 12.0},
    {"episode_requests": 200, "n_instances": 3, "cache_blocks": [0, 5, 3000], "rate": 6.0},
    {"episode_requests": 150, "n_instances": 2, "cache_blocks": 0, "model": "llama3-8b"},
], ids=repr)
def test_v0_on_the_engine_is_the_reference_episode_for_episode(kwargs):
    n = PrefillRoutingEnv(**kwargs).action_space.n
    actions = np.random.default_rng(3).integers(0, n, 997).tolist()
    ref, nat, envs = both(kwargs, actions)
    assert_same_episode(ref, nat)
    assert "metrics" in nat[-1][-1]
    # after the episode: zeros and all-ones, and the action masks the same
    assert envs["native"].action_masks().tolist() == envs["python"].action_masks().tolist()


def test_v0_by_default_runs_native_and_gym_make_gives_the_reference_episode():
    env = gym.make(ENV_ID, episode_requests=120)
    assert env.unwrapped.engine == "native"
    actions = np.random.default_rng(0).integers(0, env.action_space.n, 500).tolist()
    assert_same_episode(episode(gym.make(ENV_ID, episode_requests=120, engine="python"), actions), episode(env, actions))


def test_v0_replays_a_trace_window_on_both_engines_the_same():
    trace = trace_of([(0.01 * k, 600 + 37 * k, [1, 2, 100 + k % 7, 200 + k]) for k in range(60)])
    kwargs = {"trace": trace, "window_requests": 25, "n_instances": 3, "cache_blocks": 6}
    ref, nat, _ = both(kwargs, [0, 4, 5, 1, 2, 3, 3], options={"offset": 11})
    assert_same_episode(ref, nat)
    assert len(nat) == 26


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(30), data=st.data())
def test_generated_envs_and_actions_same_episodes(trace, data):
    n = data.draw(st.integers(1, 5))
    kwargs = {"trace": trace, "n_instances": n,
              "cache_blocks": data.draw(st.integers(0, 12) | st.lists(st.integers(0, 12), min_size=n, max_size=n)),
              "ttft_slo_s": data.draw(st.sampled_from([0.05, 1.0, 5.0])),
              "reward": data.draw(st.sampled_from(["ttft", "slo"])), "allow_pull": data.draw(st.booleans()),
              "model": data.draw(st.sampled_from(sorted(MODELS)))}
    if data.draw(st.booleans()):
        kwargs["instances"] = data.draw(st.lists(st.sampled_from(["H800", "A800", "H100"]), min_size=n, max_size=n))
    n_actions = 2 * n if kwargs["allow_pull"] else n
    actions = data.draw(st.lists(st.integers(0, n_actions - 1), min_size=1, max_size=40))
    ref, nat, _ = both(kwargs, actions)
    assert_same_episode(ref, nat)


def test_the_engine_argument():
    assert PrefillRoutingEnv(engine="python").engine == "python"
    assert PrefillRoutingEnv(observation="scraped").engine == "python"  # the default falls back
    with pytest.raises(ValueError, match="engine: 'native' cannot run this environment: the native engine shows "
                                         "the exact observation only"):
        PrefillRoutingEnv(observation="scraped", engine="native")
    with pytest.raises(ValueError, match="engine: expected one of"):
        PrefillRoutingEnv(engine="rust")


def test_rendering_on_the_engine_is_the_references():
    pictures = {}
    for e in ("python", "native"):
        env = PrefillRoutingEnv(engine=e, episode_requests=40, render_mode="ansi")
        env.reset(seed=2)
        frames = [env.render()]
        for a in [3, 9, 0, 0, 12] * 8:
            env.step(a)
            frames.append(env.render())
        rgb = PrefillRoutingEnv(engine=e, episode_requests=40, render_mode="rgb_array")
        rgb.reset(seed=2)
        for a in [3, 9, 0]:
            rgb.step(a)
        pictures[e] = (frames, rgb.render())
    assert pictures["python"][0] == pictures["native"][0]
    assert np.array_equal(pictures["python"][1], pictures["native"][1])


def test_pickled_native_env_goes_on_with_the_same_steps():
    env = PrefillRoutingEnv(episode_requests=80)
    env.reset(seed=1)
    for a in range(30):
        env.step(a % 16)
    clone = pickle.loads(pickle.dumps(env))
    assert clone._core is not None
    a_steps = [env.step(a % 5) for a in range(50)]
    b_steps = [clone.step(a % 5) for a in range(50)]
    np.testing.assert_equal(a_steps, b_steps)


# --- snapshots ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["python", "native"])
def test_restore_then_the_same_actions_give_the_same_trajectory(engine):
    env = PrefillRoutingEnv(engine=engine, episode_requests=120, rate=10.0)
    env.reset(seed=4)
    rng = np.random.default_rng(1)
    for a in rng.integers(0, 16, 40):
        env.step(int(a))
    early = env.snapshot()
    obs_early = env._observe()
    first = [env.step(int(a)) for a in rng.integers(0, 16, 30)]
    late = env.snapshot()
    rest = [env.step(int(a)) for a in range(16)]
    for _ in range(2):  # a snapshot stays valid for more restores
        assert env.restore(early).tobytes() == obs_early.tobytes()
        again = [env.step(int(a[4]["instance"] + 8 * a[4]["pull"])) for a in first]
        np.testing.assert_equal(again, first)
    other = [env.step(0) for _ in range(5)]  # another branch from the late state ...
    env.restore(late)  # ... and back to the later snapshot after the earlier one
    np.testing.assert_equal([env.step(int(a)) for a in range(16)], rest)
    assert other  # (the branch was taken)
    # to the end and the metrics: restored runs end with the reference's metrics
    env.restore(early)
    steps = [env.step(int(a[4]["instance"] + 8 * a[4]["pull"])) for a in first]
    while not steps[-1][2]:
        steps.append(env.step(3))
    ref = PrefillRoutingEnv(engine="python", episode_requests=120, rate=10.0)
    ref.reset(seed=4)
    rng = np.random.default_rng(1)
    for a in rng.integers(0, 16, 40):
        ref.step(int(a))
    ref_steps = [ref.step(int(a[4]["instance"] + 8 * a[4]["pull"])) for a in first]
    while not ref_steps[-1][2]:
        ref_steps.append(ref.step(3))
    np.testing.assert_equal(steps, ref_steps)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(30), pool=pools(), data=st.data())
def test_simulator_snapshots_on_both_engines(trace, pool, data):
    config, cost = pool
    n = config.n_instances
    sims = [routing.RoutingSimulator(trace, config, cost), NativeRoutingSimulator(trace, config, cost)]
    at = data.draw(st.integers(0, len(trace) - 1))
    actions = [(data.draw(st.integers(0, n - 1)), data.draw(st.booleans())) for _ in range(len(trace))]
    for sim in sims:
        for a in actions[:at]:
            sim.step(a)
        snap = sim.snapshot()
        first = [(sim.step(a), sim.last) for a in actions[at:]]
        result = sim.result("p")
        sim.restore(snap)
        assert [(sim.step(a), sim.last) for a in actions[at:]] == first
        assert_same(sim.result("p"), result)
    assert_same(sims[0].result("p"), sims[1].result("p"))


def test_a_snapshot_of_another_simulator_is_refused():
    trace = trace_of([(0.0, 100, [1]), (0.1, 100, [1])])
    a, b = NativeRoutingSimulator(trace), NativeRoutingSimulator(trace_of([(0.0, 100, [1])]))
    with pytest.raises(ValueError, match="restore: a snapshot of another simulator"):
        b.restore(a.snapshot())


# --- vector environments -----------------------------------------------------------------------------------
def _sync(num_envs, **kwargs):
    return gym.vector.SyncVectorEnv([lambda: PrefillRoutingEnv(engine="python", **kwargs) for _ in range(num_envs)])


def _compare_vectors(a, b, steps, seed=0, n_actions=16):
    oa, ia = a.reset(seed=seed)
    ob, ib = b.reset(seed=seed)
    assert oa.tobytes() == ob.tobytes()
    rng = np.random.default_rng(7)
    ends = 0
    for _ in range(steps):
        actions = rng.integers(0, n_actions, a.num_envs)
        ra, rb = a.step(actions), b.step(actions)
        for x, y in zip(ra[:4], rb[:4]):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
        infos_a, infos_b = dict(ra[4]), dict(rb[4])
        mask_b = infos_b.pop("action_mask")
        infos_b.pop("_action_mask")
        np.testing.assert_equal(infos_a.pop("action_mask"), np.stack(list(mask_b)) if mask_b.dtype == object else mask_b)
        infos_a.pop("_action_mask")
        np.testing.assert_equal(infos_a, infos_b)
        ends += int(ra[2].sum())
    return ends


def test_vector_env_is_gymnasiums_sync_vector_env_step_for_step():
    kwargs = {"episode_requests": 25, "rate": 8.0}
    native = gym.make_vec(ENV_ID, num_envs=4, vectorization_mode="vector_entry_point", **kwargs)
    assert isinstance(native.unwrapped, BatchedVectorEnv)
    assert _compare_vectors(native, _sync(4, **kwargs), 130) >= 10  # episodes ended and autoreset
    assert native.unwrapped._native.all()


def test_vector_env_on_two_threads_and_in_python_the_same():
    kwargs = {"episode_requests": 20, "n_instances": 3}
    threaded = BatchedVectorEnv(lambda: PrefillRoutingEnv(**kwargs), 5, threads=2)
    python = BatchedVectorEnv(lambda: PrefillRoutingEnv(engine="python", **kwargs), 5)
    python.reset(seed=0)
    assert not python._native.any()
    assert _compare_vectors(threaded, python, 90, n_actions=6) >= 10


def test_vector_env_same_step_autoreset_and_truncation():
    kwargs = {"episode_requests": 15, "n_instances": 2}
    a = BatchedVectorEnv(lambda: PrefillRoutingEnv(**kwargs), 3, autoreset_mode="SameStep", max_episode_steps=9)
    b = gym.vector.SyncVectorEnv([lambda: gym.wrappers.TimeLimit(PrefillRoutingEnv(engine="python", **kwargs), 9)
                                  for _ in range(3)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    a.reset(seed=3)
    b.reset(seed=3)
    rng = np.random.default_rng(2)
    for _ in range(40):
        actions = rng.integers(0, 4, 3)
        ra, rb = a.step(actions), b.step(actions)
        for x, y in zip(ra[:4], rb[:4]):
            assert x.tobytes() == y.tobytes()
        if ra[3].any():
            i = int(np.flatnonzero(ra[3])[0])
            assert ra[4]["final_obs"][i].tobytes() == rb[4]["final_obs"][i].tobytes()
            assert ra[4]["final_info"]["ttft_s"][i] == rb[4]["final_info"]["ttft_s"][i]


@pytest.mark.parametrize("limit", [None, 11])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
@pytest.mark.parametrize("seed", [0, 11, 2024])
def test_vector_env_is_single_envs_episode_for_episode_across_autoresets(mode, seed, limit):
    """Each sub-env of the native vector env runs the episodes of one single reference env seeded
    seed + i and reset without a seed at each autoreset: every observation's bytes, reward, flag
    and info entry, the final observations and infos (SAME_STEP), with truncations."""
    kwargs = {"episode_requests": 14, "n_instances": 3, "rate": 5.0}
    n = 4  # episodes end by termination (14 requests) or, with the limit, by truncation (11 steps)
    vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(**kwargs), n, autoreset_mode=mode, max_episode_steps=limit)
    singles = [PrefillRoutingEnv(engine="python", **kwargs) for _ in range(n)]
    obs, infos = vec.reset(seed=seed)
    expected = [env.reset(seed=seed + i) for i, env in enumerate(singles)]
    steps = [0] * n
    for i, (o, info) in enumerate(expected):
        assert obs[i].tobytes() == o.tobytes() and infos["requests"][i] == info["requests"]
        assert infos["action_mask"][i].tolist() == info["action_mask"].tolist()
    rng = np.random.default_rng(seed)
    resetting = [False] * n
    ends = 0
    for _ in range(70):
        actions = rng.integers(0, 6, n)
        obs, rewards, terminated, truncated, infos = vec.step(actions)
        for i, env in enumerate(singles):
            if resetting[i]:  # NEXT_STEP: this step starts env i's next episode
                o, info = env.reset()
                steps[i] = 0
                assert obs[i].tobytes() == o.tobytes() and rewards[i] == 0.0 and not terminated[i] and not truncated[i]
                assert infos["_requests"][i] and infos["requests"][i] == info["requests"]
                assert not infos.get("_ttft_s", np.zeros(n, bool))[i]
                resetting[i] = False
                continue
            o, r, term, _, info = env.step(int(actions[i]))
            steps[i] += 1
            trunc = limit is not None and steps[i] >= limit and not term
            assert (rewards[i], terminated[i], truncated[i]) == (r, term, trunc)
            for name, _ in PrefillRoutingEnv.NATIVE_INFO:
                assert infos["_" + name][i] and infos[name][i] == info[name] and type(infos[name][i].item()) is type(info[name]), name
            if not (term or trunc):
                assert obs[i].tobytes() == o.tobytes()
                assert infos["action_mask"][i].tolist() == info["action_mask"].tolist()
                continue
            ends += 1
            if term:
                assert infos["_metrics"][i] and infos["metrics"]["mean_ttft_s"][i] == info["metrics"]["mean_ttft_s"]
                assert infos["metrics"]["p99_ttft_s"][i] == info["metrics"]["p99_ttft_s"]
            if mode == "NextStep":
                assert obs[i].tobytes() == o.tobytes()
                resetting[i] = True
            else:  # the final observation and info, then the next episode's first observation
                assert infos["final_obs"][i].tobytes() == o.tobytes()
                assert vec.single_info(infos["final_info"], i)["ttft_s"] == info["ttft_s"]
                o, info = env.reset()
                steps[i] = 0
                assert obs[i].tobytes() == o.tobytes() and infos["requests"][i] == info["requests"]
                assert infos["action_mask"][i].tolist() == info["action_mask"].tolist()
    assert ends >= 12


def test_vector_env_rejects_bad_actions():
    env = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=10), 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="actions: expected integers in 0..15"):
        env.step(np.array([0, 16]))
    with pytest.raises(ValueError, match="actions: expected 2 integers"):
        env.step(np.array([0.5, 1.0]))


def test_sb3_vec_env_steps_and_trains_ppo():
    from stable_baselines3 import PPO

    venv = SB3VecEnv.routing(4, episode_requests=30)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (4, 42) and obs.dtype == np.float32
    seen_end = False
    for k in range(40):
        obs, rewards, dones, infos = venv.step(np.full(4, k % 16))
        assert rewards.dtype == np.float32 and dones.shape == (4,)
        for i in np.flatnonzero(dones):
            seen_end = True
            assert infos[i]["terminal_observation"].shape == (42,) and "metrics" in infos[i]
            assert infos[i]["TimeLimit.truncated"] is False
            assert not np.array_equal(obs[i], infos[i]["terminal_observation"])  # the next episode's first
    assert seen_end
    assert venv.env_method("action_masks")[0].shape == (16,)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=512)
    assert model.num_timesteps >= 512


# --- native sizesplit and relsplit ---------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), pool=pools(), seed=st.integers(0, 2**32), relative=st.booleans(),
       long=st.sampled_from([None, 0.0005, 0.01, 0.3, 2.0]), long_instances=st.integers(1, 6),
       work_weight=st.sampled_from([0.0, 0.5, 2.0]), threshold=st.sampled_from([1.0, 1.5, 1e9]),
       memory=st.sampled_from([1.0, 3.0, 1000.0]), min_load=st.sampled_from([0.0, 0.5, 3.0]))
def test_native_sizesplit_and_relsplit_are_the_python_rules(trace, pool, seed, relative, long, long_instances,
                                                            work_weight, threshold, memory, min_load):
    config, cost = pool

    def make():
        if relative:
            return RelativeSizeSplit(None if long is None else 1.0 + 100 * long, long_instances, work_weight,
                                     threshold, memory, min_load)
        return SizeSplit(long, long_instances, work_weight, threshold)

    out = {}
    for engine in ("python", "native"):
        policy = make()
        out[engine] = (routing.simulate(trace, policy, config, cost, seed=seed, engine=engine), policy)
    assert_same(out["python"][0], out["native"][0])
    p, q = out["python"][1], out["native"][1]
    assert p.rng.bit_generator.state == q.rng.bit_generator.state
    if relative:
        assert (p.scale._sum, p.scale._weight, p._load_s) == (q.scale._sum, q.scale._weight, q._load_s)


def test_relsplit_sends_a_long_prompt_to_the_first_instances_by_hand():
    """Three idle instances, no cache: two short prompts set the running mean, then a prompt 20x as
    long is long (ratio above 6, no load needed) and may go only to instance 0; a sizesplit with
    long_s between the sizes does the same, and both engines agree."""
    config = RoutingConfig(n_instances=3, cache_blocks=0)
    trace = trace_of([(0.0, 500, [1]), (10.0, 500, [2]), (20.0, 10000, [3, 4]), (20.0, 500, [5])])
    for engine in ("python", "native"):
        res = routing.simulate(trace, RelativeSizeSplit(6.0, 1), config, seed=0, engine=engine)
        assert res.instance[2] == 0
        assert res.instance[3] != 0  # the short one after it avoids the busy instance 0
        short, long_ = routing.simulate(trace, SizeSplit(None), config, seed=0, engine=engine).prefill_s[[0, 2]]
        res = routing.simulate(trace, SizeSplit((short + long_) / 2, 1), config, seed=0, engine=engine)
        assert res.instance[2] == 0


# --- the synthetic generator's block ids: the engine's (synthetic.hpp) against the numpy reference ---
def test_synthetic_block_ids_by_hand():
    from mooncake_gym.model import workload as w

    # prompt 0 of 2 blocks; request 0 shares 3 blocks of session 0, request 1 2 of session 1
    args = (np.array([1536, 1536]), np.array([3, 2]), np.array([2]), np.array([0, 0]), np.array([0, 1]), 512, 4096)
    starts, ids = w._block_ids_reference(*args)
    assert starts.tolist() == [0, 3, 6] and ids.tolist() == [0, 1, 2, 0, 1, 3]


def _reference_trace(monkeypatch, *args, **kwargs):
    """synthetic_trace assembled by the numpy reference (_session_batch, _assemble_reference)."""
    from mooncake_gym.model import workload as w

    with monkeypatch.context() as m:
        m.setattr(w, "_assembly", lambda *a: None)
        return w.synthetic_trace(*args, **kwargs)


@pytest.mark.parametrize("case", range(14))
def test_synthetic_trace_assembled_natively_is_the_reference(monkeypatch, case):
    from mooncake_gym.model.workload import SyntheticConfig, synthetic_trace

    configs = [SyntheticConfig(), SyntheticConfig(document_share=0.9, output_max=50, input_max=3000, questions_mean=1.0,
                                                  system_prompt_blocks=(2, 9), n_system_prompts=3),
               SyntheticConfig(document_share=0.0, think_time_mean_s=0.0, chat_turn_sigma=3.0, output_sigma=2.5)]
    kwargs = {"config": configs[case % 3], "duration_s": None if case % 2 else 40.0 + case,
              "n_requests": 150 + 70 * case if case % 2 else (None if case % 4 == 0 else 90)}
    if case in (5, 6):
        kwargs["arrivals"] = {"burst_ratio": 6.0, "calm_s": 5.0, "burst_s": 1.0}
    native, reference = (synthetic_trace(case, 0.3 + 1.7 * case, **kwargs),
                         _reference_trace(monkeypatch, case, 0.3 + 1.7 * case, **kwargs))
    assert len(native) > 0 and native.name == reference.name
    for column in ("arrival_s", "input_tokens", "output_tokens", "session_ids"):
        a, b = getattr(native, column), getattr(reference, column)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), column
    assert [x.tolist() for x in native.flat_blocks] == [x.tolist() for x in reference.flat_blocks]
    # the generator goes on from the same state: the draws were numpy's, in the same order
    g1, g2 = np.random.default_rng(case), np.random.default_rng(case)
    synthetic_trace(g1, 2.0, duration_s=None, n_requests=50)
    _reference_trace(monkeypatch, g2, 2.0, duration_s=None, n_requests=50)
    assert g1.bit_generator.state == g2.bit_generator.state


def test_generated_trace_block_ids_made_on_first_read():
    from mooncake_gym.model.workload import synthetic_trace

    t = synthetic_trace(3, 2.0, duration_s=None, n_requests=50)
    starts, ids = t.flat_blocks
    assert t.block_ids == [tuple(ids[a:e].tolist()) for a, e in zip(starts[:-1], starts[1:])]
    t.block_ids = [()] * 50  # a replaced column drops the flat one
    assert t.flat_blocks is None and t.block_ids == [()] * 50
