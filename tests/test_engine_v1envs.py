"""The v1 environments on the native engine (``ClusterEnvCore``, ``_engine/clusterenv.hpp``) against the
reference (``envs/cluster.py`` ``_Simulator``): whole episodes with the same seeds and actions give
the same observations (bytes), rewards, flags, infos (values and types), action masks and final
metrics, on every kind of cluster the native engine runs (reserve decode, continuous batching with
each preemption mode), with the oracle and prediction features; the engine switch and bad input."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the ids)
from mooncake_gym import _engine
from mooncake_gym._engine.cluster import NativeClusterSimulator, preset_unsupported
from mooncake_gym.envs.cluster import _Simulator
from mooncake_gym.model.presets import NO_ENGINE, get_preset
from mooncake_gym.sim.decode import TBT_TAIL_SHARE, tail_means

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built")

ROUTING, ADMISSION, CONDUCTOR = ("mooncake_gym/PrefillRouting-v1", "mooncake_gym/OverloadAdmission-v1",
                                 "mooncake_gym/Conductor-v1")


def native_preset(name: str, **changes):
    return get_preset(name).with_(**{**NO_ENGINE, **changes})


def same(x, y) -> bool:
    return type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


def assert_same_info(a: dict, b: dict, step: int) -> None:
    assert list(a) == list(b), (step, list(a), list(b))
    for k in a:
        if k == "metrics":
            assert list(a[k]) == list(b[k])
            for m in a[k]:
                assert same(a[k][m], b[k][m]), (step, m, a[k][m], b[k][m])
        elif k == "action_mask":
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), (step, a[k], b[k])
        else:
            assert same(a[k], b[k]), (step, k, a[k], b[k], type(a[k]), type(b[k]))


def episodes(env_id: str, seeds, actions=None, wrapped: bool = False, **kwargs) -> dict:
    """Both engines through whole episodes with the same actions (uniformly random valid ones, or
    ``actions(env, rng)``), compared step by step; returns the native episodes' final metrics."""
    make = (lambda **kw: gym.make(env_id, **kw)) if wrapped else (lambda **kw: gym.make(env_id, **kw).unwrapped)
    out = {}
    for seed in seeds:
        native, ref = make(engine="native", **kwargs), make(engine="python", **kwargs)
        (on, info_n), (orf, info_r) = native.reset(seed=seed), ref.reset(seed=seed)
        assert isinstance(native.unwrapped.sim, NativeClusterSimulator)
        assert type(ref.unwrapped.sim) is _Simulator
        assert on.dtype == orf.dtype == np.float32 and on.tobytes() == orf.tobytes()
        assert_same_info(info_n, info_r, -1)
        rng = np.random.default_rng(seed)
        native.action_space.seed(seed)
        step, terminated = 0, False
        while not terminated:
            action = native.action_space.sample() if actions is None else actions(native.unwrapped, rng)
            on, rn, terminated, tn, info_n = native.step(action)
            orf, rr, tr, trr, info_r = ref.step(action)
            assert on.tobytes() == orf.tobytes(), (step, np.flatnonzero(on != orf))
            assert type(rn) is type(rr) is float and rn == rr, (step, rn, rr)
            assert (terminated, tn) == (tr, trr)
            assert_same_info(info_n, info_r, step)
            if hasattr(native.unwrapped, "action_masks"):
                assert np.array_equal(native.unwrapped.action_masks(), ref.unwrapped.action_masks())
            step += 1
        out[seed] = info_n["metrics"]
    return out


@pytest.mark.parametrize("env_id", [ROUTING, ADMISSION, CONDUCTOR])
def test_continuous_batching_episodes_equal(env_id):
    m = episodes(env_id, (0, 1, 2), preset=native_preset("mooncake"), episode_requests=250)
    assert all(x["completed"] > 0 and x["token_goodput"] > 0 for x in m.values())


@pytest.mark.parametrize("env_id", [ADMISSION, CONDUCTOR])
def test_overload_with_oracle_and_prediction_equal(env_id):
    """Mostly admitted (nine in ten) at three times the saturation: rejections after prefill, so
    waste in the rewards."""
    def mostly_admit(env, rng):
        a = env.action_space.sample()
        if env_id == ADMISSION:
            return int(rng.random() < 0.9)
        a[0] = int(rng.random() < 0.9)
        return a

    m = episodes(env_id, (3, 4), actions=mostly_admit, preset=native_preset("mooncake-overload"),
                 episode_requests=300, load=3.0, oracle=True, prediction=True, waste_penalty=0.5)
    assert all(x["rejected_after_prefill"] > 0 for x in m.values())


@pytest.mark.parametrize("env_id", [ROUTING, ADMISSION, CONDUCTOR])
def test_reserve_decode_episodes_equal(env_id):
    """The lecture preset (the reserve decode model: TBTs known at once)."""
    episodes(env_id, (0, 1), preset="lecture", episode_requests=200, load_range=(0.5, 2.5))


