"""The v1 environments (PrefillRouting-v1, OverloadAdmission-v1, Conductor-v1): Gymnasium's and
SB3's checkers, determinism, pickling, vectorisation, bad actions, exact rewards on hand-built
traces, the env against ``conductor.simulate`` with the same policies, and the docs pages."""

import math
import pathlib

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from conftest import pickle_round_trip
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import mooncake_gym.envs
from mooncake_gym.sim.cluster import ClusterAction, simulate
from mooncake_gym.envs import (ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID, ROUTING_V1_ENV_ID, ConductorV1Env,
                               OverloadAdmissionV1Env, PrefillRoutingV1Env)
from mooncake_gym.reporting.env_docs import DOC_PAGES, doc_page
from mooncake_gym.model.presets import NO_ENGINE, get_preset
from mooncake_gym.sim.routing import Route
from test_conductor import trace_of  # the hand-built traces of the simulator's tests

IDS = [ROUTING_V1_ENV_ID, ADMISSION_V1_ENV_ID, CONDUCTOR_ENV_ID]
SMALL = {"episode_requests": 60}
ONE = get_preset("mooncake").with_(n_prefill=1, n_decode=1)
ROOT = pathlib.Path(__file__).resolve().parents[1]


def same(a: dict, b: dict) -> bool:
    """Metrics equal key by key (NaN equals NaN), the policy name aside."""
    keys = (set(a) | set(b)) - {"policy"}
    return all(a.get(k) == b.get(k) or (isinstance(a.get(k), float) and math.isnan(a[k]) and math.isnan(b[k]))
               for k in keys)


def rollout(env, seed, n=None, actions_seed=0):
    """Observations, rewards and final info of an episode of random actions (n steps at most)."""
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(actions_seed)
    out, rewards, info = [obs], [], {}
    while n is None or len(rewards) < n:
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        out.append(obs)
        rewards.append(r)
        if term:
            break
    return out, rewards, info


@pytest.mark.parametrize("env_id", IDS)
def test_checkers_pass(env_id):
    gym_check_env(gym.make(env_id, **SMALL).unwrapped)
    sb3_check_env(gym.make(env_id, **SMALL).unwrapped, warn=True)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_episode_and_observations_in_the_box(env_id):
    a = rollout(gym.make(env_id, **SMALL), seed=4)
    b = rollout(gym.make(env_id, **SMALL), seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1]
    assert same(a[2]["metrics"], b[2]["metrics"])
    space = gym.make(env_id, **SMALL).observation_space
    assert all(space.contains(o) for o in a[0])
    c = rollout(gym.make(env_id, **SMALL), seed=5)
    assert c[1] != a[1]


@pytest.mark.parametrize("env_id", IDS)
def test_pickle_mid_episode_continues_identically(env_id):
    env = gym.make(env_id, **SMALL).unwrapped
    env.reset(seed=1)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(60)]
    for a in actions[:20]:
        env.step(a)
    clone = pickle_round_trip(env)
    if clone is None:  # the compiled core: the limit asserted there
        return
    for a in actions[20:]:
        o1, r1, t1, _, i1 = env.step(a)
        o2, r2, t2, _, i2 = clone.step(a)
        assert np.array_equal(o1, o2) and r1 == r2 and t1 == t2
        if t1:
            assert same(i1["metrics"], i2["metrics"])
            break


@pytest.mark.parametrize("env_id", IDS)
def test_make_vec_sync(env_id):
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode="sync", **SMALL)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2,) + envs.single_observation_space.shape
    for _ in range(70):  # across the autoreset
        obs, rew, term, trunc, _ = envs.step(envs.action_space.sample())
    envs.close()


@pytest.mark.parametrize("env_id, bad", [
    (ROUTING_V1_ENV_ID, 16), (ROUTING_V1_ENV_ID, -1), (ROUTING_V1_ENV_ID, 1.5), (ROUTING_V1_ENV_ID, "0"),
    (ADMISSION_V1_ENV_ID, 2), (ADMISSION_V1_ENV_ID, None),
    (CONDUCTOR_ENV_ID, [2, 0, 0, 0]), (CONDUCTOR_ENV_ID, [1, 8, 0, 0]), (CONDUCTOR_ENV_ID, [1, 0, 2, 0]),
    (CONDUCTOR_ENV_ID, [1, 0, 0, 9]), (CONDUCTOR_ENV_ID, [1, 0, 0]), (CONDUCTOR_ENV_ID, 3),
    (CONDUCTOR_ENV_ID, [1, 0.5, 0, 0]), (CONDUCTOR_ENV_ID, np.array([1.0, 0, 0, 0])), (CONDUCTOR_ENV_ID, "1000"),
    (CONDUCTOR_ENV_ID, ["1", "0", "0", "0"]), (CONDUCTOR_ENV_ID, np.array([[1, 0, 0, 0]]))])
