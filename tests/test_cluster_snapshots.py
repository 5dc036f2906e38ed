"""Snapshots of the cluster simulator and the v1 environments (docs/engine.md "Snapshots").

After ``restore(s)``, continuing with the same actions gives the same views, counters, decode
instances' state, records and metrics as the run the snapshot was taken in (bitwise), on both engines,
whatever ran in between (other actions, other restores): reserve and batching decode, the preemption
modes, batching prefill with and without shared NICs. The v1 environments give the same observations,
rewards and infos.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_engine_cluster import assert_same_result, clusters, counters, view_fields, workloads
from test_engine_realistic import cluster_changes, decode_state, long_workloads

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym import _engine
from mooncake_gym.model.presets import NO_ENGINE, PRESETS
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim.cluster import ClusterAction, ClusterSimulator
from mooncake_gym.sim.policies import KVCentric
from mooncake_gym.sim.views import Route

pytestmark = pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")

ENGINES = ("python", "native")


@st.composite
def snapshot_clusters(draw):
    """The lecture's reserve cluster, or a realistic preset's batching decode (any preemption mode)
    with one prompt at a time per prefill instance, batching prefill, or batching prefill over
    shared NICs."""
    kind = draw(st.sampled_from(["reserve", "batching", "batching-prefill", "shared-nics"]))
    if kind == "reserve":
        return draw(clusters())
    name, changes = cluster_changes(draw, ["mooncake", "mooncake-hetero", "h100"])
    if kind == "batching":
        return PRESETS[name].with_(**{**NO_ENGINE, **changes})
    return PRESETS[name].with_(**changes, pipeline_nodes=1, pipeline_min_tokens=0, shared_nics=kind == "shared-nics")


def state(sim):
    """What a policy and the records see after a step."""
    out = (counters(sim), decode_state(sim) if not sim.reserve else (tuple(sim._cluster.used()) if hasattr(sim, "_cluster")
                                                                       else tuple(d.used for d in sim.decode)))
    return out + ((None,) if sim.done else (view_fields(sim.view),))


def run(sim, actions):
    """Step ``sim`` with ``actions`` until it is done: the state after each step."""
    out = []
    for a in actions:
        if sim.done:
            break
        sim.step(a)
        out.append(state(sim))
    return out


def drawn_actions(draw, preset, n):
    return [ClusterAction(draw(st.booleans() | st.just(True)),
                          draw(st.none() | st.builds(Route, st.integers(0, preset.n_prefill - 1), st.booleans())),
                          draw(st.none() | st.integers(0, preset.n_decode - 1))) for _ in range(n)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=st.one_of(workloads(), long_workloads()), preset=snapshot_clusters(), data=st.data())
def test_restore_then_the_same_actions_give_the_same_run_on_both_engines(trace, preset, data):
    """Two snapshots (at drawn decisions) of a run with drawn actions; restored in the order s2, s1
    (then other actions), s1, s2, each continued with the run's own actions: the same state after
    every step and the same result, on both engines, and the engines agree."""
    n = len(trace)
    actions = drawn_actions(data.draw, preset, n)
    other = drawn_actions(data.draw, preset, n)
    k1 = data.draw(st.integers(0, n))
    k2 = data.draw(st.integers(k1, n))
    seed = data.draw(st.integers(0, 2**32))
    tails = {}
    for engine in ENGINES:
        sim = ClusterSimulator(trace, preset, engine=engine, router=KVCentric(), seed=seed)
        assert getattr(sim, "native", False) == (engine == "native")
        run(sim, actions[:k1])
        s1 = sim.snapshot()
        between = run(sim, actions[k1:k2])
        s2 = sim.snapshot()
        after = run(sim, actions[k2:])
        whole = sim.result("x")
        view = sim.restore(s2)
        assert (view is None) == sim.done and (view is None or view.index == sim.view.index)
        assert run(sim, actions[k2:]) == after
        assert_same_result(sim.result("x"), whole)
        sim.restore(s1)
        run(sim, other)  # another branch
        sim.restore(s1)
        assert run(sim, actions[k1:]) == between + after
        assert_same_result(sim.result("x"), whole)
        sim.restore(s2)  # the same snapshot once more, after a later state
        assert run(sim, actions[k2:]) == after
        assert_same_result(sim.result("x"), whole)
        tails[engine] = (between + after, whole)
    assert tails["python"][0] == tails["native"][0]
    assert_same_result(tails["python"][1], tails["native"][1])


def test_snapshot_worked_by_hand():
    """Lecture cluster, 1 prefill and 1 decode instance of 1,000 tokens at 0.5 s per token: r0 (100
    tokens in, 4 out) admitted at 0, snapshot at r1's arrival (t = 1), r1 rejected; restored, r1
    admitted instead: it is the pending request again and the run goes on from there."""
    p = PRESETS["lecture"].with_(n_prefill=1, n_decode=1, decode_capacity_tokens=1000, tbt_s=0.5)
    trace = Trace([0.0, 1.0], [100, 100], [4, 4], [[1], [2]], name="hand")
    for engine in ENGINES:
        sim = ClusterSimulator(trace, p, engine=engine)
        sim.step(True)
        s = sim.snapshot()
        assert sim.view.index == 1 and sim.admitted == 1
        sim.step(False)
        assert sim.done and sim.rejected_at_arrival == 1
        view = sim.restore(s)
        assert view.index == 1 and not sim.done and sim.admitted == 1 and sim.rejected_at_arrival == 0
        sim.step(True)
        r = sim.result("x")
        assert r.metrics["completed"] == 2 and sim.rejected_at_arrival == 0
        with pytest.raises(ValueError, match="snapshot"):
            sim.restore("not a snapshot")


def test_a_snapshot_of_another_native_cluster_is_refused():
    trace = Trace([0.0, 1.0], [100, 100], [4, 4], [[1], [2]], name="hand")
    a, b = (ClusterSimulator(trace, "mooncake", engine="native") for _ in range(2))
    with pytest.raises(ValueError, match="restore: a snapshot of another cluster"):
        b.restore(a.snapshot())


# --- the v1 environments ------------------------------------------------------------------------------
def env_steps(env, actions):
    out = []
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        out.append((obs, reward, terminated, info))
        if terminated:
            break
    return out


def assert_same_steps(a, b):
    assert len(a) == len(b)
    for (o1, r1, t1, i1), (o2, r2, t2, i2) in zip(a, b):
        assert np.array_equal(o1, o2) and r1 == r2 and t1 == t2
        np.testing.assert_equal(i1, i2)  # (metrics at the end: NaN == NaN here)


@pytest.mark.parametrize("env_id, kwargs", [
    ("mooncake_gym/PrefillRouting-v1", {}),  # the mooncake preset: batching prefill, shared NICs, recompute
    ("mooncake_gym/PrefillRouting-v1", {"preset": PRESETS["mooncake"].with_(preemption="swap", decode_capacity_tokens=20000)}),
    ("mooncake_gym/OverloadAdmission-v1", {}),
    ("mooncake_gym/Conductor-v1", {"preset": PRESETS["mooncake"].with_(**NO_ENGINE, decode_capacity_tokens=20000)}),
])
def test_v1_env_restore_gives_the_same_observations_rewards_and_infos(env_id, kwargs):
    """A 150-request episode at 0.9x saturation with random actions: snapshots after 30 and 60 steps;
    restore returns the observation of the snapshot's step; then the same actions give the same
    observations, rewards and infos (the end's metrics included) on both engines, after other
    branches too; and the engines agree."""
    runs = {}
    for engine in ENGINES:
        env = gym.make(env_id, engine=engine, episode_requests=150, load=0.9, **kwargs)
        u = env.unwrapped
        obs, _ = env.reset(seed=5)
        assert (u._core is not None) == (engine == "native")
        env.action_space.seed(7)
        actions = [env.action_space.sample() for _ in range(400)]
        other = [env.action_space.sample() for _ in range(400)]
        first = env_steps(env, actions[:30])
        s1, obs1 = u.snapshot(), first[-1][0]
        middle = env_steps(env, actions[30:60])
        s2, obs2 = u.snapshot(), middle[-1][0]
        rest = env_steps(env, actions[60:])
        assert len(first) == len(middle) == 30 and rest[-1][2]  # (then terminated)
        assert np.array_equal(u.restore(s2), obs2)
        assert_same_steps(env_steps(env, actions[60:]), rest)
        assert np.array_equal(u.restore(s1), obs1)
        env_steps(env, other)
        assert np.array_equal(u.restore(s1), obs1)
        assert_same_steps(env_steps(env, actions[30:]), middle + rest)
        assert np.array_equal(u.restore(s2), obs2)
        assert_same_steps(env_steps(env, actions[60:]), rest)
        runs[engine] = first + middle + rest
        with pytest.raises(ValueError, match="snapshot"):
            u.restore(u.sim.snapshot())
        env.close()
    assert_same_steps(runs["python"], runs["native"])


def test_v1_env_snapshot_before_reset_is_refused():
    env = gym.make("mooncake_gym/PrefillRouting-v1", episode_requests=20)
    with pytest.raises(RuntimeError, match="snapshot: call reset"):
        env.unwrapped.snapshot()
