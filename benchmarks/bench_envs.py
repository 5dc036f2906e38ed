"""Raw ``step`` throughput of the mooncake-gym environments next to Gymnasium's CartPole-v1.

    python benchmarks/bench_envs.py [--seconds 3]
    python benchmarks/bench_envs.py --parts      # a v1 step's parts around its simulator (:func:`parts`)
    python benchmarks/bench_envs.py --engine     # issue 25's targets for PrefillRouting-v0 (:func:`engine_targets`)

Each environment is built with ``gym.make(...).unwrapped`` (no wrappers: the raw ``step``), driven
by uniformly random valid actions drawn before the clock starts, and reset with the next seed
whenever an episode ends. Two figures per environment:

- *with resets*: steps per second of wall time with the resets inside the timed loop, so a
  workload drawn at ``reset`` counts (the figure the issue's target applies to);
- *step only*: steps per second of the time spent in ``step`` alone; the time spent in ``reset``
  is clocked separately and reported as ms per episode.

The environments are measured in the same process run, in interleaved rounds (CartPole, env,
CartPole, env, ...), and each figure is the median over rounds, because a shared machine is noisy.
The speed of an environment is quoted as a ratio to CartPole measured in the same run, with
resets and step only (``../shared/spec/gym-conventions.md``); the target of issue 5 is a ratio
of at least 0.25 (with resets).

:func:`run` returns the figures as a dict (for ``mooncake-gym bench``); adding an environment is
one more entry of :data:`ENV_CASES`.

Figures (issue 11's speed work, 2026-12-01). On a quiet machine before it (with resets):
PrefillRouting-v1 0.054x, OverloadAdmission-v1 0.078x, Conductor-v1 0.076x (v0: 0.29x, 0.43x).
The per-step goodput scoring of the v1 rewards no longer runs a numpy TBT pass per step
(``BatchingDecodeInstance.tbt_within``); with the decode side's other changes,
PrefillRouting-v1 takes 0.91e6 -> 0.59e6 instructions per step (``valgrind --tool=callgrind``,
3000 random steps, set-up subtracted; OverloadAdmission-v1: 0.50e9 fewer instructions over the
same 3000 steps). Wall clock on the then shared machine (load 1 to 9 on 2 cores): 0.060 -> 0.093,
0.081 -> 0.111, 0.084 -> 0.113 in two runs ten minutes apart, but within noise when both codes
ran side by side under load 8. Still below the 0.25 target: a v1 step is one cluster-simulator
step (about half of it the prefill pool's ``RoutingSimulator``, as in v0) plus the observation
(prefill features, one load read per decode instance, the default router's predicted TTFT).

Second round (2026-12-01; the cluster simulator's changes in ``bench_cluster.py``, plus only the
decode and request features clipped in the v1 observation): instructions per step (callgrind, 1,000
random steps, from step 200 to 1,200) PrefillRouting-v1 623.6e3 -> 599.5e3 (-3.9 %),
OverloadAdmission-v1 538.9e3 -> 496.2e3 (-7.9 %), Conductor-v1 498.5e3 -> 470.5e3 (-5.6 %). Wall
clock, old and new commit back to back on the shared machine (load 6 to 8), two rounds each: before
0.098 / 0.114 / 0.132 and 0.088 / 0.117 / 0.104, after 0.118 / 0.122 / 0.124 and 0.102 / 0.109 /
0.137 (within noise). Still below 0.25. A v1 step now (py-spy, PrefillRouting-v1): the cluster
simulator's step 48 % (its prefill pool 19 %, events 25 %), the observation 27 % (one context solve
per decode instance 9.5 %, prefill features 5 %, the default router's TTFT 5 %, packing 4.6 %), the
episode's final metrics 10 %, the reset 4 %.

Third round (2026-12-01, fourth session), idle machine: pure Python 0.090-0.097 / 0.109-0.115 /
0.118-0.124 (PrefillRouting-v1 / OverloadAdmission-v1 / Conductor-v1); with the optional compiled
core (``make install-fast``, mypyc) 0.120-0.125 / 0.132-0.139 / 0.154-0.166, about 1.2-1.3x
(instructions per step 561e3 -> 425e3, 450e3 -> 398e3, 441e3 -> 339e3). Compiling the env layer too
(envs/cluster.py, common.py, the three v1 classes) changed nothing measurable and was dropped. Still
about half the 0.25 target: a v1 step costs one cluster-simulator decision (itself ~50 us pure,
~38 us compiled) plus the observation, against CartPole's ~6.5 us, and most of that time is CPython's
object machinery (see bench_cluster.py), which only a core with native data structures (C, Cython
cdef classes or Rust) removes. For PPO training this is not the bottleneck: stable-baselines3's PPO
runs 500-1,600 steps/s on this CPU, against ~15,000-25,000 env steps/s here.

Fourth round (2026-12-01, fifth session): the rows "its cluster simulator alone" step each v1
env's simulator through the env's own episodes and actions with nothing else (a floor under the env's
step). Two alternating runs per mode, idle machine (load about 1): pure Python, envs 0.092-0.120 and
their simulators alone 0.171-0.180 / 0.220-0.224 / 0.286-0.288 (PrefillRouting-v1 /
OverloadAdmission-v1 / Conductor-v1); compiled, envs 0.091-0.155 and simulators alone 0.181-0.228 /
0.233-0.270 / 0.317-0.371 (one quieter run earlier: 0.244 / 0.284 / 0.404). The rest of a step is
the Python environment layer, measured by its parts (``--parts``; pure Python, PrefillRouting-v1 /
OverloadAdmission-v1 / Conductor-v1): the observation 9.9 / 9.0 / 10.3 us (the decode instances'
loads 2.9 / 0.5 / 2.9 us, 1.4 us compiled; the default router's choice for the predicted TTFT
2.1 / 4.9 / 2.1 us; the prefill features 3.4 / 5.9 / 3.3 us; clipping and packing the floats
3.2-3.5 us), and the final metrics 6.9 / 6.5 / 4.0 us per step (4-7 ms per 1,000-request episode:
the TBT of every finished request, one vectorised pass). The target is 0.25 x CartPole's ~6.5 us = ~26 us per step; PrefillRouting-v1's
simulator alone takes about that already, and its observation alone takes it to about 0.18x at best.
Compiling the prefill features with mypyc gained 3.4 -> 3.0 us; compiling ``costmodel`` too gave the
simulators about 7 % but broke pickling its frozen dataclasses, and was dropped. So the 0.25 target
is not reachable in Python, compiled or not: it needs the simulator and the observation in native
code with native data structures (C, Cython ``cdef`` classes, Rust).

Fifth round (2026-12-04, issue 25): the v1 environments on the native engine (``ClusterEnvCore``,
docs/engine.md "The v1 environments on the engine"), measured here on presets the native cluster
runs (the last three cases: ``native_preset``); the report names each case's engine. One run at
load 9-10: 0.67 / 0.61 / 0.78x CartPole with resets (PrefillRouting-v1 / OverloadAdmission-v1 /
Conductor-v1; the reference 0.056 / 0.073 / 0.076x in the same run), below issue 25's 1.5x.

Sixth round (2026-12-04, branch v1-speed; ``python benchmarks/bench_envs.py --wrapped --seconds 2``,
main (de455ce) and the branch alternating, two runs each, load average 7-9): with resets, x CartPole-v1
through ``gym.make``, defaults (the native engine on the shipped presets) PrefillRouting-v1 0.694 /
0.688 before, 0.843 / 0.789 after; OverloadAdmission-v1 0.660 / 0.632 -> 0.727 / 0.708; Conductor-v1
0.726 / 0.692 -> 0.925 / 0.782 (step only 0.87 / 0.86 -> 1.00 / 0.91, 0.83 / 0.75 -> 0.83 / 0.81,
0.88 / 0.90 -> 1.03 / 0.91); the reset 4.8 / 3.8 -> 3.1 / 2.4 ms per episode (PrefillRouting-v1).
What changed: a resampled episode's trace is read by the engine from its base trace's columns
(``Trace.taken_from``, ``trace_take``: no block id hashed again), the preset's checks are made once
per preset, the native simulator's constructor makes no view, and the episode's final TBTs are
made request by request. Still below issue 25's 1.5x: in CPU time per 1,000-request episode
(PrefillRouting-v1, best of 12) the reset fell from 1.34 to 0.67 ms and the final TBTs and metrics
from 1.90 to 1.47 ms, and the core's 1,000 steps alone (C++: the cluster's events, the observation,
the scoring) take 2.6 ms, half of the episode's 5.3 ms (docs/engine.md, "The v1 environments on the
engine").

Issue 25's vector env (``--engine``; 2026-12-04, branch vec-speed, load average 15-17, the code
before, 3fd16a7, and after alternating, one run each of ``python benchmarks/bench_envs.py --engine
--seconds 2``): vector 16 native 2.36x and 2.18x CartPole-v1 before, 2.99x and 2.99x after, with
resets (step only 3.02x / 2.71x before, 3.58x / 4.11x after); the target is >= 8x. In CPU time the
engine's ``EnvBatch.step`` of 16 envs alone is 5.7-5.9x CartPole-v1's step, so the target needs the
engine's routing step itself faster (docs/engine.md, "Measured speed"). With worker threads
(branch vec2, two runs of ``python benchmarks/bench_envs.py --engine`` at load average 8-10): the vector env of 16 2.88x and 2.50x on one thread
(the default below 64 envs), 2.48x and 2.27x on two; PrefillRouting-v1's vector env of 16 0.75x and
0.59x against its single env's 0.67x and 0.63x.

Third round on the vector env (2026-12-04, branch vec-speed3; main at 870d058 and the branch
alternating, two runs each of ``python benchmarks/bench_envs.py --engine``, load average 6.1-6.8):
vector 16 native 2.89x and 2.87x CartPole-v1 before, 3.33x and 3.15x after, with resets (step only
3.82x / 3.78x before, 4.37x / 4.02x after); on 2 threads 2.41x / 2.44x before, 2.64x / 2.61x after;
PrefillRouting-v1's vector env of 16 0.85x / 0.84x before, 1.00x / 0.83x after. What changed: the
vector step's info columns (one copy per kind's block, rows indexed into a copied dict: 8.9 -> 5.8 us
per call of 16 in CPU), the synthetic trace's order (a radix sort) and the native simulator's set-up
(a reset 517 -> 435 us of CPU). The >= 8x target is not met and cannot be on this engine step: in
CPU time per env step (load 6.2) the vector env costs 1.65 us against CartPole-v1's 4.77 us per step
(2.89x): the engine's ``EnvBatch.step`` 0.85 us, the episodes' starts 0.44 us (numpy's draws and the
trace's assembly 0.33 us), their final metrics 0.11 us, the Python around the engine call 0.26 us;
with all but the engine free the vector env would make 5.6x, and 8x needs 0.60 us per env step in all
(docs/engine.md, "Measured speed").

Seventh round (2026-12-05, branch v1-speed2; ``python benchmarks/bench_envs.py --wrapped --seconds
2``, main (870d058) and the branch alternating, two runs each, load average 5.8-6.2): with resets,
x CartPole-v1 through ``gym.make``, PrefillRouting-v1 0.793 / 0.767 before, 1.475 / 0.923 after;
OverloadAdmission-v1 0.746 / 0.677 -> 1.443 / 1.118; Conductor-v1 0.825 / 0.748 -> 1.411 / 1.109 (the
machine's load moves these by a quarter; in CPU time, 3 interleaved rounds, 0.69-0.73 / 0.62-0.63 /
0.71-0.73 -> 0.99-1.04 / 0.99-1.02 / 0.94-1.05). What changed: the last step's ``info["metrics"]``
is made when first read (``envs.cluster.EpisodeMetrics``; read at every episode's end the branch
gives 0.75 / 0.65 / 0.81 in CPU time), Conductor-v1's action check, and a few allocations per step
in the engine's core and binding. Still below issue 25's 1.5x: the core's 1,000 calls (2.0-2.9 ms of
CPU per episode) and the reset (1.2-2.0 ms) exceed the 3.2 ms an episode may take (docs/engine.md,
"Measured speed"). The "simulator alone" rows step the native simulator through its Python API
(``ClusterSimulator.step`` per decision), so the env, one engine call per step, now runs faster
than them: they are no longer a floor under the native env.

``OverloadAdmission-v0`` on the native engine (2026-12-04, branch adm-native; its row's engine tag is
the env's ``engine``, native by default now): ``python benchmarks/bench_envs.py --wrapped --seconds 2``,
one run each at load average 6-10, 1.40 / 1.70 / 1.54 / 1.50 / 1.46 / 1.95 / 1.57x CartPole-v1 with
resets (the reference was 0.248x on an idle machine; 0.258x against the engine's 1.82x in one run);
step only 2.1-2.7x; the rest is the episode's start (building the native cluster) and its final
metrics (docs/engine.md, "OverloadAdmission-v0 on the engine").
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import gymnasium as gym
import numpy as np

import mooncake_gym  # noqa: F401  (registers the mooncake_gym/... ids)
from mooncake_gym.envs.cluster import ClusterEnv
from mooncake_gym.envs.vector import default_threads
from mooncake_gym.model.presets import NO_ENGINE, ClusterPreset, get_preset


def native_preset(name: str) -> ClusterPreset:
    """Preset ``name`` with ``presets.NO_ENGINE``'s prefill: a cluster the native engine runs (the v1
    environments' episodes then run on it: docs/engine.md), named ``<name>+NO_ENGINE``."""
    return get_preset(name).with_(name=f"{name}+NO_ENGINE", **NO_ENGINE)


