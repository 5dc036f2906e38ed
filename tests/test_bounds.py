"""The lower bound on mean TTFT (mooncake_gym.analysis.bounds) and its row in compare."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mooncake_gym.evaluation import problems
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.baselines import ROUTING_POLICIES, make_policy
from mooncake_gym.analysis.bounds import min_service_s, seen_prefix_blocks, srpt_flow_times, ttft_lower_bound
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.envs import ROUTING_ENV_ID
from mooncake_gym.sim.routing import RoutingConfig, simulate
from mooncake_gym.model.workload import Trace, synthetic_trace

COST = CostModel()
ONE = RoutingConfig(n_instances=1)


def test_exact_on_two_requests_that_share_a_prefix():
    # the second request arrives after the first finished and can reuse its two blocks
    trace = Trace([0.0, 100.0], [1024, 1500], [1, 1], [(1, 2), (1, 2, 3)])
    bound = ttft_lower_bound(trace, ONE, COST)
    w = [COST.prefill_s(1024, 0), COST.prefill_s(1500, 1024)]
    assert bound.min_service_s.tolist() == w
    run = simulate(trace, make_policy("routing", "cache"), ONE, COST)
    assert run.ttft_s.tolist() == w
    assert bound.mean_ttft_s == bound.isolated_mean_s == run.metrics["mean_ttft_s"]


def test_exact_when_queueing_binds():
    # two unrelated requests at once on one instance, the shorter first: FIFO is SRPT here
    trace = Trace([0.0, 0.0], [2048, 4096], [1, 1], [(1, 2, 3, 4), (5, 6, 7, 8, 9, 10, 11, 12)])
    bound = ttft_lower_bound(trace, ONE, COST)
    a, b = COST.prefill_s(2048, 0), COST.prefill_s(4096, 0)
    assert bound.srpt_mean_s == pytest.approx((a + (a + b)) / 2, rel=1e-12)
    assert bound.isolated_mean_s == pytest.approx((a + b) / 2) and bound.mean_ttft_s == bound.srpt_mean_s
    run = simulate(trace, make_policy("routing", "cache"), ONE, COST)
    assert run.metrics["mean_ttft_s"] == pytest.approx(bound.mean_ttft_s, rel=1e-12)


def test_seen_prefix_is_the_union_of_earlier_requests():
    trace = Trace([0.0, 1.0, 2.0, 3.0], [4 * 512] * 4, [1] * 4, [(1, 2), (1, 3), (1, 3, 2, 9), (8, 1)])
    # block ids are prefix hashes (Trace normalises them, docs/reliability.md): the 2 after (1, 3) is
    # not request 0's 2 after (1,), so request 2 has seen (1, 3) only; request 3's 1 follows 8
    assert seen_prefix_blocks(trace).tolist() == [0, 1, 2, 0]


def test_min_service_takes_the_fastest_hit_not_the_largest():
    # on H800 a fully cached 40-block prompt loads its KV slower than it would compute the last
    # blocks: the fastest prefill reuses slightly less than everything
    cost = CostModel.preset("llama2-70b", gpu="H800")
    n = 40 * 512
    trace = Trace([0.0, 1.0], [n, n], [1, 1], [tuple(range(40)), tuple(range(40))])
    w = min_service_s(trace, cost)
    every_hit = [cost.prefill_s(n, cost.hit_tokens(k, n)) for k in range(41)]
    assert w[1] == min(every_hit) < every_hit[-1]
    assert w[0] == cost.prefill_s(n, 0)


def test_srpt_flow_times():
    # speed 2, jobs of 2 s, 1 s at t=0 and 1 s at t=0.25: SRPT runs 1 s -> done 0.5; then the
    # 1-s job of t=0.25 (1 s left) -> done 1.0; then the 2-s job -> done 2.0
    flow = srpt_flow_times(np.array([0.0, 0.0, 0.25]), np.array([2.0, 1.0, 1.0]), 2.0)
    assert flow.tolist() == [2.0, 0.5, 0.75]


@pytest.mark.parametrize("rate, requests", [(4.0, 500), (8.0, 500), (12.0, 500), (24.0, 800)])
def test_no_baseline_beats_the_bound(rate, requests):
    for seed in (0, 1):
        trace = synthetic_trace(seed=seed, rate=rate).head(requests)
        bound = ttft_lower_bound(trace)
        if rate == 24.0:  # overload: the queueing (SRPT) part binds, so it is tested too
            assert bound.srpt_mean_s > 2 * bound.isolated_mean_s
        for name in ROUTING_POLICIES:
            run = simulate(trace, make_policy("routing", name), seed=seed)
            assert run.metrics["mean_ttft_s"] >= bound.mean_ttft_s, (rate, seed, name)
            assert np.all(run.ttft_s >= bound.min_service_s), (rate, seed, name)  # request by request


def test_bad_trace_is_a_clear_error():
    with pytest.raises(ValueError, match="^trace: expected a mooncake_gym.model.workload.Trace"):
        ttft_lower_bound([1, 2])


def test_compare_shows_the_bound_row():
    setting = cmp.routing_settings(rates=(8.0,), episode_requests=200)[0]
    seeds = [1, 2]
    bound = problems.get("routing").bound(setting.env_id, setting.env_kwargs, seeds)
    import gymnasium as gym

    env = gym.make(ROUTING_ENV_ID, **setting.env_kwargs)
    expected = []
    for s in seeds:
        env.reset(seed=s)
        expected.append(ttft_lower_bound(env.unwrapped.sim.trace).mean_ttft_s)
    assert bound["policy"] == "bound" and bound["mean_ttft_s"] == pytest.approx(np.mean(expected), rel=1e-12)
    cmp.run_setting(setting, cmp.policies_for("routing", {}), seeds)
    setting.bound = bound
    assert all(row["mean_ttft_s"] >= bound["mean_ttft_s"] for row in setting.rows)
    last = cmp.format_setting(setting, markdown=True).splitlines()[-1]
    assert last.startswith("| bound | ") and last.endswith("| - | - | - | - | - |")
    assert cmp.settings_json([setting], 2)["settings"][0]["bound"] == bound
    assert not math.isnan(bound["mean_ttft_s_ci95"])