def test_action_outside_the_space_is_a_value_error(env_id, bad):
    env = gym.make(env_id, **SMALL).unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(bad)


@pytest.mark.parametrize("kwargs, name", [({"preset": "nope"}, "preset"), ({"load": 0}, "load"),
                                          ({"load": 1, "load_range": (1, 2)}, "load"),
                                          ({"render_mode": "ansi"}, "render_mode"), ({"oracle": 1}, "oracle"),
                                          ({"episode_requests": 0}, "episode_requests")])
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        gym.make(CONDUCTOR_ENV_ID, **kwargs)


@pytest.mark.parametrize("preset", ["lecture", "mooncake", "mooncake-overload", "h100"])
def test_any_preset_sizes_spaces(preset):
    env = gym.make(CONDUCTOR_ENV_ID, preset=preset, oracle=True, **SMALL).unwrapped
    p = get_preset(preset)
    assert env.observation_space.shape == (5 * p.n_prefill + 2 + 4 * p.n_decode + 3 + 1,)
    assert list(env.action_space.nvec) == [2, p.n_prefill, 2, p.n_decode + 1]
    assert env.observation_space.contains(env.reset(seed=0)[0])


# --- exact rewards on hand-built traces -------------------------------------------------------------
def test_routing_reward_is_minus_ttft_over_slo():
    # one request at a time (FIFO): the TTFT is known at the decision (with the realistic presets'
    # prefill batching the step's reward is the estimate at dispatch, the last step's the real TTFT)
    env = PrefillRoutingV1Env(preset=ONE.with_(**NO_ENGINE))
    env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 5), (0.0, 2000, 5))})
    p = ONE.prefill_cost.prefill_s(1000, 0)
    q = ONE.prefill_cost.prefill_s(2000, 0)
    _, r1, t1, _, _ = env.step(0)
    _, r2, t2, _, info = env.step(0)  # FIFO behind the first
    assert (t1, t2) == (False, True)
    assert r1 == pytest.approx(-p / 30.0, rel=1e-12) and r2 == pytest.approx(-(p + q) / 30.0, rel=1e-12)
    assert info["metrics"]["completed"] == 2 and info["metrics"]["goodput"] == 2


def test_goodput_reward_counts_good_tokens_and_charges_waste():
    # one decode instance of 1500 tokens: the first request (1000 + 400) decodes; the second's prefill
    # ends while it does, finds no room and is rejected after prefill (its prefill wasted); both happen
    # before the third (rejected) arrives at 100 s, the horizon, so they are in the second step's reward
    env = OverloadAdmissionV1Env(preset=ONE.with_(decode_capacity_tokens=1500))
    env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 400), (0.0, 1000, 5), (100.0, 800, 9))})
    _, r1, _, _, _ = env.step(1)
    _, r2, _, _, i2 = env.step(1)
    _, r3, term, _, info = env.step(0)
    p = ONE.prefill_cost.prefill_s(1000, 0)
    assert (r1, r3) == (0.0, 0.0) and term
    assert r2 == pytest.approx(400 / env.mean_output_tokens - 0.1 * p / env.mean_prefill_s, rel=1e-12)
    m = info["metrics"]
    assert (m["completed"], m["rejected_after_prefill"], m["rejected_at_arrival"]) == (1, 1, 1)
    assert m["wasted_prefill_s"] == pytest.approx(p, rel=1e-12)
    assert (m["token_goodput"], m["goodput_requests"]) == (400, 1)
    assert (i2["good_tokens"], i2["good_requests"]) == (400, 1) and i2["wasted_s"] == pytest.approx(p, rel=1e-12)


def test_conductor_reject_and_explicit_decode_instance():
    env = ConductorV1Env(preset=ONE.with_(n_decode=2))
    # the third request (rejected) sets the horizon at 30 s: the second completes before it
    env.reset(seed=0, options={"trace": trace_of((0.0, 1000, 7), (0.5, 1000, 7), (30.0, 1000, 7))})
    _, r1, _, _, i1 = env.step([0, 0, 0, 0])
    _, r2, _, _, i2 = env.step(np.array([1, 0, 1, 1]))
    _, r3, term, _, _ = env.step([0, 0, 0, 0])
    assert (i1["admitted"], i2["admitted"], term) == (False, True, True)
    assert r1 == r3 == 0.0 and r2 == pytest.approx(7 / env.mean_output_tokens, rel=1e-12)
    assert env.sim.decode_instance[1] == 1 and env.sim.prefill_instance[1] == 0


# --- the env is the simulator: same policy, same metrics -------------------------------------------
def algorithm1_admission(view):
    return view.predicted_ttft_s <= view.ttft_slo_s


def least_queue(routing_view):
    return Route(min(range(routing_view.n_instances), key=routing_view.queue_s.__getitem__), True)


def emptiest_decode(view):
    used = view.decode_used_per_instance
    return min(range(len(used)), key=used.__getitem__)


