"""The benchmark scenarios (mooncake_gym.evaluation.scenarios) and what they added: several routers with their
own scraped views, bursty session arrivals, replayed trace windows, the scenario docs page, and
``compare --scenario`` with its bound row.
"""

import hashlib
import json
import shutil

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the environments and scenarios)
from mooncake_gym.evaluation import scenarios
from mooncake_gym.baselines import make_policy
from mooncake_gym.experiments.compare import compare_scenarios
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.evaluation.episodes import ViewPolicy, run_episode
from mooncake_gym.sim.observation import ObservationConfig
from mooncake_gym.sim.routing import RoutingConfig, RoutingSimulator
from mooncake_gym.experiments.leaderboard import PAGE, scenarios_markdown
from mooncake_gym.experiments.tune import tune_baseline
from mooncake_gym.model.workload import BurstyArrivals, Request, Trace, synthetic_trace, trace_lines, write_trace

from conftest import REPO_ROOT, SHARED_TRACE

COST = CostModel()
ROUTING = [s for s in scenarios.scenarios_of("routing")]


def trace_of(*reqs):
    """Requests as (arrival_s, input_tokens, block_ids)."""
    return Trace.from_requests([Request(t, n, 10, tuple(ids)) for t, n, ids in reqs], name="tiny")


# -- every scenario builds and runs --------------------------------------------------------------
@pytest.mark.parametrize("name", [s.name for s in ROUTING])
def test_every_routing_scenario_runs_a_short_baseline_episode(name):
    sc = scenarios.get_scenario(name)
    short = {"window_requests": 60} if "window_requests" in sc.kwargs else {"episode_requests": 60}
    if sc.missing():
        if not SHARED_TRACE.is_file():
            pytest.skip(f"{name} needs Mooncake's synthetic trace, absent at {SHARED_TRACE}")
        short["trace"] = str(SHARED_TRACE)
    env = scenarios.make(name, **short)
    try:
        assert env.spec.id == sc.env_id
        m = run_episode(env, ViewPolicy(make_policy("routing", "kvcentric")), seed=3)
        assert m["requests"] == 60 and m["mean_ttft_s"] > 0
    finally:
        env.close()


def test_a_scenario_that_needs_a_trace_says_so():
    with pytest.raises(ValueError, match="give trace"):
        scenarios.make("routing-mooncake-trace")


# -- fingerprints -----------------------------------------------------------------------------
def test_fingerprint_is_stable_and_follows_parameters_and_trace_bytes(tmp_path):
    sc = scenarios.get_scenario("routing-saturated")
    same = scenarios.Scenario(sc.name, sc.problem, sc.base_env_id, dict(sc.kwargs), "another description")
    assert sc.fingerprint() == sc.fingerprint() == same.fingerprint()
    assert sc.fingerprint(rate=11.5) != sc.fingerprint()
    path = tmp_path / "t.jsonl"
    write_trace(trace_of((0.0, 1024, [1, 2]), (1.0, 1024, [1, 3])), path)
    mt = scenarios.get_scenario("routing-mooncake-trace")
    before = mt.fingerprint(trace=str(path))
    assert mt.fingerprint(trace=str(path)) == before
    copy = tmp_path / "elsewhere.jsonl"
    copy.write_bytes(path.read_bytes())
    assert mt.fingerprint(trace=str(copy)) == before  # the bytes count, not the path
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"output_length": 10', b'"output_length": 11', 1))
    assert mt.fingerprint(trace=str(path)) != before