REFERENCE = ("CartPole-v1", {})
#: (env id, constructor kwargs) of the environments to measure: their default settings, then the v1
#: environments on a cluster the native engine runs (their default presets are not native yet).
ENV_CASES: list[tuple[str, dict]] = [
    ("mooncake_gym/PrefillRouting-v0", {}),
    ("mooncake_gym/OverloadAdmission-v0", {}),
    ("mooncake_gym/PrefillRouting-v1", {}),
    ("mooncake_gym/OverloadAdmission-v1", {}),
    ("mooncake_gym/Conductor-v1", {}),
    ("mooncake_gym/PrefillRouting-v1", {"preset": native_preset("mooncake")}),
    ("mooncake_gym/OverloadAdmission-v1", {"preset": native_preset("mooncake-overload")}),
    ("mooncake_gym/Conductor-v1", {"preset": native_preset("mooncake")}),
]
#: The issue's target: every env at least this fraction of CartPole's steps per second.
TARGET_RATIO = 0.25
_CHUNK = 1000  # steps between clock reads
_POOL = 1 << 16  # pre-drawn actions, reused cyclically


def case_names(cases: list[tuple[str, dict]]) -> list[str]:
    """Each case's name in the report: its env id, with its arguments where the id comes twice."""
    ids = [env_id for env_id, _ in cases]

    def arg(v):
        return v.name if isinstance(v, ClusterPreset) else repr(v)

    return [env_id if ids.count(env_id) == 1 else
            f"{env_id} ({', '.join(f'{k}={arg(v)}' for k, v in kwargs.items()) or 'defaults'})"
            for env_id, kwargs in cases]


