"""SB3 PPO's training speed on PrefillRouting-v0: the vector env of 16 on the native engine against
today's single-process envs, in one run (issue 25's target: at least 4x).

    python benchmarks/bench_training.py [--timesteps 20000] [--v1]

Four set-ups train PPO with the shipped hyperparameters (``mooncake_gym/agents/hyperparams.yml``: n_steps 512,
batch 256, 10 epochs, net [128, 128]; the recipe's training workload) for the same number of
timesteps, alternating, and the figure is timesteps per second of ``model.learn`` (rollouts and
updates):

- *today, 1 env*: one reference env (``engine="python"``) in SB3's ``DummyVecEnv`` (the single
  process env of issue 25's day, the target's base);
- *1 env, native*: one env as ``gym.make`` gives it now (the native engine by default) in
  ``DummyVecEnv``, so the vector env's gain over today's default single env is in the same run;
- *today, recipe*: the recipe's ``n_envs`` (4) reference envs in ``DummyVecEnv`` (what
  ``mooncake-gym train`` ran before the engine);
- *vector 16*: :class:`mooncake_gym.envs.vector.SB3VecEnv` of 16 native envs (one engine call per
  step of all 16).

With ``--v1``, PrefillRouting-v1 (its shipped hyperparameters) as well: one reference env in
``DummyVecEnv`` against ``SB3VecEnv.routing_v1`` of 16 native envs.

PyTorch runs on ``threads`` threads (``--threads``; default 1, as ``mooncake-gym train``'s
``threads``): on the project's 2-core machines, shared with other jobs, two intra-op threads made
every set-up 10-25x slower (PPO of the vector env 134 against 3,040 timesteps/s, of the native
single env 40 against 1,023, 2026-12-04, load average 10), which hides what the environments cost.

``n_steps`` is per env, as in SB3, so a rollout holds ``n_steps x n_envs`` samples; the learner's
cost per sample is the same in all three, and what the vector env saves is the rollout's per-step
cost (one policy forward for 16 envs, one engine call). :func:`run` returns the figures.

Figures (2026-12-04, branch vec-speed, ``--timesteps 16384``, load average 10-17): the vector env
4.04x, 3.38x and 2.75x the single reference env in three runs (2.91x, 3.40x and 2.29x the single
native env); the code before (3fd16a7) 5.74x in a run between them. The spread is the shared
machine's: the update costs about 280 us of PyTorch per sample in every set-up, against rollouts of
about 48 us per sample (vector) and 700 us (single env), so the ratio sits near 3-4x
(docs/engine.md, "Measured speed"). Later (2026-12-04, branch vec2, ``--timesteps 16384 --rounds 2
--v1``, load average 11-12): 3.36x the single reference env (2.98x the native single env, 1.91x the
recipe's 4 envs); PrefillRouting-v1's vector env of 16 2.75x its single reference env. At load
average 2: 2.68x (2.48x the native single env), v1 3.39x.

Each set-up's rollouts (``collect_rollouts``) and updates (``train``) are clocked too, in wall and
in CPU time per sample, and the run prints the ceiling the update's cost sets: the single reference
env's (rollout + update) / update, the ratio a vector env whose rollout cost nothing would reach.
One run (2026-12-04, branch vec-speed3, ``--timesteps 16384 --rounds 1``, load average 5.2-5.9):
the vector env 3.18x the single reference env (3,115 vs 980 timesteps/s; 2.95x the native single
env, 2.13x the recipe's 4 envs); in CPU time per sample, the single reference env's rollout 311 us
and update 137 us, the vector env's rollout 20 us and update 117 us. The ceiling is 3.28x with the
single env's update cost and 3.83x with the vector set-up's (wall time: 3.26x and 3.81x), and the
vector env already makes (311 + 137) / (20 + 117) = 3.27x in CPU time: with the shipped
hyperparameters (10 epochs over minibatches of 256 per sample) issue 25's 4x is out of reach
whatever the environment costs (docs/engine.md, "Measured speed").
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import mooncake_gym  # noqa: F401
from mooncake_gym.agents.train import load_hyperparams
from mooncake_gym.envs.vector import SB3VecEnv

ENV_ID = "mooncake_gym/PrefillRouting-v0"
V1_ID = "mooncake_gym/PrefillRouting-v1"
TARGET_RATIO = 4.0
VECTOR_ENVS = 16
NATIVE_SINGLE = "1 env, native"
_PPO_KEYS = ("n_steps", "batch_size", "n_epochs", "learning_rate", "gamma", "gae_lambda", "ent_coef", "clip_range",
             "policy_kwargs")


def _ppo(venv, hp: dict, seed: int):
    from stable_baselines3 import PPO

    return PPO(hp["policy"], venv, seed=seed, device="cpu", verbose=0, **{k: hp[k] for k in _PPO_KEYS if k in hp})


def setups(hp: dict) -> dict:
    """name -> a function making the set-up's SB3 VecEnv."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    kwargs = dict(hp.get("env_kwargs", {}))

    def dummy(n):
        return lambda: DummyVecEnv([lambda: gym.make(ENV_ID, engine="python", **kwargs) for _ in range(n)])

    def native_single():
        return DummyVecEnv([lambda: gym.make(ENV_ID, **kwargs)])

    return {"today, 1 env": dummy(1), NATIVE_SINGLE: native_single,
            f"today, recipe ({hp['n_envs']} envs)": dummy(int(hp["n_envs"])),
            f"vector {VECTOR_ENVS} native": lambda: SB3VecEnv.routing(VECTOR_ENVS, **kwargs)}