# -- several routers, each with its own scraped view -----------------------------------------------
def test_two_routers_each_see_their_own_snapshots_and_requests():
    n = 32768  # long prompts: every prefill outlasts the times below
    p = COST.prefill_s(n, 0)
    assert p > 1.0
    trace = trace_of((0.0, n, range(0, 64)), (0.2, n, range(100, 164)), (0.4, n, range(200, 264)),
                     (0.7, n, range(300, 364)))
    obs = ObservationConfig("scraped", scrape_period_s=1.0, routers=2)  # router 1 scrapes at 0.5, 1.5, ...
    sim = RoutingSimulator(trace, RoutingConfig(n_instances=2), observation=obs)
    v = sim.view  # r0 -> router 0, whose snapshot of t = 0 is the empty cluster
    assert (v.queue_s, v.queued_requests) == ((0.0, 0.0), (0, 0))
    v = sim.step(0)  # r1 at 0.2 -> router 1: no snapshot of its own yet and nothing sent: it does not see r0
    assert (v.queue_s, v.queued_requests, v.queued_tokens) == ((0.0, 0.0), (0, 0), (0, 0))
    assert sim.exact_view.queue_s == (pytest.approx(p - 0.2, abs=1e-12), 0.0)
    v = sim.step(0)  # the herd: r1 to the instance router 1 thinks idle. r2 at 0.4 -> router 0: sees r0 only
    assert v.queue_s == (p, 0.0) and v.queued_requests == (1, 0) and v.queued_tokens == (n, 0)
    assert sim.exact_view.queue_s == (pytest.approx(2 * p - 0.4, abs=1e-12), 0.0)
    assert sim.exact_view.queued_requests == (2, 0)
    v = sim.step(1)  # r3 at 0.7 -> router 1: its snapshot of t = 0.5 holds r0, r1, r2, aged 0.2 s
    exact = sim.exact_view
    assert v.queue_s == (pytest.approx(2 * p - 0.7, abs=1e-12), pytest.approx(p - 0.3, abs=1e-12))
    assert v.queue_s == pytest.approx(exact.queue_s, abs=1e-12)
    assert v.queued_requests == exact.queued_requests == (2, 1)
    # one router with the same settings sees everything it sent: r1 sees r0
    single = RoutingSimulator(trace, RoutingConfig(n_instances=2),
                              observation=ObservationConfig("scraped", scrape_period_s=1.0))
    assert single.step(0).queue_s == (p, 0.0)


def test_routers_needs_the_scraped_mode_and_a_positive_count():
    with pytest.raises(ValueError, match="routers: applies to mode 'scraped'"):
        ObservationConfig("approximate", routers=2)
    with pytest.raises(ValueError, match="routers: expected an integer"):
        ObservationConfig("scraped", routers=0)
    assert ObservationConfig.parse("scraped,routers=3").routers == 3


def test_several_routers_herd_on_the_multirouter_scenario():
    """The herd effect: kvcentric does worse behind 4 routers than behind 1 with the same staleness."""
    sc = scenarios.get_scenario("routing-stale-multirouter")
    one = {**sc.kwargs["observation"], "routers": 1}
    worse = 0
    for seed in range(3):
        means = []
        for obs in (sc.kwargs["observation"], one):
            env = gym.make(sc.base_env_id, **{**sc.kwargs, "observation": obs, "episode_requests": 1500})
            means.append(run_episode(env, ViewPolicy(make_policy("routing", "kvcentric")), seed=seed)["mean_ttft_s"])
            env.close()
        worse += means[0] > means[1]
    assert worse == 3


# -- bursty arrivals -----------------------------------------------------------------------------
def _session_starts(trace):
    first = {}
    for t, s in zip(trace.arrival_s.tolist(), trace.session_ids.tolist()):
        first.setdefault(s, t)
    return np.sort(np.fromiter(first.values(), float))


