"""The env benchmark's floor (``benchmarks/bench_envs.py``): "its cluster simulator alone" steps the
same episodes as the environment, with the same decisions, and nothing else; the PPO benchmark's
phases and ceiling (``benchmarks/bench_training.py``). No timing is asserted."""

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import mooncake_gym  # noqa: F401  (registers the ids)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """The script ``benchmarks/NAME.py`` as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_envs():
    return load_benchmark("bench_envs")


@pytest.mark.parametrize("env_id", ["mooncake_gym/PrefillRouting-v1", "mooncake_gym/Conductor-v1"])
def test_simulator_alone_makes_the_envs_decisions(bench_envs, env_id):
    kwargs = {"episode_requests": 60}
    env = gym.make(env_id, **kwargs).unwrapped
    alone = bench_envs._SimulatorAlone(gym.make(env_id, **kwargs).unwrapped)
    env.action_space.seed(5)
    actions = [env.action_space.sample() for _ in range(60)]
    env.reset(seed=11)
    alone.reset(seed=11)
    for a, converted in zip(actions, alone.convert(actions)):
        _, _, terminated, _, info = env.step(a)
        _, _, done, _, _ = alone.step(converted)
        assert done == terminated
        if terminated:
            break
    assert terminated
    metrics = alone.env.sim.result("env").metrics
    assert metrics["completed"] > 0
    np.testing.assert_equal(metrics, info["metrics"])  # NaN == NaN here (an undefined correlation)


def test_run_reports_the_floor_of_each_v1_env_only(bench_envs):
    cases = [("mooncake_gym/PrefillRouting-v0", {}), ("mooncake_gym/OverloadAdmission-v1", {"episode_requests": 40})]
    result = bench_envs.run(seconds=0.05, rounds=1, env_cases=cases, verbose=False)
    assert "simulator_alone" not in result["envs"]["mooncake_gym/PrefillRouting-v0"]
    floor = result["envs"]["mooncake_gym/OverloadAdmission-v1"]["simulator_alone"]
    assert floor["steps"] > 0 and floor["episodes"] > 0
    assert floor["ratio"] == floor["steps_per_s"] / result["reference"]["steps_per_s"]
    assert "its cluster simulator alone" in bench_envs.format_report(result)


def test_parts_times_each_part_of_a_v1_step(bench_envs):
    p = bench_envs.parts("mooncake_gym/Conductor-v1", {"episode_requests": 40}, seconds=0.05, warmup_steps=10)
    assert list(p) == ["observation", "decode loads", "default router", "prefill features", "clip and pack",
                       "final metrics per step"]
    assert all(v > 0 for v in p.values())
    assert "    decode loads" in bench_envs.format_parts("mooncake_gym/Conductor-v1", p)
    with pytest.raises(ValueError, match="env_id: expected a v1 environment"):
        bench_envs.parts("mooncake_gym/PrefillRouting-v0")


def test_bench_json_prints_one_json_document(capsys):
    from mooncake_gym.cli import main

    assert main(["bench", "--only", "bench_cache", "--seconds", "0.1", "--json"]) == 0
    out = capsys.readouterr()
    assert list(json.loads(out.out)) == ["bench_cache"] and "bench_cache" in out.err


# --- the PPO benchmark's phases and the ceiling its update cost sets (benchmarks/bench_training.py) ---
@pytest.fixture(scope="module")
def bench_training():
    return load_benchmark("bench_training")


def test_training_ceiling_is_the_single_envs_whole_cost_over_the_update(bench_training):
    # us per sample: the single env 300 + 100 (wall), 150 + 50 (CPU); the vector set-up's update 80 / 40
    single = {"rollout": 300.0, "update": 100.0, "rollout_cpu": 150.0, "update_cpu": 50.0}
    vector = {"rollout": 20.0, "update": 80.0, "rollout_cpu": 10.0, "update_cpu": 40.0}
    assert bench_training.ceiling(single, vector) == {"with_single_update": 4.0, "with_vector_update": 5.0,
                                                      "with_single_update_cpu": 4.0, "with_vector_update_cpu": 5.0}
    text = bench_training.format_phases({"today, 1 env": {**single, "learn": 410.0}}, bench_training.ceiling(single, vector))
    assert "4.00x with the single env's update, 5.00x with the vector set-up's (CPU time: 4.00x, 5.00x)" in text


def test_training_phases_clock_the_rollouts_and_the_updates_apart(bench_training):
    class Model:  # an algorithm's two phases: each busy for a while, returning what SB3's do
        def collect_rollouts(self, *args):
            return sum(i * i for i in range(200_000)) > 0

        def train(self):
            sum(i * i for i in range(100_000))

    model = Model()
    spent = bench_training._clock_phases(model)
    assert model.collect_rollouts(1, 2) is True
    assert spent["rollout"] > 0 and spent["rollout_cpu"] > 0 and spent["update"] == spent["update_cpu"] == 0.0
    model.train()
    assert spent["update"] > 0 and spent["update_cpu"] > 0