@pytest.mark.parametrize("mode", ["abort", "recompute", "swap"])
def test_preemptions_equal(mode):
    """A decode instance with little KV that Conductor-v1 fills on purpose (admit everything, ask
    instance 0): preemptions (aborted, or re-queued with stints and stalls) reach the reward's TBT
    check and the waste penalty."""
    p = native_preset("mooncake", preemption=mode, decode_capacity_tokens=40_000)

    def fill(env, rng):
        return np.array([1, rng.integers(env.preset.n_prefill), rng.integers(2), 0], np.int64)

    m = episodes(CONDUCTOR, (0, 1), actions=fill, preset=p, episode_requests=250, load=2.0)
    if mode == "abort":
        assert sum(x["preempted"] for x in m.values()) > 0
    else:
        assert sum(x["preemptions"] for x in m.values()) > 0


def test_through_gym_make_with_its_wrappers():
    episodes(ROUTING, (5,), wrapped=True, preset=native_preset("mooncake-hetero"), episode_requests=150)


def test_tail_tbt_sums_as_numpy():
    """The engine's TBT of one request (decode.hpp tail_means, which the v1 core's goodput test and
    the cluster's finish_tbt use) equals the reference's to the bit (numpy's pairwise sum of the
    tail), for tails of 1 to 300 intervals (the sum's three regimes: a loop, eight lanes, halves)."""
    def tail_tbt(v, share):
        return _engine.native.tail_means([0, len(v)], list(v), share)[0][0]

    rng = np.random.default_rng(0)
    for n in list(range(1, 40)) + [79, 80, 81, 127, 128, 129, 255, 256, 640, 1279, 1280, 1281, 3000]:
        v = np.exp(rng.normal(-3, 2, n))
        tbt, _, _ = tail_means(np.array([0, n]), v)
        assert tail_tbt(v.tolist(), TBT_TAIL_SHARE) == tbt[0], n
    # worked by hand: ten intervals, the largest one (ceil(0.1 x 10) = 1) is the TBT
    assert tail_tbt([0.01 * k for k in range(1, 11)], 0.1) == 0.1
    assert tail_tbt([], 0.1) == 0.0


def test_engine_switch():
    p = native_preset("mooncake")
    assert gym.make(ROUTING, preset=p).unwrapped.engine == _engine.engine()
    assert gym.make(ROUTING, preset=p, observation="scraped").unwrapped.engine == "python"
    with pytest.raises(ValueError, match="engine: 'native' cannot run this environment: the native engine shows "
                                         "the exact observation only"):
        gym.make(ADMISSION, preset=p, observation="scraped", engine="native")
    shipped = get_preset("mooncake")
    why = preset_unsupported(shipped)
    if why is None:  # once the native cluster runs the shipped presets
        assert gym.make(CONDUCTOR).unwrapped.engine == _engine.engine()
    else:
        assert gym.make(CONDUCTOR).unwrapped.engine == "python"
        with pytest.raises(ValueError, match="engine: 'native' cannot run this environment: preset 'mooncake'"):
            gym.make(CONDUCTOR, engine="native")
    with pytest.raises(ValueError, match="engine"):
        gym.make(ROUTING, preset=p, engine="gpu")


@pytest.mark.parametrize("env_id, bad", [(ROUTING, 16), (ROUTING, -1), (ROUTING, 1.5), (ADMISSION, 2),
                                         (CONDUCTOR, [1, 0, 0]), (CONDUCTOR, np.array([1, 8, 0, 0])),
                                         (CONDUCTOR, np.array([1.0, 0, 0, 0]))])
def test_bad_actions_named_on_the_engine(env_id, bad):
    env = gym.make(env_id, preset=native_preset("mooncake"), episode_requests=20, engine="native").unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="^action: expected"):
        env.step(bad)


def test_after_the_last_step():
    env = gym.make(ADMISSION, preset=native_preset("mooncake-overload"), episode_requests=5,
                   engine="native").unwrapped
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)
    env.reset(seed=0)
    terminated = False
    while not terminated:
        obs, _, terminated, _, info = env.step(1)
    assert not obs.any() and "metrics" in info
    with pytest.raises(RuntimeError, match="the episode has terminated"):
        env.step(1)
    assert env.decision_view() is None


def test_conductor_core_flat_action_is_the_four_values():
    """The core's step(action) (the vector env's interface) takes Conductor-v1's four values as one
    flat index, ((admit x P + instance) x 2 + pull) x (D + 1) + decode: the same steps as the env's."""
    kwargs = dict(preset=native_preset("mooncake"), episode_requests=120, engine="native")
    env, flat = gym.make(CONDUCTOR, **kwargs).unwrapped, gym.make(CONDUCTOR, **kwargs).unwrapped
    env.reset(seed=7)
    flat.reset(seed=7)
    p, d = env.preset.n_prefill, env.preset.n_decode
    assert flat._core.n_actions == 2 * p * 2 * (d + 1)
    env.action_space.seed(7)
    terminated = False
    while not terminated:
        a = env.action_space.sample()
        obs, reward, terminated, _, info = env.step(a)
        r, t, i = flat._core.step(int(((a[0] * p + a[1]) * 2 + a[2]) * (d + 1) + a[3]))
        assert (r, t) == (reward, terminated)
        assert flat._obs.tobytes() == obs.tobytes() and flat._mask_buffer.tobytes() == info["action_mask"].tobytes()
        assert i == {k: v for k, v in info.items() if k not in ("metrics", "action_mask")}