def test_bursty_arrivals_keep_the_mean_rate_and_are_overdispersed():
    rate, duration, window = 4.0, 2000.0, 10.0
    bursty = BurstyArrivals(burst_ratio=4.0, calm_s=20.0, burst_s=10.0)
    calm, burst = bursty.multipliers()
    assert (1 - bursty.burst_share) * calm + bursty.burst_share * burst == pytest.approx(1.0)
    counts, dispersion = [], {}
    for arrivals in (None, bursty):
        index = []
        for seed in range(3):
            starts = _session_starts(synthetic_trace(seed, rate, duration_s=duration, arrivals=arrivals))
            if arrivals is not None:
                counts.append(len(starts))
            c = np.histogram(starts, bins=np.arange(0.0, duration + window, window))[0]
            index.append(c.var() / c.mean())  # index of dispersion of counts: 1 for a Poisson process
        dispersion[arrivals is None] = float(np.mean(index))
    assert np.mean(counts) / duration == pytest.approx(rate, rel=0.05)
    assert 0.8 < dispersion[True] < 1.2  # Poisson
    assert dispersion[False] > 3.0


def test_the_default_generator_is_unchanged():
    """The default generator's traces, byte for byte, as before bursty arrivals were added."""
    expected = {(0, 4.0, None, 2000): "019dce07299f097cf74bc0c0a10146776ac603c873aa0bcfe5c9528607f42a7b",
                (5, 12.0, 60.0, None): "0a160c0ca47c2f84f1a927b53ff7056d5d563700b8d3cad0ffad79751279c2fe"}
    for (seed, rate, duration, n), digest in expected.items():
        t = synthetic_trace(seed, rate, duration_s=duration, n_requests=n)
        assert hashlib.sha256("\n".join(trace_lines(t)).encode() + t.arrival_s.tobytes()).hexdigest() == digest


def test_bad_arrivals_are_named():
    with pytest.raises(ValueError, match="burst_ratio"):
        BurstyArrivals(burst_ratio=0.5)
    with pytest.raises(ValueError, match="arrivals"):
        gym.make("mooncake_gym/PrefillRouting-v0", arrivals={"ratio": 2})


# -- a window of a replayed trace ------------------------------------------------------------------
def test_window_of_a_trace_from_a_seeded_or_given_offset():
    trace = synthetic_trace(0, 4.0, duration_s=None, n_requests=50)
    env = gym.make("mooncake_gym/PrefillRouting-v0", trace=trace, speed=2.0, window_requests=10)
    env.reset(options={"offset": 7})
    t = env.unwrapped.sim.trace
    assert t.input_tokens.tolist() == trace.input_tokens[7:17].tolist()
    assert t.arrival_s.tolist() == pytest.approx(((trace.arrival_s[7:17] - trace.arrival_s[7]) / 2).tolist())
    firsts = set()
    for seed in range(5):
        env.reset(seed=seed)
        firsts.add(env.unwrapped.sim.trace.input_tokens.tolist()[0])
    assert len(firsts) > 1
    with pytest.raises(ValueError, match=r"options\['offset'\]: expected an integer in \[0, 40\]"):
        env.reset(options={"offset": 41})
    env.close()
    with pytest.raises(ValueError, match="window_requests: replays a window of a trace"):
        gym.make("mooncake_gym/PrefillRouting-v0", window_requests=10)
    # a trace no longer than the window is replayed whole, whatever the seed
    env = gym.make("mooncake_gym/PrefillRouting-v0", trace=trace, window_requests=80)
    for seed in range(3):
        env.reset(seed=seed)
        assert env.unwrapped.sim.trace.input_tokens.tolist() == trace.input_tokens.tolist()
    env.close()


# -- docs ----------------------------------------------------------------------------------------
def test_scenario_page_is_up_to_date():
    page = (REPO_ROOT / PAGE).read_text()
    assert page == scenarios_markdown(), "run `python -m mooncake_gym.experiments.leaderboard` to regenerate docs/scenarios.md"
    for s in scenarios.SCENARIOS.values():
        assert f"`{s.env_id}`" in page


