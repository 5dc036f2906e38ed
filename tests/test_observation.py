"""The observation layer (mooncake_gym.sim.observation): what a router sees, in every mode.

Exact values on hand-built traces for scraped, approximate and precise; the modes that must reduce
to the exact view do so bit for bit for every baseline; staleness hurts kvcentric on the synthetic
workload; noise is seeded; the environment's action masks and its runs match simulate's.
"""

import json

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.baselines import ROUTING_POLICIES, make_policy
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.sim.observation import ObservationConfig, as_observation
from mooncake_gym.sim.routing import Route, RoutingConfig, RoutingSimulator, simulate
from mooncake_gym.model.workload import Request, Trace, synthetic_trace

COST = CostModel()
ROUTING_ENV_ID = "mooncake_gym/PrefillRouting-v0"


def trace_of(*reqs):
    """Requests as (arrival_s, input_tokens, block_ids)."""
    return Trace.from_requests([Request(t, n, 10, tuple(ids)) for t, n, ids in reqs], name="tiny")


def same_run(a, b):
    """Two RoutingResults with bit-identical per-request outcomes and metrics."""
    return (a.ttft_s.tobytes() == b.ttft_s.tobytes() and a.instance.tolist() == b.instance.tolist()
            and a.hit_tokens.tolist() == b.hit_tokens.tolist() and a.metrics == b.metrics)


# -- modes that must reduce to the exact view ----------------------------------------------------
REDUCES_TO_EXACT = [
    "scraped,scrape_period_s=0,scrape_delay_s=0",
    "approximate,index_capacity_blocks=none,index_ttl_s=none",
    "precise,kv_event_delay_s=0",
    "scraped+approximate,scrape_period_s=0,scrape_delay_s=0",
]


@pytest.mark.parametrize("mode", REDUCES_TO_EXACT)
def test_modes_without_staleness_or_evictions_give_exactly_the_exact_numbers(mode):
    trace = synthetic_trace(0, 8.0, duration_s=None, n_requests=800)
    config = RoutingConfig(cache_blocks=1_000_000)  # no cache ever evicts
    sim = RoutingSimulator(trace, config)
    view = sim.view
    while view is not None:
        view = sim.step(0)
    assert sum(inst.cache.evictions for inst in sim.instances) == 0
    for name in ROUTING_POLICIES:
        exact = simulate(trace, make_policy("routing", name), config, seed=3)
        seen = simulate(trace, make_policy("routing", name), config, seed=3, observation=mode)
        assert same_run(exact, seen), (name, mode)


def test_with_evictions_the_approximate_index_changes_decisions():
    # the same workload on the default 3,000-block caches: the unbounded index believes in evicted
    # blocks, so kvcentric decides differently (the check that the equality above is not vacuous)
    trace = synthetic_trace(0, 8.0)
    exact = simulate(trace, make_policy("routing", "kvcentric"))
    approx = simulate(trace, make_policy("routing", "kvcentric"), observation="approximate")
    assert exact.instance.tolist() != approx.instance.tolist()


def test_staleness_hurts_kvcentric_at_8_sessions_per_s():
    for seed in (0, 1, 2):
        trace = synthetic_trace(seed, rate=8)
        exact = simulate(trace, make_policy("routing", "kvcentric"), seed=seed).metrics["mean_ttft_s"]
        stale = simulate(trace, make_policy("routing", "kvcentric"), seed=seed,
                         observation="scraped,scrape_delay_s=0.5").metrics["mean_ttft_s"]
        assert stale > exact, seed


