"""Cost model: presets, FLOP counts, tier and transfer times, and lecture demo 1's conclusions."""

import math

import pytest

from mooncake_gym.model import costmodel
from mooncake_gym.model.costmodel import (
    MODELS,
    NODE_TIER_BANDWIDTH,
    CostModel,
    InstanceSpec,
    ModelConfig,
    get_model,
)

SLOW_TIERS = ("dram", "ssd", "rdma")


def llama():
    return CostModel.preset("llama2-70b", "A800", 8)


def opt():
    return CostModel.preset("opt-13b", "A100", 1)


# --- presets ------------------------------------------------------------------------------------
def test_kv_bytes_per_token_of_the_lecture_presets():
    assert MODELS["llama2-70b"].kv_bytes_per_token == 327_680  # 2 x 80 x 8 x 128 x 2 B
    assert MODELS["opt-13b"].kv_bytes_per_token == 819_200  # 2 x 40 x 40 x 128 x 2 B


def test_lecture_presets_have_the_lecture_table_fields():
    m = MODELS["llama2-70b"]
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_head, m.d_ff, m.vocab, m.tied_embeddings) == (
        80, 8192, 64, 8, 128, 28672, 32000, False)
    m = MODELS["opt-13b"]
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_head, m.d_ff, m.vocab, m.tied_embeddings) == (
        40, 5120, 40, 40, 128, 13653, 50272, True)


@pytest.mark.parametrize("name, billions, rel", [
    ("llama2-70b", 69.0, 0.03),
    ("llama3-70b", 70.6, 0.03),
    ("llama3-8b", 8.03, 0.03),
    ("opt-13b", 12.9, 0.03),
])
def test_parameter_counts_are_plausible(name, billions, rel):
    assert MODELS[name].n_params / 1e9 == pytest.approx(billions, rel=rel)


def test_llama2_70b_recompute_is_about_140_gflop_per_token():
    gflop = MODELS["llama2-70b"].prefill_flops(8192) / 8192 / 1e9
    assert gflop == pytest.approx(140, rel=0.10)


def test_opt_13b_needs_about_a_fifth_of_llama2_70b_compute():
    ratio = MODELS["opt-13b"].prefill_flops(8192) / MODELS["llama2-70b"].prefill_flops(8192)
    assert 0.15 < ratio < 0.25


def test_get_model_is_case_insensitive_and_passes_configs_through():
    assert get_model("LLaMA2-70B") is MODELS["llama2-70b"]
    assert get_model(MODELS["opt-13b"]) is MODELS["opt-13b"]


# --- exact FLOPs on a tiny hand-made model --------------------------------------------------------
TINY = ModelConfig("tiny", n_layers=2, d_model=4, n_heads=2, n_kv_heads=1, d_head=2, d_ff=3, vocab=10,
                   tied_embeddings=False)


def test_tiny_model_parameters_and_kv_bytes_by_hand():
    # q 4*2*2=16, k+v 2*4*1*2=16, o 2*2*4=16, gated mlp 3*4*3=36
    assert TINY.params_per_layer == 84
    assert TINY.n_params == 2 * 84 + 2 * 10 * 4  # untied: embedding + LM head
    tied = ModelConfig("tied", 2, 4, 2, 1, 2, 3, 10, True)
    assert tied.n_params == 2 * 84 + 10 * 4
    assert TINY.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2  # K and V x layers x kv heads x d_head x BF16


def test_tiny_model_prefill_flops_by_hand():
    # per layer: linear 2 FLOP x 84 weights x computed tokens; attention 4 x n_heads x d_head = 16 FLOP
    # per (query, key) pair, token i attending to i + 1 keys.
    # 3 tokens, no cache: linear 2*84*3 = 504, keys 1+2+3 = 6 -> 96; 2 layers -> 1200
    assert TINY.prefill_flops(3) == 1200
    # 3 tokens, 1 cached: linear 2*84*2 = 336, keys 2+3 = 5 -> 80; 2 layers -> 832
    assert TINY.prefill_flops(3, 1) == 832
    # everything cached: nothing to compute
    assert TINY.prefill_flops(3, 3) == 0
    # 1 token: linear 168, 1 key -> 16; 2 layers -> 368
    assert TINY.prefill_flops(1) == 368


def test_prefill_flops_split_adds_up():
    m = MODELS["llama2-70b"]
    assert m.prefill_flops(8704, 4352) + m.prefill_flops(4352) == pytest.approx(m.prefill_flops(8704), rel=1e-12)


