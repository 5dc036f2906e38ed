"""Overload-simulator speed: admission decisions per second on lecture demo 3's workload.

Target (issue 4): >= 20,000 decisions/s on this machine for the simulator driven by the baseline
policy (the cost of the policy itself is part of the figure; the predictive policies replay the
decode pool forward at every decision and are slower). The workload is built once, outside the
timing. Run: ``python benchmarks/bench_overload.py`` or ``mooncake-gym bench --only overload``.
"""

from __future__ import annotations

import time

from mooncake_gym.baselines.admission import ADMISSION_POLICIES
from mooncake_gym.sim.admission import OverloadSimulator, overload_workload, simulate

TARGET = 20_000


def _rate(trace, name: str, seconds: float) -> float:
    decisions, start = 0, time.perf_counter()
    while True:
        simulate(trace, ADMISSION_POLICIES[name]())
        decisions += len(trace)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return decisions / elapsed


def _raw_rate(trace, seconds: float) -> float:
    """The bare step loop (admit everything), without a policy object."""
    decisions, start = 0, time.perf_counter()
    while True:
        sim = OverloadSimulator(trace)
        view = sim.reset()
        step = sim.step
        while view is not None:
            view = step(True)
        decisions += len(trace)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return decisions / elapsed


def run(seconds: float = 2.0) -> dict:
    trace, capacity = overload_workload()
    out = {"trace": trace.name, "requests": len(trace), "target_decisions_per_s": TARGET}
    rate = _raw_rate(trace, seconds)
    out["admit_all_decisions_per_s"] = rate
    print(f"overload admit-all     {rate:10,.0f} decisions/s  ({trace.name})")
    for name in ADMISSION_POLICIES:
        rate = _rate(trace, name, seconds)
        out[f"{name}_decisions_per_s"] = rate
        flag = "" if name != "baseline" else ("  (target met)" if rate >= TARGET else f"  (below target {TARGET:,})")
        print(f"overload {name:13s} {rate:10,.0f} decisions/s{flag}")
    return out


if __name__ == "__main__":
    run()