def test_env_benchmark_names_native_cases_and_stays_json():
    """benchmarks/bench_envs.py measures the v1 envs on a native preset beside their defaults: one
    row per case (the arguments in the name where an id comes twice), its engine, JSON-able."""
    import importlib.util
    import json
    from pathlib import Path

    from mooncake_gym.reporting.tables import to_jsonable

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_envs.py"
    spec = importlib.util.spec_from_file_location("bench_envs_v1_native", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = [(ADMISSION, {"preset": bench.native_preset("mooncake-overload"), "episode_requests": 30}),
             (ADMISSION, {"episode_requests": 30})]
    result = bench.run(seconds=0.05, rounds=1, env_cases=cases, verbose=False)
    native, ref = (f"{ADMISSION} (preset=mooncake-overload+NO_ENGINE, episode_requests=30)",
                   f"{ADMISSION} (episode_requests=30)")
    assert list(result["envs"]) == [native, ref]
    assert result["envs"][native]["engine"] == _engine.engine()
    assert result["envs"][ref]["engine"] == "python" or preset_unsupported(get_preset("mooncake-overload")) is None
    assert json.loads(json.dumps(to_jsonable(result)))["envs"][native]["kwargs"]["preset"] == "mooncake-overload+NO_ENGINE"
    assert "[native]" in bench.format_report(result) or _engine.engine() == "python"


@pytest.mark.parametrize("env_id, preset", [(ROUTING, "mooncake"), (ADMISSION, "mooncake-overload"),
                                            (CONDUCTOR, "mooncake")])
def test_shipped_presets_once_native(env_id, preset):
    """The environments' own presets as shipped (chunked prefill batching, shared NICs, recompute):
    on the engine by default as soon as the native cluster runs them, with the reference's numbers."""
    why = preset_unsupported(get_preset(preset))
    if why is not None:
        pytest.skip(f"not native yet: {why}")
    episodes(env_id, (0,), preset=preset, episode_requests=200)


def test_final_metrics_made_when_first_read_are_the_references():
    """On the engine the last step's ``info["metrics"]`` is an ``EpisodeMetrics``: a dict made when
    first read. Read after a restore that took the finished episode back (which fills it first), as
    JSON, pickled, copied or key by key, it is the reference's metrics."""
    import copy
    import json
    import pickle

    from mooncake_gym.envs.cluster import EpisodeMetrics

    finals = {}
    for engine in ("native", "python"):
        env = gym.make(ROUTING, engine=engine, episode_requests=60).unwrapped
        env.reset(seed=4)
        rng = np.random.default_rng(0)
        snapshot, terminated, step = None, False, 0
        while not terminated:
            _, _, terminated, _, info = env.step(int(rng.integers(env.action_space.n)))
            step += 1
            if step == 20:
                snapshot = env.snapshot()
        finals[engine] = (env, info["metrics"], snapshot)
    env, lazy, snapshot = finals["native"]
    ref = finals["python"][1]
    assert type(lazy) is EpisodeMetrics and isinstance(lazy, dict) and type(ref) is dict
    assert dict.__len__(lazy) == 1  # not made yet: only its first entry
    for read in (json.dumps, repr, len, list, lambda m: repr(sorted(m.items())), lambda m: "policy" in m):  # (NaN: by repr)
        fresh = EpisodeMetrics(env.sim)  # (over the finished episode's simulator, as the step's)
        assert read(fresh) == read(ref)
    env.restore(snapshot)  # the finished episode's state changes: the metrics are made first
    assert list(lazy) == list(ref)
    for k in ref:
        assert same(lazy[k], ref[k]), (k, lazy[k], ref[k])
    assert json.dumps(lazy) == json.dumps(ref)
    for made in (pickle.loads(pickle.dumps(lazy)), copy.deepcopy(lazy), dict(lazy), {**lazy}):
        assert type(made) is dict and repr(made) == repr(ref)


def test_final_metrics_held_unread_are_made_when_the_next_episode_ends():
    """An episode's ``info["metrics"]`` still held unread when the next episode ends is made then (its
    simulator freed: at most one finished episode's is kept), with the values it would have had;
    one nobody holds is never made."""
    import gc
    import weakref

    env = gym.make(ROUTING, engine="native", episode_requests=40).unwrapped
    rng = np.random.default_rng(1)

    def episode(seed):
        env.reset(seed=seed)
        while True:
            _, _, terminated, _, info = env.step(int(rng.integers(env.action_space.n)))
            if terminated:
                return info["metrics"]

    kept = episode(1)
    sim = weakref.ref(env.sim)
    expected = repr(env.sim.result("env").metrics)
    assert dict.__len__(kept) == 1
    dropped = weakref.ref(episode(2))  # the first is made now; the second's info is dropped at once
    assert dict.__len__(kept) > 1 and repr(kept) == expected
    gc.collect()
    assert sim() is None and dropped() is None
    episode(3)  # nothing left to make
