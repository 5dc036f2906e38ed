"""The cost model by component (issue 24, items 1-3): iteration_breakdown, NCCL all-reduces from the
interconnect table, the decode step as its sum, and the decode instances' cap on running requests."""

import math

import pytest

from mooncake_gym.model import costmodel
from mooncake_gym.model.costmodel import CostModel, InstanceSpec, ModelConfig, PrefillTime
from mooncake_gym.model.presets import PRESETS
from mooncake_gym.sim.decode import BatchingDecodeInstance, fastest_accepting

KEYS = ["linear", "attention", "elementwise", "all_reduce", "overhead"]
# a tiny model: 2 layers, d_model 8, 2 heads of 4 (1 KV head), d_ff 16, gated MLP
TINY = ModelConfig("tiny", 2, 8, 2, 1, 4, 16, 10, True)


def tiny(n_gpus=2, **kw):
    spec = dict(gpu="A100", n_gpus=n_gpus, mfu=0.5, realistic=True, chunk_tokens=4, iteration_overhead_s=1e-3,
                memory_efficiency=0.5, attention_efficiency=0.5, kv_read_efficiency=0.25, prefill_overhead_s=0.0)
    spec.update(kw)
    return CostModel(TINY, InstanceSpec(**spec))


def test_tiny_breakdown_by_hand():
    c = tiny()
    # weights per layer: q 8*2*4 + kv 2*8*1*4 + o 2*4*8 + mlp 3*8*16 = 64 + 64 + 64 + 384 = 576; 2 layers +
    # tied embeddings 10*8 = 1232 params = 2464 bytes over 2 GPUs x 2.039e12 x 0.5
    weights_s = 2464 / (2 * 2.039e12 * 0.5)
    flops = 2 * 312e12 * 0.5
    new, ctx = 3, 5
    linear = 2 * (2 * 576) * new / flops
    # attention: 4 n_heads d_head = 32 FLOPs per query-key pair per layer; pairs 3*5 + 3*4/2 = 21
    attention = 2 * 32 * 21 / (flops * 0.5)
    kv = 2 * 2 * 1 * 4 * 2 * (ctx + new) / (2 * 2.039e12 * 0.25)  # K and V of 8 keys, all layers
    # element-wise bytes per token per layer per GPU: 2 * (10*8 + 2*(2+1)*4//2 + 3*16//2) = 2 * 116
    elementwise = 2 * 2 * 116 * new / (2.039e12 * 0.5)
    latency, busbw = costmodel.INTERCONNECT["A100"]["latency_s"][2], costmodel.INTERCONNECT["A100"]["busbw"][2]
    all_reduce = 2 * 2 * (latency + 2 * (2 - 1) / 2 * new * 8 * 2 / busbw)
    got = c.iteration_breakdown(new, ctx)
    assert list(got) == KEYS
    want = {"linear": max(linear, weights_s), "attention": max(attention, kv), "elementwise": elementwise,
            "all_reduce": all_reduce, "overhead": 1e-3}
    for k in KEYS:
        assert got[k] == pytest.approx(want[k], rel=1e-12), k


def test_one_gpu_has_no_all_reduce():
    assert tiny(1).iteration_breakdown(4)["all_reduce"] == 0.0


@pytest.mark.parametrize("n,h", [(1, 0), (4, 0), (5, 0), (13, 3), (12, 4), (100, 37)])
def test_prefill_is_the_sum_of_its_chunks_breakdowns(n, h):
    c = tiny(prefill_overhead_s=0.01)
    total, p = 0.01, h
    while p < n:
        e = min(p + 4, n)
        total += sum(c.iteration_breakdown(e - p, p).values())
        p = e
    assert PrefillTime(c, "gpu")(n, h) == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("preset", ["mooncake", "h100", "mooncake-hetero"])
def test_realistic_prefill_of_a_long_prompt_is_the_sum_of_breakdowns(preset):
    c = PRESETS[preset].prefill_cost
    n, total, p = 20_000, c.instance.prefill_overhead_s, 0
    while p < n:
        e = min(p + c.instance.chunk_tokens, n)
        total += sum(c.iteration_breakdown(e - p, p).values())
        p = e
    assert c.prefill_s(n, 0, "gpu") == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("batch,context", [(1, 0), (1, 1000), (7, 7 * 3000), (64, 64 * 20_000)])
def test_decode_step_is_the_sum_of_its_breakdown(batch, context):
    for c in (tiny(), PRESETS["mooncake"].decode_cost, PRESETS["h100"].decode_cost):
        parts = c.iteration_breakdown(batch, context / batch, batch)
        assert c.decode_step_s(batch, context) == pytest.approx(sum(parts.values()), rel=1e-12)


