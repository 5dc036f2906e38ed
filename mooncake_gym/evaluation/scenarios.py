"""Named, versioned benchmark scenarios: one environment configuration each, a registered env id each.

A scenario fixes everything about an environment that a benchmark result depends on (cluster,
workload, observation mode, objective), so that a number is reported as "PPO on
``routing-saturated`` v1" and anyone can reproduce it. Each scenario is registered as the
Gymnasium id ``mooncake_gym/<name>-v<version>``::

    import gymnasium as gym, mooncake_gym
    env = gym.make("mooncake_gym/routing-saturated-v1")

or made by name with :func:`make`. Its :meth:`Scenario.fingerprint` (sha256 of its configuration
and of the bytes of any trace file it reads) is printed by ``compare`` beside its results: two
results with the same fingerprint were measured on the same problem.

Changing a scenario's parameters means a new version (a new id); the old one stays registered.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from mooncake_gym.evaluation.problems import SCENARIO_PROBLEMS

#: The problems a scenario may name (each tabulated by one problem of the registry).
PROBLEMS = SCENARIO_PROBLEMS
#: Keyword arguments whose string value names a trace file: the fingerprint hashes the file's bytes.
TRACE_ARGUMENTS = ("trace", "base_trace")
#: sha256 of Mooncake's public synthetic trace (FAST'25 release, ``synthetic_trace.jsonl``), the file of
#: the scenarios defined on it
MOONCAKE_SYNTHETIC_SHA256 = "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"


@dataclass(frozen=True)
class Scenario:
    """One benchmark problem: ``base_env_id`` made with ``kwargs``.

    ``requires``: arguments the user must give at ``make`` time (e.g. the path of a trace that
    the project does not ship); ``reset_options``: the ``reset(options=...)`` keys the scenario's
    environment accepts per episode (documented in ``docs/scenarios.md``).
    """

    name: str
    problem: str
    base_env_id: str
    kwargs: dict
    description: str
    version: int = 1
    requires: tuple = ()
    reset_options: tuple = ()
    #: the sha256 of the trace file the scenario is defined on, where it needs one (``requires``):
    #: another file is another problem (:meth:`trace_check`)
    trace_sha256: str | None = None
    #: a hard scenario: the best known rule is far from the look-ahead reference and the bound, so it is
    #: where the benchmark's targets for learned agents are measured (docs/scenarios.md marks it)
    hard: bool = False

    @property
    def env_id(self) -> str:
        return f"mooncake_gym/{self.name}-v{self.version}"

    def config(self, **overrides) -> dict:
        """The environment's keyword arguments with ``overrides`` applied (JSON-able description)."""
        return {**self.kwargs, **overrides}

    def fingerprint(self, **overrides) -> str:
        """sha256 of the scenario's identity and configuration, and of every trace file it reads."""
        h = hashlib.sha256()
        # a trace file counts by its bytes (below), not by the spelling of its path
        kwargs = {k: ("<file>" if k in TRACE_ARGUMENTS and isinstance(v, (str, os.PathLike)) else v)
                  for k, v in self.config(**overrides).items()}
        h.update(json.dumps({"name": self.name, "version": self.version, "env": self.base_env_id,
                             "kwargs": kwargs}, sort_keys=True, default=repr).encode())
        for key in TRACE_ARGUMENTS:
            path = self.config(**overrides).get(key)
            if isinstance(path, (str, os.PathLike)):
                try:
                    with open(path, "rb") as f:
                        h.update(hashlib.file_digest(f, "sha256").digest() if hasattr(hashlib, "file_digest")
                                 else hashlib.sha256(f.read()).digest())
                except OSError as e:
                    raise ValueError(f"{key}: scenario {self.name} cannot read trace file {path!r}: {e}") from None
        return h.hexdigest()

    def trace_check(self, trace) -> dict | None:
        """``{"path", "sha256", "own"}`` of a trace file given to a scenario defined on one
        (``own``: it is the scenario's own file), None otherwise."""
        if self.trace_sha256 is None or not isinstance(trace, (str, os.PathLike)):
            return None
        try:
            with open(trace, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            raise ValueError(f"trace: scenario {self.name} cannot read trace file {os.fspath(trace)!r}: {e}") from None
        return {"path": os.fspath(trace), "sha256": digest, "own": digest == self.trace_sha256}

    def trace_kwargs(self, trace) -> dict:
        """The arguments a trace file given on the command line (``--trace``) fills: each trace
        argument the scenario requires (``trace``, replayed; ``base_trace``, drawn from); empty
        when it requires none or ``trace`` is None."""
        return {} if trace is None else {k: trace for k in self.requires if k in TRACE_ARGUMENTS}

    def missing(self, **overrides) -> list[str]:
        """The required arguments not given (empty when the scenario can be made)."""
        return [k for k in self.requires if overrides.get(k) is None]


SCENARIOS: dict[str, Scenario] = {}


def _add(scenario: Scenario) -> None:
    if scenario.problem not in PROBLEMS:
        raise ValueError(f"scenario {scenario.name}: problem must be one of {PROBLEMS}")
    if scenario.name in SCENARIOS:
        raise ValueError(f"scenario {scenario.name} is defined twice")
    SCENARIOS[scenario.name] = scenario


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return SCENARIOS[name]
    except (KeyError, TypeError):
        raise ValueError(f"scenario: expected one of {', '.join(SCENARIOS)}, got {name!r}") from None


def scenarios_of(problem: str | None = None) -> list[Scenario]:
    return [s for s in SCENARIOS.values() if problem is None or s.problem == problem]


def make(name: str, **overrides):
    """``gym.make`` of scenario ``name``; ``overrides`` replace its arguments (e.g. ``render_mode``)."""
    import gymnasium as gym

    scenario = get_scenario(name)
    missing = scenario.missing(**overrides)
    if missing:
        raise ValueError(f"scenario {name}: give {', '.join(missing)} (it has no default)")
    return gym.make(scenario.env_id, **overrides)


def register_scenarios() -> None:
    """Register every scenario's env id (called when :mod:`mooncake_gym` is imported)."""
    import gymnasium as gym

    from mooncake_gym.envs import register_envs

    register_envs()
    for s in SCENARIOS.values():
        if s.env_id not in gym.registry:
            spec = gym.spec(s.base_env_id)
            gym.register(s.env_id, entry_point=spec.entry_point, kwargs=dict(s.kwargs))


# --- routing scenarios (PrefillRouting-v0's cluster; observation modes of mooncake_gym.sim.observation)
_add(Scenario("routing-sanity", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 4.0, "episode_requests": 3000},
              "The lecture's 8 prefill instances at 4 sessions/s, exact observation: the rules are near "
              "the bound here; a check that an agent is not broken.",
              reset_options=("trace",)))
