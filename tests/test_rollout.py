"""The rollout reference (mooncake_gym.analysis.rollout): exact trial costs on a hand-made workload
where Algorithm 1's greedy choice is provably worse, on both engines, through the env and compare."""

import itertools
import math

import gymnasium as gym
import pytest

from helpers import trace_of
from mooncake_gym import _engine
from mooncake_gym._engine.routing import native_policy, production_unsupported
from mooncake_gym._engine.stepper import NativeRoutingSimulator
from mooncake_gym.analysis.rollout import admission_trials, env_trials, rollout_route, trials
from mooncake_gym.baselines import make_policy
from mooncake_gym.evaluation.episodes import RolloutPolicy, evaluate
from mooncake_gym.experiments import compare as cmp
from mooncake_gym.evaluation.problems import OnRoutingView
from mooncake_gym.model.presets import NO_ENGINE, PRESETS
from mooncake_gym.sim.cluster import ClusterSimulator
from mooncake_gym.sim.policies import KVCentric
from mooncake_gym.sim.routing import RoutingConfig, RoutingSimulator

# One H800 and one A800 instance, no prefix cache: a 32k prompt at 0 s, a 16k one at 0.4 s, a 32k one
# at 0.76 s. Greedy (kvcentric) puts the 16k prompt behind the first on the fast H800 (it ends
# sooner there than alone on the A800), so the last 32k prompt waits for both; sending the 16k
# prompt to the A800 keeps the H800 for the last one, which is the best of all 8 assignments.
POOL = RoutingConfig(cache_blocks=0, instances="1xH800+1xA800")
ARRIVALS = (0.0, 0.4, 0.76)
LENGTHS = (32768, 16384, 32768)
TRACE = trace_of(*[(a, n, 10) for a, n in zip(ARRIVALS, LENGTHS)])


def fifo_total(assignment, prefill) -> float:
    """The sum of TTFTs of routing request k to instance assignment[k], each instance FIFO."""
    free, total = [0.0, 0.0], 0.0
    for k, (arrival, i) in enumerate(zip(ARRIVALS, assignment)):
        free[i] = max(free[i], arrival) + prefill[i][k]
        total += free[i] - arrival
    return total


def simulators():
    out = [RoutingSimulator(TRACE, POOL)]
    if _engine.available():
        out.append(NativeRoutingSimulator(TRACE, POOL))
    return out


@pytest.mark.parametrize("sim", simulators(), ids=lambda s: type(s).__name__)
def test_rollout_leaves_the_greedy_choice_for_the_provably_better_one(sim):
    prefill = [[c.prefill_s(n, 0) for n in LENGTHS] for c in sim.costs]
    totals = {a: fifo_total(a, prefill) for a in itertools.product((0, 1), repeat=3)}
    base = KVCentric()
    # first decision: the H800 (the base's answer), its trial the base's whole episode
    route, costs = rollout_route(sim, base, horizon=5)
    assert route == (0, False)
    assert costs == pytest.approx([totals[0, 0, 0], totals[1, 0, 0]], abs=1e-12)
    sim.step(route)
    # second decision: greedy says the H800 again; the rollout's trials (the TTFTs from this request
    # on: the totals less the first request's) say the A800
    assert base(sim.view).instance == 0
    route, costs = rollout_route(sim, base, horizon=5)
    first = prefill[0][0]
    assert costs == pytest.approx([totals[0, 0, 0] - first, totals[0, 1, 0] - first], abs=1e-12)
    assert route == (1, False)
    assert sim.view.index == 1  # the trials left the simulator where it was
    sim.step(route)
    sim.step(rollout_route(sim, base, horizon=5)[0])
    total = sim.result("rollout").metrics["mean_ttft_s"] * 3
    assert total == pytest.approx(min(totals.values()), abs=1e-12)
    assert total < totals[0, 0, 0] - 0.2


def test_horizon_zero_over_kvcentric_is_kvcentric_and_over_any_base_the_greedy_choice():
    # H=0: a trial is the request's own TTFT, so the rollout is greedy on it; kvcentric's choice on
    # this pool (its estimate is the exact TTFT), relsplit's answer only breaks ties
    sim = RoutingSimulator(TRACE, POOL)
    while sim.view is not None:
        view = sim.view
        own = [q + p for q, p in zip(view.queue_s, view.prefill_s)]
        greedy = KVCentric()(view)
        route, costs = rollout_route(sim, KVCentric(), horizon=0)
        assert route == greedy and costs[0] == pytest.approx(own[greedy.instance], abs=1e-12)
        assert rollout_route(sim, make_policy("routing", "relsplit"), horizon=0)[0] == greedy
        sim.step(route)
    prefill = [[c.prefill_s(n, 0) for n in LENGTHS] for c in sim.costs]
    assert sim.result("h0").metrics["mean_ttft_s"] * 3 == pytest.approx(fifo_total((0, 0, 0), prefill), abs=1e-12)


