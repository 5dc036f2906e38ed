"""``mooncake-gym bench``: run the speed benchmarks of the source checkout's ``benchmarks/`` folder.

Each ``benchmarks/bench_*.py`` exposes ``run(seconds=...) -> dict`` and prints its own figures.
Speeds are reported as measured, and where a target is a ratio (env steps against CartPole, our
cache pass against the oracle's) the two sides are measured in the same run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

from mooncake_gym import engine
from mooncake_gym.cli.options import JSON, Command, opt
from mooncake_gym.reporting import tables as report

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmarks(seconds: float = 2.0, only: str | None = None) -> dict:
    if not BENCH_DIR.is_dir():
        raise FileNotFoundError(f"bench: no benchmarks folder at {BENCH_DIR} (run from a source checkout)")
    print(f"default engine: {engine()} (docs/engine.md)")
    results = {}
    for path in sorted(BENCH_DIR.glob("bench_*.py")):
        name = path.stem
        if only and only not in name:
            continue
        spec = importlib.util.spec_from_file_location(f"mooncake_gym_benchmarks.{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"=== {name}")
        results[name] = module.run(seconds=seconds)
    if not results:
        raise ValueError(f"--only: no benchmark name contains {only!r}")
    return results


def run(args) -> int:
    if not args.json:
        run_benchmarks(seconds=args.seconds, only=args.only)
        return 0
    with contextlib.redirect_stdout(sys.stderr):  # the figures as they come, to stderr; one JSON document on stdout
        results = run_benchmarks(seconds=args.seconds, only=args.only)
    report.print_json(results)
    return 0


COMMAND = Command("bench", "speed benchmarks (decisions/s, env steps/s next to CartPole)", (
    opt("--seconds", type=float, default=2.0, limit="seconds", help="time budget per measurement (default 2)"),
    opt("--only", default=None, help="run only benchmarks whose name contains this"),
    JSON,
), run)