def _actions(space: gym.spaces.Discrete, seed: int) -> list:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.MultiDiscrete):  # rows of uniformly random values
        return list((rng.integers(0, space.nvec, size=(_POOL, len(space.nvec)))).astype(np.int64))
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"action space: only Discrete and MultiDiscrete spaces are benchmarked, got {space}")
    return (int(space.start) + rng.integers(0, int(space.n), size=_POOL)).tolist()


class _SimulatorAlone:
    """A v1 environment's cluster simulator stepped alone, through the env's own episodes (its
    ``reset``) with the env's own actions already converted (``ClusterEnv._action``): each step is
    ``ClusterSimulator.step`` only, without the observation, the reward's scoring, the info dict or
    the final metrics. What an env step made of this simulator's Python calls cannot go below (the
    engine's env core, one call per step, runs below it)."""

    def __init__(self, env):
        self.env = env
        self.action_space = env.action_space

    def convert(self, actions: list) -> list:
        return [self.env._action(a) for a in actions]

    def step(self, action):
        sim = self.env.sim
        sim.step(action)
        return None, 0.0, sim.done, False, None

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def close(self):
        self.env.close()


class _Runner:
    """One environment, its pre-drawn actions and its position, so rounds can resume it;
    ``alone=True``: its cluster simulator alone (:class:`_SimulatorAlone`, v1 environments only)."""

    def __init__(self, env_id: str, kwargs: dict, seed: int = 0, wrapped: bool = False, alone: bool = False):
        self.env_id = env_id
        self.env = gym.make(env_id, **kwargs)
        if not wrapped or alone:
            self.env = self.env.unwrapped
        if alone:
            self.env = _SimulatorAlone(self.env)
        self.actions = _actions(self.env.action_space, seed)
        if alone:
            self.actions = self.env.convert(self.actions)
        self.seed = seed
        self.env.reset(seed=self.seed)
        self.k = 0
        self.steps = self.episodes = 0
        self.elapsed_s = self.reset_s = 0.0

    def round(self, seconds: float) -> tuple[float, float]:
        """Step for about ``seconds``; returns this round's steps per second with resets and step
        only (the time inside ``reset`` is clocked and left out of the second)."""
        env, actions, pool = self.env, self.actions, len(self.actions)
        step, reset, clock = env.step, env.reset, time.perf_counter
        k, seed, steps, episodes, reset_s = self.k, self.seed, 0, 0, 0.0
        start = clock()
        deadline = start + seconds
        while True:
            for _ in range(_CHUNK):
                _, _, terminated, truncated, _ = step(actions[k])
                k += 1
                if k == pool:
                    k = 0
                if terminated or truncated:
                    seed += 1
                    t0 = clock()
                    reset(seed=seed)
                    reset_s += clock() - t0
                    episodes += 1
            steps += _CHUNK
            now = clock()
            if now >= deadline:
                break
        self.k, self.seed = k, seed
        self.steps += steps
        self.episodes += episodes
        self.elapsed_s += now - start
        self.reset_s += reset_s
        return steps / (now - start), steps / (now - start - reset_s)


