"""The native engine against the Python reference: kvcentric decisions per second of
``routing.simulate`` on the shared trace x2 (Mooncake's public synthetic trace at twice its
speed; a synthetic trace at rate 8 where ../shared/traces is absent) with ``engine="python"`` and
``engine="native"``, for the ``lecture`` preset and a realistic one (``mooncake``), measured in one
run, alternating the engines, so that the ratio is read under the same load. :func:`run_production`
(part of :func:`run`) does the same for each production router of ``baselines/production.py`` on the
trace's first 5,000 requests (``lecture``'s pool).

Target (issue 25): native >= 25x the reference's decisions per second, for both presets. The
native figure is the whole ``simulate`` call (the simulator's checks, the engine's run, the
result's arrays and metrics); "engine loop" is the engine's run alone on a trace it has already
read. Run: ``python benchmarks/bench_engine.py`` or ``mooncake-gym bench --only engine``. The figures
measured are in docs/engine.md.

:func:`run_cluster` (part of :func:`run`) does the same for the cluster simulator (``cluster.simulate``: kvcentric routing
by the default router, early rejection, the decode rule at the prefill's end) on ``lecture`` (the
reserve decode pool) and ``mooncake`` as shipped (chunked prefill batching, KV transfers over shared
NICs, continuous-batching decode with recompute): its decisions (arrivals) per second on each
engine, and, for a preset whose cluster is not native, the reason.

:func:`run_snapshots` (part of :func:`run`) times the snapshots of the default v1 cluster
(``gym.make("mooncake_gym/PrefillRouting-v1")``: preset ``mooncake``, 1,000-request episodes)
mid-episode (after ``at`` = 500 decisions by random actions): the env's ``snapshot()`` and
``restore(s)`` (the simulator's state and the reward's sums; restore writes the observation), the
native cluster's own, the Python reference's, and one env step for scale. Target (issue 25): at
most 50 us each for the env's snapshot and restore.
"""

from __future__ import annotations

import time
from pathlib import Path

from mooncake_gym import engine as default_engine
from mooncake_gym._engine import cluster as native_cluster, routing as native_routing
from mooncake_gym.baselines.admission import EarlyRejection
from mooncake_gym.baselines import make_policy
from mooncake_gym.model.presets import PRESETS
from mooncake_gym.model.workload import read_trace, synthetic_trace
from mooncake_gym.sim import cluster, routing

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"
PRESET_NAMES = ("lecture", "mooncake")


def _timed(run_once, seconds: float) -> tuple[int, float]:
    """(runs, elapsed) of ``run_once`` repeated for at least ``seconds`` (at least once)."""
    runs, start = 0, time.perf_counter()
    while True:
        run_once()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return runs, elapsed


def _rates(runs: dict, n: int, seconds: float, rounds: int) -> dict:
    """Decisions per second of each of ``runs`` (name -> a run of ``n`` decisions), measured in
    ``rounds`` alternating rounds that share the budget of ``seconds``."""
    totals = {key: [0, 0.0] for key in runs}
    for _ in range(rounds):
        for key, f in runs.items():
            count, elapsed = _timed(f, seconds / rounds)
            totals[key][0] += count
            totals[key][1] += elapsed
    return {key: count * n / elapsed for key, (count, elapsed) in totals.items()}