# -- hand-built cases with exact expected views --------------------------------------------------
def test_scraped_view_on_a_tiny_trace():
    n = 32768  # a long prompt: its prefill outlasts the snapshots below
    p0, p1 = COST.prefill_s(n, 0), COST.prefill_s(n, 0)
    assert p0 > 1.7
    trace = trace_of((0.0, n, range(0, 64)), (1.2, n, range(100, 164)), (1.7, n, range(200, 264)))
    obs = ObservationConfig("scraped", scrape_period_s=1.0, scrape_delay_s=0.5)
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2), observation=obs)
    v = sim.view
    assert (v.queue_s, v.queued_requests) == ((0.0, 0.0), (0, 0))
    v = sim.step(0)  # t = 1.2: the snapshot of t = 1 is not seen before 1.5; the one of t = 0 was empty
    assert sim.exact_view.queue_s == (pytest.approx(p0 - 1.2, abs=1e-12), 0.0)
    assert v.queue_s == (p0, 0.0) and v.queued_requests == (1, 0)  # the router's in-flight count of r0
    assert v.queued_tokens == (n, 0)  # and the prompt tokens it expects r0 to compute (no hit)
    v = sim.step(1)  # t = 1.7: the snapshot of t = 1 (r0 queued, taken before r1) aged 0.7 s, plus r1 in flight
    assert v.queue_s == (pytest.approx(p0 - 1.7, abs=1e-12), p1) and v.queued_requests == (1, 1)
    assert v.queued_tokens == (n, n) == sim.exact_view.queued_tokens
    assert sim.exact_view.queue_s == (pytest.approx(p0 - 1.7, abs=1e-12), pytest.approx(p1 - 0.5, abs=1e-12))
    # everything else is the exact view's, and the service stays exact
    assert v.prefill_s == sim.exact_view.prefill_s and v.hit_tokens == sim.exact_view.hit_tokens
    sim.step(1)
    assert sim.last["queue_s"] == pytest.approx(p1 - 0.5, abs=1e-12)

    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2), observation=ObservationConfig(
        "scraped", scrape_period_s=1.0, scrape_delay_s=0.5, inflight=False))
    assert sim.step(0).queue_s == (0.0, 0.0)  # the empty cluster: the router does not count what it sent
    v = sim.step(1)
    assert v.queue_s == (pytest.approx(p0 - 1.7, abs=1e-12), 0.0) and v.queued_requests == (1, 0)
    assert v.queued_tokens == (n, 0)


def _eviction_trace():
    # instance 0 holds 2 blocks: r1 evicts r0's blocks 1, 2; r2 starts with them again
    return trace_of((0.0, 1024, [1, 2]), (10.0, 1024, [3, 4]), (20.0, 1536, [1, 2, 5]))


def test_approximate_index_overestimates_after_an_eviction():
    sim = RoutingSimulator(_eviction_trace(), RoutingConfig(n_instances=2, cache_blocks=2), observation="approximate")
    sim.step(0)
    v = sim.step(0)
    exact = sim.exact_view
    assert (exact.hit_tokens, exact.best_hit_tokens, exact.best_instance) == ((0, 0), 0, -1)
    assert (v.hit_tokens, v.best_hit_tokens, v.best_instance) == ((1024, 0), 1024, 0)
    assert (v.hit_blocks, exact.hit_blocks) == ((2, 0), (0, 0))  # blocks as the index believes
    assert v.prefill_s == (COST.prefill_s(1536, 1024), COST.prefill_s(1536, 0))
    assert v.transfer_s == (0.0, COST.transfer_s(1024))
    assert v.pull_prefill_s == (COST.prefill_s(1536, 1024),) * 2
    assert v.queue_s == exact.queue_s == (0.0, 0.0)
    sim.step(0)  # served as it really is: no hit
    assert (sim.last["hit_tokens"], sim.last["ttft_s"]) == (0, COST.prefill_s(1536, 0))


@pytest.mark.parametrize("kwargs", [{"index_capacity_blocks": 2}, {"index_ttl_s": 15.0}])
def test_a_bounded_or_expiring_index_forgets_the_evicted_blocks(kwargs):
    sim = RoutingSimulator(_eviction_trace(), RoutingConfig(n_instances=2, cache_blocks=2),
                           observation=ObservationConfig("approximate", **kwargs))
    sim.step(0)
    v = sim.step(0)
    assert (v.hit_tokens, v.best_instance, v.prefill_s) == ((0, 0), -1, sim.exact_view.prefill_s)


def test_approximate_ttl_drops_blocks_the_cache_still_holds():
    trace = trace_of((0.0, 1024, [1, 2]), (10.0, 1536, [1, 2, 3]))
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2), observation="approximate,index_ttl_s=5")
    v = sim.step(0)
    assert sim.exact_view.hit_tokens == (1024, 0)  # the cache still holds r0's blocks
    assert v.hit_tokens == (0, 0) and v.best_instance == -1