@pytest.mark.parametrize("env_id, admission, routing, decode", [
    (ROUTING_V1_ENV_ID, None, least_queue, None),
    (ADMISSION_V1_ENV_ID, algorithm1_admission, None, None),
    (CONDUCTOR_ENV_ID, algorithm1_admission, least_queue, emptiest_decode)])
def test_env_equals_conductor_simulate(env_id, admission, routing, decode):
    env = gym.make(env_id, episode_requests=400).unwrapped
    _, reset_info = env.reset(seed=7)
    total, good, wasted = 0.0, 0, 0.0
    while True:
        v = env.decision_view()
        admit = True if admission is None else admission(v)
        route = routing(v.routing) if admit and routing is not None else None
        target = decode(v) if admit and decode is not None else None
        if env_id == ROUTING_V1_ENV_ID:
            action = env.encode_action(route)
        elif env_id == ADMISSION_V1_ENV_ID:
            action = env.encode_action(admit)
        else:
            action = env.encode_action(ClusterAction(admit, route, target))
        _, r, term, _, info = env.step(action)
        total += r
        good += info["good_tokens"]
        wasted += info["wasted_s"]
        if term:
            break
    direct = simulate(env.sim.trace, env.preset, admission=admission, routing=routing, decode=decode,
                      seed=reset_info["sim_seed"]).metrics
    assert same(info["metrics"], direct)
    assert wasted == pytest.approx(direct["wasted_prefill_s"], rel=1e-9, abs=1e-12)
    assert good == direct["token_goodput"] <= direct["goodput_tokens"]
    if env_id != ROUTING_V1_ENV_ID:
        assert total == pytest.approx(good / env.mean_output_tokens
                                      - 0.1 * direct["wasted_prefill_s"] / env.mean_prefill_s, rel=1e-9)


# --- the docs pages are the docstrings ------------------------------------------------------------
@pytest.mark.parametrize("name, env_id, page", DOC_PAGES)
def test_docs_page_is_the_docstring(name, env_id, page):
    text = (ROOT / page).read_text()
    assert text == doc_page(getattr(mooncake_gym.envs, name), env_id), \
        f"{page} differs from the docstring: run python -m mooncake_gym.reporting.env_docs"
    assert gym.spec(env_id).entry_point.endswith(":" + name)
    for section in ("Description", "Action Space", "Observation Space", "Rewards", "Info", "Starting State",
                    "Episode End", "Arguments", "Version History"):
        assert f"## {section}\n" in text


@pytest.mark.parametrize("preset", ["mooncake", "lecture"])
def test_decode_features_are_the_views_fields(preset):
    env = gym.make(CONDUCTOR_ENV_ID, preset=preset, load=1.5, episode_requests=300).unwrapped
    obs, _ = env.reset(seed=2)
    p = get_preset(preset)
    start, busy = 5 * p.n_prefill + 2, 0
    while True:
        v = env.decision_view()
        expected = []
        for b, u, s, sw in zip(v.decode_batch, v.decode_used_per_instance, v.decode_step_s, v.decode_step_with_s):
            expected += [b / 256, u / p.decode_capacity_per_instance, s / (2 * p.tbt_slo_s), sw / (2 * p.tbt_slo_s)]
        expected = np.clip(np.asarray(expected, np.float32), 0, 1)
        assert np.array_equal(obs[start:start + 4 * p.n_decode], expected)
        assert obs[-3] == np.float32(min(1.0, v.predicted_ttft_s / 45.0))
        busy += sum(b > 0 for b in v.decode_batch)
        obs, _, term, _, _ = env.step([1, v.default_route[0], int(v.default_route[1]), p.n_decode])
        if term:
            break
    assert busy > 100  # the decode side was observed busy, not only empty


@pytest.mark.parametrize("env_id", IDS)
def test_observation_mode_exact_is_the_default_and_a_stale_view_changes_only_what_is_seen(env_id):
    from mooncake_gym.sim.observation import ObservationConfig

    base = rollout(gym.make(env_id, **SMALL), seed=7)
    exact = rollout(gym.make(env_id, observation="exact", **SMALL), seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(base[0], exact[0])) and base[1] == exact[1]
    stale = ObservationConfig(mode="scraped", scrape_period_s=2.0, scrape_delay_s=1.0, inflight=False)
    a = rollout(gym.make(env_id, observation=stale, load=1.5, **SMALL), seed=7)
    b = rollout(gym.make(env_id, observation=stale, load=1.5, **SMALL), seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1]  # same seed, same episode
    seen = rollout(gym.make(env_id, load=1.5, **SMALL), seed=7)
    assert len(a[0]) == len(seen[0])  # the same requests arrive
    assert any(not np.array_equal(x, y) for x, y in zip(a[0], seen[0]))  # but the snapshots lag


def test_a_bad_observation_mode_names_the_argument():
    with pytest.raises(ValueError, match="observation"):
        gym.make(ROUTING_V1_ENV_ID, observation="psychic")
