"""ClusterSimulator(observation=...): the observation modes of mooncake_gym.sim.observation on the whole
cluster, through its prefill pool's RoutingSimulator(observation=, rng=)."""

import numpy as np
import pytest

from mooncake_gym.sim import cluster as conductor
from mooncake_gym.sim import routing
from mooncake_gym.baselines import make_policy
from mooncake_gym.sim.cluster import ClusterSimulator
from mooncake_gym.model.presets import NO_ENGINE, get_preset
from mooncake_gym.sim.routing import RoutingConfig
from mooncake_gym.model.workload import synthetic_trace

TRACE = synthetic_trace(0, rate=4.0).head(1500)
# one request at a time per prefill instance (the routing simulator's own model; the preset's
# batching is the cluster's, tests/test_engine_mechanisms.py)
MOONCAKE = get_preset("mooncake").with_(**NO_ENGINE)


@pytest.mark.parametrize("mode", ["scraped+noisy,scrape_delay_s=0.3,noise_sigma=0.5",
                                  "approximate,index_capacity_blocks=200", "precise,kv_event_delay_s=0.5"])
def test_the_cluster_routes_as_the_routing_simulator_under_the_same_observation(mode):
    """The same router, seed and observation: the same instances and TTFTs as the prefill-only
    simulator (whose observation handling the observation tests pin down), on the mooncake preset."""
    config = RoutingConfig(MOONCAKE.n_prefill, MOONCAKE.cache_blocks, MOONCAKE.ttft_slo_s)
    old = routing.simulate(TRACE, make_policy("routing", "kvcentric"), config, MOONCAKE.prefill_cost, seed=4,
                           observation=mode)
    new = conductor.simulate(TRACE, MOONCAKE, routing=make_policy("routing", "kvcentric"), seed=4,
                             observation=mode, refuse_never_fit=False)
    exact = conductor.simulate(TRACE, MOONCAKE, routing=make_policy("routing", "kvcentric"), seed=4,
                               refuse_never_fit=False)
    assert np.array_equal(new.prefill_instance, old.instance)
    np.testing.assert_allclose(new.ttft_s, old.ttft_s, rtol=1e-12, atol=1e-9)
    assert not np.array_equal(new.prefill_instance, exact.prefill_instance)  # the mode changed decisions


@pytest.mark.parametrize("mode", ["scraped,scrape_period_s=0", "precise,kv_event_delay_s=0"])
def test_modes_without_staleness_give_the_exact_numbers(mode):
    exact = conductor.simulate(TRACE, MOONCAKE, seed=1).metrics
    seen = conductor.simulate(TRACE, MOONCAKE, seed=1, observation=mode).metrics
    assert seen == exact


def test_the_view_is_the_observed_one_and_service_follows_the_exact_state():
    sim = ClusterSimulator(TRACE, MOONCAKE, observation="noisy,noise_sigma=0.5", seed=2)
    view = sim.view
    assert view.routing is sim.prefill.view and view.routing is not sim.prefill.exact_view
    assert view.routing.prefill_s != sim.prefill.exact_view.prefill_s  # what the router sees is noisy
    exact = sim.prefill.exact_view
    k = view.prefill_instance  # the default router's choice on the noisy view
    sim.step(True)
    assert sim.ttft_s[0] == pytest.approx(exact.queue_s[k] + exact.prefill_s[k], rel=1e-12)


def test_same_seed_same_numbers_and_reset_replays_them():
    mode = "scraped+noisy,scrape_delay_s=0.2"
    a = conductor.simulate(TRACE, MOONCAKE, seed=3, observation=mode).metrics
    b = conductor.simulate(TRACE, MOONCAKE, seed=3, observation=mode).metrics
    assert a == b
    sim = ClusterSimulator(TRACE, MOONCAKE, seed=3, observation=mode)
    for _ in range(2):
        view = sim.reset()
        while view is not None:
            view = sim.step(True)
        assert sim.result("default").metrics == {**a, "policy": "default"}


def test_stale_load_without_inflight_counts_hurts_kvcentric():
    tr = synthetic_trace(0, rate=5.0).head(2000)
    ttft = {mode: conductor.simulate(tr, MOONCAKE, routing=make_policy("routing", "kvcentric"),
                                     observation=mode).metrics["mean_ttft_s"]
            for mode in ("exact", "scraped,scrape_delay_s=0.5,inflight=false")}
    assert ttft["scraped,scrape_delay_s=0.5,inflight=false"] > 1.3 * ttft["exact"]  # 1.37 s vs 0.77 s


def test_a_bad_observation_is_named():
    with pytest.raises(ValueError, match="mode|observation"):
        ClusterSimulator(TRACE, MOONCAKE, observation="foggy")
