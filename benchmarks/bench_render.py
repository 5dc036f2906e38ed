"""Time per ``render()`` frame of both environments with ``render_mode="rgb_array"``.

    python benchmarks/bench_render.py [--seconds 2]

Each environment (default settings, plus a 32-instance routing cluster) runs a baseline for 500
steps, so that queues, caches and the decode pool are busy, then ``render()`` is timed alone, over
and over, for about ``seconds``; the figure is the median over rounds of the mean time per frame,
in milliseconds. The target of issue 14 is at most 20 ms a frame (the earlier text picture drawn
with matplotlib took about 240 ms). A 1,000-step episode recorded with gymnasium's ``RecordVideo``
costs 1,000 frames: the figure times 1,000 is the drawing part of that.

:func:`run` returns the figures as a dict (for ``mooncake-gym bench``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import mooncake_gym  # noqa: F401  (registers the mooncake_gym/... ids)
from mooncake_gym.baselines import make_policy
from mooncake_gym.evaluation.episodes import as_env_policy

#: (label, env id, constructor kwargs, baseline that fills the cluster)
CASES = [
    ("routing, 8 instances", "mooncake_gym/PrefillRouting-v0", {"rate": 8.0}, ("routing", "kvcentric")),
    ("routing, 32 instances", "mooncake_gym/PrefillRouting-v0", {"rate": 12.0, "n_instances": 32},
     ("routing", "kvcentric")),
    ("admission, 8 + 8 instances", "mooncake_gym/OverloadAdmission-v0", {"load": 2.0}, ("admission", "baseline")),
]
TARGET_MS = 20.0
WARM_STEPS = 500
ROUNDS = 5


def _busy_env(env_id: str, kwargs: dict, baseline: tuple[str, str]):
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    obs, _ = env.reset(seed=0)
    policy = as_env_policy(make_policy(*baseline))
    policy.reset(env, 0)
    for _ in range(WARM_STEPS):
        obs, _, terminated, truncated, _ = env.step(policy.act(env, obs))
        if terminated or truncated:
            break
    return env


def _ms_per_frame(env, seconds: float) -> float:
    frames, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            env.render()
        frames += 20
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / frames * 1000.0


def run(seconds: float = 2.0) -> dict:
    results = {}
    for label, env_id, kwargs, baseline in CASES:
        env = _busy_env(env_id, kwargs, baseline)
        shape = env.render().shape
        ms = statistics.median(_ms_per_frame(env, seconds / ROUNDS) for _ in range(ROUNDS))
        env.close()
        results[label] = {"ms_per_frame": ms, "frame_shape": list(shape), "target_ms": TARGET_MS}
        print(f"{label:28} {ms:7.3f} ms per frame  (frame {shape[0]}x{shape[1]}x{shape[2]}; target <= "
              f"{TARGET_MS:g} ms: {'met' if ms <= TARGET_MS else 'NOT met'})")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time spent rendering per environment")
    run(parser.parse_args().seconds)


if __name__ == "__main__":
    main()