def run(seconds: float = 3.0, rounds: int = 3, env_cases: list[tuple[str, dict]] | None = None,
        wrapped: bool = False, verbose: bool = True) -> dict:
    """Measure every env of ``env_cases`` (default :data:`ENV_CASES`) and CartPole-v1 for about
    ``seconds`` each, in ``rounds`` interleaved rounds. ``wrapped=True`` steps the envs as
    ``gym.make`` returns them (with CartPole's TimeLimit and the checker wrappers) instead of raw.

    Returns ``{"reference": {...}, "envs": {env_id: {...}}, "target_ratio": 0.25}``; each entry has
    ``steps_per_s`` (with resets, median over rounds), ``rounds_steps_per_s``,
    ``step_only_steps_per_s`` (time in ``reset`` left out, median over rounds),
    ``rounds_step_only_steps_per_s``, ``reset_ms_per_episode``, ``reset_share`` (of the timed wall
    time), ``steps``, ``episodes``, ``seconds`` and, for the envs, ``ratio`` (with resets, to
    CartPole's with resets), ``step_only_ratio`` (step only, to CartPole's step only) and
    ``meets_target`` (``ratio`` >= the target). Prints the table unless ``verbose=False``.
    """
    if not seconds > 0:
        raise ValueError(f"seconds: expected > 0, got {seconds!r}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    cases = ENV_CASES if env_cases is None else env_cases
    runners = [_Runner(*REFERENCE, wrapped=wrapped)] + [_Runner(env_id, kwargs, wrapped=wrapped)
                                                        for env_id, kwargs in cases]
    # the v1 environments' simulators alone, after the environments (index len(cases) + 1 on)
    names = case_names(cases)
    alone = [(name, _Runner(env_id, kwargs, alone=True)) for name, (env_id, kwargs), r in zip(names, cases, runners[1:])
             if isinstance(r.env.unwrapped, ClusterEnv)]
    runners += [r for _, r in alone]
    for r in runners:  # warm-up: first calls, caches, one reset
        r.round(min(0.2, seconds / 10))
        r.steps = r.episodes = 0
        r.elapsed_s = r.reset_s = 0.0
    per_round: list[list[float]] = [[] for _ in runners]
    per_round_step: list[list[float]] = [[] for _ in runners]
    for _ in range(rounds):
        for i, r in enumerate(runners):
            with_resets, step_only = r.round(seconds / rounds)
            per_round[i].append(with_resets)
            per_round_step[i].append(step_only)

    def entry(i: int) -> dict:
        r = runners[i]
        return {"steps_per_s": statistics.median(per_round[i]), "rounds_steps_per_s": per_round[i],
                "step_only_steps_per_s": statistics.median(per_round_step[i]),
                "rounds_step_only_steps_per_s": per_round_step[i],
                "reset_ms_per_episode": 1e3 * r.reset_s / r.episodes if r.episodes else float("nan"),
                "reset_share": r.reset_s / r.elapsed_s,
                "steps": r.steps, "episodes": r.episodes, "seconds": r.elapsed_s}

    reference = entry(0)
    envs = {}
    for i, (name, (env_id, kwargs)) in enumerate(zip(names, cases), start=1):
        e = entry(i)
        e["kwargs"] = {k: v.name if isinstance(v, ClusterPreset) else v for k, v in kwargs.items()}  # JSON-able
        e["engine"] = getattr(runners[i].env.unwrapped, "engine", None)
        e["ratio"] = e["steps_per_s"] / reference["steps_per_s"]
        e["step_only_ratio"] = e["step_only_steps_per_s"] / reference["step_only_steps_per_s"]
        e["meets_target"] = e["ratio"] >= TARGET_RATIO
        envs[name] = e
    for i, (name, _) in enumerate(alone, start=len(cases) + 1):
        e = entry(i)
        e["ratio"] = e["steps_per_s"] / reference["steps_per_s"]
        e["step_only_ratio"] = e["step_only_steps_per_s"] / reference["step_only_steps_per_s"]
        envs[name]["simulator_alone"] = e
    for r in runners:
        r.env.close()
    result = {"reference": {"env_id": REFERENCE[0], **reference}, "envs": envs, "target_ratio": TARGET_RATIO,
              "wrapped": wrapped, "seconds": seconds, "rounds": rounds}
    if verbose:
        print(format_report(result))
    return result


def format_report(result: dict) -> str:
    ref = result["reference"]
    labels = {name: name + (f" [{e['engine']}]" if e.get("engine") else "") for name, e in result["envs"].items()}
    w = max([34] + [len(x) for x in labels.values()])

    def row(name: str, e: dict, ratio: float, step_ratio: float, mark: str = "") -> str:
        return (f"{name:<{w}s} {e['steps_per_s']:>10,.0f} {ratio:>7.3f} {e['step_only_steps_per_s']:>10,.0f} "
                f"{step_ratio:>7.3f} {e['reset_ms_per_episode']:>9.3f} {e['reset_share']:>6.1%} "
                f"{e['episodes']:>8d}{mark}")

    lines = [f"{'':<{w}s} {'with resets':>18s} {'step only':>18s} {'reset':>16s}",
             f"{'environment [engine]':<{w}s} {'steps/s':>10s} {'ratio':>7s} {'steps/s':>10s} {'ratio':>7s} "
             f"{'ms/episode':>9s} {'share':>6s} {'episodes':>8s}",
             row(ref["env_id"], ref, 1.0, 1.0)]
    for name, e in result["envs"].items():
        mark = "" if e["meets_target"] else f"  (below the {result['target_ratio']:g} target)"
        lines.append(row(labels[name], e, e["ratio"], e["step_only_ratio"], mark))
        a = e.get("simulator_alone")
        if a is not None:
            lines.append(row("  its cluster simulator alone", a, a["ratio"], a["step_only_ratio"]))
    lines.append("ratio: to CartPole-v1 in the same run (with resets to with resets, step only to step only)")
    if any("simulator_alone" in e for e in result["envs"].values()):
        lines.append("simulator alone: ClusterSimulator.step with the env's actions and episodes, without the "
                     "observation, reward, info or metrics, through its Python API (the native env core, one call per step, can run below it)")
    return "\n".join(lines)


def _per_call_us(f, seconds: float) -> float:
    """Microseconds per call of ``f()``, the best of five rounds of about ``seconds / 5`` each."""
    n = max(1, int(timeit.Timer(f).autorange()[0] * seconds / 5 / 0.2))
    return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6


def parts(env_id: str, kwargs: dict | None = None, seconds: float = 1.0, warmup_steps: int = 300) -> dict:
    """What a v1 environment's ``step`` on the reference (``engine="python"``) spends around its
    simulator, part by part, in microseconds:
    on one mid-episode state (after ``warmup_steps`` random steps of seed 0), the observation (its
    default route already computed), its four parts (the decode instances' load reads, the default
    router's choice that gives the predicted TTFT, the prefill features, clipping and packing the
    floats), and the final metrics (``ClusterSimulator.result``, once per episode: its time over the
    episode's requests; timed on a second episode, after a first one's imports and caches)."""
    from mooncake_gym.envs.common import as_float32, clipped
    from mooncake_gym.envs.features import routing_features

    env = gym.make(env_id, **(kwargs or {})).unwrapped
    if isinstance(env, ClusterEnv) and env.engine != "python":  # the parts of the reference's step
        env = gym.make(env_id, **{**(kwargs or {}), "engine": "python"}).unwrapped
    if not isinstance(env, ClusterEnv):
        raise ValueError(f"env_id: expected a v1 environment (a ClusterEnv), got {env_id}")
    env.action_space.seed(0)
    metrics_ms = []
    for seed in (0, 1):  # the second episode's final metrics are timed
        env.reset(seed=seed)
        sim = env.sim
        while not sim.done:
            sim.step(env._action(env.action_space.sample()))
        start = time.perf_counter()
        sim.result("env")
        metrics_ms.append(1e3 * (time.perf_counter() - start))
    env.reset(seed=0)
    for _ in range(warmup_steps):
        if env.step(env.action_space.sample())[2]:
            env.reset(seed=0)
    sim, v = env.sim, env.sim.view
    now, tokens, scale = v.now, v.input_tokens, env._time_scale
    floats = env._observe().tolist()
    out = {"observation": _per_call_us(env._observe, seconds),
           "decode loads": _per_call_us(lambda: [d.load(now, tokens) for d in sim.decode], seconds),
           "default router": _per_call_us(lambda: sim.router(v.routing), seconds),
           "prefill features": _per_call_us(lambda: routing_features(v.routing, scale), seconds),
           "clip and pack": _per_call_us(lambda: as_float32(clipped(floats)), seconds),
           "final metrics per step": 1e3 * metrics_ms[1] / len(sim.trace)}
    env.close()
    return out


def format_parts(env_id: str, p: dict) -> str:
    """:func:`parts`' figures as lines; the four parts are indented under the observation."""
    inner = ("decode loads", "default router", "prefill features", "clip and pack")
    lines = [f"{env_id}: a step's parts around its simulator, us"]
    lines += [f"  {'  ' if k in inner else ''}{k:<{28 if k in inner else 30}s} {v:8.2f}" for k, v in p.items()]
    return "\n".join(lines)


#: Issue 25's targets (:func:`engine_targets`): v0's step through gym.make at least 1.5x CartPole-v1's
#: through gym.make; a vector env of 16 at least 8x CartPole's single env in aggregate; a snapshot of
#: the default cluster at most 50 us.
ENGINE_TARGETS = {"v0": 1.5, "vector": 8.0, "snapshot_us": 50.0}
VECTOR_ENVS = 16


class _VectorRunner:
    """``gym.make_vec(env_id, n, vectorization_mode=...)`` stepped with pre-drawn actions: each
    call steps ``n`` envs (autoreset inside); :meth:`round` gives env steps per second in aggregate."""

    def __init__(self, env_id: str, n: int, kwargs: dict | None = None, mode: str = "vector_entry_point", seed: int = 0):
        self.env = gym.make_vec(env_id, num_envs=n, vectorization_mode=mode, **(kwargs or {}))
        self.n = n
        space = self.env.single_action_space
        self.actions = np.random.default_rng(seed).integers(0, int(space.n), size=(_POOL // 16, n))
        self.env.reset(seed=seed)
        self.k = 0
        self.reset_s = 0.0
        inner = self.env.unwrapped
        if hasattr(inner, "_reset_env"):  # the time spent starting episodes, clocked (the step-only figure)
            reset_env = inner._reset_env

            def clocked(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return reset_env(*args, **kwargs)
                finally:
                    self.reset_s += time.perf_counter() - t0
            inner._reset_env = clocked

    def round(self, seconds: float) -> tuple[float, float]:
        """Aggregate env steps per second, with the episodes' starts and without them (only
        measured for the native vector env; Gymnasium's sync env gives the first twice)."""
        step, actions, pool, clock = self.env.step, self.actions, len(self.actions), time.perf_counter
        k, calls, reset_before = self.k, 0, self.reset_s
        start = clock()
        deadline = start + seconds
        while True:
            for _ in range(100):
                step(actions[k])
                k = k + 1 if k + 1 < pool else 0
            calls += 100
            now = clock()
            if now >= deadline:
                break
        self.k = k
        steps = calls * self.n
        return steps / (now - start), steps / (now - start - (self.reset_s - reset_before))

    def close(self):
        self.env.close()


def snapshot_cost_us(engine: str = "native", steps: int = 500, seconds: float = 1.0, kwargs: dict | None = None) -> dict:
    """Microseconds of ``snapshot()`` and of ``restore()`` of PrefillRouting-v0's simulator (default
    cluster: 8 instances, 3,000-block caches) after ``steps`` random steps of seed 0."""
    from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv

    env = PrefillRoutingEnv(engine=engine, **(kwargs or {}))
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for a in rng.integers(0, env.action_space.n, steps):
        env.step(int(a))
    sim = env.sim
    snap = sim.snapshot()
    return {"snapshot_us": _per_call_us(sim.snapshot, seconds), "restore_us": _per_call_us(lambda: sim.restore(snap), seconds),
            "cached_blocks": None if engine != "native" else int(sum(sim.pool_state(0.0)[1]))}


def engine_targets(seconds: float = 3.0, rounds: int = 3, verbose: bool = True, with_v1: bool = True) -> dict:
    """Issue 25's targets for PrefillRouting-v0, measured in one run (interleaved rounds, medians):
    steps/s through ``gym.make`` (wrappers included, resets in the loop) of CartPole-v1, of v0 on the
    native engine and on the reference; the aggregate steps/s of a vector env of 16
    (``vectorization_mode="vector_entry_point"``, its default threads, and on two threads; Gymnasium's
    ``sync`` of 16 reference envs beside it); with ``with_v1``, PrefillRouting-v1's single native env
    and its vector env of 16 (default preset); the snapshot's and restore's cost on both engines."""
    v0, v1 = "mooncake_gym/PrefillRouting-v0", "mooncake_gym/PrefillRouting-v1"
    runners = {"CartPole-v1": _Runner(*REFERENCE, wrapped=True),
               "v0 native": _Runner(v0, {"engine": "native"}, wrapped=True),
               "v0 python": _Runner(v0, {"engine": "python"}, wrapped=True),
               f"vector {VECTOR_ENVS} native": _VectorRunner(v0, VECTOR_ENVS),
               f"vector {VECTOR_ENVS} native, 2 threads": _VectorRunner(v0, VECTOR_ENVS, {"threads": 2}),
               f"sync {VECTOR_ENVS} python": _VectorRunner(v0, VECTOR_ENVS, {"engine": "python"}, mode="sync")}
    if with_v1:
        runners.update({"v1 native": _Runner(v1, {"engine": "native"}, wrapped=True),
                        f"v1 vector {VECTOR_ENVS} native": _VectorRunner(v1, VECTOR_ENVS)})
    for r in runners.values():
        r.round(min(0.2, seconds / 10))
    rates: dict[str, list[float]] = {name: [] for name in runners}
    step_only: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, r in runners.items():
            with_resets, alone = r.round(seconds / rounds)
            rates[name].append(with_resets)
            step_only[name].append(alone)
    for r in runners.values():
        r.env.close()
    med = {name: statistics.median(v) for name, v in rates.items()}
    med_step = {name: statistics.median(v) for name, v in step_only.items()}
    cart, cart_step = med["CartPole-v1"], med_step["CartPole-v1"]
    snaps = {e: snapshot_cost_us(e, seconds=seconds / 3) for e in ("native", "python")}
    result = {"steps_per_s": med, "rounds": rates, "ratio": {name: v / cart for name, v in med.items()},
              "step_only_steps_per_s": med_step,
              "step_only_ratio": {name: v / cart_step for name, v in med_step.items()},
              "snapshot": snaps, "targets": ENGINE_TARGETS, "threads": default_threads(VECTOR_ENVS)}
    result["meets"] = {"v0": result["ratio"]["v0 native"] >= ENGINE_TARGETS["v0"],
                       "vector": result["ratio"][f"vector {VECTOR_ENVS} native"] >= ENGINE_TARGETS["vector"],
                       "snapshot_us": snaps["native"]["snapshot_us"] <= ENGINE_TARGETS["snapshot_us"]}
    if verbose:
        print(format_engine_targets(result))
    return result


def format_engine_targets(result: dict) -> str:
    t = result["targets"]
    target = {"v0 native": f">= {t['v0']}x", f"vector {VECTOR_ENVS} native": f">= {t['vector']}x"}
    lines = [f"{'through gym.make / make_vec':<28s} {'with resets':>22s} {'step only':>22s}",
             f"{'':<28s} {'steps/s':>11s} {'x CartPole':>10s} {'steps/s':>11s} {'x CartPole':>10s}  target (with resets)"]
    for name, v in result["steps_per_s"].items():
        lines.append(f"{name:<28s} {v:>11,.0f} {result['ratio'][name]:>10.2f} "
                     f"{result['step_only_steps_per_s'][name]:>11,.0f} {result['step_only_ratio'][name]:>10.2f}  "
                     f"{target.get(name, '')}")
    for e, s in result["snapshot"].items():
        mark = f"  target <= {t['snapshot_us']:g} us" if e == "native" else ""
        lines.append(f"snapshot ({e}, default cluster, mid-episode)   {s['snapshot_us']:>9.1f} us, "
                     f"restore {s['restore_us']:.1f} us{mark}")
    lines.append("met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["meets"].items()) +
                 f" (a vector env of {VECTOR_ENVS}'s default threads here: {result.get('threads', '?')})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per environment (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--wrapped", action="store_true", help="step the envs as gym.make returns them")
    parser.add_argument("--parts", action="store_true",
                        help="instead, time the parts of each v1 environment's step around its simulator")
    parser.add_argument("--engine", action="store_true",
                        help="instead, issue 25's targets for PrefillRouting-v0 (native engine, vector env, snapshots)")
    parser.add_argument("--no-v1", action="store_true", help="with --engine: leave out PrefillRouting-v1's rows")
    args = parser.parse_args(argv)
    if args.engine:
        engine_targets(args.seconds, args.rounds, with_v1=not args.no_v1)
        return 0
    if args.parts:
        for env_id, kwargs in ENV_CASES:
            if env_id.endswith("-v1"):
                print(format_parts(env_id, parts(env_id, kwargs, args.seconds / 3)))
        return 0
    run(args.seconds, args.rounds, wrapped=args.wrapped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