# -- compare --scenario ----------------------------------------------------------------------------
def test_compare_scenario_bound_row_is_never_beaten(monkeypatch):
    tiny = {"routing-tiny": {"rate": 10.0, "episode_requests": 300},
            "routing-tiny-hetero": {"rate": 14.0, "episode_requests": 300, "instances": "2xH800+2xA800"}}
    for name, kwargs in tiny.items():
        monkeypatch.setitem(scenarios.SCENARIOS, name, scenarios.Scenario(
            name, "routing", "mooncake_gym/PrefillRouting-v0", kwargs, "a test scenario"))
    doc = tune_baseline("kvcentric", "routing", seeds=1, scenario="routing-tiny")
    assert doc["scenario"] == "routing-tiny" and doc["fingerprint"] == scenarios.SCENARIOS["routing-tiny"].fingerprint()
    assert doc["workloads"][0]["env_kwargs"] == tiny["routing-tiny"]
    settings, skipped = compare_scenarios(list(tiny) + ["routing-mooncake-trace"], seeds=2, agents={},
                                          tuned=[doc], progress=False)
    assert skipped == ["routing-mooncake-trace: skipped, it needs --trace (not given)"]
    assert [s.scenario for s in settings] == list(tiny)
    names = [[r["policy"] for r in s.rows] for s in settings]
    assert "kvcentric (tuned on routing-tiny)" in names[0]  # only on the scenario it was tuned on
    assert not any("tuned" in n for n in names[1])
    for s in settings:
        assert s.fingerprint == scenarios.SCENARIOS[s.scenario].fingerprint()
        assert s.bound["policy"] == "bound" and len(s.rows) >= 15
        bound_per_seed = s.bound["per_seed"]
        for name, episodes in s.episodes.items():
            for e, b in zip(episodes, bound_per_seed):
                assert e["mean_ttft_s"] >= b, (s.scenario, name, e["seed"])


def test_every_scenario_asked_for_is_run_or_skipped_with_a_reason(monkeypatch):
    from mooncake_gym.evaluation import problems

    monkeypatch.setattr(problems, "of_scenario", lambda problem: None)  # as for problems with no table yet
    settings, skipped = compare_scenarios("all", seeds=1, agents={}, progress=False)
    assert settings == [] and len(skipped) == len(scenarios.SCENARIOS)
    assert skipped[0] == "routing-sanity: skipped, compare has no table for routing scenarios yet"