def test_precise_index_sees_kv_events_late():
    trace = trace_of((0.0, 1024, [1, 2]), (0.5, 1536, [1, 2, 3]), (2.0, 1536, [1, 2, 7]))
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2), observation="precise,kv_event_delay_s=1")
    v = sim.step(0)  # r0's blocks reach the router's index at t = 1
    assert sim.exact_view.hit_tokens == (1024, 0)
    assert v.hit_tokens == (0, 0) and v.best_hit_tokens == 0 and v.pull_prefill_s == (COST.prefill_s(1536, 0),) * 2
    v = sim.step(Route(1, False))
    for name in ("hit_tokens", "prefill_s", "transfer_s", "pull_prefill_s", "best_hit_tokens", "best_instance"):
        assert getattr(v, name) == getattr(sim.exact_view, name), name


# -- noise ----------------------------------------------------------------------------------------
def test_noise_is_seeded_and_leaves_the_real_times_exact():
    trace = synthetic_trace(1, 8.0, duration_s=None, n_requests=600)
    a = simulate(trace, make_policy("routing", "kvcentric"), seed=5, observation="noisy")
    b = simulate(trace, make_policy("routing", "kvcentric"), seed=5, observation="noisy")
    c = simulate(trace, make_policy("routing", "kvcentric"), seed=6, observation="noisy")
    assert same_run(a, b) and not same_run(a, c)

    sim = RoutingSimulator(trace, observation="noisy,noise_sigma=0.3", rng=np.random.default_rng(0))
    logs = []
    v = sim.view
    while v is not None:
        exact = sim.exact_view
        assert v.queue_s == exact.queue_s and v.hit_tokens == exact.hit_tokens
        logs += [np.log(p / q) for p, q in zip(v.prefill_s, exact.prefill_s)]
        for i in range(v.n_instances):
            if exact.transfer_s[i] == 0.0:
                assert v.transfer_s[i] == 0.0 and v.pull_prefill_s[i] == v.prefill_s[i]
        v = sim.step(int(np.argmin(v.queue_s)))
        assert sim.last["prefill_s"] == exact.prefill_s[sim.last["instance"]]  # served at the true time
    assert abs(np.mean(logs)) < 0.02 and 0.28 < np.std(logs) < 0.32


def test_env_and_simulate_agree_in_a_combined_mode():
    mode = "scraped+approximate+noisy,scrape_delay_s=0.2"
    policy = make_policy("routing", "kvcentric")
    env_run = evaluate(ROUTING_ENV_ID, policy, seeds=[4], rate=8.0, episode_requests=300, observation=mode)[0]
    from gymnasium.utils.seeding import np_random

    trace = synthetic_trace(np_random(4)[0], 8.0, duration_s=None, n_requests=300)
    direct = simulate(trace, make_policy("routing", "kvcentric"), seed=4, observation=mode)
    exact = simulate(trace, make_policy("routing", "kvcentric"), seed=4)
    assert env_run["mean_ttft_s"] == direct.metrics["mean_ttft_s"] != exact.metrics["mean_ttft_s"]


# -- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, name", [
    ({"mode": "stale"}, "mode"),
    ({"mode": "approximate+precise"}, "mode"),
    ({"mode": "scraped", "scrape_delay_s": -1}, "scrape_delay_s"),
    ({"mode": "scraped", "scrape_period_s": float("inf")}, "scrape_period_s"),
    ({"mode": "approximate", "index_capacity_blocks": 1.5}, "index_capacity_blocks"),
    ({"mode": "approximate", "index_ttl_s": 0}, "index_ttl_s"),
    ({"mode": "noisy", "noise_sigma": -0.1}, "noise_sigma"),
    ({"mode": "approximate", "scrape_delay_s": 0.5}, "scrape_delay_s: applies to mode 'scraped'"),
    ({"mode": "scraped", "kv_event_delay_s": 0.0}, "kv_event_delay_s: applies to mode 'precise'"),
])
def test_bad_configs_name_the_parameter(bad, name):
    with pytest.raises(ValueError, match=name):
        ObservationConfig(**bad)


def test_parse_and_coerce():
    c = as_observation("scraped+noisy, scrape_delay_s=0.5 ,noise_sigma=0.2,inflight=false")
    assert c == ObservationConfig("scraped+noisy", scrape_delay_s=0.5, noise_sigma=0.2, inflight=False)
    assert (c.scraped, c.noisy, c.prefix_index, c.exact) == (True, True, "exact", False)
    assert as_observation(None).exact and as_observation({"mode": "precise"}).prefix_index == "precise"
    with pytest.raises(ValueError, match="delay"):
        as_observation("scraped,delay=0.5")
    with pytest.raises(ValueError, match="scrape_delay_s"):
        as_observation("scraped,scrape_delay_s=soon")
    with pytest.raises(ValueError, match="observation"):
        as_observation(0.5)
    with pytest.raises(ValueError, match="observation"):
        gym.make(ROUTING_ENV_ID, observation="scraped,period=1")


