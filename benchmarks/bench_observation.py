"""Observation-layer speed: routing decisions per second with kvcentric under each observation mode,
next to the exact view measured in the same run (the exact mode adds no work: the simulator hands
its own view to the policy). Falls back to a synthetic trace at rate 8 when ../shared/traces is
absent. Run: ``python benchmarks/bench_observation.py`` or ``mooncake-gym bench --only observation``.
"""

from __future__ import annotations

import time
from pathlib import Path

from mooncake_gym.baselines import make_policy
from mooncake_gym.sim.routing import simulate
from mooncake_gym.model.workload import read_trace, synthetic_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"
MODES = ("exact", "scraped", "scraped,scrape_delay_s=0.5", "approximate", "precise", "noisy",
         "scraped+approximate+noisy")


def run(seconds: float = 2.0) -> dict:
    trace = read_trace(SHARED) if SHARED.exists() else synthetic_trace(0, 8.0)
    out = {"trace": trace.name, "requests": len(trace)}
    for mode in MODES:
        decisions, start = 0, time.perf_counter()
        while True:
            simulate(trace, make_policy("routing", "kvcentric"), observation=mode)
            decisions += len(trace)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        out[f"{mode}_decisions_per_s"] = rate = decisions / elapsed
        ratio = rate / out["exact_decisions_per_s"]
        print(f"observation {mode:28s} {rate:10,.0f} decisions/s  ({ratio:.2f} x exact; {trace.name})")
    return out


if __name__ == "__main__":
    run()
