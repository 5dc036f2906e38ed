"""The native vector environments (envs/vector.py, batch.hpp; docs/engine.md "Vector
environments"): the threaded step gives every env the same numbers whatever the number of threads,
with the resets of NEXT_STEP made while the engine steps the others; the v1 vector envs
(PrefillRouting-v1, OverloadAdmission-v1 on ClusterEnvCore) run the single envs' episodes, bit
for bit, through autoresets, against native and reference single envs."""

import gc
import math
import os
import time

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401
from mooncake_gym import _engine
from mooncake_gym.envs.overload_admission_v1 import OverloadAdmissionV1Env
from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv
from mooncake_gym.envs.prefill_routing_v1 import PrefillRoutingV1Env
from mooncake_gym.envs.vector import ENVS_PER_THREAD, BatchedVectorEnv, SB3VecEnv, default_threads

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")


def _run(vec, steps, seed, n_actions):
    """Every array the vector env returns over ``steps`` random steps, as bytes, and its infos."""
    out = []
    obs, infos = vec.reset(seed=seed)
    out.append(obs.tobytes())
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, rewards, terminated, truncated, infos = vec.step(rng.integers(0, n_actions, vec.num_envs))
        out.append(b"".join(x.tobytes() for x in (obs, rewards, terminated, truncated, infos["action_mask"])))
        out.append({k: (v.tobytes() if isinstance(v, np.ndarray) and v.dtype != object else repr(v))
                    for k, v in infos.items() if k != "metrics"})
    return out


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_threaded_steps_give_every_env_the_same_numbers(mode):
    """1, 2, 3 and 7 threads over 13 envs whose episodes end at different steps (NEXT_STEP: the
    resets run while the engine's threads step the others): every byte the same."""
    runs = []
    for threads in (1, 2, 3, 7):
        lengths = iter(range(5, 18))
        vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=next(lengths), n_instances=3, rate=6.0),
                               13, autoreset_mode=mode, threads=threads)
        runs.append(_run(vec, 60, 4, 6))
        vec.close()
    assert all(run == runs[0] for run in runs[1:])
    assert len(runs[0]) == 121


def test_threads_option_and_its_default():
    assert default_threads(1) == 1 and default_threads(ENVS_PER_THREAD - 1) == 1
    assert 1 <= default_threads(1000) <= 8
    assert BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=5), 2, threads=1).threads == 1
    with pytest.raises(ValueError, match="threads: expected None or an integer >= 1"):
        BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=5), 2, threads=0)


def test_a_reset_failing_while_the_threads_step_the_others():
    """The exception comes out after the threads have finished, and the vector env works on."""
    lengths = iter([3, 6, 6, 6])
    vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=next(lengths), n_instances=2), 4, threads=2)
    vec.reset(seed=0)
    for _ in range(3):
        vec.step(np.zeros(4, np.int64))
    assert vec._resets == [0]
    env = vec.envs[0]

    def fail(**kwargs):
        raise RuntimeError("reset failed")

    env.reset = fail
    with pytest.raises(RuntimeError, match="reset failed"):
        vec.step(np.ones(4, np.int64))  # envs 1..3 stepped on the engine's threads meanwhile
    del env.reset
    obs, _ = vec.reset(seed=1)
    obs, rewards, terminated, truncated, infos = vec.step(np.ones(4, np.int64))
    assert obs.shape == (4, 12) and (rewards < 0).all() and infos["index"].tolist() == [0, 0, 0, 0]


def _assert_info(infos, i, info, n):
    for name, kind in PrefillRoutingV1Env.NATIVE_INFO:
        if name in info:
            assert infos["_" + name][i] and infos[name][i] == info[name], name
            assert type(infos[name][i].item()) is type(info[name]), name
        else:  # ttft_s of a rejected request: NaN in the vector's column
            assert name == "ttft_s" and math.isnan(infos[name][i])