@pytest.mark.parametrize("engine", ["python"] + (["native"] if _engine.available() else []))
def test_horizon_zero_over_kvcentric_gives_kvcentric_episodes_with_a_prefix_cache(engine):
    kw = dict(episode_requests=60, n_instances=4, rate=12, engine=engine)
    env = "mooncake_gym/PrefillRouting-v0"
    base = evaluate(env, make_policy("routing", "kvcentric"), [1, 2], **kw)
    assert evaluate(env, RolloutPolicy(make_policy("routing", "kvcentric"), 0), [1, 2], **kw) == base


def test_same_seed_same_numbers_on_both_engines_with_a_random_base():
    # the base's own draws (random: every decision; kvcentric: ties) are replayed alike in every trial
    kw = dict(episode_requests=60, n_instances=4, rate=12)
    env = "mooncake_gym/PrefillRouting-v0"
    runs = [evaluate(env, RolloutPolicy(make_policy("routing", "random"), 8), [1, 2], engine=e, **kw)
            for e in ["python", "python"] + (["native"] if _engine.available() else [])]
    assert all(r == runs[0] for r in runs)
    rnd = evaluate(env, make_policy("routing", "random"), [1, 2], engine="python", **kw)
    assert all(ro["mean_ttft_s"] < 0.7 * r["mean_ttft_s"] for ro, r in zip(runs[0], rnd))


def test_a_base_rule_without_a_native_twin_runs_its_trials_in_python_on_either_engine():
    kw = dict(episode_requests=40, n_instances=4, rate=12)
    env = "mooncake_gym/PrefillRouting-v0"
    # preble is native in whole runs, but at a decision it holds its load window (running state the
    # engine does not take in): its trials run in Python
    base = make_policy("routing", "preble")
    assert native_policy(base) == "preble"
    base(RoutingSimulator(TRACE, POOL).view)
    assert "running state" in production_unsupported(base)
    runs = [evaluate(env, RolloutPolicy(make_policy("routing", "preble"), 4), [1], engine=e, **kw)
            for e in ["python"] + (["native"] if _engine.available() else [])]
    assert all(r == runs[0] for r in runs)
    assert runs[0][0]["mean_ttft_s"] < evaluate(env, make_policy("routing", "preble"), [1], **kw)[0]["mean_ttft_s"]


def test_trials_try_each_instance_with_the_pull_that_pays_and_the_base_answer_first():
    sim = RoutingSimulator(TRACE, POOL)
    assert trials(sim.view, (1, False)) == [(1, False), (0, False)]


def test_rollout_through_the_env_on_both_engines_gives_the_best_assignment():
    engines = ["python"] + (["native"] if _engine.available() else [])
    prefill = [[c.prefill_s(n, 0) for n in LENGTHS] for c in RoutingSimulator(TRACE, POOL).costs]
    best = min(fifo_total(a, prefill) for a in itertools.product((0, 1), repeat=3))
    for engine in engines:
        kw = dict(trace=TRACE, cache_blocks=0, instances="1xH800+1xA800", engine=engine)
        ro = evaluate("mooncake_gym/PrefillRouting-v0", RolloutPolicy(make_policy("routing", "kvcentric"), 4), [0], **kw)
        base = evaluate("mooncake_gym/PrefillRouting-v0", make_policy("routing", "kvcentric"), [0], **kw)
        assert ro[0]["mean_ttft_s"] * 3 == pytest.approx(best, abs=1e-12)
        assert base[0]["mean_ttft_s"] * 3 == pytest.approx(fifo_total((0, 0, 0), prefill), abs=1e-12)


def test_rollout_refuses_a_feedback_rule_and_a_bad_horizon():
    with pytest.raises(ValueError, match="base: lbgr learns from feedback"):
        RolloutPolicy(make_policy("routing", "lbgr"))
    with pytest.raises(ValueError, match=r"horizon: expected an integer in \[0, 10000\]"):
        RolloutPolicy(make_policy("routing", "kvcentric"), -1)


