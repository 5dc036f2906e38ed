"""The engine benchmark (benchmarks/bench_engine.py) runs and reports both engines' rates and their
ratio for each preset; no speed is asserted."""

import importlib.util
from pathlib import Path

import pytest

from mooncake_gym import _engine
from mooncake_gym.model.workload import synthetic_trace

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_engine.py"


@pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")
def test_bench_engine_reports_both_engines_per_preset(capsys):
    spec = importlib.util.spec_from_file_location("bench_engine_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.run(seconds=0.01, rounds=1, trace=synthetic_trace(0, 8.0).head(50))
    assert out["requests"] == 50 and set(out["presets"]) == {"lecture", "mooncake"}
    for figures in out["presets"].values():
        assert figures["ratio"] == figures["native_per_s"] / figures["python_per_s"]
        assert figures["loop_ratio"] == figures["loop_per_s"] / figures["python_per_s"]
    assert out["target_met"] == (min(f["ratio"] for f in out["presets"].values()) >= 25.0)
    printed = capsys.readouterr().out
    assert "lecture" in printed and "mooncake" in printed and "target (native >= 25x" in printed


@pytest.mark.skipif(not _engine.available(), reason="the native engine is not built (no C++ compiler)")
def test_bench_engine_cluster_reports_the_native_presets_and_why_the_others_are_not(capsys):
    from mooncake_gym.model.presets import PRESETS
    spec = importlib.util.spec_from_file_location("bench_engine_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trace = synthetic_trace(0, 8.0).head(50)
    out = module.run(seconds=0.01, rounds=1, trace=trace)["cluster"]
    lecture, mooncake = out["presets"]["lecture"], out["presets"]["mooncake"]
    for figures in (lecture, mooncake):  # both native: mooncake as shipped (batching, shared NICs)
        assert figures["ratio"] == figures["native_per_s"] / figures["python_per_s"]
    assert out["target_met"] == (min(lecture["ratio"], mooncake["ratio"]) >= 25.0)
    printed = capsys.readouterr().out
    assert "cluster target (native >= 25x" in printed
    tiered = PRESETS["mooncake"].with_(name="tiered", ssd_cache_blocks=1000)
    out = module.run_cluster(trace, 0.01, 1, presets=("lecture", tiered))
    assert "no SSD tier" in out["presets"]["tiered"]["not_native"]
    assert out["target_met"] is False  # a preset not native cannot meet it
    assert "not native" in capsys.readouterr().out
