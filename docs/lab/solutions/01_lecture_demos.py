"""Solutions to the checked exercises of ``01_lecture_demos.py`` (run: ``python 01_lecture_demos.py``)."""

from mooncake_gym.course import lab
from mooncake_gym.model.costmodel import CostModel, get_model
from mooncake_gym.course.lecture import DEMO1_SETUPS
from mooncake_gym.baselines import run_baselines
from mooncake_gym.sim.cluster import overload_workload
from mooncake_gym.model.workload import synthetic_trace

# K and V (2) x layers x KV heads x head dimension x 2 bytes (BF16): GQA keeps 8 KV heads of 64
m = get_model("llama2-70b")
kv_bytes = 2 * m.n_layers * m.n_kv_heads * m.d_head * 2

# recompute one token (an 8,192-token prompt's prefill compute / 8,192) against reading its KV from DRAM
cost = CostModel.preset("llama2-70b", "A800", 8)
dram_speedup = cost.recompute_s_per_token(8192) / cost.load_s(1, "dram")

# the model whose SSD read is slower than recomputing: OPT-13B is MHA (40 KV heads), 2.5x the KV per token
# of LLaMA2-70B at a fifth of the compute
ssd_loser = next(model for model, gpu, n in DEMO1_SETUPS
                 if CostModel.preset(model, gpu, n).recompute_s_per_token(8192)
                 < CostModel.preset(model, gpu, n).load_s(1, "ssd"))

hit_share = run_baselines("routing", synthetic_trace(0, 8.0))["cache"].metrics["hit_ratio"]

results = run_baselines("admission", overload_workload()[0])
waste_cut = 1 - results["early"].metrics["wasted_prefill_s"] / results["baseline"].metrics["wasted_prefill_s"]

passed = [lab.check("kv-bytes-per-token", kv_bytes), lab.check("dram-speedup", dram_speedup),
          lab.check("ssd-loses", ssd_loser), lab.check("cache-hit-share", hit_share),
          lab.check("early-waste-cut", waste_cut)]
raise SystemExit(0 if all(passed) else 1)
