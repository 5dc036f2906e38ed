"""The fast paths of issue 11's speed work give exactly the numbers of the straightforward code:
the remembered prefill time (``PrefillTime.cached``), the routing view's load fields read in one pass
(``cluster.pool_load``), the routing baselines' argmin and kvcentric estimates, ``check_route``'s
shortcut for a well-typed ``Route``, the v1 observation's clipping (only the decode and request
features), and the load series that stops at the horizon. Pinned values were computed before the
speed work and must not move."""

import math

import numpy as np
import pytest

import mooncake_gym.model.costmodel as costmodel
from mooncake_gym.sim import cluster as conductor
from mooncake_gym.sim import routing
from mooncake_gym.baselines import make_policy
from mooncake_gym.baselines.routing import KVCentric
from mooncake_gym.sim.prefill import PrefillInstance, pool_load
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.envs.common import clipped
from mooncake_gym.envs.features import routing_features
from mooncake_gym.model.presets import NO_ENGINE, get_preset
from mooncake_gym.sim.routing import Route, check_route
from mooncake_gym.model.workload import synthetic_trace

MOONCAKE = get_preset("mooncake")


@pytest.mark.parametrize("cost", [CostModel(), MOONCAKE.prefill_cost], ids=["lecture", "mooncake"])
def test_cached_prefill_time_equals_the_computation(cost, monkeypatch):
    f = cost.prefill_time()
    monkeypatch.setattr(costmodel, "PREFILL_MEMO_SIZE", 7)  # the memo starts afresh several times
    pairs = [(n, h) for n in (1, 2, 513, 8192, 8193, 40000, 131072) for h in (0, 1, 512, n - 1) if 0 <= h < n]
    for n, h in pairs + pairs[::-1]:
        got = f.cached(n, h)
        assert type(got) is float and got == f(n, h) == cost.prefill_s(n, h)
    assert len(f._memo) <= 7


def test_pool_load_equals_each_instances_own_reads():
    rng = np.random.default_rng(3)
    reads = [PrefillInstance(i, cached=False) for i in range(5)]
    fast = [PrefillInstance(i, cached=False) for i in range(5)]
    now = 0.0
    for _ in range(400):
        now += float(rng.exponential(0.3))
        i = int(rng.integers(5))
        if rng.random() < 0.6:
            service, tokens = float(rng.exponential(1.0)), int(rng.integers(1, 5000))
            reads[i].dispatch(now, service, tokens)
            fast[i].dispatch(now, service, tokens)
        # the straightforward reads: each instance's own methods (an idle one holds nothing)
        queue = tuple(inst.queue_s(now) for inst in reads)
        queued = tuple(inst.queued_requests(now) if inst.busy(now) else 0 for inst in reads)
        tokens = tuple(inst.queued_tokens if inst.busy(now) else 0 for inst in reads)
        assert pool_load(fast, now) == (queue, queued, tokens)


def _argmin_reference(rng, costs):
    best = min(costs)
    ties = [i for i, c in enumerate(costs) if c == best]
    return ties[0] if len(ties) == 1 else ties[int(rng.integers(len(ties)))]


def test_argmin_breaks_ties_with_the_same_draws():
    policy = KVCentric()
    policy.reset(np.random.default_rng(5))
    reference = np.random.default_rng(5)
    values = np.random.default_rng(6)
    for _ in range(500):
        costs = [float(x) for x in values.integers(0, 4, int(values.integers(1, 9)))]
        assert policy._argmin(costs) == _argmin_reference(reference, costs)
    assert policy.rng.integers(10**9) == reference.integers(10**9)  # the same number of draws


def _kvcentric_reference(view, threshold):
    best = view.best_hit_tokens
    costs, pulls = [], []
    for q, p, h, tr, pp in zip(view.queue_s, view.prefill_s, view.hit_tokens, view.transfer_s, view.pull_prefill_s):
        branch = best > h and (h == 0 or best / h > threshold)
        pulls.append(branch)
        costs.append(q + tr + pp if branch else q + p)
    return costs, pulls


@pytest.mark.parametrize("threshold", [1.0, 1.5])
def test_kvcentric_estimates_and_route_checks_on_a_run(threshold):
    trace = synthetic_trace(2, 8.0).head(600)
    sim = routing.RoutingSimulator(trace, routing.RoutingConfig(cache_blocks=200))
    policy = KVCentric(threshold)
    view, pulls_seen = sim.view, 0
    while view is not None:
        assert policy.estimates(view) == _kvcentric_reference(view, threshold)
        route = policy(view)
        pulls_seen += route.pull
        assert type(route) is Route and check_route(route, view.n_instances) == (route.instance, route.pull)
        view = sim.step(route)
    assert pulls_seen > 0  # the transfer branch was taken


def test_check_route_shortcut_and_slow_path_agree():
    assert check_route(Route(2, True), 4) == (2, True)
    got = check_route(Route(np.int64(2), np.bool_(False)), 4)  # not the shortcut's types: converted
    assert got == (2, False) and type(got[0]) is int and type(got[1]) is bool
    with pytest.raises(ValueError, match="instance must be in 0..3"):
        check_route(Route(4, False), 4)
    with pytest.raises(TypeError, match="pull must be True or False"):
        check_route(Route(1, "no"), 4)


@pytest.mark.parametrize("observation", ["exact", "scraped", "approximate", "precise", "noisy"])
def test_prefill_features_need_no_clipping(observation):
    """The v1 observation clips only its decode and request features: the prefill ones (v0's) are in
    [0, 1] by construction, in every observation mode."""
    trace = synthetic_trace(1, 6.0).head(300)
    sim = conductor.ClusterSimulator(trace, "mooncake", observation=observation, seed=1)
    scale = 1.0 / math.log1p(10 * MOONCAKE.ttft_slo_s / 0.1)
    view, n = sim.view, 0
    while view is not None:
        features = routing_features(view.routing, scale)
        assert clipped(features) == features
        view, n = sim.step(True), n + 1
    assert n == len(trace)


def test_pinned_cluster_and_routing_numbers():
    """Values computed before the speed work (commit 69c0e8b), re-pinned with the cost model by
    component (issue 24: faster prefill, NCCL all-reduces, the engine overhead); the load series stops
    at the horizon."""
    trace = synthetic_trace(0, 4.0).head(400)
    # (one request at a time per prefill instance, as then: the engines' mechanisms off, presets.NO_ENGINE)
    r = conductor.simulate(trace, get_preset("mooncake").with_(**NO_ENGINE), routing=make_policy("routing", "kvcentric"))
    m = r.metrics
    assert (m["mean_ttft_s"], m["p90_tbt_s"], m["goodput"]) == (0.45453213837144335, 0.025560858850799662, 400)
    assert (m["mean_prefill_load"], m["mean_decode_load"]) == (0.007778515897349566, 0.1955184552490523)
    assert r.sample_times_s.tolist() == [float(k) for k in range(69)]  # every second up to the last arrival, 68.9 s
    cfg = routing.RoutingConfig(MOONCAKE.n_prefill, MOONCAKE.cache_blocks, MOONCAKE.ttft_slo_s)
    rr = routing.simulate(synthetic_trace(0, 8.0).head(500), make_policy("routing", "kvcentric"), cfg,
                          MOONCAKE.prefill_cost)
    assert (rr.metrics["mean_ttft_s"], rr.metrics["hit_ratio"], rr.metrics["fetched_tokens"]) == \
        (0.5414219110065643, 0.4646774835232583, 557568)
