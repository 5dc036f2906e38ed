"""Cluster-simulator speed: routing decisions per second of ``conductor.ClusterSimulator`` on the
shared trace (admit all, kvcentric, the decode pool's default rule), beside the prefill-only
routing simulator in the same run, and the admission problem on the ``mooncake-overload`` preset.

Target (issue 11): >= 20,000 routing decisions/s on the shared trace. Falls back to a synthetic
trace at rate 8 when ../shared/traces is absent. Run: ``python benchmarks/bench_cluster.py`` or
``mooncake-gym bench --only cluster``.

Figures (issue 11's speed work, 2026-12-01). On a quiet machine before it: routing simulator 22,408/s,
cluster 7,991/s (0.36x), admission early 7,108/s. The machine was then shared (load 5 to 8 on 2
cores), so wall-clock ratios moved by +-0.05 between runs of the same code; the deterministic
figure is the instruction count (``valgrind --tool=callgrind``, one run of the shared trace x2,
3993 requests, import and trace reading subtracted): cluster simulator 1.84e9 -> 1.61e9
instructions (12.5 % fewer), against 0.79e9 for the routing simulator alone (the routing
simulator's share of the cluster's instructions: 0.43 -> 0.49). The target (>= 20,000/s, i.e. within ~10 % of the routing simulator's own speed) is
not met: about half the cluster's time is the prefill pool (``routing.RoutingSimulator``: the
routing view rebuilt at every dispatch, prefix-cache insert and match, kvcentric's estimates),
the rest the decode side (default decode rule over the instances, joins, finishes, the vectorised
TBT pass at the end).

Second round (2026-12-01): the prefill time remembered by (tokens, cached tokens)
(``PrefillTime.cached``), the routing view's load fields in one pass (``cluster.pool_load``),
kvcentric's estimates as list comprehensions, no load-series call at every event of the drain after
the last arrival, the default decode rule evaluating instances in order of their step's lower bound
(1.05 context solves per decision instead of 2.8) and the result's arrays in one conversion each.
Same numbers bit for bit (``tests/test_speed_fast_paths.py``). Instructions (callgrind, one run of the
first 1,200 requests of the shared trace x2, three runs minus one): cluster simulator 425.3e6 ->
380.1e6 (-10.6 %), routing simulator 177.7e6 -> 158.6e6 (-10.8 %), so the cluster's ratio to the
routing simulator stays about 0.42. Wall clock on the shared machine (load 6 to 8 on 2 cores), old
and new commit back to back, two rounds each: ratio 0.39 and 0.43 before, 0.44 and 0.42 after; the
absolute figures moved by up to 50 % between rounds of the same code. The target is still not met.
Where the time goes now (py-spy, runs of the shared trace x2): the prefill pool 35 % (prefix-cache
insert 11 %, the view's estimates 11 %, prefix match 5.5 %), the event loop 30 % (default decode
rule 7 %, decode finishes 6.5 %, joins 5.4 %, load samples 4.6 %), the result 11 % (TBT pass 7 %),
kvcentric 6 %. Each is a few dozen bytecodes per decision spread over some 60 Python calls; a 2.4x
gain would need those loops compiled (the prefix cache, the decode instance's arithmetic, the event
loop, e.g. in Cython), not more restructuring in Python.

Third round (2026-12-01, fourth session): on an idle machine (load < 1) the pure-Python cluster
simulator runs 19,400-20,400 decisions/s (median of three rounds 19.7k), i.e. at the target's
20,000/s in absolute terms: the earlier 0.36-0.44 ratios were read on a machine loaded 5-8 deep.
The optional compiled core (``make install-fast``: prefixcache, cluster, decode, routing and
conductor compiled with mypyc; setup.py) runs 23,500-28,300 (median 26.6k, 1.35x pure; admission
early 1.24x; the prefill-only routing simulator 1.07x, its policy kvcentric not being compiled),
same numbers bit for bit (``benchmarks/golden.py``). Instructions (callgrind, shared trace x2):
1,542e6 pure -> 1,180e6 compiled. ``perf`` of the compiled run: the compiled code's own instructions
are ~7 % of cycles, CPython's object machinery ~74 % (dict lookups of the prefix cache and the
request-keyed dicts ~10 %, tuple and float allocation, heap-tuple comparisons, GC ~5 %), which
mypyc leaves as it is. The 20,000/s target is met compiled (with margin) and borderline in pure
Python.

Issue 24's budget (2026-12-03): the faithful cluster's engine mechanisms (prefill batching, shared
NICs, preemption; ``presets.ENGINE``) may cost at most 1.5x against the same preset without them
(``presets.NO_ENGINE``), in the same run. Three runs on the 2-core machine while CI ran on it (load
2): 1.51x, 1.18x, 1.10x (4,435-5,015 against 4,885-7,239 decisions/s): within the budget but for the
noisiest run. The prefill-only routing simulator now runs on the native engine (about 560,000
decisions/s), so the cluster's ratio to it no longer measures the Python code.
"""

from __future__ import annotations

import time
from pathlib import Path

from mooncake_gym.sim import cluster as conductor
from mooncake_gym.sim import routing
from mooncake_gym.baselines import make_policy
from mooncake_gym.model.presets import NO_ENGINE, get_preset
from mooncake_gym.model.workload import read_trace, synthetic_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"


def _rate(run_once, n: int, seconds: float) -> float:
    decisions, start = 0, time.perf_counter()
    while True:
        run_once()
        decisions += n
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return decisions / elapsed


def run(seconds: float = 2.0) -> dict:
    trace = read_trace(SHARED).scaled(2) if SHARED.exists() else synthetic_trace(0, 8.0)
    n = len(trace)
    prefill_only = _rate(lambda: routing.simulate(trace, make_policy("routing", "kvcentric")), n, seconds)
    cluster = _rate(lambda: conductor.simulate(trace, "mooncake", routing=make_policy("routing", "kvcentric")),
                    n, seconds)
    # the faithful cluster's engine mechanisms off (presets.NO_ENGINE), in the same run: issue 24's budget
    # is a fall of at most 1.5x from them
    plain = get_preset("mooncake").with_(**NO_ENGINE)
    mechanisms_off = _rate(lambda: conductor.simulate(trace, plain, routing=make_policy("routing", "kvcentric")),
                           n, seconds)
    overload, _ = conductor.overload_workload(synthetic_trace(0, 4.0), 2.0, 3000, seed=1, preset="mooncake-overload")
    admission = _rate(lambda: conductor.simulate(overload, "mooncake-overload",
                                                 admission=make_policy("admission", "early")), len(overload), seconds)
    print(f"routing simulator (prefill only)   {prefill_only:10,.0f} decisions/s  ({trace.name}, {n} requests; "
          f"the native engine where it is built)")
    print(f"cluster simulator, mooncake        {cluster:10,.0f} decisions/s  ({cluster / prefill_only:.2f}x the above)")
    print(f"cluster simulator, mechanisms off  {mechanisms_off:10,.0f} decisions/s  (mooncake with presets.NO_ENGINE: "
          f"the mechanisms cost {mechanisms_off / cluster:.2f}x, budget 1.5x)")
    print(f"cluster simulator, admission early {admission:10,.0f} decisions/s  (mooncake-overload, load 2)")
    return {"prefill_only_per_s": prefill_only, "cluster_per_s": cluster, "ratio": cluster / prefill_only,
            "mechanisms_off_per_s": mechanisms_off, "mechanisms_cost": mechanisms_off / cluster,
            "admission_per_s": admission}


if __name__ == "__main__":
    run()
