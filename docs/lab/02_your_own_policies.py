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
# # Lab 2: your own router and your own admission policy
#
# A policy is any Python function `policy(view) -> action`. The *view* is what Mooncake's
# scheduler (the Conductor) knows at one arriving request; the action is where the request goes
# (routing) or whether it is served at all (admission). The same function runs in the simulator,
# in the Gymnasium environments and in the comparison tables, next to the paper's baselines.
#
# The cells below start you with a simple, working policy for each problem. Each exercise's check
# FAILs on it and gives a hint: improve the policy until the check passes.

# %%
import os
from pathlib import Path

import gymnasium as gym
import matplotlib

matplotlib.use("Agg")  # pictures go to files when run as a script; Jupyter shows them inline too
import matplotlib.pyplot as plt

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.course import lab
from mooncake_gym.baselines import make_policy
from mooncake_gym.evaluation import evaluate
from mooncake_gym.sim.routing import Route, RoutingSimulator
from mooncake_gym.model.workload import synthetic_trace

OUT = Path(os.environ.get("LAB_OUT", "lab_output"))
OUT.mkdir(parents=True, exist_ok=True)


def picture(env_id, policy, filename, decisions=300, **env_kwargs):
    """Run ``policy`` for ``decisions`` steps of ``env_id`` (seed 0) and save the cluster's picture."""
    env = gym.make(env_id, render_mode="rgb_array", **env_kwargs)
    env.reset(seed=0)
    for _ in range(decisions):
        env.step(env.unwrapped.encode_action(policy(env.unwrapped.decision_view())))
    plt.figure(figsize=(8, 5))
    plt.imshow(env.render())
    plt.axis("off")
    plt.savefig(OUT / filename, bbox_inches="tight")
    print("picture written to", OUT / filename)

# %% [markdown]
# ## A look at the routing view, and a picture of the cluster
#
# Let Algorithm 1 (`kvcentric`) route the first 500 requests of a synthetic trace, then look at the
# view of the next one: per instance its queued work `queue_s`, its local prefix hit `hit_tokens`
# and the estimated TTFT `view.ttft_s(i)` (and `view.ttft_s(i, pull=True)` after pulling the
# longest prefix cached anywhere).

# %%
sim = RoutingSimulator(synthetic_trace(0, 8.0))
kvcentric = make_policy("routing", "kvcentric")
view = sim.view
while view.index < 500:
    view = sim.step(kvcentric(view))
print(view)
print("TTFT estimate without / with a pull (s):")
for i in range(view.n_instances):
    print(f"  instance {i}: {view.ttft_s(i):6.2f}  {view.ttft_s(i, pull=True):6.2f}")

# %% [markdown]
# The environment draws the same state as a picture (`render_mode="rgb_array"`): per instance the
# queue with this request's prefill stacked on it (together: the TTFT estimate), the request's
# prefix hit (orange) and the cache occupancy (green); the last choice is highlighted.

# %%
picture("mooncake_gym/PrefillRouting-v0", kvcentric, "routing_picture.png", rate=8.0)

# %% [markdown]
# **Exercise `best-instance`.** Write the heart of Algorithm 1 without pulls: return the instance
# with the smallest estimated TTFT.

# %%
def best_instance(view):
    return 0  # your code: the argmin over the instances of the estimated TTFT


lab.check("best-instance", best_instance)

# %% [markdown]
# **Exercise `router`.** A router whose mean TTFT is no worse than the `cache` baseline's on the
# check's episodes (8 sessions/s). The starting point balances queues only.
#
# **Exercise `router-pulls`.** Then get within 5 % of Algorithm 1 (`kvcentric`), which may pull the
# best prefix first: return `Route(i, pull=True)` to do so.

# %%
def my_router(view):
    return min(range(view.n_instances), key=lambda i: view.queue_s[i])  # least queued work


lab.check("router", my_router)
lab.check("router-pulls", my_router)

# %% [markdown]
# Compare your router with the baselines on a few episodes of the environment (`evaluate` runs any
# policy function or trained agent; one episode per seed, 1,000 requests each).

# %%
seeds = [0] if lab.QUICK else [0, 1, 2]
for name, policy in [("my_router", my_router), ("cache", make_policy("routing", "cache")),
                     ("kvcentric", kvcentric)]:
    runs = evaluate("mooncake_gym/PrefillRouting-v0", policy, seeds=seeds, rate=8.0)
    print(f"{name:10} mean TTFT per episode {[round(r['mean_ttft_s'], 3) for r in runs]}")

# %% [markdown]
# ## Admission
#
# The admission view holds `predicted_ttft_s` (queue + prefill on the least-loaded prefill
# instance, exact here), `ttft_slo_s`, the decode pool's `decode_used_per_instance` and
# `decode_capacity_per_instance`, the workload's `mean_output_tokens`, and projections of the
# decode pool into the future (`view.project_decode(at_s, ...)`).
#
# **Exercise `decode-fits`.** Return whether the request's expected KV (its input tokens plus the
# workload's mean output tokens) fits on the emptiest decode instance *now*.

# %%
def decode_fits(view):
    return True  # your code


lab.check("decode-fits", decode_fits)

# %% [markdown]
# **Exercise `admission`.** An admission policy with at least the goodput of `early` (§7.2) and at
# most its wasted prefill, at twice the decode capacity. The start admits everything that meets the
# TTFT SLO, like `baseline`. Here is the picture of that cluster after 300 decisions.

# %%
def my_admission(view):
    return view.predicted_ttft_s <= view.ttft_slo_s


picture("mooncake_gym/OverloadAdmission-v0", my_admission, "admission_picture.png", load=2.0)
lab.check("admission", my_admission)

# %% [markdown]
# When both checks pass, compare with the baselines at other loads
# (`evaluate("mooncake_gym/OverloadAdmission-v0", my_admission, seeds=[0, 1, 2], load=1.5)`), and
# read `mooncake_gym/baselines/admission.py` next to §7 of the paper.
