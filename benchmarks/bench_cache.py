"""Speed of the cache analysis beside kvcache-simulator's Python backend (issue 7).

The LRU pass over the shared Mooncake trace at 3,000 blocks, second-half window, timed as a whole
process (interpreter start, imports, reading the trace, the replay, the ceiling, printing), run
the same number of times for each tool, alternating; the median wall time is compared. Then an
in-process breakdown of our own passes.

    python benchmarks/bench_cache.py [--trace ../shared/traces/synthetic_trace.jsonl] [--repeat 7]

The two commands timed:

    mooncake-gym cache TRACE --blocks 3000 --policies lru --window second-half
    kvcache-simulator run --trace TRACE --model llama-3.1-70b --block-size 512 --budgets-gib 468.75 \
        --policies lru --backend python --no-progress

(468.75 GiB of LLaMA-70B KV at 320 KiB per token = 3,000 blocks of 512 tokens.) Goal: no slower
than the oracle's Python backend.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO_ROOT.parent / "shared" / "traces" / "synthetic_trace.jsonl"


def wall_time(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run(seconds: float = 2.0, trace: str | Path = DEFAULT_TRACE, repeat: int | None = None) -> dict:
    """Time both commands ``repeat`` times (by default as many as fit about ``seconds`` x 4, at
    least 3); print the table and the in-process breakdown; return the medians and their ratio."""
    trace = str(trace)
    if not Path(trace).exists():
        print(f"no trace at {trace}: cache benchmark skipped", file=sys.stderr)
        return {"skipped": f"no trace at {trace}"}
    repeat = repeat or max(3, int(seconds * 4 / 0.5))

    ours = [sys.executable, "-m", "mooncake_gym.cli", "cache", trace, "--blocks", "3000",
            "--policies", "lru", "--window", "second-half"]
    oracle = [sys.executable, "-m", "kvcache_sim", "run", "--trace", trace, "--model", "llama-3.1-70b",
              "--block-size", "512", "--budgets-gib", "468.75", "--policies", "lru", "--backend", "python",
              "--no-progress"]
    have_oracle = importlib.util.find_spec("kvcache_sim") is not None

    wall_time(ours)  # warm the file cache and .pyc files
    if have_oracle:
        wall_time(oracle)
    times: dict[str, list[float]] = {"mooncake-gym cache": [], "kvcache-simulator (python)": []}
    for _ in range(repeat):
        times["mooncake-gym cache"].append(wall_time(ours))
        if have_oracle:
            times["kvcache-simulator (python)"].append(wall_time(oracle))

    print(f"Whole process, LRU at 3,000 blocks, second-half window, {repeat} runs each")
    print(f"{'command':<28} {'median s':>9} {'min s':>7}")
    for name, ts in times.items():
        if ts:
            print(f"{name:<28} {statistics.median(ts):9.3f} {min(ts):7.3f}")
    out = {name.split()[0] + "_median_s": statistics.median(ts) for name, ts in times.items() if ts}
    if have_oracle:
        ratio = statistics.median(times["mooncake-gym cache"]) / statistics.median(times["kvcache-simulator (python)"])
        out["ratio_ours_to_oracle"] = ratio
        print(f"ratio ours / oracle (median): {ratio:.2f}  ({'faster' if ratio < 1 else 'slower'} than the oracle)")
    else:
        print("kvcache-simulator is not installed: no comparison")

    # in-process breakdown of our passes
    from mooncake_gym.analysis.cache import PrefixTree, cache_ceiling, simulate_cache
    from mooncake_gym.model.workload import read_trace

    t0 = time.perf_counter()
    trace = read_trace(trace)
    t1 = time.perf_counter()
    tree = PrefixTree(trace)
    t2 = time.perf_counter()
    print(f"\nIn process: read {t1 - t0:.3f} s, prefix tree {t2 - t1:.3f} s "
          f"({sum(map(len, tree.paths)):,} blocks looked up, {tree.n_blocks:,} distinct)")
    for policy in ("lru", "fifo", "optimal"):
        cells = []
        for cap in (1000, 3000, 10000, 30000):
            t = time.perf_counter()
            r = simulate_cache(trace, cap, policy, "second-half", tree=tree)
            cells.append(f"{cap:>6,}: {r.hit_rate:.4f} in {time.perf_counter() - t:.3f} s")
        print(f"  {policy:<8}" + "   ".join(cells))
    t = time.perf_counter()
    c = cache_ceiling(trace, "second-half", tree=tree)
    print(f"  ceiling   {c.hit_rate:.4f} in {time.perf_counter() - t:.3f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="trace file (default: the shared Mooncake trace)")
    ap.add_argument("--repeat", type=int, default=7, help="runs of each command (default 7)")
    args = ap.parse_args(argv)
    return 2 if "skipped" in run(trace=args.trace, repeat=args.repeat) else 0


if __name__ == "__main__":
    sys.exit(main())