# -- action masks --------------------------------------------------------------------------------
def test_action_masks_on_a_tiny_trace():
    trace = trace_of((0.0, 1536, [1, 2, 3]), (0.01, 1536, [1, 2, 5]), (10.0, 1024, [1, 9]))
    env = gym.make(ROUTING_ENV_ID, n_instances=2, cache_blocks=16, trace=trace).unwrapped
    _, info = env.reset(seed=0)
    assert info["action_mask"].dtype == np.int8
    assert info["action_mask"].tolist() == [1, 1, 0, 0]  # no prefix anywhere: a pull does nothing
    assert env.action_masks().tolist() == [True, True, False, False]
    _, _, _, _, info = env.step(0)
    assert info["action_mask"].tolist() == [1, 1, 0, 1]  # instance 0 holds the best prefix, 1 can pull it
    assert env.action_masks().tolist() == [True, True, False, True]
    _, _, _, _, info = env.step(3)
    assert info["action_mask"].tolist() == [1, 1, 0, 0]  # block 1 is on both
    _, _, terminated, _, info = env.step(1)
    assert terminated and info["action_mask"].tolist() == [1, 1, 1, 1]  # no decision pending
    env = gym.make(ROUTING_ENV_ID, n_instances=2, allow_pull=False, trace=trace).unwrapped
    _, info = env.reset(seed=0)
    assert info["action_mask"].tolist() == [1, 1] and env.action_masks().shape == (2,)


def test_action_masks_follow_what_the_policy_sees():
    trace = trace_of((0.0, 1024, [1, 2]), (10.0, 1024, [3, 4]), (20.0, 1536, [1, 2, 5]))
    env = gym.make(ROUTING_ENV_ID, n_instances=2, cache_blocks=2, trace=trace, observation="approximate").unwrapped
    env.reset(seed=0)
    env.step(0)
    _, _, _, _, info = env.step(0)
    assert info["action_mask"].tolist() == [1, 1, 0, 1]  # the index believes instance 0 still holds 1, 2


def test_maskable_ppo_reads_the_masks():
    pytest.importorskip("sb3_contrib", reason="sb3-contrib is an optional extra")
    from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported

    env = gym.make(ROUTING_ENV_ID, n_instances=2, rate=4.0, episode_requests=20)
    env.reset(seed=0)
    assert is_masking_supported(env)
    assert get_action_masks(env).tolist() == env.unwrapped.action_masks().tolist()


# -- the command line --------------------------------------------------------------------------------
def test_replay_with_observation_modes(capsys):
    from mooncake_gym.cli import main

    argv = ["replay", "--preset", "lecture", "--rate", "1", "--seed", "1", "--policy", "kvcentric", "--json"]
    assert main(argv + ["--observation", "exact", "--observation", "scraped,scrape_delay_s=0.5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["results"]) == ["exact", "scraped,scrape_delay_s=0.5"]
    assert doc["observation"]["scraped,scrape_delay_s=0.5"]["scrape_delay_s"] == 0.5
    trace = synthetic_trace(1, 1.0)
    for mode, result in doc["results"].items():
        direct = simulate(trace, make_policy("routing", "kvcentric"), seed=1, observation=mode)
        assert result["kvcentric"]["mean_ttft_s"] == direct.metrics["mean_ttft_s"]
    assert main(argv + ["--observation", "noisy", "--pool", "2xH800+2xA800"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["observation"]["mode"] == "noisy" and doc["config"]["instances"][0]["gpu"] == "H800"
    assert len(doc["results"]["kvcentric"]["request_share"]) == 4
    assert main(["replay", "--observation", "scraped,delay=1"]) == 2
    assert "observation" in capsys.readouterr().err


def test_both_checkers_pass_with_an_observation_mode_and_a_mixed_pool():
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    kwargs = {"rate": 4.0, "episode_requests": 50, "observation": "scraped+approximate+noisy",
              "instances": "2xH800+2xA800"}
    gym_check_env(gym.make(ROUTING_ENV_ID, **kwargs).unwrapped, skip_render_check=True)
    sb3_check_env(gym.make(ROUTING_ENV_ID, **kwargs).unwrapped, warn=True)