@pytest.mark.parametrize("env_class", [PrefillRoutingV1Env, OverloadAdmissionV1Env])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
@pytest.mark.parametrize("threads", [1, 2])
def test_v1_vector_env_is_single_envs_episode_for_episode_across_autoresets(env_class, mode, threads):
    """Each sub-env of the v1 vector env runs the episodes of one single env seeded seed + i (native
    and reference singles) and reset without a seed at each autoreset: the observations' bytes,
    rewards, flags, infos and final metrics, through many autoresets."""
    kwargs = {"episode_requests": 12, "load": 1.5}
    n, seed = 3, 7
    vec = BatchedVectorEnv(lambda: env_class(**kwargs), n, autoreset_mode=mode, threads=threads)
    singles = [env_class(engine=("python" if i == 1 else "native"), **kwargs) for i in range(n)]
    obs, infos = vec.reset(seed=seed)
    assert vec._native.all()
    for i, env in enumerate(singles):
        o, info = env.reset(seed=seed + i)
        assert obs[i].tobytes() == o.tobytes() and infos["sim_seed"][i] == info["sim_seed"]
    rng = np.random.default_rng(seed)
    resetting = [False] * n
    ends = 0
    n_actions = int(vec.single_action_space.n)
    for _ in range(45):
        actions = rng.integers(0, n_actions, n)
        obs, rewards, terminated, truncated, infos = vec.step(actions)
        assert not truncated.any()
        for i, env in enumerate(singles):
            if resetting[i]:
                o, info = env.reset()
                assert obs[i].tobytes() == o.tobytes() and rewards[i] == 0.0 and not terminated[i]
                assert infos["sim_seed"][i] == info["sim_seed"]
                resetting[i] = False
                continue
            o, r, term, _, info = env.step(int(actions[i]))
            assert rewards[i] == r and terminated[i] == term
            _assert_info(infos, i, info, n)
            if not term:
                assert obs[i].tobytes() == o.tobytes()
                continue
            ends += 1
            assert infos["_metrics"][i]
            for key in ("token_goodput", "good_requests", "wasted_prefill_s", "mean_ttft_s"):
                a, b = infos["metrics"][key][i], info["metrics"][key]
                assert a == b or (math.isnan(a) and math.isnan(b)), key
            if mode == "NextStep":
                assert obs[i].tobytes() == o.tobytes()
                resetting[i] = True
            else:
                assert infos["final_obs"][i].tobytes() == o.tobytes()
                o, info = env.reset()
                assert obs[i].tobytes() == o.tobytes() and infos["sim_seed"][i] == info["sim_seed"]
    assert ends >= 6


def test_v1_make_vec_and_sb3_vec_env():
    from stable_baselines3 import PPO

    vec = gym.make_vec("mooncake_gym/PrefillRouting-v1", num_envs=2, vectorization_mode="vector_entry_point",
                       episode_requests=10)
    assert isinstance(vec.unwrapped, BatchedVectorEnv) and vec.unwrapped._batchable
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (2, vec.single_observation_space.shape[0])
    assert isinstance(gym.make_vec("mooncake_gym/OverloadAdmission-v1", num_envs=2,
                                   vectorization_mode="vector_entry_point").unwrapped, BatchedVectorEnv)
    venv = SB3VecEnv.routing_v1(4, episode_requests=20)
    venv.seed(0)
    venv.reset()
    seen_end = False
    for k in range(25):
        obs, rewards, dones, infos = venv.step(np.full(4, k % 8))
        for i in np.flatnonzero(dones):
            seen_end = True
            assert "metrics" in infos[i] and infos[i]["terminal_observation"].shape == obs[i].shape
    assert seen_end
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    assert model.num_timesteps >= 256


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_steps_without_the_parents_threads():
    """A process forked after the worker threads started has none: its steps run on its own thread
    (the same numbers as the parent's) and its batch is freed without joining them."""
    vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=6, n_instances=2), 4, threads=2)
    vec.reset(seed=0)
    vec.step(np.zeros(4, np.int64))
    pid = os.fork()
    if pid == 0:  # the child: step, compare with the parent's step written to no file, free, exit
        code = 3
        try:
            obs = vec.step(np.ones(4, np.int64))[0]
            code = 0 if obs.tobytes() == expected_next(vec.num_envs) else 1
            del vec
            gc.collect()
        finally:
            os._exit(code)
    obs = vec.step(np.ones(4, np.int64))[0]
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    assert obs.tobytes() == expected_next(4)


def expected_next(n):
    """The observations after the steps of test_a_forked_child_steps_without_the_parents_threads, on
    one thread."""
    vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=6, n_instances=2), n, threads=1)
    vec.reset(seed=0)
    vec.step(np.zeros(n, np.int64))
    return vec.step(np.ones(n, np.int64))[0].tobytes()


def test_a_launched_step_is_finished_before_its_batch_is_freed():
    vec = BatchedVectorEnv(lambda: PrefillRoutingEnv(episode_requests=30, n_instances=2), 8, threads=2)
    vec.reset(seed=0)
    batch = vec._batch
    batch.launch(np.ones(8, np.int64), None, 2)
    with pytest.raises(ValueError, match="step: a launched step is not finished"):
        batch.step(np.ones(8, np.int64), None, 2)
    assert batch.finish() == 0
    with pytest.raises(ValueError, match="finish: no launched step"):
        batch.finish()
    batch.launch(np.zeros(8, np.int64), None, 2)
    del vec, batch  # (freed with the step launched: the batch waits for it)
    gc.collect()