def run(seconds: float = 2.0, rounds: int = 3, trace=None) -> dict:
    if default_engine() != "native":
        print("the native engine is not in use (mooncake_gym.engine() == 'python'): nothing to compare")
        return {"engine": default_engine()}
    if trace is None:
        trace = read_trace(SHARED).scaled(2) if SHARED.exists() else synthetic_trace(0, 8.0)
    n = len(trace)
    out = {"trace": trace.name, "requests": n, "presets": {}}
    for name in PRESET_NAMES:
        p = PRESETS[name]
        config, cost = p.routing_config(), p.prefill_cost

        def once(engine, config=config, cost=cost):
            routing.simulate(trace, make_policy("routing", "kvcentric"), config, cost, engine=engine)

        sim = routing.RoutingSimulator(trace, config, cost)
        engine = native_routing.make_engine(sim)
        state = native_routing.rng_state(make_policy("routing", "kvcentric").rng)

        def loop(engine=engine, state=state):
            engine.reset()
            engine.run("kvcentric", 1.0, state)

        rate = _rates({"python": lambda: once("python"), "native": lambda: once("native"), "loop": loop}, n,
                      seconds, rounds)
        out["presets"][name] = {"python_per_s": rate["python"], "native_per_s": rate["native"],
                                "loop_per_s": rate["loop"], "ratio": rate["native"] / rate["python"],
                                "loop_ratio": rate["loop"] / rate["python"]}
        print(f"{name:9s} kvcentric  reference {rate['python']:10,.0f}/s  native {rate['native']:12,.0f}/s "
              f"({rate['native'] / rate['python']:5.1f}x)  engine loop {rate['loop']:12,.0f}/s "
              f"({rate['loop'] / rate['python']:5.1f}x)  [{trace.name}, {n} requests]")
    worst = min(v["ratio"] for v in out["presets"].values())
    out["target_met"] = worst >= 25.0
    print(f"target (native >= 25x the reference, both presets): {'met' if out['target_met'] else 'NOT met'} "
          f"(lowest {worst:.1f}x)")
    out["production"] = run_production(trace.head(PRODUCTION_REQUESTS), seconds, rounds)
    out["cluster"] = run_cluster(trace, seconds, rounds)
    out["snapshots"] = run_snapshots(seconds)
    return out


#: The issue's target for a snapshot and a restore of the default v1 cluster, in microseconds.
SNAPSHOT_TARGET_US = 50.0


def run_snapshots(seconds: float = 2.0, at: int = 500) -> dict:
    """Microseconds per ``snapshot()`` and per ``restore(s)`` of the default ``PrefillRouting-v1``
    env after ``at`` decisions (random actions, seed 0), on the native engine (the env's, and its
    cluster's alone) and on the reference, with one env step's for scale."""
    import gymnasium as gym
    import numpy as np

    import mooncake_gym  # noqa: F401  (registers the environments)

    out = {"at": at}
    for engine in ("native", "python"):
        env = gym.make("mooncake_gym/PrefillRouting-v1", engine=engine)
        env.reset(seed=0)
        u, rng = env.unwrapped, np.random.default_rng(0)
        for _ in range(at):
            env.step(int(rng.integers(env.action_space.n)))
        snap = u.snapshot()
        budget = seconds / 4 if engine == "native" else seconds / 8
        row = {"snapshot_us": _per_call(u.snapshot, budget), "restore_us": _per_call(lambda: u.restore(snap), budget)}
        actions = [int(a) for a in rng.integers(env.action_space.n, size=64)]

        def steps(env=env, u=u, snap=snap, actions=actions):
            u.restore(snap)
            for a in actions:
                env.step(a)

        row["step_us"] = _per_call(steps, budget) / len(actions) - row["restore_us"] / len(actions)
        if engine == "native":
            c = u.sim._cluster
            cs = c.snapshot()
            row["cluster_snapshot_us"] = _per_call(c.snapshot, budget)
            row["cluster_restore_us"] = _per_call(lambda: c.restore(cs), budget)
        out[engine] = row
        env.close()
    nat, ref = out["native"], out["python"]
    out["target_met"] = max(nat["snapshot_us"], nat["restore_us"]) <= SNAPSHOT_TARGET_US
    print(f"snapshot  PrefillRouting-v1 (mooncake) after {at} decisions: native env snapshot {nat['snapshot_us']:.1f} us, "
          f"restore {nat['restore_us']:.1f} us (cluster alone {nat['cluster_snapshot_us']:.1f} / "
          f"{nat['cluster_restore_us']:.1f} us; one env step {nat['step_us']:.1f} us); reference "
          f"{ref['snapshot_us']:,.0f} / {ref['restore_us']:,.0f} us ({ref['snapshot_us'] / nat['snapshot_us']:.0f}x / "
          f"{ref['restore_us'] / nat['restore_us']:.0f}x the native)")
    print(f"snapshot target (native env snapshot and restore <= {SNAPSHOT_TARGET_US:.0f} us each): "
          f"{'met' if out['target_met'] else 'NOT met'}")
    return out


