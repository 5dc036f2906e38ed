"""LBGR (mooncake_gym/baselines/lbgr.py) on hand-made cases, and the simulators' feedback channel (sim/policy.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import mooncake_gym  # noqa: F401  (registers the env ids)
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.lbgr import LBGR
from mooncake_gym.envs import ROUTING_ENV_ID, ROUTING_V1_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.evaluation.problems import OnRoutingView
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim import cluster
from mooncake_gym.sim.routing import RoutingConfig, simulate


def view(now, index, tokens, blocks, n=2, cache=10):
    """The fields LBGR reads of a RoutingView."""
    return SimpleNamespace(now=now, index=index, input_tokens=tokens, block_ids=blocks, n_instances=n,
                           cache_blocks=(cache,) * n)


def test_predictions_loads_and_the_rls_bias_exactly():
    # 1 ms per uncached token, loads halved every second, forgetting 0.5
    p = LBGR(token_cost_s=1e-3, decay=0.5, decay_interval_s=1.0, lam=0.5)
    p.reset(None)
    # request 0: nothing indexed, both predict 1024 x 1 ms; the tie keeps instance 0
    assert p.predictions(view(0.0, 0, 1024, (1, 2))) == ([1.024, 1.024], [1.024, 1.024])
    assert p(view(0.0, 0, 1024, (1, 2))).instance == 0
    assert p.load_s == [1.024, 0.0]
    # request 1 at t = 1 (one decay tick): its two blocks are in instance 0's index, so its base
    # there is the 1 ms floor; 0.001 + 0.512 against 1.024 on instance 1
    pred, base = p.predictions(view(1.0, 1, 1024, (1, 2)))
    assert base == [0.001, 1.024] and pred == pytest.approx([0.513, 1.024], rel=1e-15)
    assert p(view(1.0, 1, 1024, (1, 2))).instance == 0
    assert p.load_s == pytest.approx([0.513, 0.0], rel=1e-15)
    # request 0's prefill ends at t = 1.5 after 2.0 s: residual y = 2.0 - (1.024 + 0 at routing);
    # RLS from p0 = 1e6: k = p0 / (0.5 + p0); what is left of its reservation, 1.024 x 0.5**1, is freed
    p.observe(0, 0, 2.0, 1.5)
    k = 1e6 / (0.5 + 1e6)
    assert p.bias_s == pytest.approx([k * 0.976, 0.0], rel=1e-12)
    assert p.cov[0] == pytest.approx((1e6 - k * 1e6) / 0.5, rel=1e-12)
    assert p.load_s[0] == pytest.approx(0.513 - 0.512, rel=1e-9)
    # request 2 at t = 2, a new prompt: instance 0 now predicts 1.024 + 0.0005 + bias, so instance 1
    pred, _ = p.predictions(view(2.0, 2, 1024, (5, 6)))
    assert pred == pytest.approx([1.024 + 0.0005 + k * 0.976, 1.024], rel=1e-9)
    assert p(view(2.0, 2, 1024, (5, 6))).instance == 1
    # request 1's prefill ends at 2.5 after 0.3 s: the residual is clipped at the 1 ms floor, and
    # the second RLS step moves the bias towards it with gain p1 / (0.5 + p1)
    p.observe(1, 0, 0.3, 2.5)
    p1 = (1e6 - k * 1e6) / 0.5
    k2 = p1 / (0.5 + p1)
    assert p.bias_s[0] == pytest.approx(k * 0.976 + k2 * (0.001 - k * 0.976), rel=1e-12)
    p.observe(99, 1, 1.0, 3.0)  # a request it did not route: ignored
    assert p.bias_s[1] == 0.0


def test_margin_keeps_the_earlier_instance_unless_strictly_better():
    p = LBGR(margin_s=0.01)
    p.reset(None)
    p.predictions(view(0.0, 0, 100, (1,), n=3))
    p.load_s = [0.010, 0.0, 0.0]  # instance 1 is better by exactly the margin: not strictly
    assert p(view(0.0, 0, 100, (1,), n=3)).instance == 0
    p.load_s = [0.0111, 0.0, 0.0]  # by more than the margin: instance 1 (instance 2 ties it)
    assert p(view(0.0, 1, 100, (2,), n=3)).instance == 1
    with pytest.raises(ValueError, match="decay"):
        LBGR(decay=0.0)
    with pytest.raises(ValueError, match="token_cost_s"):
        LBGR(token_cost_s=-1.0)


class Spy:
    """A routing policy that logs its decisions and the feedback it is told, in order."""

    name = "spy"

    def __init__(self, route=lambda v: 0):
        self.route, self.log = route, []

    def __call__(self, v):
        self.log.append(("decide", v.index, v.now))
        return self.route(v)

    def observe(self, request_index, instance, measured_ttft_s, now_s):
        self.log.append(("observe", request_index, instance, measured_ttft_s, now_s))


def _check_feedback(log, arrival):
    """Each request told once, at its end (arrival + measured TTFT): after every decision before its
    end and before the first decision at or after it."""
    told = set()
    for pos, e in enumerate(log):
        if e[0] != "observe":
            continue
        _, k, _, ttft, end = e
        assert k not in told
        told.add(k)
        assert end == pytest.approx(arrival[k] + ttft, abs=1e-9)
        assert all(d[2] < end for d in log[:pos] if d[0] == "decide")  # never before its end
        after = next((d for d in log[pos + 1:] if d[0] == "decide"), None)
        assert after is None or after[2] >= end  # and before the next decision
    return told


def test_routing_simulator_tells_each_ttft_at_its_prefill_end_not_before():
    # two instances, FIFO: requests 0 and 1 at t = 0 and 0.1 to instance 0 (request 1 queues
    # behind 0), request 2 at t = 0.1 to instance 1; request 3 arrives after every end
    cost = CostModel()
    trace = Trace([0.0, 0.1, 0.1, 50.0], [8192, 8192, 1024, 1024], [1] * 4, [(k,) for k in range(4)])
    spy = Spy(lambda v: 0 if v.index < 2 else 1)
    r = simulate(trace, spy, RoutingConfig(n_instances=2), cost)
    kinds = [(e[0], e[1]) for e in spy.log]
    assert kinds == [("decide", 0), ("decide", 1), ("decide", 2), ("observe", 2), ("observe", 0), ("observe", 1),
                     ("decide", 3), ("observe", 3)]  # in order of their ends; the last one once the trace is done
    for e in spy.log:
        if e[0] == "observe":
            assert (e[2], e[3]) == (r.instance[e[1]], pytest.approx(r.ttft_s[e[1]], rel=1e-12))
    assert spy.log[4][3] == pytest.approx(cost.prefill_s(8192, 0), rel=1e-12)  # request 0: its prefill alone
    assert _check_feedback(spy.log, r.arrival_s) == {0, 1, 2, 3}


def test_cluster_simulator_tells_each_ttft_at_its_prefill_end_with_batching():
    from mooncake_gym.model.workload import synthetic_trace

    trace = synthetic_trace(3, 6.0, duration_s=20.0)
    spy = Spy(lambda v: v.index % 2)
    cluster.simulate(trace, "mooncake", routing=spy, seed=1)
    told = _check_feedback(spy.log, trace.arrival_s)
    assert len(told) > 10
    assert all(e[2] == e[1] % 2 for e in spy.log if e[0] == "observe")


def test_lbgr_same_seed_same_numbers_and_feedback_reaches_it_through_the_envs():
    p = make_policy("routing", "lbgr")
    a = evaluate(ROUTING_ENV_ID, p, [3, 4], rate=8.0, episode_requests=300)
    b = evaluate(ROUTING_ENV_ID, make_policy("routing", "lbgr"), [3, 4], rate=8.0, episode_requests=300)
    assert [e["mean_ttft_s"] for e in a] == [e["mean_ttft_s"] for e in b]
    assert any(x != 0.0 for x in p.bias_s)  # the env's simulator told it the measured TTFTs
    # the same through the cluster environment (PrefillRouting-v1, via OnRoutingView)
    q = make_policy("routing", "lbgr")
    evaluate(ROUTING_V1_ENV_ID, OnRoutingView(q), [3], episode_requests=200)
    assert any(x != 0.0 for x in q.bias_s)


@pytest.mark.parametrize("env_id, kwargs", [(ROUTING_ENV_ID, {"rate": 8.0, "episode_requests": 60}),
                                            (ROUTING_V1_ENV_ID, {"episode_requests": 60})])
def test_listen_moves_a_native_episode_to_the_reference_before_its_first_step_only(env_id, kwargs):
    """``listen`` (one place for both environments, ``envs.common.FeedbackChannel``): on the engine,
    which has no feedback channel, the episode drawn at reset continues on the reference, the same
    episode; after a step it is refused."""
    import gymnasium as gym

    from mooncake_gym import _engine

    if not _engine.available():
        pytest.skip("the native engine is not built")

    def run(listen: bool):
        env = gym.make(env_id, engine="native", **kwargs)
        env.reset(seed=5)
        spy = Spy()
        if listen:
            assert env.unwrapped._engine_steps() == 0
            env.unwrapped.listen(spy)
            assert env.unwrapped._engine_steps() is None  # on the reference now
        rewards, done = [], False
        while not done:
            _, r, term, trunc, _ = env.step(0)
            rewards.append(r)
            done = term or trunc
        return rewards, spy

    (native, _), (listened, spy) = run(False), run(True)
    assert listened == native and len(native) == 60  # the same episode
    assert sum(e[0] == "observe" for e in spy.log) == 60  # every request's TTFT told
    env = gym.make(env_id, engine="native", **kwargs)
    env.reset(seed=5)
    env.unwrapped.listen(lambda v: 0)  # a policy without observe: nothing to tell, it stays on the engine
    assert env.unwrapped._engine_steps() == 0
    env.step(0)
    with pytest.raises(RuntimeError, match="listen: call it after reset, before the episode's first step"):
        env.unwrapped.listen(Spy())