_add(Scenario("routing-sanity-8", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 8.0, "episode_requests": 3000},
              "The same at 8 sessions/s (lecture demo 2's load, where random routing overloads): kvcentric "
              "is within about 30 % of the bound; the second sanity check.",
              reset_options=("trace",)))
_add(Scenario("routing-saturated", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 11.0, "episode_requests": 3000},
              "8 A800 instances at 11 sessions/s, exact observation: near saturation. kvcentric starts to "
              "queue at about 10/s (mean TTFT 0.70 s, 2x the bound) and at 12/s its queues grow with the "
              "episode's length; at 11/s a 3,000-request episode stays finite with kvcentric at 3-4x the bound.",
              reset_options=("trace",), hard=True))
_add(Scenario("routing-heterogeneous", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 18.0, "episode_requests": 3000, "instances": "4xH800+4xA800"},
              "Two GPU generations in one pool: 4 H800 nodes (989 TFLOPS per GPU) and 4 A800 nodes "
              "(312) at 18 sessions/s; each instance prefills at its own speed, so a rule must weigh "
              "work against speed.",
              reset_options=("trace",), hard=True))
_add(Scenario("routing-stale-multirouter", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 8.0, "episode_requests": 3000,
               "observation": {"mode": "scraped", "routers": 4, "scrape_period_s": 0.5, "scrape_delay_s": 0.1}},
              "4 routers (gateway replicas) take turns over the arrivals; each sees load snapshots scraped "
              "every 0.5 s at its own phase, 0.1 s late, plus only its own in-flight requests: routers "
              "that see the same idle instance all send to it (the herd effect). 8 sessions/s.",
              reset_options=("trace",)))