def _per_call(f, seconds: float) -> float:
    """Microseconds per call of ``f``, repeated for at least ``seconds``."""
    runs, elapsed = _timed(f, seconds)
    return elapsed / runs * 1e6


#: The production routers' case runs on the trace's first requests (the reference is slow on all of them).
PRODUCTION_REQUESTS = 5000


def run_production(trace, seconds: float = 2.0, rounds: int = 3, preset: str = "lecture", names=None) -> dict:
    """Decisions per second of ``routing.simulate`` with each production router (``baselines/production.py``,
    native in ``_engine/production.hpp``; default knobs) on each engine, on ``preset``'s prefill pool."""
    from mooncake_gym.baselines.production import PRODUCTION_ROUTING_POLICIES

    p = PRESETS[preset]
    config, cost = p.routing_config(), p.prefill_cost
    n = len(trace)
    out = {"trace": trace.name, "requests": n, "preset": preset, "routers": {}}
    for name in names or PRODUCTION_ROUTING_POLICIES:
        def once(engine, name=name):
            routing.simulate(trace, make_policy("routing", name), config, cost, engine=engine)

        rate = _rates({"python": lambda: once("python"), "native": lambda: once("native")}, n, seconds, rounds)
        out["routers"][name] = {"python_per_s": rate["python"], "native_per_s": rate["native"],
                                "ratio": rate["native"] / rate["python"]}
        print(f"{preset:9s} {name:12s} reference {rate['python']:10,.0f}/s  native {rate['native']:12,.0f}/s "
              f"({rate['native'] / rate['python']:5.1f}x)  [{trace.name}, {n} requests]")
    return out


def run_cluster(trace, seconds: float = 2.0, rounds: int = 3, presets=PRESET_NAMES) -> dict:
    """Decisions per second of ``cluster.simulate`` (kvcentric, early rejection) on ``trace`` on each
    engine, per preset of ``presets`` (names of ``PRESETS`` or ``ClusterPreset``s); a preset whose
    cluster is not native is reported with the reason."""
    n = len(trace)
    out = {"trace": trace.name, "requests": n, "presets": {}}
    for preset in presets:
        p = PRESETS[preset] if isinstance(preset, str) else preset
        name = p.name
        why = native_cluster.preset_unsupported(p)
        if why is not None:
            out["presets"][name] = {"not_native": why}
            print(f"{name:9s} cluster    not native: {why}")
            continue

        def once(engine, p=p):
            cluster.simulate(trace, p, EarlyRejection(), engine=engine)

        rate = _rates({"python": lambda: once("python"), "native": lambda: once("native")}, n, seconds, rounds)
        out["presets"][name] = {"python_per_s": rate["python"], "native_per_s": rate["native"],
                                "ratio": rate["native"] / rate["python"]}
        print(f"{name:9s} cluster    reference {rate['python']:10,.0f}/s  native {rate['native']:12,.0f}/s "
              f"({rate['native'] / rate['python']:5.1f}x)  [kvcentric + early, {trace.name}, {n} requests]")
    ratios = [v["ratio"] for v in out["presets"].values() if "ratio" in v]
    out["target_met"] = bool(ratios) and min(ratios) >= 25.0 and len(ratios) == len(presets)
    print(f"cluster target (native >= 25x the reference, every preset): {'met' if out['target_met'] else 'NOT met'}"
          f" ({', '.join(f'{r:.1f}x' for r in ratios) or 'none native'}; "
          f"{len(presets) - len(ratios)} preset(s) not native)")
    return out


if __name__ == "__main__":
    run()