def test_compare_rollout_rows_take_the_tuned_knobs_and_are_references():
    assert cmp.parse_rollout("relsplit:64") == ("relsplit", 64)
    assert cmp.parse_rollout("kvcentric") == ("kvcentric", None)  # the problem's default (128 on routing)
    for bad in ("nosuch:4", "kvcentric:x", "kvcentric:-2"):
        with pytest.raises(ValueError, match="--rollout: expected BASE"):
            cmp.parse_rollout(bad)
    setting = cmp.Setting("routing", "tiny", "mooncake_gym/PrefillRouting-v0",
                          dict(trace=TRACE, cache_blocks=0, instances="1xH800+1xA800"), scenario="tiny")
    tuned = [{"policy": "kvcentric", "env": "routing", "knobs": {"threshold": 2.0}, "scenario": "tiny"}]
    assert list(cmp.rollout_policies(setting, [("kvcentric", None)], tuned)) == [
        "rollout H=128 over kvcentric (tuned on tiny) (reference)"]
    (name, policy), = cmp.rollout_policies(setting, [("kvcentric", 4)], tuned).items()
    assert name == "rollout H=4 over kvcentric (tuned on tiny) (reference)"
    assert policy.policy.threshold == 2.0 and policy.horizon == 4
    cmp.run_setting(setting, {"kvcentric": cmp.problems.get("routing").policy("kvcentric"), name: policy}, [0])
    cmp.add_ratios(setting)
    rows = {r["policy"]: r for r in setting.rows}
    assert rows[name]["kind"] == "reference" and rows["kvcentric"]["kind"] == "rule"
    assert rows[name]["best_rule"] == "kvcentric"  # a reference is never the best rule
    assert rows[name]["ratio_to_best_rule"] < 1.0
    scraped = cmp.Setting("routing", "s", "mooncake_gym/PrefillRouting-v0", {"observation": "scraped"}, scenario="s")
    with pytest.raises(ValueError, match="--rollout: no rollout row on s: the rollout reference needs the exact observation"):
        cmp.rollout_policies(scraped, [("kvcentric", 4)], [])
    admission = cmp.Setting("admission-cluster", "a", "mooncake_gym/OverloadAdmission-v1", {}, scenario="a")
    with pytest.raises(ValueError, match="--rollout: no rollout row on a: .*routing-cluster, admission-v1 scenarios, not admission-cluster"):
        cmp.rollout_policies(admission, [("kvcentric", 4)], [])
    assert cmp.rollout_policies(scraped, [], []) == {}
    assert not math.isnan(rows[name]["mean_ttft_s"])


# --- on the cluster simulator (PrefillRouting-v1, the routing-cluster scenarios) -----------------------
# The same three prompts on a cluster whose prefill pool is one H800 and one A800 node serving one
# prompt at a time (no engine mechanisms, no prefix cache): each instance FIFO, so the TTFTs are the
# FIFO totals of the pool's prefill times.
CLUSTER = PRESETS["mooncake-hetero"].with_(**NO_ENGINE, n_prefill=2, prefill_gpus=("H800", "A800"), cache_blocks=0)


def test_rollout_on_the_cluster_reaches_the_best_assignment_on_both_engines():
    engines = ["python"] + (["native"] if _engine.available() else [])
    costs = ClusterSimulator(TRACE, CLUSTER, engine="python").prefill.costs
    prefill = [[c.prefill_s(n, 0) for n in LENGTHS] for c in costs]
    best = min(fifo_total(a, prefill) for a in itertools.product((0, 1), repeat=3))
    assert best < fifo_total((0, 0, 0), prefill) - 1.0
    out = {}
    for engine in engines:
        kw = dict(trace=TRACE, preset=CLUSTER, engine=engine)
        base = OnRoutingView(make_policy("routing", "kvcentric"))
        out[engine] = evaluate("mooncake_gym/PrefillRouting-v1", RolloutPolicy(base, 4), [0], **kw)[0]
        assert out[engine]["mean_ttft_s"] * 3 == pytest.approx(best, abs=1e-12)
        sim = ClusterSimulator(TRACE, CLUSTER, engine=engine)
        route, costs = rollout_route(sim, base, horizon=0)
        assert sim.view.index == 0 and len(costs) == 2  # each instance tried; the simulator left as it was
        assert sorted(costs) == pytest.approx(sorted([prefill[0][0], prefill[1][0]]), abs=1e-12)
    if len(engines) == 2:
        assert out["python"]["mean_ttft_s"] == out["native"]["mean_ttft_s"]