def test_compute_time_is_flops_over_effective_throughput():
    cost = CostModel(TINY, InstanceSpec("A100", 2, 0.5))
    assert cost.instance.effective_flops == 2 * 312e12 * 0.5
    assert cost.compute_s(3, 1) == 832 / (2 * 312e12 * 0.5)


# --- tiers, overlap, transfer -------------------------------------------------------------------
def test_one_gpu_gets_an_eighth_of_the_node_bandwidth():
    for tier in costmodel.TIERS:
        assert opt().instance.tier_bandwidth(tier) == NODE_TIER_BANDWIDTH[tier] / 8
        assert llama().instance.tier_bandwidth(tier) == NODE_TIER_BANDWIDTH[tier]


def test_load_time_is_bytes_over_bandwidth_and_free_from_gpu_memory():
    cost = llama()
    assert cost.load_s(1000, "dram") == 1000 * 327_680 / 128e9
    assert cost.load_s(1000, "gpu") == 0.0
    assert cost.load_s(0, "ssd") == 0.0


def test_transfer_is_bytes_over_bandwidth_plus_latency_exactly():
    cost = llama()
    for tokens in (1, 512, 10_000):
        expected = tokens * 327_680 / NODE_TIER_BANDWIDTH["rdma"] + costmodel.DEFAULT_TRANSFER_LATENCY_S
        assert cost.transfer_s(tokens) == expected
    slow = CostModel(MODELS["llama2-70b"], transfer_latency_s=0.25)
    assert slow.transfer_s(512) == 512 * 327_680 / NODE_TIER_BANDWIDTH["rdma"] + 0.25
    assert cost.transfer_s(0) == 0.0


CASES = [(8704, 4352), (8192, 0), (4096, 4095), (100_000, 99_999), (50_000, 25_000), (600, 512), (1, 0)]


@pytest.mark.parametrize("overhead", [0.0, 0.05])
@pytest.mark.parametrize("tier", ["gpu", *SLOW_TIERS])
@pytest.mark.parametrize("setup", [llama, opt])
def test_overlap_bounds_and_no_overlap_is_load_then_compute(setup, tier, overhead):
    cost = setup().with_overhead(overhead)
    for n, h in CASES:
        compute, load = cost.compute_s(n, h), cost.load_s(h, tier)
        overlapped = cost.prefill_s(n, h, tier, overlap=True)
        sequential = cost.prefill_s(n, h, tier, overlap=False)
        assert sequential == pytest.approx(compute + load + overhead, rel=1e-12)
        # overlap can hide the shorter of the two, never the longer one
        assert overlapped >= max(compute, load) + overhead
        # and overlapping is never slower than loading first and computing after
        assert overlapped <= sequential * (1 + 1e-12)


def test_overlap_when_load_dominates_ends_with_one_layer_of_compute():
    # A full hit from SSD: loading 99,999 tokens takes far longer than computing the last one.
    cost = llama()
    n, h = 100_000, 99_999
    compute, load = cost.compute_s(n, h), cost.load_s(h, "ssd")
    assert load > 80 * compute
    assert cost.prefill_s(n, h, "ssd") == pytest.approx(load + compute / 80, rel=1e-12)


def test_no_cache_prefill_is_pure_compute_plus_overhead():
    cost = llama().with_overhead(0.02)
    assert cost.prefill_s(8192, 0) == pytest.approx(cost.compute_s(8192) + 0.02, rel=1e-12)


# --- lecture demo 1's conclusions ----------------------------------------------------------------
def test_demo1_llama2_70b_reads_back_more_than_10x_faster_from_every_tier():
    cost = llama()
    recompute = cost.recompute_s_per_token(8192)
    assert recompute == cost.compute_s(8192) / 8192
    for tier in SLOW_TIERS:
        assert recompute / cost.load_s(1, tier) > 10, tier


def test_demo1_opt_13b_reads_back_only_a_few_times_faster_and_ssd_is_slower():
    cost = opt()
    recompute = cost.recompute_s_per_token(8192)
    for tier in ("dram", "rdma"):
        assert 1 < recompute / cost.load_s(1, tier) < 5, tier
    assert recompute / cost.load_s(1, "ssd") < 1


def test_demo1_overlap_hides_the_load_behind_compute():
    cost = llama()
    compute = cost.compute_s(8704, 4352)
    for tier in SLOW_TIERS:
        overlapped = cost.prefill_s(8704, 4352, tier, overlap=True)
        assert overlapped == pytest.approx(compute, rel=0.03), tier
        # without overlap the load is visible (it is what overlap hides)
        assert cost.prefill_s(8704, 4352, tier, overlap=False) > overlapped
    # and a cached half saves about half of the no-cache time or more
    assert cost.prefill_s(8704, 4352, "ssd") < 0.6 * cost.prefill_s(8704, 0)


