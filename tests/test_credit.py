"""The queueing-delay credit (mooncake_gym.sim.credit) and PrefillRouting-v0's reward="credit": exact
charges on hand-made workloads, when they are paid, and the return they sum to, on both engines."""

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401
from helpers import trace_of
from mooncake_gym import _engine
from mooncake_gym.baselines.routing import KVCentric
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.credit import QueueCredit, queue_charges
from mooncake_gym.sim.routing import RoutingConfig, simulate
from mooncake_gym.model.workload import synthetic_trace

ENGINES = ["python"] + (["native"] if _engine.available() else [])


def test_charges_on_a_hand_made_busy_period():
    # instance 0: r0 at 0 s served [0, 4]; r1 at 1 s waits 3 (behind r0), served [4, 6]; r2 at 2 s
    # waits 4 (2 behind r0, 2 behind r1), served [6, 7]; r3 at 7 s on an idle instance 0;
    # r4 at 3 s on instance 1 (a wait there is nobody's on instance 0)
    credit = QueueCredit(2)
    credit.record(0, 0.0, 0, 0.0, 4.0)
    assert credit.pay(1.0) == []
    credit.record(1, 1.0, 0, 3.0, 5.0)
    assert credit.pay(2.0) == []
    credit.record(2, 2.0, 0, 4.0, 5.0)
    assert credit.pay(3.0) == []
    credit.record(4, 3.0, 1, 0.0, 8.0)
    # by 7 s, r0 (ended 4 s), r1 (6 s) and r2 (7 s) are final; r4 (ends 11 s) is open
    paid = credit.pay(7.0)
    assert paid == [(0, 4.0 + 3.0 + 2.0), (1, 2.0 + 2.0), (2, 1.0)]
    credit.record(3, 7.0, 0, 0.0, 1.0)
    paid += credit.pay()
    assert paid[3:] == [(3, 1.0), (4, 8.0)]
    # the charges sum to the total TTFT
    assert sum(c for _, c in paid) == 4.0 + 5.0 + 5.0 + 1.0 + 8.0


def test_queue_charges_sum_to_the_total_ttft_of_a_run():
    trace = synthetic_trace(rate=10.0, n_requests=400, seed=5)
    res = simulate(trace, KVCentric(), RoutingConfig(n_instances=4), engine="python")
    charges = np.array(queue_charges(res.arrival_s, res.instance, res.queue_s, res.ttft_s))
    service = res.ttft_s - res.queue_s
    assert res.queue_s.sum() > 10.0  # a loaded run: the waits are most of the total
    assert charges.sum() == pytest.approx(res.ttft_s.sum(), rel=1e-12)
    assert np.all(charges >= service - 1e-12)
    assert (charges > service + 1e-9).sum() > 50  # many requests delay later ones


# Two A800 instances without prefix caches: three prompts at 0, 0.25 and 0.5 s; actions put the
# first two on instance 0 and the third on instance 1 (idle), then a fourth at 60 s on instance 0.
POOL = dict(n_instances=2, cache_blocks=0, allow_pull=False, ttft_slo_s=2.0)
TRACE = trace_of((0.0, 16384, 10), (0.25, 8192, 10), (0.5, 8192, 10), (60.0, 1024, 10))


@pytest.mark.parametrize("engine", ENGINES)
def test_credit_reward_pays_each_charge_when_it_is_known(engine):
    p = [CostModel.preset("llama2-70b").prefill_s(n, 0) for n in (16384, 8192, 8192, 1024)]
    assert p[0] > 0.25  # r1 waits behind r0
    env = gym.make("mooncake_gym/PrefillRouting-v0", reward="credit", engine=engine, **POOL)
    env.reset(seed=0, options={"trace": TRACE})
    rewards, infos = [], []
    for a in (0, 0, 1, 0):
        _, r, term, _, info = env.step(a)
        rewards.append(r)
        infos.append(info)
    assert term
    wait1 = p[0] - 0.25
    # r0, r1, r2 end before 60 s: paid at the third step (the next decision is at 60 s); r3 at the last
    assert [i["credited"] for i in infos[:2]] == [[], []]
    ends = {0: p[0], 1: p[0] + p[1], 2: 0.5 + p[2]}
    assert [k for k, _ in infos[2]["credited"]] == sorted(ends, key=ends.get)  # by the end of their service
    charges = dict(infos[2]["credited"] + infos[3]["credited"])
    assert charges[0] == pytest.approx(p[0] + wait1, abs=1e-12)
    assert charges[1] == pytest.approx(p[1], abs=1e-12)
    assert charges[2] == pytest.approx(p[2], abs=1e-12)
    assert charges[3] == pytest.approx(p[3], abs=1e-12)
    assert rewards[:2] == [0.0, 0.0]
    assert rewards[2] == pytest.approx(-(p[0] + wait1 + p[1] + p[2]) / 2.0, abs=1e-12)
    # the return is minus the episode's total TTFT in SLO units, as with reward="ttft"
    ttfts = [i["ttft_s"] for i in infos]
    assert ttfts[1] == pytest.approx(wait1 + p[1], abs=1e-12)
    assert sum(rewards) == pytest.approx(-sum(ttfts) / 2.0, abs=1e-12)


def test_credit_reward_is_the_same_on_both_engines_and_keeps_the_ttft_return():
    if not _engine.available():
        pytest.skip("the native engine is not built")
    out = {}
    for engine in ENGINES:
        for reward in ("ttft", "credit"):
            env = gym.make("mooncake_gym/PrefillRouting-v0", reward=reward, engine=engine, rate=11.0,
                           episode_requests=400)
            obs, _ = env.reset(seed=3)
            rng = np.random.default_rng(0)
            rows, done = [], False
            while not done:
                a = int(rng.integers(0, 16))
                obs, r, done, _, _ = env.step(a)
                rows.append((r, obs))
            out[engine, reward] = rows
    credit, native = out["python", "credit"], out["native", "credit"]
    assert [r for r, _ in credit] == [r for r, _ in native]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(credit, native))
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(credit, out["python", "ttft"]))
    assert sum(r for r, _ in credit) == pytest.approx(sum(r for r, _ in out["python", "ttft"]), rel=1e-12)
    assert [r for r, _ in credit] != [r for r, _ in out["python", "ttft"]]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_snapshot_restores_the_open_charges(engine):
    env = gym.make("mooncake_gym/PrefillRouting-v0", reward="credit", engine=engine, rate=11.0, episode_requests=200)
    env.reset(seed=1)
    for _ in range(50):
        env.step(0)
    snap = env.unwrapped.snapshot()
    first = [env.step(0)[1] for _ in range(30)]
    env.unwrapped.restore(snap)
    assert [env.step(0)[1] for _ in range(30)] == first
    assert min(first) < 0.0


def test_an_unknown_reward_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^reward: expected one of 'ttft', 'slo', 'credit', got 'delay'$"):
        gym.make("mooncake_gym/PrefillRouting-v0", reward="delay")