def v1_setups(hp: dict) -> dict:
    """PrefillRouting-v1's two set-ups (``--v1``): one reference env in ``DummyVecEnv`` and the
    vector env of 16 native envs (``SB3VecEnv.routing_v1``), PPO with v1's shipped hyperparameters."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    kwargs = dict(hp.get("env_kwargs", {}))
    return {"v1 today, 1 env": lambda: DummyVecEnv([lambda: gym.make(V1_ID, engine="python", **kwargs)]),
            f"v1 vector {VECTOR_ENVS} native": lambda: SB3VecEnv.routing_v1(VECTOR_ENVS, **kwargs)}


def run(timesteps: int = 20000, rounds: int = 2, seed: int = 0, verbose: bool = True, threads: int = 1,
        v1: bool = False) -> dict:
    import torch

    torch.set_num_threads(threads)
    hp = load_hyperparams(ENV_ID)
    made = {name: (make, hp) for name, make in setups(hp).items()}
    if v1:
        hp1 = load_hyperparams(V1_ID)
        made.update({name: (make, hp1) for name, make in v1_setups(hp1).items()})
    rates: dict[str, list[float]] = {name: [] for name in made}
    phases: dict[str, list[dict]] = {name: [] for name in made}
    for r in range(rounds):
        for name, (make, hp_of) in made.items():
            model = _ppo(make(), hp_of, seed + r)
            clock = _clock_phases(model)
            start = time.perf_counter()
            model.learn(total_timesteps=timesteps)
            elapsed = time.perf_counter() - start
            rates[name].append(model.num_timesteps / elapsed)
            phases[name].append({k: v / model.num_timesteps * 1e6 for k, v in clock.items()}
                                | {"learn": elapsed / model.num_timesteps * 1e6})
            model.env.close()
    best = {name: max(v) for name, v in rates.items()}
    # each set-up's phases in its best round (us per sample)
    per_sample = {name: phases[name][rates[name].index(best[name])] for name in made}
    base = best["today, 1 env"]
    recipe = next(n for n in best if n.startswith("today, recipe"))
    vec = f"vector {VECTOR_ENVS} native"
    result = {"steps_per_s": best, "rounds": rates, "ratio_to_single": best[vec] / base,
              "ratio_to_native_single": best[vec] / best[NATIVE_SINGLE],
              "ratio_to_recipe": best[vec] / best[recipe], "target": TARGET_RATIO, "timesteps": timesteps,
              "threads": threads, "us_per_sample": per_sample,
              "ceiling": ceiling(per_sample["today, 1 env"], per_sample[vec])}
    result["meets_target"] = result["ratio_to_single"] >= TARGET_RATIO
    if v1:
        result["v1_ratio_to_single"] = best[f"v1 vector {VECTOR_ENVS} native"] / best["v1 today, 1 env"]
    if verbose:
        for name, v in best.items():
            of = best["v1 today, 1 env"] if name.startswith("v1") else base
            print(f"{name:<28s} {v:>9,.0f} timesteps/s  {v / of:5.2f}x   (rounds: "
                  + ", ".join(f"{x:,.0f}" for x in rates[name]) + ")")
        print(f"vector {VECTOR_ENVS} / today's single env: {result['ratio_to_single']:.2f}x (target >= {TARGET_RATIO:g}x: "
              f"{'met' if result['meets_target'] else 'NOT met'}); / the native single env: "
              f"{result['ratio_to_native_single']:.2f}x; / the recipe's {hp['n_envs']} envs: {result['ratio_to_recipe']:.2f}x")
        if v1:
            print(f"PrefillRouting-v1: vector {VECTOR_ENVS} / one reference env: {result['v1_ratio_to_single']:.2f}x")
        print(format_phases(per_sample, result["ceiling"]))
    return result


def _clock_phases(model) -> dict:
    """Clock ``model``'s rollouts (``collect_rollouts``) and updates (``train``): the dict returned
    accumulates each phase's wall seconds (``rollout``, ``update``) and CPU seconds of the process
    (``rollout_cpu``, ``update_cpu``: what a shared machine's other jobs do not inflate) while
    ``model.learn`` runs."""
    spent = {"rollout": 0.0, "update": 0.0, "rollout_cpu": 0.0, "update_cpu": 0.0}

    def clocked(f, phase):
        def run(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[phase] += time.perf_counter() - t0
                spent[phase + "_cpu"] += time.process_time() - c0
        return run

    model.collect_rollouts = clocked(model.collect_rollouts, "rollout")
    model.train = clocked(model.train, "update")
    return spent


def ceiling(single: dict, vector: dict) -> dict:
    """What the update's cost allows the vector set-up over the single reference env: the single
    env's rollout plus its update, per sample, over the update alone (the ratio with a rollout that
    costs nothing), with the single env's update cost and with the vector set-up's, in wall time
    and in CPU time."""
    out = {}
    for clock in ("", "_cpu"):
        whole = single["rollout" + clock] + single["update" + clock]
        out["with_single_update" + clock] = whole / single["update" + clock]
        out["with_vector_update" + clock] = whole / vector["update" + clock]
    return out


def format_phases(per_sample: dict, ceil: dict) -> str:
    lines = [f"{'us per sample (best round)':<28s} {'rollout':>9s} {'update':>9s} {'learn':>9s}   CPU: "
             f"{'rollout':>9s} {'update':>9s}"]
    for name, p in per_sample.items():
        lines.append(f"{name:<28s} {p['rollout']:>9.1f} {p['update']:>9.1f} {p['learn']:>9.1f}        "
                     f"{p['rollout_cpu']:>9.1f} {p['update_cpu']:>9.1f}")
    lines.append("ceiling of vector / today's single env with a free rollout, (rollout_single + update) / update: "
                 f"{ceil['with_single_update']:.2f}x with the single env's update, {ceil['with_vector_update']:.2f}x "
                 f"with the vector set-up's (CPU time: {ceil['with_single_update_cpu']:.2f}x, "
                 f"{ceil['with_vector_update_cpu']:.2f}x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=20000, help="timesteps per set-up and round (default 20000)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best of them counts (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's threads (default 1, as mooncake-gym train)")
    parser.add_argument("--v1", action="store_true",
                        help="also PrefillRouting-v1: one reference env against the vector env of 16 native envs")
    args = parser.parse_args(argv)
    run(args.timesteps, args.rounds, threads=args.threads, v1=args.v1)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    raise SystemExit(main())
