"""Routing-simulator speed: decisions per second replaying the shared synthetic trace with kvcentric.

Target (issue 3): >= 20,000 decisions/s on this machine. Falls back to a synthetic trace at rate 8
when ../shared/traces is absent. Run: ``python benchmarks/bench_routing.py`` or ``mooncake-gym bench``.
"""

from __future__ import annotations

import time
from pathlib import Path

from mooncake_gym.baselines import make_policy
from mooncake_gym.sim.routing import simulate
from mooncake_gym.model.workload import read_trace, synthetic_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"


def run(seconds: float = 2.0) -> dict:
    trace = read_trace(SHARED) if SHARED.exists() else synthetic_trace(0, 8.0)
    out = {"trace": trace.name, "requests": len(trace)}
    for name in ("random", "cache", "kvcentric"):
        decisions, start = 0, time.perf_counter()
        while True:
            simulate(trace, make_policy("routing", name))
            decisions += len(trace)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        out[f"{name}_decisions_per_s"] = decisions / elapsed
        print(f"routing {name:10s} {decisions / elapsed:10,.0f} decisions/s  ({trace.name}, {len(trace)} requests)")
    return out


if __name__ == "__main__":
    run()
