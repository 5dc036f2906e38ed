"""Preset files (``--preset-file FILE.toml``, ``mooncake_gym.model.presets.load_preset_file``): the worked H200
example builds what the cost model builds from the same figures, and every malformed key is a
one-line error naming the file and the key's dotted path."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_gym.model import costmodel
from mooncake_gym.model.presets import PresetFileError, load_preset_file
from mooncake_gym.model.presets import PRESETS, get_preset

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "h200-preset.toml"
TABLES = (costmodel.GPU_PEAK_BF16_FLOPS, costmodel.GPU_HBM_BYTES, costmodel.GPU_HBM_BANDWIDTH,
          costmodel.INTERCONNECT, costmodel.MODELS, PRESETS)


@pytest.fixture(autouse=True)
def restore_tables(preset_tables):
    """Every test here leaves the tables as it found them (conftest's ``preset_tables``)."""
    assert preset_tables == TABLES


GPU = """
[gpus.X1]
peak_bf16_flops = 100e12
hbm_bytes = 64_000_000_000
hbm_bandwidth = 1e12
[gpus.X1.allreduce]
busbw = { 2 = 100e9, 8 = 50e9 }
latency_s = { 2 = 1e-5, 8 = 2e-5 }
"""
MODEL = """
[models.tiny]
n_layers = 2
d_model = 1024
n_heads = 8
n_kv_heads = 2
d_head = 128
d_ff = 4096
vocab = 1000
"""
PRESET = """
[preset]
name = "x1-tiny"
n_decode = 2
[preset.cost]
model = "tiny"
gpu = "X1"
n_gpus = 8
"""


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_the_h200_example_is_the_cost_model_of_its_figures():
    p = load_preset_file(EXAMPLE)
    assert p.name == "h200" and PRESETS["h200"] is p
    assert costmodel.GPU_PEAK_BF16_FLOPS["H200"] == 989e12
    assert costmodel.GPU_HBM_BYTES["H200"] == 141_000_000_000
    assert costmodel.GPU_HBM_BANDWIDTH["H200"] == 4.8e12
    assert costmodel.INTERCONNECT["H200"] == costmodel.INTERCONNECT["H100"]
    # the file restates the built-in LLaMA3-70B, and the cost model is CostModel.realistic's
    assert costmodel.MODELS["llama3-70b"].vocab == 128256
    assert p.prefill_cost == p.decode_cost == costmodel.CostModel.realistic("llama3-70b", "H200")
    # everything else is the base preset's (mooncake)
    assert p.with_(name="mooncake", description=PRESETS["mooncake"].description,
                   prefill_cost=PRESETS["mooncake"].prefill_cost,
                   decode_cost=PRESETS["mooncake"].decode_cost) == PRESETS["mooncake"]
    # KV tokens of a decode node: 8 x 141 GB x 0.9 less 70,552,387,584 BF16 weights, over 327,680 B a token
    weights = 2 * (80 * (2 * 8192 * 8192 + 2 * 8192 * 8 * 128 + 3 * 8192 * 28672) + 2 * 128256 * 8192)
    assert p.decode_capacity_per_instance == (8 * 141_000_000_000 * 0.9 - weights) // 327_680 == 2_667_526
    # a second load of the same file is the same preset
    assert load_preset_file(EXAMPLE) is p
    assert get_preset(str(EXAMPLE)) is p


def test_a_file_of_new_figures_extends_the_tables_and_a_base_preset(tmp_path):
    p = load_preset_file(write(tmp_path, GPU + MODEL + PRESET))
    assert p.n_prefill == 8 and p.n_decode == 2 and p.ttft_slo_s == 30.0  # mooncake's, but n_decode
    assert p.prefill_cost.instance.gpu == "X1" and p.prefill_cost.model.name == "tiny"
    assert costmodel.allreduce_figures("X1", 4) == (2e-5, 50e9)  # TP 4 takes the next listed degree, 8
    assert p.prefill_cost.instance.effective_flops == 8 * 100e12 * costmodel.REALISTIC_MFU
    # an instance of the new GPU prefills as the cost model says: the file adds data, not a formula
    assert p.prefill_cost.prefill_s(1000) == costmodel.CostModel.realistic("tiny", "X1").prefill_s(1000)


def test_engine_and_per_pool_tables(tmp_path):
    text = PRESET.replace('[preset.cost]', 'base = "lecture"\n[preset.cost]') + """
engine = "slow"
[preset.decode_cost]
n_gpus = 4
iteration_overhead_s = 0.01
"""
    p = load_preset_file(write(tmp_path, GPU + MODEL + text))
    assert p.decode_model == "reserve" and p.decode_capacity_tokens == 60_000  # lecture's
    assert p.prefill_cost.instance.iteration_overhead_s == costmodel.ENGINE_OVERHEAD_S["slow"]
    assert p.prefill_cost.instance.attention_efficiency == costmodel.ENGINE_ATTENTION_EFFICIENCY["slow"]
    assert p.decode_cost.instance.n_gpus == 4 and p.decode_cost.instance.iteration_overhead_s == 0.01
    assert p.prefill_cost.instance.realistic is False  # lecture's toy instance, its GPU and model replaced


@pytest.mark.parametrize("text, key, expected", [
    (PRESET.replace("n_decode", "n_decod"), "preset.n_decod", "unknown key; expected one of name, description"),
    (PRESET.replace("n_decode = 2", 'n_decode = "2"'), "preset.n_decode", "expected an integer, got a string ('2')"),
    (PRESET.replace("n_decode = 2", "n_decode = 2.0"), "preset.n_decode", "expected an integer, got a number (2.0)"),
    (PRESET.replace("n_decode = 2", "n_decode = 0"), "preset.n_decode", "expected an integer in [1, 1024], got 0"),
    (PRESET.replace("n_decode = 2", "ttft_slo_s = inf"), "preset.ttft_slo_s", "expected a finite number, got inf"),
    (PRESET.replace("n_decode = 2", "ttft_slo_s = nan"), "preset.ttft_slo_s", "expected a finite number, got nan"),
    (PRESET.replace("n_decode = 2", "shared_nics = 1"), "preset.shared_nics", "expected true or false"),
    (PRESET.replace("n_decode = 2", 'preemption = "drop"'), "preset.preemption", "expected one of ['abort'"),
    (PRESET.replace("n_gpus = 8", "n_gpus = 16"), "preset.cost.n_gpus", "expected an integer in [1, 8], got 16"),
    (PRESET.replace('gpu = "X1"', 'gpu = "Z9"'), "preset.cost.gpu", "unknown 'Z9'; expected one of"),
    (PRESET.replace('model = "tiny"', 'model = "huge"'), "preset.cost.model", "unknown 'huge'"),
    (PRESET.replace('name = "x1-tiny"', 'name = "mooncake"'), "preset.name", "'mooncake' is a built-in preset"),
    (PRESET.replace('name = "x1-tiny"', 'base = "x1"\nname = "x"'), "preset.base", "expected a built-in preset"),
    (PRESET.replace('name = "x1-tiny"\n', ""), "preset.name", "missing; it must be given"),
    (GPU.replace("hbm_bandwidth = 1e12", "hbm_bandwidth = 1e20"), "gpus.X1.hbm_bandwidth",
     "expected a finite number in [1000000.0, 1000000000000000.0], got 1e+20"),
    (GPU.replace("hbm_bytes = 64_000_000_000\n", ""), "gpus.X1.hbm_bytes", "missing; it must be given"),
    (GPU.replace("8 = 50e9", "9 = 50e9"), "gpus.X1.allreduce.busbw.9", "expected a TP degree in 1..8"),
    (GPU.replace("8 = 2e-5", "4 = 2e-5"), "gpus.X1.allreduce", "expected busbw and latency_s for the same TP"),
    (GPU.replace("[gpus.X1]", "[gpus.x1]").replace("gpus.X1.", "gpus.x1."), "gpus.x1", "upper-case letters"),
    (GPU.replace("X1", "H100"), "gpus.H100", "H100 is known with other figures; give yours another name"),
    (MODEL.replace("n_kv_heads = 2", "n_kv_heads = 3"), "models.tiny.n_kv_heads", "expected a divisor of n_heads"),
    (MODEL.replace("[models.tiny]", "[models.llama3-70b]"), "models.llama3-70b", "known with other figures"),
    ("[presets]\n", "presets", "unknown key; expected one of gpus, models, preset"),
])
def test_every_malformed_key_is_one_line_naming_the_file_and_the_key(tmp_path, text, key, expected):
    full = {"gpus": GPU, "models": MODEL}
    body = "".join(part for name, part in full.items() if f"[{name}." not in text) + text
    if "[preset]" not in body and not text.startswith("[presets]"):
        body += PRESET
    path = write(tmp_path, body)
    with pytest.raises(PresetFileError) as e:
        load_preset_file(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: "), message
    assert expected in message, message


def test_a_failing_file_adds_nothing(tmp_path):
    before = [dict(t) for t in TABLES]
    with pytest.raises(PresetFileError, match="preset.cost.model"):
        load_preset_file(write(tmp_path, GPU + MODEL + PRESET.replace('model = "tiny"', 'model = "huge"')))
    assert [dict(t) for t in TABLES] == before  # X1 and tiny were added, then taken back


def test_weights_that_do_not_fit_and_files_that_are_not_toml(tmp_path):
    small = GPU.replace("hbm_bytes = 64_000_000_000", "hbm_bytes = 1_048_576")
    with pytest.raises(PresetFileError, match=r"p.toml: preset: instance: tiny .* does not fit"):
        load_preset_file(write(tmp_path, small + MODEL + PRESET))
    with pytest.raises(PresetFileError, match=r"p.toml: not valid TOML"):
        load_preset_file(write(tmp_path, "[preset\n"))
    with pytest.raises(FileNotFoundError, match="preset file: no such file"):
        load_preset_file(tmp_path / "missing.toml")


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "mooncake_gym.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_every_command_with_a_preset_takes_a_preset_file():
    from mooncake_gym.cli.app import COMMANDS

    with_preset = [c.name for c in COMMANDS if any(o.dest == "preset" for o in c.options)]
    assert set(with_preset) >= {"replay", "overload", "compare", "sweep"}
    for c in COMMANDS:
        assert any(o.dest == "preset_file" for o in c.all_options) == (c.name in with_preset)


def test_the_command_line_runs_a_preset_file_and_refuses_it_with_preset(tmp_path):
    from mooncake_gym.cli import main

    assert main(["replay", "--preset-file", str(EXAMPLE), "--policy", "kvcentric", "--json"]) == 0
    done = run_cli("replay", "--preset-file", str(EXAMPLE), "--preset", "h100")
    assert done.returncode == 2
    assert done.stderr.strip() == ("mooncake-gym replay: error: --preset-file: give --preset or --preset-file, "
                                   "not both (the file's base = NAME starts from a built-in preset)")
    bad = write(tmp_path, PRESET.replace("n_decode = 2", "n_decode = -1"))
    done = run_cli("overload", "--preset-file", str(bad))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr == (f"mooncake-gym overload: error: --preset-file: {bad}: preset.n_decode: expected an integer "
                           "in [1, 1024], got -1\n")


def test_an_environment_takes_a_preset_file():
    import gymnasium as gym

    import mooncake_gym  # noqa: F401

    env = gym.make("mooncake_gym/Conductor-v1", preset=str(EXAMPLE), episode_requests=20)
    assert env.unwrapped.preset.name == "h200"
    obs, _ = env.reset(seed=0)
    assert math.isfinite(float(obs.sum()))
    env.close()
