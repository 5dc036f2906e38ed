# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 1: the lecture's three demos
#
# Mooncake (arXiv 2407.00079) serves an LLM with separate *prefill* and *decode* pools and keeps
# the KV cache of earlier prompts in a disaggregated store. The lecture made three points with three
# small simulations; here you rerun them, look inside, and check what you read off with
# `lab.check(...)`. A check prints PASS or FAIL with a hint; it never prints the answer.
#
# Run this file top to bottom with `python 01_lecture_demos.py`, or open it in Jupyter (jupytext
# opens `.py` percent scripts as notebooks; see `README.md` beside it).

# %%
from mooncake_gym.course import lab
from mooncake_gym.model.costmodel import CostModel, get_model
from mooncake_gym.course.lecture import demo1, demo2, demo3

# %% [markdown]
# ## Demo 1: trade storage for compute
#
# For each token of a cached prefix, the prefill instance can either read its KV back (from CPU
# DRAM, a local SSD or another machine over RDMA) or recompute it. The table compares both.

# %%
data, text = demo1()
print(text)

# %% [markdown]
# **Exercise `kv-bytes-per-token`.** How many bytes of KV cache does one token of LLaMA2-70B take
# in BF16? Compute it from the preset's fields (not from the table above), then check it.

# %%
model = get_model("llama2-70b")
print(model)
kv_bytes = None  # your answer: an expression over model's fields
if kv_bytes is not None:
    lab.check("kv-bytes-per-token", kv_bytes)

# %% [markdown]
# **Exercise `dram-speedup`.** How many times faster is reading one token's KV from DRAM than
# recomputing it, for LLaMA2-70B on 8 A800? Use the cost model's methods, not the table.
#
# **Exercise `ssd-loses`.** For which of demo 1's two models (`"llama2-70b"`, `"opt-13b"`) is
# reading KV from the SSD *slower* than recomputing it? Why does the attention design (GQA versus
# MHA) decide this?

# %%
cost = CostModel.preset("llama2-70b", "A800", 8)
dram_speedup = None  # your answer, from cost's methods
if dram_speedup is not None:
    lab.check("dram-speedup", dram_speedup)
ssd_loser = None  # "llama2-70b" or "opt-13b"
if ssd_loser is not None:
    lab.check("ssd-loses", ssd_loser)

# %% [markdown]
# ## Demo 2: which prefill instance gets the request (Algorithm 1)
#
# Eight prefill instances with local prefix caches. `random` and `load` ignore the caches, `cache`
# picks the smallest estimated TTFT (queue + prefill of the part not cached there), and
# `kvcentric` (Algorithm 1) may first pull a hot prefix from another instance over RDMA.

# %%
data, text = demo2()
print(text)

# %% [markdown]
# **Exercise `cache-hit-share`.** Reproduce one number of the table yourself: the hit share of the
# `cache` router at 8 sessions/s (trace seed 0). `mooncake_gym.baselines.run_baselines("routing", ...)` and
# `mooncake_gym.model.workload.synthetic_trace` are what demo 2 uses.

# %%
hit_share = None  # your answer: a share between 0 and 1
if hit_share is not None:
    lab.check("cache-hit-share", hit_share)

# %% [markdown]
# ## Demo 3: early rejection under overload (§7)
#
# Requests arrive at twice what the decode pool can serve. `baseline` checks the decode pool only
# after prefill and wastes the prefill of the requests it then drops; `early` rejects at arrival on
# the decode load *now*; `predict` and `predict_dist` project the decode load to the moment the
# request's prefill will end.

# %%
data, text = demo3()
print(text)

# %% [markdown]
# **Exercise `early-waste-cut`.** By what share does `early` cut `baseline`'s wasted prefill
# seconds (1 − early's / baseline's)? Compute it from `run_baselines("admission", overload_workload()[0])`
# (modules `mooncake_gym.baselines` and `mooncake_gym.sim.cluster`). And look at the correlation column: what does a negative
# prefill/decode load correlation mean for the cluster?

# %%
waste_cut = None  # your answer: a share between 0 and 1
if waste_cut is not None:
    lab.check("early-waste-cut", waste_cut)