_add(Scenario("routing-bursty", "routing", "mooncake_gym/PrefillRouting-v0",
              {"rate": 8.0, "episode_requests": 3000,
               "arrivals": {"burst_ratio": 2.0, "calm_s": 20.0, "burst_s": 10.0}},
              "Bursty sessions: a two-state Markov-modulated Poisson process with mean 8 sessions/s, "
              "6/s in calm periods (mean 20 s) and 12/s in bursts (mean 10 s); queues built in a burst "
              "drain in the calm.",
              reset_options=("trace",), hard=True))
_add(Scenario("routing-mooncake-trace", "routing", "mooncake_gym/PrefillRouting-v0",
              {"speed": 2.0, "window_requests": 1000},
              "Mooncake's public synthetic trace (FAST'25 release, 3,993 requests) replayed at twice its "
              "speed; each episode a window of 1,000 consecutive requests from an offset drawn from the "
              "episode's seed (heavily loaded: queues build in its busy stretches). Not shipped: give "
              "trace=PATH.",
              requires=("trace",), reset_options=("offset", "trace"),
              trace_sha256=MOONCAKE_SYNTHETIC_SHA256, hard=True))

# --- routing scenarios on the realistic cluster (PrefillRouting-v1; tabulated as problem routing-cluster)
# The routing scenarios above are the lecture's toy (PrefillRouting-v0's cost model, the prefill pool
# alone); these are their versions on the faithful cluster of the presets (mooncake_gym.model.presets:
# chunked prefill, batching decode, prefix caches, RDMA pulls), with their own names: a scenario's name
# is its identity in tuned files, agent cards and tables, so the toy's names keep meaning the toy's
# problems. The episodes are short (compare over 3 seeds of a 2,000-request scenario takes about 15 s
# on one core on the native engine, 2026-12-04). The load is a multiple of the cluster's measured saturation
# throughput (mooncake_gym.sim.cluster.saturation); each was chosen where the best rule's mean TTFT is
# well above the unloaded one and kvcentric is well above the bound (the figures in each description:
# `mooncake-gym compare --scenario NAME --seeds 3`, seeds 1,000,000-1,000,002). The rollout reference
# (mooncake_gym.analysis.rollout, over the cluster's snapshots) runs on these scenarios with the exact
# observation; each description gives its ratio to the best rule of its own run (`compare --scenario
# NAME --rollout relsplit:32 --seeds 2`, seeds 1,000,000-1,000,001, so that best rule may differ from
# the 3-seed one); the leaderboard's tables have no rollout row. A scenario is marked hard where the
# best rule's mean TTFT is at least 3 times the bound (here the bound is about the unloaded TTFT, so
# that ratio is an upper limit on the room, not the room; the rollout's ratio is a lower one). The
# bursty, diurnal and trace-window scenarios use PrefillRouting-v1's ``arrivals`` and
# ``window_requests`` (the arrival processes of mooncake_gym.model.workload and the window of
# envs/common.py, the code of PrefillRouting-v0's).
_CLUSTER_REQUESTS = 2000


def _rollout(ratio: str, best: str, ci: str) -> str:
    """The look-ahead reference on the cluster (analysis/rollout.py over the cluster's snapshots), as
    measured by ``compare --rollout relsplit:32 --seeds 2``: its ratio to that run's best rule."""
    return f"the rollout reference (compare --rollout relsplit:32 --seeds 2) {ratio}x {best}, paired 95 % CI {ci}"