def test_lecture_demo1_data_matches_the_cost_model():
    from mooncake_gym.course.lecture import demo1

    data, text = demo1()
    llama_row, opt_row = data["per_token"]
    assert llama_row["kv_bytes_per_token"] == 327_680 and opt_row["kv_bytes_per_token"] == 819_200
    assert all(llama_row[f"{t}_speedup"] > 10 for t in SLOW_TIERS)
    assert opt_row["ssd_speedup"] < 1 < opt_row["rdma_speedup"] < opt_row["dram_speedup"] < 5
    assert data["request"]["compute_uncached_s"] == llama().compute_s(8704, 4352)
    assert "320 KB" in text


# --- invalid input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("make, parameter", [
    (lambda: get_model("gpt-5"), "model"),
    (lambda: CostModel.preset("llama9-1t"), "model"),
    (lambda: InstanceSpec(gpu="V100"), "gpu"),
    (lambda: InstanceSpec(n_gpus=0), "n_gpus"),
    (lambda: InstanceSpec(n_gpus=9), "n_gpus"),
    (lambda: InstanceSpec(mfu=0.0), "mfu"),
    (lambda: InstanceSpec(mfu=1.5), "mfu"),
    (lambda: InstanceSpec(prefill_overhead_s=-1.0), "prefill_overhead_s"),
    (lambda: llama().with_overhead(-0.1), "prefill_overhead_s"),
    (lambda: llama().load_s(100, "tape"), "tier"),
    (lambda: llama().load_s(0, "tape"), "tier"),
    (lambda: llama().prefill_s(8192, 0, tier="tape"), "tier"),
    (lambda: llama().instance.tier_bandwidth("nvlink"), "tier"),
    (lambda: llama().compute_s(100, 200), "cached_tokens"),
    (lambda: llama().compute_s(100, -1), "cached_tokens"),
    (lambda: llama().compute_s(-5), "n_tokens"),
])
def test_invalid_presets_and_parameters_name_the_parameter(make, parameter):
    with pytest.raises(ValueError, match=rf"^{parameter}:"):
        make()


def test_assumed_constants_are_the_documented_ones():
    assert costmodel.GPU_PEAK_BF16_FLOPS["A800"] == costmodel.GPU_PEAK_BF16_FLOPS["A100"] == 312e12
    assert costmodel.GPU_PEAK_BF16_FLOPS["H800"] == costmodel.GPU_PEAK_BF16_FLOPS["H100"] == 989e12
    assert costmodel.DEFAULT_MFU == 0.6
    assert NODE_TIER_BANDWIDTH["dram"] == 128e9
    assert NODE_TIER_BANDWIDTH["rdma"] == 800e9 / 8
    assert math.isclose(MODELS["llama2-70b"].kv_bytes_per_token / 1024, 320)


# --- PrefillTime: the one implementation of prefill time -------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 400_000), share=st.floats(0, 1), tier=st.sampled_from(costmodel.TIERS),
       overlap=st.booleans(), model=st.sampled_from(sorted(costmodel.MODELS)), overhead=st.sampled_from([0.0, 0.02]))
def test_prefill_s_is_compute_and_load_combined_to_the_last_bit(n, share, tier, overlap, model, overhead):
    cost = costmodel.CostModel.preset(model, prefill_overhead_s=overhead)
    h = int(n * share)
    compute, load = cost.compute_s(n, h), cost.load_s(h, tier)
    busy = max(compute, load) + min(compute, load) / cost.model.n_layers if overlap else compute + load
    assert cost.prefill_s(n, h, tier, overlap) == busy + overhead
    assert cost.prefill_time(tier, overlap)(n, h) == busy + overhead


def test_prefill_time_is_cached_per_setting_and_survives_pickling():
    import pickle

    cost = costmodel.CostModel()
    assert cost.prefill_time() is cost.prefill_time("dram", True)
    assert cost.prefill_time("ssd") is not cost.prefill_time()
    copy = pickle.loads(pickle.dumps(cost))
    assert copy == cost and copy.prefill_s(9000, 1024) == cost.prefill_s(9000, 1024)
    with pytest.raises(ValueError, match="tier"):
        cost.prefill_time("tape")
    with pytest.raises(ValueError, match="cached_tokens"):
        cost.prefill_s(100, 101)
