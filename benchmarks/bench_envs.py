"""Raw ``step`` throughput of the mooncake-gym environments next to Gymnasium's CartPole-v1.

    python benchmarks/bench_envs.py [--seconds 3]

Each environment is built with ``gym.make(...).unwrapped`` (no wrappers: the raw ``step``), driven
by uniformly random valid actions drawn before the clock starts, and reset with the next seed
whenever an episode ends; the resets are inside the timed loop, so a workload drawn at ``reset``
counts. The environments are measured in the same process run, in interleaved rounds (CartPole,
env, CartPole, env, ...), and each figure is the median over rounds, because a shared machine is
noisy. The speed of an environment is quoted as a ratio to CartPole measured in the same run
(``../shared/spec/gym-conventions.md``); the target of issue 5 is a ratio of at least 0.25.

:func:`run` returns the figures as a dict (for ``mooncake-gym bench``); adding an environment is
one more entry of :data:`ENV_CASES`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import mooncake_gym  # noqa: F401  (registers the mooncake_gym/... ids)

REFERENCE = ("CartPole-v1", {})
#: (env id, constructor kwargs) of the environments to measure; their default settings.
ENV_CASES: list[tuple[str, dict]] = [
    ("mooncake_gym/PrefillRouting-v0", {}),
    # ("mooncake_gym/OverloadAdmission-v0", {}),
]
#: The issue's target: every env at least this fraction of CartPole's steps per second.
TARGET_RATIO = 0.25
_CHUNK = 1000  # steps between clock reads
_POOL = 1 << 16  # pre-drawn actions, reused cyclically


def _actions(space: gym.spaces.Discrete, seed: int) -> list[int]:
    if not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"action space: only Discrete spaces are benchmarked, got {space}")
    rng = np.random.default_rng(seed)
    return (int(space.start) + rng.integers(0, int(space.n), size=_POOL)).tolist()


class _Runner:
    """One environment, its pre-drawn actions and its position, so rounds can resume it."""

    def __init__(self, env_id: str, kwargs: dict, seed: int = 0, wrapped: bool = False):
        self.env_id = env_id
        self.env = gym.make(env_id, **kwargs)
        if not wrapped:
            self.env = self.env.unwrapped
        self.actions = _actions(self.env.action_space, seed)
        self.seed = seed
        self.env.reset(seed=self.seed)
        self.k = 0
        self.steps = self.episodes = 0
        self.elapsed_s = 0.0

    def round(self, seconds: float) -> float:
        """Step for about ``seconds``; returns this round's steps per second."""
        env, actions, pool = self.env, self.actions, len(self.actions)
        step, reset = env.step, env.reset
        k, seed, steps, episodes = self.k, self.seed, 0, 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(_CHUNK):
                _, _, terminated, truncated, _ = step(actions[k])
                k += 1
                if k == pool:
                    k = 0
                if terminated or truncated:
                    seed += 1
                    reset(seed=seed)
                    episodes += 1
            steps += _CHUNK
            now = time.perf_counter()
            if now >= deadline:
                break
        self.k, self.seed = k, seed
        self.steps += steps
        self.episodes += episodes
        self.elapsed_s += now - start
        return steps / (now - start)


def run(seconds: float = 3.0, rounds: int = 3, env_cases: list[tuple[str, dict]] | None = None,
        wrapped: bool = False, verbose: bool = True) -> dict:
    """Measure every env of ``env_cases`` (default :data:`ENV_CASES`) and CartPole-v1 for about
    ``seconds`` each, in ``rounds`` interleaved rounds. ``wrapped=True`` steps the envs as
    ``gym.make`` returns them (with CartPole's TimeLimit and the checker wrappers) instead of raw.

    Returns ``{"reference": {...}, "envs": {env_id: {...}}, "target_ratio": 0.25}``; each entry has
    ``steps_per_s`` (median over rounds), ``rounds_steps_per_s``, ``steps``, ``episodes`` and, for
    the envs, ``ratio`` (to CartPole's median) and ``meets_target``. Prints the table unless
    ``verbose=False``.
    """
    if not seconds > 0:
        raise ValueError(f"seconds: expected > 0, got {seconds!r}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds: expected an integer >= 1, got {rounds!r}")
    cases = ENV_CASES if env_cases is None else env_cases
    runners = [_Runner(*REFERENCE, wrapped=wrapped)] + [_Runner(env_id, kwargs, wrapped=wrapped)
                                                        for env_id, kwargs in cases]
    for r in runners:  # warm-up: first calls, caches, one reset
        r.round(min(0.2, seconds / 10))
        r.steps = r.episodes = 0
        r.elapsed_s = 0.0
    per_round: list[list[float]] = [[] for _ in runners]
    for _ in range(rounds):
        for i, r in enumerate(runners):
            per_round[i].append(r.round(seconds / rounds))

    def entry(i: int) -> dict:
        r = runners[i]
        return {"steps_per_s": statistics.median(per_round[i]), "rounds_steps_per_s": per_round[i],
                "steps": r.steps, "episodes": r.episodes, "seconds": r.elapsed_s}

    reference = entry(0)
    envs = {}
    for i, (env_id, kwargs) in enumerate(cases, start=1):
        e = entry(i)
        e["kwargs"] = dict(kwargs)
        e["ratio"] = e["steps_per_s"] / reference["steps_per_s"]
        e["meets_target"] = e["ratio"] >= TARGET_RATIO
        envs[env_id] = e
    for r in runners:
        r.env.close()
    result = {"reference": {"env_id": REFERENCE[0], **reference}, "envs": envs, "target_ratio": TARGET_RATIO,
              "wrapped": wrapped, "seconds": seconds, "rounds": rounds}
    if verbose:
        print(format_report(result))
    return result


def format_report(result: dict) -> str:
    ref = result["reference"]
    lines = [f"{'environment':<34s} {'steps/s':>10s} {'ratio':>7s}  episodes",
             f"{ref['env_id']:<34s} {ref['steps_per_s']:>10,.0f} {1.0:>7.3f}  {ref['episodes']}"]
    for env_id, e in result["envs"].items():
        mark = "" if e["meets_target"] else f"  (below the {result['target_ratio']:g} target)"
        lines.append(f"{env_id:<34s} {e['steps_per_s']:>10,.0f} {e['ratio']:>7.3f}  {e['episodes']}{mark}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per environment (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--wrapped", action="store_true", help="step the envs as gym.make returns them")
    args = parser.parse_args(argv)
    run(args.seconds, args.rounds, wrapped=args.wrapped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