_NO_ROLLOUT = "no rollout reference (it needs the exact observation)"

_STALE = {"mode": "scraped", "routers": 4, "scrape_period_s": 0.5, "scrape_delay_s": 0.1}
_add(Scenario("routing-cluster-saturated", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "load": 0.6, "episode_requests": _CLUSTER_REQUESTS},
              ("Mooncake's testbed (preset mooncake: 8 prefill + 8 decode nodes of 8x A800, LLaMA2-70B; "
               "chunked prefill, batching decode, prefix caches, RDMA pulls) at 0.6 times its measured "
               "saturation throughput (11.5 requests/s of the synthetic mix, i.i.d., Poisson), exact "
               "observation; 2,000-request episodes. Near saturation: queues build (at 0.7 kvcentric's mean "
               "TTFT is 10 s). Measured (compare --seeds 3): best rule relsplit 2.36 s mean TTFT, kvcentric "
               "2.51 s (1.06x), sizesplit 3.03 s but the lowest P90 (1.80 s against 6.37), bound 0.52 s = the "
               "unloaded TTFT (best rule at load 0.1: 0.52 s); " + _rollout("0.79", "relsplit", "[0.71, 0.90]") + "."),
              reset_options=("trace",), hard=True))
_add(Scenario("routing-cluster-heterogeneous", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake-hetero", "load": 0.55, "episode_requests": _CLUSTER_REQUESTS},
              ("Preset mooncake-hetero: a prefill pool of 4 H800 and 4 A800 nodes (8 GPUs each), decode as "
               "mooncake; at 0.55 times its measured saturation throughput (17.4 requests/s of the synthetic "
               "mix), exact observation; 2,000-request episodes. A rule must weigh queued work against each "
               "instance's speed. Measured (compare --seeds 3): best rule sizesplit 0.82 s mean TTFT, "
               "relsplit 0.83 s, kvcentric 0.85 s (1.04x), bound 0.24 s = the unloaded TTFT (best rule at "
               "load 0.1: 0.24 s); " + _rollout("0.76", "sizesplit", "[0.69, 0.85]") + "."),
              reset_options=("trace",), hard=True))
_add(Scenario("routing-cluster-stale-multirouter", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "load": 0.5, "episode_requests": _CLUSTER_REQUESTS, "observation": _STALE},
              ("Preset mooncake at 0.5 times its saturation throughput (9.6 requests/s); 4 routers take turns "
               "over the arrivals, each seeing load snapshots scraped every 0.5 s at its own phase, 0.1 s "
               "late, plus only its own in-flight requests (the herd effect; observation mode scraped of "
               "mooncake_gym.sim.observation); 2,000-request episodes. Measured (compare --seeds 3): best "
               "rule relsplit 1.13 s mean TTFT, kvcentric 1.24 s (1.10x), against 0.90 s and 0.97 s on the "
               "same episodes with the exact observation; bound 0.52 s; best rule at load 0.1 with the same "
               "observation 0.57 s; " + _NO_ROLLOUT + "."),
              reset_options=("trace",)))
_add(Scenario("routing-cluster-long-context", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "load": 0.45, "episode_requests": 1000},
              ("Long prompts: requests drawn i.i.d. from Mooncake's public synthetic trace (FAST'25 release; "
               "prompts of 15,326 tokens on average, P99 66,456, up to 191,378) with Poisson arrivals, on "
               "preset mooncake at 0.45 times the saturation throughput of that mix (4.3 requests/s), exact "
               "observation; 1,000-request episodes (a long prompt costs the simulator more). The knee is "
               "steep: at 0.5 kvcentric's mean TTFT is 19 s. Not shipped: give base_trace=PATH (compare "
               "--trace). Measured (compare --seeds 3): best rule relsplit 3.77 s mean TTFT, kvcentric 3.80 s "
               "(1.01x), bound 1.39 s = the unloaded TTFT (best rule at load 0.1: 1.40 s); "
               + _rollout("0.79", "relsplit", "[0.67, 0.99]") + "."),
              requires=("base_trace",), reset_options=("trace",), trace_sha256=MOONCAKE_SYNTHETIC_SHA256))