def test_long_context_decode_attention_is_kv_bound_for_gqa_and_grows_linearly():
    c = PRESETS["mooncake"].decode_cost
    a = c.iteration_breakdown(8, 10_000, 8)["attention"]
    b = c.iteration_breakdown(8, 20_000, 8)["attention"]
    kv = c.component_coefficients["kv_token_s"]
    assert a == pytest.approx(kv * 8 * 10_001) and b == pytest.approx(kv * 8 * 20_001)


def test_module_function_uses_preset_names_and_the_engine():
    fast = costmodel.iteration_breakdown("llama2-70b", "A100", 8, 16, 1000, batch=16)
    slow = costmodel.iteration_breakdown("llama2-70b", "A100", 8, 16, 1000, batch=16, engine="slow")
    assert list(fast) == KEYS
    assert fast["overhead"] == costmodel.ENGINE_OVERHEAD_S["fast"]
    assert slow["overhead"] == costmodel.ENGINE_OVERHEAD_S["slow"]
    assert {k: v for k, v in fast.items() if k != "overhead"} == {k: v for k, v in slow.items() if k != "overhead"}
    with pytest.raises(ValueError, match="engine"):
        costmodel.iteration_breakdown("llama2-70b", "A100", 8, 1, engine="turbo")


@pytest.mark.parametrize("args,part", [((0,), "new_tokens"), ((3, 0, 2), "new_tokens"), ((4, -1), "context_tokens"),
                                       ((4, 0, 0), "batch")])
def test_bad_iteration_arguments_name_the_parameter(args, part):
    with pytest.raises(ValueError, match=part):
        tiny().iteration_breakdown(*args)


def test_allreduce_is_latency_plus_bytes_over_busbw():
    assert costmodel.allreduce_s("A100", 1, 1e9) == 0.0
    assert costmodel.allreduce_s("A100", 8, 2**30) == 18e-6 + 1.75 * 2**30 / 205e9
    assert costmodel.allreduce_s("H800", 4, 0) == 14e-6
    assert costmodel.allreduce_figures("H100", 3) == costmodel.allreduce_figures("H100", 4)  # nearest above
    with pytest.raises(ValueError, match="gpu"):
        costmodel.allreduce_s("V100", 8, 1)


def test_two_all_reduces_per_layer():
    c = CostModel.realistic("llama2-70b", "A800", 8)
    fixed, per_token = c.allreduce_coefficients
    assert fixed == 2 * 80 * 18e-6
    assert per_token == pytest.approx(2 * 80 * 8192 * 2 * 1.75 / 137e9, rel=1e-12)


def test_bloom_has_a_two_matrix_mlp_and_176b_parameters():
    bloom = costmodel.MODELS["bloom-176b"]
    assert bloom.params_per_layer == 4 * 14336**2 + 2 * 14336 * 57344
    assert 175e9 < bloom.n_params < 177e9


# --- the decode instances' cap on running requests ------------------------------------------------------------
def test_decode_instance_refuses_beyond_max_running_counting_requests_on_their_way():
    inst = BatchingDecodeInstance(0, PRESETS["mooncake"].decode_cost, 10**6, 1.0, max_running=2)
    assert inst.accepts(100, 0.0)
    inst.reserve(100)  # accepted, KV on its way
    assert inst.accepts(100, 0.0)
    inst.join(0, 0.0, 100, 50, 0.0, reserved=100)
    assert (inst.batch, inst.pending_requests) == (1, 0)
    inst.join(1, 0.0, 100, 50, 0.0)
    assert inst.batch == 2 and not inst.accepts(1, 0.0)
    other = BatchingDecodeInstance(1, PRESETS["mooncake"].decode_cost, 10**6, 1.0, max_running=2)
    assert fastest_accepting([inst, other], 100, 0.0) == 1


def test_realistic_presets_cap_decode_at_vllms_default_and_the_lecture_does_not():
    assert PRESETS["lecture"].max_running is None
    for name in ("mooncake", "mooncake-overload", "mooncake-hetero", "h100"):
        assert PRESETS[name].max_running == 256
    with pytest.raises(ValueError, match="max_running"):
        PRESETS["mooncake"].with_(max_running=0)


def test_lecture_cost_model_constants_are_unchanged():
    c = PRESETS["lecture"].prefill_cost
    assert (c.instance.mfu, c.instance.realistic, c.instance.prefill_overhead_s) == (0.6, False, 0.0)
    assert c.prefill_s(8192, 0) == pytest.approx(costmodel.MODELS["llama2-70b"].prefill_flops(8192) / (8 * 312e12 * 0.6),
                                                 rel=1e-15)
    assert math.isfinite(c.decode_step_s(1, 1000))