@pytest.mark.skipif(not _engine.available(), reason="the native engine is not built")
def test_rollout_on_the_realistic_cluster_same_decisions_on_both_engines():
    """Batching prefill, shared NICs, recompute (preset mooncake as shipped), 60 requests near
    saturation: the rollout over relsplit (H = 4) takes the same actions and gets the same rewards
    on both engines (with so short a look-ahead it is not better than relsplit here: 1.172 s mean TTFT
    against 1.163 s; on routing-cluster-saturated over 2,000-request episodes, H = 32 is 0.79x relsplit)."""
    runs = {}
    for engine in ("python", "native"):
        env = gym.make("mooncake_gym/PrefillRouting-v1", engine=engine, episode_requests=60, load=0.8)
        policy = RolloutPolicy(cmp.problems.get("routing-cluster").policy("relsplit").policy, 4)
        obs, _ = env.reset(seed=3)
        policy.reset(env, 3)
        actions, rewards, done = [], [], False
        while not done:
            actions.append(policy.act(env, obs))
            obs, reward, done, _, info = env.step(actions[-1])
            rewards.append(reward)
        runs[engine] = (actions, rewards, info["metrics"]["mean_ttft_s"])
        env.close()
    assert runs["python"] == runs["native"]


# --- admission (OverloadAdmission-v1, Conductor-v1's admission) -----------------------------------------
# One prefill instance and the one decode instance of mooncake-overload; 12 prompts of 8k-16k tokens
# every 0.5 s with 300-900 output tokens. Admitting all of them (baseline: every TTFT is within the SLO)
# makes 1,500 good tokens; the rollout with a look-ahead to the episode's end rejects one of them and
# makes 1,900 (the cost improvement property, exact with a full horizon).
ADMISSION_PRESET = PRESETS["mooncake-overload"].with_(n_prefill=1)
ADMISSION_TRACE = trace_of(*[(0.5 * k, 8000 + 4000 * (k % 3), 300 + 200 * (k % 4)) for k in range(12)])
ADMISSION = "mooncake_gym/OverloadAdmission-v1"
ENGINES = ["python"] + (["native"] if _engine.available() else [])


def episode_return(env, first: bool, rule) -> float:
    """The return of the episode whose first request is admitted iff ``first``, the rest decided by ``rule``."""
    u = env.unwrapped
    env.reset(seed=0)
    _, total, done, _, _ = env.step(u.encode_action(first))
    while not done:
        _, reward, done, _, _ = env.step(u.encode_action(rule(u.decision_view())))
        total += reward
    return total


@pytest.mark.parametrize("engine", ENGINES)
def test_admission_trials_with_a_full_horizon_are_the_episode_returns(engine):
    env = gym.make(ADMISSION, trace=ADMISSION_TRACE, preset=ADMISSION_PRESET, engine=engine)
    rule = cmp.problems.get("admission-v1").policy("baseline").policy
    obs, _ = env.reset(seed=0)
    tried, costs = admission_trials(env, rule, horizon=11)
    assert tried == [True, False]  # the base rule's answer first
    assert env.unwrapped.decision_view().index == 0 and env.unwrapped.snapshot() is not None
    assert [-c for c in costs] == [episode_return(env, a, rule) for a in tried]
    assert costs == pytest.approx([-8.20453624724601, -6.563629], abs=1e-6)
    env.reset(seed=0)
    assert env_trials(env, rule, 11) == (tried, costs)  # env actions: 1 admit, 0 reject


@pytest.mark.parametrize("engine", ENGINES)
def test_admission_rollout_with_a_full_horizon_beats_its_base_and_prunes_hopeless_requests(engine):
    rule = cmp.problems.get("admission-v1").policy("baseline")
    # (on the 8 s TTFT SLO the rollout's rejection shortens the prefill queue: one of the last requests meets it)
    for preset, rejected in ((ADMISSION_PRESET, (0, 1)), (PRESETS["mooncake-overload-tight"].with_(n_prefill=1), (3, 3))):
        kw = dict(trace=ADMISSION_TRACE, preset=preset, engine=engine)
        base = evaluate(ADMISSION, rule, [0], **kw)[0]
        roll = evaluate(ADMISSION, RolloutPolicy(rule.policy, 12), [0], **kw)[0]
        assert (base["token_goodput"], roll["token_goodput"]) == (1500, 1900)
        assert base["wasted_prefill_gpu_s"] == roll["wasted_prefill_gpu_s"] == 0
        assert (base["rejected_at_arrival"], roll["rejected_at_arrival"]) == rejected
    # on the 8 s TTFT SLO the last requests would miss it: rejected without trials
    env = gym.make(ADMISSION, trace=ADMISSION_TRACE, preset=preset, engine=engine)
    env.reset(seed=0)
    pruned = 0
    while True:
        view = env.unwrapped.decision_view()
        tried, costs = admission_trials(env, rule.policy, 3)
        if view.predicted_ttft_s > view.ttft_slo_s:
            assert (tried, costs) == ([False], [0.0])
            pruned += 1
        if env.step(env.unwrapped.encode_action(rule.policy(view)))[2]:
            break
    assert pruned == 3


