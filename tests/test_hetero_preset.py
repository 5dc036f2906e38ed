"""The mooncake-hetero preset: a prefill pool of two GPU generations (ClusterPreset.prefill_gpus),
each instance the realistic cost model with its GPU's constants."""

from dataclasses import replace

import pytest

from mooncake_gym.sim.cluster import saturation, simulate
from mooncake_gym.model.presets import PRESETS, get_preset
from mooncake_gym.model.workload import Trace, synthetic_trace

HETERO = get_preset("mooncake-hetero")


def on_gpu(gpu: str):
    cost = HETERO.prefill_cost
    return replace(cost, instance=replace(cost.instance, gpu=gpu))


def test_each_prefill_instance_computes_at_its_own_gpus_speed():
    assert HETERO.prefill_gpus == ("H800",) * 4 + ("A800",) * 4
    config = HETERO.routing_config()
    assert [c.instance.gpu for c in config.instance_costs(HETERO.prefill_cost)] == list(HETERO.prefill_gpus)
    h800, a800 = on_gpu("H800").prefill_s(4000, 0), on_gpu("A800").prefill_s(4000, 0)
    # 0.23 vs 0.49 s: 3.2x the FLOPs (989 vs 312 TFLOPS per GPU) and 1.6x the all-reduce bus
    # bandwidth (215 GB/s measured on 8x H800 against A800's 137), but the overheads stay
    assert a800 == HETERO.prefill_cost.prefill_s(4000, 0) and 0.4 * a800 < h800 < 0.55 * a800
    # two requests at once on an idle cluster: Algorithm 1 puts each on an H800 node (the fastest
    # TTFT), and each TTFT is that node's prefill time
    res = simulate(Trace([0.0, 0.0], [4000, 4000], [5, 5], [tuple(range(8)), tuple(range(8, 16))]), HETERO)
    assert all(res.prefill_instance < 4)
    assert res.ttft_s.tolist() == pytest.approx([h800, h800], rel=1e-12)


def test_the_faster_generation_raises_the_prefill_pools_saturation():
    base = synthetic_trace(0, rate=4.0)
    mixed, a800 = saturation(base, HETERO), saturation(base, "mooncake")
    assert mixed.bottleneck == a800.bottleneck == "prefill"
    assert 1.2 * a800.prefill_per_s < mixed.prefill_per_s < 3.2 * a800.prefill_per_s  # 18.5 vs 12.2 requests/s
    assert mixed.decode_per_s == a800.decode_per_s  # the same decode pool


def test_the_other_presets_have_one_kind_of_prefill_instance():
    for name, p in PRESETS.items():
        if name != "mooncake-hetero":
            assert p.prefill_gpus is None and p.routing_config().instances is None, name


@pytest.mark.parametrize("gpus, message", [
    ("4xH800+3xA800", r"prefill_gpus: expected one GPU per prefill instance \(8\), got 7"),
    ("8xB200", "prefill_gpus: instances\\[0\\]: gpu: unknown 'B200'"),
    (3, "prefill_gpus: instances: expected a string like"),
])
def test_bad_prefill_gpus_are_named(gpus, message):
    with pytest.raises(ValueError, match=message):
        get_preset("mooncake").with_(prefill_gpus=gpus)