def test_cli_compare_scenario_skips_with_the_reason(capsys):
    from mooncake_gym.cli import main

    assert main(["compare", "--scenario", "routing-mooncake-trace", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"] == [] and doc["skipped"] == ["routing-mooncake-trace: skipped, it needs --trace (not given)"]
    assert main(["compare", "--scenario", "routing-nothing"]) == 2
    assert "scenario: expected one of" in capsys.readouterr().err
    assert main(["compare", "--scenario", "all", "--rates", "4"]) == 2
    assert "--rates: has no effect with --scenario" in capsys.readouterr().err
    assert main(["tune", "--policy", "early", "--env", "admission", "--scenario", "routing-sanity",
                 "--out", "x.json"]) == 2
    assert "routing-sanity is a routing scenario, but --env is admission" in capsys.readouterr().err
    assert main(["tune", "--policy", "kvcentric", "--env", "routing", "--scenario", "routing-sanity",
                 "--rates", "4", "--out", "x.json"]) == 2
    assert "--rates: has no effect with --scenario" in capsys.readouterr().err


def test_a_tuned_oracle_rule_is_evaluated_on_the_oracle_environment_like_its_default_row():
    from mooncake_gym.experiments.compare import ADMISSION_V1, policies_for, with_tuned

    doc = {"env": ADMISSION_V1, "policy": "size_oracle", "knobs": {}}
    policies = with_tuned(policies_for(ADMISSION_V1, {}), ADMISSION_V1, [doc])
    tuned = [p for name, p in policies.items() if name.startswith("size_oracle (tuned")]
    assert len(tuned) == 1 and tuned[0].env_kwargs == policies["size_oracle"].env_kwargs == {"oracle": True}
    assert policies["early"].env_kwargs == {}


def test_leaderboard_tune_plan_covers_every_tunable_baseline_on_every_scenario():
    from mooncake_gym.experiments.leaderboard import tunable_policies, tune_plan, tune_targets

    routing = tunable_policies("routing")
    assert {"kvcentric", "llmd", "preble"} <= set(routing) and "random" not in routing
    plan = [line.split() for line in tune_plan("routing")]
    assert len(plan) == len(tune_targets("routing")) * len(routing)  # the trace scenario needs --trace
    assert ["routing-sanity", "kvcentric", "--search", "grid", "--budget", "5"] in plan
    assert ["routing-sanity", "llmd", "--search", "grid", "--budget", "36"] in plan
    small = [line.split() for line in tune_plan("routing", trace="t.jsonl", policies="kvcentric llmd", budget=12)]
    assert ["routing-saturated", "llmd", "--search", "random", "--budget", "12"] in small
    assert ["routing-mooncake-trace", "kvcentric", "--search", "grid", "--budget", "5", "--trace", "t.jsonl"] in small
    whole = [line.split() for line in tune_plan("admission", policies="early context_predicted", budget=6,
                                                  full="context_predicted")]
    assert ["admission-load2", "early", "--search", "random", "--budget", "6"] in whole
    assert ["admission-load2", "context_predicted", "--search", "grid", "--budget", "48"] in whole
    admission = {(s, p) for s, p, *_ in (line.split() for line in tune_plan("admission"))}
    assert ("conductor-mooncake", "context_predicted") in admission and ("admission-load2", "size_oracle") in admission
    with pytest.raises(ValueError, match="policies: foo not tunable routing"):
        tune_plan("routing", policies="kvcentric foo")
    with pytest.raises(ValueError, match="budget"):
        tune_plan("routing", budget=0)


def test_the_scenario_page_command_writes_the_checkouts_page(monkeypatch, capsys):
    """``python -m mooncake_gym.experiments.leaderboard`` writes docs/scenarios.md of this checkout."""
    from pathlib import Path

    from mooncake_gym.experiments import leaderboard

    written = {}
    monkeypatch.setattr(leaderboard, "write_atomic", lambda path, text: written.update({Path(path): text}))
    assert leaderboard.main([]) == 0
    page = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"
    assert list(written) == [page] and written[page] == page.read_text()


def test_hard_scenarios_are_the_routing_ones_with_room():
    """The scenarios where the best rule is far from the rollout reference (docs/leaderboard.md):
    the learned agents' targets are measured on these; the sanity checks and the herd scenario are not."""
    from mooncake_gym.evaluation.scenarios import SCENARIOS
    hard = sorted(name for name, s in SCENARIOS.items() if s.hard and s.base_env_id.endswith("-v0"))
    assert hard == ["routing-bursty", "routing-heterogeneous", "routing-mooncake-trace", "routing-saturated"]


def test_cli_compare_scenario_takes_an_agent_and_tuned_files(monkeypatch, capsys, tmp_path):
    """A scenario fixes its own environment, so --agent and --tuned apply whatever the default --preset."""
    from mooncake_gym.cli import main

    monkeypatch.setitem(scenarios.SCENARIOS, "routing-tiny", scenarios.Scenario(
        "routing-tiny", "routing", "mooncake_gym/PrefillRouting-v0", {"rate": 10.0, "episode_requests": 200},
        "a test scenario"))
    tuned = tmp_path / "kv.json"
    tuned.write_text(json.dumps({"policy": "kvcentric", "env": "routing", "knobs": {"threshold": 4.0},
                                 "scenario": "routing-tiny"}))
    # the tutorial agent's card says "scenarios": [] (on no scenario's table): a copy without it
    shipped = REPO_ROOT / "mooncake_gym" / "agents" / "ppo_routing"
    shutil.copy(shipped.with_suffix(".zip"), tmp_path / "mine.zip")
    card = json.loads(shipped.with_suffix(".json").read_text())
    assert card.pop("scenarios") == []
    (tmp_path / "mine.json").write_text(json.dumps(card))
    agent = tmp_path / "mine.zip"
    assert main(["compare", "--scenario", "routing-tiny", "--seeds", "1", "--json",
                 "--agent", str(agent), "--tuned", str(tuned)]) == 0
    (setting,) = json.loads(capsys.readouterr().out)["settings"]
    names = [r["policy"] for r in setting["rows"]]
    assert "user_agent" in names and "kvcentric (tuned on routing-tiny)" in names
    assert main(["compare", "--scenario", "routing-tiny", "--seeds", "1", "--json", "--agent", str(shipped) + ".zip"]) == 0
    out = capsys.readouterr()
    assert "user_agent" not in [r["policy"] for r in json.loads(out.out)["settings"][0]["rows"]]
    assert "note: --agent: in no table of these scenarios: its card's \"scenarios\" is []" in out.err
    assert main(["compare", "--preset", "mooncake", "--agent", str(agent)]) == 2
    assert "--agent: not with --preset mooncake" in capsys.readouterr().err


# -- the routing scenarios on the realistic cluster (PrefillRouting-v1) -------------------------------
CLUSTER_ROUTING = [s.name for s in scenarios.scenarios_of("routing-cluster")]

#: every scenario registered before the realistic cluster's: env id and fingerprint as on main
#: (routing-mooncake-trace's without its trace file), which must never change
OLD_SCENARIOS = {
    "routing-sanity": "2d5310005772e52f1d56eaf2a9e3c31afb51825e4b939f4a96cb312bc7e4aaf9",
    "routing-sanity-8": "258198b0d62f12ce7f5b195a63298c1df02354a97571adb5ded2feec34cc7445",
    "routing-saturated": "d21db4020d0a1f5ce8242db609fa32b6fecfffa00f319b7866b7e11144c9c592",
    "routing-heterogeneous": "8207c5b2f926952c8bd7aac95f9d501b5b6929a05e395763e6dd10f9579aaa29",
    "routing-stale-multirouter": "605890eef033f7149f4e01d16e0adb539d9b0252aa76952c048b5e11b46bb300",
    "routing-bursty": "aed3d6e326f390dfc023d53debd32f5d45b35b8f829cbd4172e1df04a377cf5e",
    "routing-mooncake-trace": "fdf4653a3a4d9ec67742b99d9c7b43b13b8f12a147bc1415d195a4bccfcd8df9",
    "admission-load1.5": "7ba191cadd4f29a463bdc16f4a3624d822911a645d26365b0c7bbcd498c3bd7c",
    "admission-load2": "bbbf2457017478fe159de66883d16094423ff5a9341f1dc15c74d080648332fa",
    "admission-load3": "a3d3780c1c19ebdf3b94032a98299a3ba8612518a74f9f8fef3b82604ab86b0e",
    "admission-tight-slo": "919ca386e029a37a812fce773bb9077055120ff049faf851d2a4c98cff160a26",
    "conductor-mooncake": "579bb60224774375cb072b6e7fc34bbd5b59c17a62afe1c183c70650984fd221",
}


def test_the_old_scenarios_keep_their_ids_fingerprints_and_base_environments():
    for name, fingerprint in OLD_SCENARIOS.items():
        sc = scenarios.get_scenario(name)
        assert (sc.env_id, sc.version, sc.fingerprint()) == (f"mooncake_gym/{name}-v1", 1, fingerprint)
        assert gym.spec(sc.env_id).kwargs == sc.kwargs
    for name in ("routing-sanity", "routing-saturated", "routing-bursty", "routing-mooncake-trace"):
        assert scenarios.get_scenario(name).base_env_id == "mooncake_gym/PrefillRouting-v0"
    assert [n for n in scenarios.SCENARIOS if n in OLD_SCENARIOS] == list(OLD_SCENARIOS)  # the page's order


def test_the_cluster_routing_scenarios_are_new_ids_on_prefill_routing_v1():
    assert len(CLUSTER_ROUTING) >= 4
    ids = [s.env_id for s in scenarios.SCENARIOS.values()]
    assert len(set(ids)) == len(ids)
    for name in CLUSTER_ROUTING:
        sc = scenarios.get_scenario(name)
        assert sc.base_env_id == "mooncake_gym/PrefillRouting-v1" and name not in OLD_SCENARIOS
        assert sc.config().get("preset") in ("mooncake", "mooncake-hetero")
        n = sc.config().get("episode_requests") or sc.config().get("window_requests")
        assert (f"{n:,}-request episodes" if n else "the whole trace") in sc.description  # its episode length
        assert "bound" in sc.description and "rollout" in sc.description  # its difficulty is stated


def _cluster_env(name, steps):
    """Scenario ``name``'s environment, a short episode of it where it draws requests (its own
    trace file from shared/ where it needs one: skipped where absent)."""
    sc = scenarios.get_scenario(name)
    given = {"episode_requests": steps} if "episode_requests" in sc.kwargs else {}
    for key in sc.requires:
        if not SHARED_TRACE.is_file():
            pytest.skip(f"{name} needs Mooncake's synthetic trace, absent at {SHARED_TRACE}")
        given[key] = str(SHARED_TRACE)
    return gym.make(sc.env_id, **given)


@pytest.mark.parametrize("name", CLUSTER_ROUTING)
def test_a_cluster_routing_scenario_steps_a_seeded_episode_deterministically(name):
    """Built through gym.make by its id; the same seed and actions give the same numbers, bit for bit."""
    steps = 40
    runs = []
    for _ in range(2):
        env = _cluster_env(name, steps)
        try:
            assert env.spec.id == scenarios.get_scenario(name).env_id
            obs, info = env.reset(seed=11)
            rng = np.random.default_rng(5)
            run = [obs.tobytes(), info["sim_seed"]]
            for _ in range(steps):
                obs, reward, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
                assert env.observation_space.contains(obs) and reward <= 0.0 and not truncated
                run += [obs.tobytes(), reward, info["ttft_s"], info["prefill_instance"]]
                if terminated:
                    run.append(repr(sorted(info["metrics"].items())))  # NaN-safe: repr(nan) == "nan"
                    break
            runs.append(run)
        finally:
            env.close()
    assert runs[0] == runs[1]
    assert any(isinstance(x, str) for x in runs[0]) == ("episode_requests" in scenarios.get_scenario(name).kwargs)


def test_compare_runs_a_cluster_routing_scenario_end_to_end(monkeypatch, capsys):
    """``compare --scenario`` on a cluster scenario (a tiny episode, one seed): the cluster's table,
    every row of every routing baseline, the bound under each, the scenario's fingerprint."""
    import dataclasses

    from mooncake_gym.cli import main
    from mooncake_gym.experiments import compare as cmp

    name = "routing-cluster-saturated"
    tiny = dataclasses.replace(scenarios.get_scenario(name),
                               kwargs={**scenarios.get_scenario(name).kwargs, "episode_requests": 30})
    monkeypatch.setitem(scenarios.SCENARIOS, name, tiny)
    monkeypatch.setattr(cmp, "shipped_agents", lambda of_problems=None: {})  # loading them takes longer than the table (none fits)
    assert main(["compare", "--scenario", name, "--seeds", "1", "--json"]) == 0
    (setting,) = json.loads(capsys.readouterr().out)["settings"]
    assert setting["problem"] == "routing-cluster" and setting["env_id"] == "mooncake_gym/PrefillRouting-v1"
    assert setting["scenario"] == name and setting["env_kwargs"]["episode_requests"] == 30
    rows = {r["policy"]: r for r in setting["rows"]}
    assert {"kvcentric", "relsplit", "sizesplit", "random"} <= set(rows)
    assert all(r["episodes"] == 1 and "tbt_attainment" in r for r in rows.values())
    bound = setting["bound"]["mean_ttft_s"]
    assert 0 < bound <= min(r["mean_ttft_s"] for r in rows.values())
    settings, skipped = compare_scenarios(["routing-cluster-long-context"], seeds=1, agents={}, progress=False)
    assert settings == [] and skipped == ["routing-cluster-long-context: skipped, it needs --trace (not given)"]


def test_hard_cluster_scenarios_are_those_whose_best_rule_measured_at_least_3x_the_bound():
    """On the cluster ``hard`` marks the scenarios whose description measured the best rule at 3 or
    more times the bound (docs/scenarios.md; the rollout reference, measured on 2 seeds, is stated beside it)."""
    import re

    hard = set()
    for name in CLUSTER_ROUTING:
        text = scenarios.get_scenario(name).description
        best = float(re.search(r"best rule \w+ ([\d.]+) s mean TTFT", text).group(1))
        bound = float(re.search(r"bound ([\d.]+) s", text).group(1))
        if best >= 3 * bound:
            hard.add(name)
    assert hard == {name for name in CLUSTER_ROUTING if scenarios.get_scenario(name).hard}
    assert "routing-cluster-saturated" in hard and "routing-cluster-stale-multirouter" not in hard


def test_a_trace_file_fills_the_trace_argument_a_scenario_requires(monkeypatch, tmp_path):
    """``--trace`` is replayed (``trace``) or drawn from (``base_trace``), as the scenario requires,
    in compare and in tune; a scenario that reads no trace takes none."""
    import dataclasses

    from mooncake_gym.experiments.tune import tune_baseline

    long_context = scenarios.get_scenario("routing-cluster-long-context")
    assert long_context.trace_kwargs("t.jsonl") == {"base_trace": "t.jsonl"} and long_context.trace_kwargs(None) == {}
    assert scenarios.get_scenario("routing-mooncake-trace").trace_kwargs("t.jsonl") == {"trace": "t.jsonl"}
    assert scenarios.get_scenario("routing-cluster-saturated").trace_kwargs("t.jsonl") == {}
    path = str(tmp_path / "t.jsonl")  # 60 long prompts, 4 per second, sharing their first block by threes
    write_trace(trace_of(*((0.25 * i, 8192 + 512 * (i % 7), [i % 3] + [1000 + 30 * i + k for k in range(15 + i % 7)])
                           for i in range(60))), path)
    tiny = dataclasses.replace(long_context, kwargs={**long_context.kwargs, "episode_requests": 20})
    monkeypatch.setitem(scenarios.SCENARIOS, tiny.name, tiny)
    (setting,), skipped = compare_scenarios([tiny.name], seeds=1, agents={}, progress=False, trace=path)
    assert skipped == [] and setting.env_kwargs["base_trace"] == path and "trace" not in setting.env_kwargs
    assert setting.trace == {"path": path, "sha256": setting.trace["sha256"], "own": False}  # not Mooncake's file
    assert setting.fingerprint == tiny.fingerprint(base_trace=path)
    assert min(r["mean_ttft_s"] for r in setting.rows) >= setting.bound["mean_ttft_s"] > 0
    doc = tune_baseline("kvcentric", "routing", budget=1, search="random", seeds=1, scenario=tiny.name, trace=path)
    assert doc["scenario"] == tiny.name and doc["fingerprint"] == setting.fingerprint and doc["env"] == "routing-cluster"
    with pytest.raises(ValueError, match="--trace: has no effect with --scenario routing-cluster-saturated"):
        tune_baseline("kvcentric", "routing", budget=1, seeds=1, scenario="routing-cluster-saturated", trace=path)
    with pytest.raises(ValueError, match="--scenario: routing-cluster-long-context needs --trace"):
        tune_baseline("kvcentric", "routing", budget=1, seeds=1, scenario=tiny.name)