def test_admission_rollout_on_the_conductor_admits_on_the_default_route():
    kw = dict(trace=ADMISSION_TRACE, preset=ADMISSION_PRESET.with_(n_decode=2))
    rule = cmp.problems.get("admission-v1").policy("baseline")
    env = gym.make("mooncake_gym/Conductor-v1", **kw)
    env.reset(seed=0)
    actions, costs = env_trials(env, rule.policy, 4)
    assert [a.tolist() for a in actions] == [[1, 0, 0, 2], [0, 0, 0, 2]] and len(costs) == 2
    roll = evaluate("mooncake_gym/Conductor-v1", RolloutPolicy(rule.policy, 12), [0], **kw)[0]
    base = evaluate("mooncake_gym/Conductor-v1", rule, [0], **kw)[0]
    assert roll["token_goodput"] >= base["token_goodput"]


def test_compare_admission_rollout_rows_take_the_rule_and_its_env_arguments():
    assert cmp.parse_rollout("context_oracle:256") == ("context_oracle", 256)
    setting = cmp.Setting("admission-v1", "a", ADMISSION, {}, scenario="a")
    assert list(cmp.rollout_policies(setting, [("early", None)], [])) == ["rollout H=10000 over early (reference)"]
    setting = cmp.Setting("admission-v1", "a", ADMISSION, dict(trace=ADMISSION_TRACE, preset=ADMISSION_PRESET),
                          scenario="a")
    tuned = [{"policy": "context_oracle", "env": "admission-v1", "knobs": {"low": 0.6}, "scenario": "a"}]
    (name, policy), = cmp.rollout_policies(setting, [("context_oracle", 12)], tuned).items()
    assert name == "rollout H=12 over context_oracle (tuned on a) (reference)"
    assert policy.policy.low == 0.6 and policy.env_kwargs == {"oracle": True}
    with pytest.raises(ValueError, match=r"--rollout: no rollout row on a: kvcentric is not a baseline of its problem \(admission-v1: "):
        cmp.rollout_policies(setting, [("kvcentric", 4)], [])
    cmp.run_setting(setting, {"baseline": cmp.problems.get("admission-v1").policy("baseline"), name: policy}, [0])
    cmp.add_ratios(setting)
    rows = {r["policy"]: r for r in setting.rows}
    assert rows[name]["kind"] == "reference" and rows[name]["best_rule"] == "baseline"


def test_compare_all_scenarios_keeps_each_rollout_where_its_base_fits(monkeypatch):
    """``compare --scenario all --rollout kvcentric:2 --rollout baseline:2``: the routing rule's rollout on
    the routing scenario, the admission rule's on the admission one, a note for each that does not fit."""
    from mooncake_gym.evaluation.scenarios import Scenario

    tiny = {"r": Scenario("r", "routing", "mooncake_gym/PrefillRouting-v0", {"trace": TRACE, "cache_blocks": 0,
                                                                            "instances": "1xH800+1xA800"}, "tiny"),
            "a": Scenario("a", "admission", ADMISSION, {"trace": ADMISSION_TRACE, "preset": ADMISSION_PRESET}, "tiny")}
    monkeypatch.setattr(cmp, "SCENARIOS", tiny)
    settings, skipped = cmp.compare_scenarios("all", seeds=1, agents={}, progress=False,
                                              rollouts=[("kvcentric", 2), ("baseline", 2)])
    rows = {s.scenario: {r["policy"] for r in s.rows if r.get("kind") == "reference"} for s in settings}
    assert rows == {"r": {"rollout H=2 over kvcentric (reference)"}, "a": {"rollout H=2 over baseline (reference)"}}
    assert skipped == ["r: no rollout row over baseline, baseline is not a baseline of its problem (routing: "
                       + ", ".join(sorted(cmp.POLICIES["routing"])) + ")",
                       "a: no rollout row over kvcentric, kvcentric is not a baseline of its problem (admission-v1: "
                       + ", ".join(sorted(cmp.POLICIES["admission-v1"])) + ")"]
    with pytest.raises(ValueError, match="--rollout: no rollout row on r: baseline is not a baseline"):
        cmp.rollout_policies(settings[0], [("baseline", 2)], [])  # (a named scenario: an error)