_add(Scenario("routing-cluster-mooncake-trace", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "speed": 1.5},
              ("Mooncake's public synthetic trace (FAST'25 release, 3,993 requests, mean prompt 15,326 "
               "tokens) replayed on preset mooncake at 1.5 times its speed (5.9 requests/s, 0.61 times the "
               "saturation throughput of its request mix), exact observation; each episode the whole trace "
               "(17 min at speed 1; routing-cluster-trace-window replays windows of it), so the seeds differ "
               "only in the default router's tie-breaks. Not shipped: give trace=PATH. Measured (compare "
               "--seeds 3): best rule relsplit 2.48 s mean TTFT, kvcentric 2.48 s (1.00x), bound 0.81 s = "
               "the unloaded TTFT (best rule at speed 0.1: 0.81 s); " + _rollout("0.84", "kvcentric", "[0.81, 0.87]")
               + "."),
              requires=("trace",), reset_options=("trace",), trace_sha256=MOONCAKE_SYNTHETIC_SHA256, hard=True))

_add(Scenario("routing-cluster-bursty", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "load": 0.65, "episode_requests": _CLUSTER_REQUESTS,
               "arrivals": {"burst_ratio": 2.0, "calm_s": 20.0, "burst_s": 10.0}},
              ("routing-bursty's arrivals on preset mooncake: requests of the synthetic mix drawn i.i.d. "
               "arriving as a two-state Markov-modulated Poisson process with mean 0.65 times the measured "
               "saturation throughput (12.5 requests/s), 0.49 times it in calm periods (mean 20 s) and 0.98 "
               "times it in bursts (mean 10 s), exact observation; 2,000-request episodes (about six bursts). "
               "Queues built in a burst drain in the calm. Measured (compare --seeds 3): best rule relsplit "
               "2.13 s mean TTFT, kvcentric 2.35 s (1.10x), sizesplit 3.20 s, bound 0.52 s = the unloaded "
               "TTFT (best rule at load 0.1: 0.52 s); " + _rollout("0.83", "relsplit", "[0.80, 0.85]") + "."),
              reset_options=("trace",), hard=True))
_add(Scenario("routing-cluster-diurnal", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "load": 0.5, "episode_requests": _CLUSTER_REQUESTS,
               "arrivals": {"amplitude": 0.5, "period_s": 100.0}},
              ("A daily cycle compressed to 100 s on preset mooncake: requests of the synthetic mix drawn "
               "i.i.d. arriving as a non-homogeneous Poisson process whose rate is 1 - 0.5 cos(2 pi t / 100 s) "
               "times a mean of 0.5 times the measured saturation throughput (9.6 requests/s): from a trough "
               "of 0.25 to a peak of 0.75 times it (DiurnalArrivals of mooncake_gym.model.workload), exact "
               "observation; 2,000-request episodes (about two cycles each). Queues build over each peak. Measured "
               "(compare --seeds 3): best rule relsplit 2.11 s mean TTFT, kvcentric 2.16 s (1.02x), sizesplit "
               "2.28 s, bound 0.52 s = the unloaded TTFT (best rule at load 0.1: 0.52 s); "
               + _rollout("0.72", "kvcentric", "[0.64, 0.92]") + "."),
              reset_options=("trace",), hard=True))
_add(Scenario("routing-cluster-trace-window", "routing-cluster", "mooncake_gym/PrefillRouting-v1",
              {"preset": "mooncake", "speed": 1.2, "window_requests": 1000},
              ("Windows of Mooncake's public synthetic trace (FAST'25 release, 3,993 requests, mean prompt "
               "15,326 tokens) on preset mooncake: 1,000-request episodes, each a window of consecutive "
               "requests from an offset drawn from the episode's seed (reset option offset), replayed at 1.2 "
               "times the trace's speed (about 4.6 requests/s), exact observation. The trace's later stretches "
               "have longer prompts (a window's mean from 11,000 to 18,600 tokens), so the load differs from "
               "window to window. "
               "Not shipped: give trace=PATH. Measured (compare --seeds 3): best rule relsplit 5.57 s mean "
               "TTFT, kvcentric 5.60 s (1.01x), sizesplit 80 s (its default thresholds do not fit these "
               "prompts), bound 1.41 s = the unloaded TTFT (best rule at speed 0.1: 1.41 s); at speed 1.0 "
               "the best rule's mean TTFT is 2.45 s, at 1.5 19 s; " + _rollout("0.89", "relsplit", "[0.74, 1.15]")
               + "."),
              requires=("trace",), reset_options=("offset", "trace"), trace_sha256=MOONCAKE_SYNTHETIC_SHA256,
              hard=True))

# --- admission scenarios (OverloadAdmission-v1 on the realistic presets)
# 16 prefill + 1 decode A800 nodes (LLaMA2-70B; the decode pool saturates first, as in Mooncake §7),
# 3,000 i.i.d. requests of the synthetic mix, the output-length prediction in the observation
# (log-normal error, sigma 0.5). The metric is token goodput without the drain (docs/envs/
# overload_admission_v1.md). reset(options={"trace": T}) replays a given trace instead (load NaN).
_ADMISSION = {"preset": "mooncake-overload", "episode_requests": 3000, "prediction": True, "prediction_sigma": 0.5}
# Difficulty (docs/leaderboard.md, 10 held-out seeds; docs/admission-v1.md for the rollout reference,
# Bertsekas' rollout over the best rule to the episode's end, 2 held-out seeds): x the best rule's goodput.
_ADMISSION_DIFFICULTY = {
    1.5: "the bound is 1.20x the best rule's token goodput (rollout reference not measured)",
    2.0: "the bound is 1.38x the best rule's token goodput, the rollout reference (over the best rule, "
         "to the episode's end) 1.024x",
    3.0: "the bound is 1.64x the best rule's token goodput, the rollout reference (over the best rule, "
         "to the episode's end) 1.048x"}
for _load, _text in ((1.5, "one and a half times"), (2.0, "twice"), (3.0, "three times")):
    _add(Scenario(f"admission-load{_load:g}", "admission", "mooncake_gym/OverloadAdmission-v1",
                  {**_ADMISSION, "load": _load},
                  f"16 prefill + 1 decode A800 nodes (LLaMA2-70B) offered {_text} the measured saturation "
                  f"throughput; output-length prediction with log-normal error sigma 0.5; "
                  f"{_ADMISSION_DIFFICULTY[_load]}.",
                  reset_options=("trace",)))
_add(Scenario("admission-tight-slo", "admission", "mooncake_gym/OverloadAdmission-v1",
              {**_ADMISSION, "preset": "mooncake-overload-tight", "load": 2.0},
              "admission-load2 with a TTFT SLO of 8 s instead of 30 s (preset mooncake-overload-tight): "
              "long prompts cannot meet it, and queueing prefill costs sooner; the bound is 1.37x the best rule's "
              "token goodput (rollout reference not measured).",
              reset_options=("trace",)))

# --- the Conductor environment (all three decisions)
_add(Scenario("conductor-mooncake", "conductor", "mooncake_gym/Conductor-v1",
              {"preset": "mooncake", "load": 1.5, "episode_requests": 3000, "prediction": True,
               "prediction_sigma": 0.5},
              "Mooncake's testbed (8 prefill + 8 decode A800 nodes, LLaMA2-70B) at 1.5 times the measured "
              "saturation throughput (the prefill pool saturates first); one agent admits, routes the "
              "prefill (and pull) and picks the decode instance; output-length prediction, sigma 0.5; the bound "
              "is 1.12x the best rule's token goodput, the rollout reference over the best rule's admission "
              "(to the episode's end, default route and decode) 1.016x on one held-out seed.",
              reset_options=("trace",)))
