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
# # Lab 4: reading the results
#
# A table of means says little without its spread. Here: what `mooncake-gym compare` prints and
# how it gets its ± figures, why every policy runs on the *same* episodes, and what the tail of the
# TTFT distribution tells that the mean does not.

# %%
import numpy as np

import mooncake_gym  # noqa: F401
from mooncake_gym.course import lab
from mooncake_gym.baselines import make_policy
from mooncake_gym.experiments.compare import format_setting, mean_ci95, routing_settings, policies_for, run_setting
from mooncake_gym.evaluation import evaluate

ENV = "mooncake_gym/PrefillRouting-v0"
SEEDS = [1_000_000, 1_000_001] if lab.QUICK else [1_000_000 + i for i in range(5)]
REQUESTS = 300 if lab.QUICK else 3000

# %% [markdown]
# ## The main table
#
# `compare` runs every baseline (and every agent) on the same held-out seeds, so on the same
# workloads (common random numbers), and prints each metric's mean over seeds with the half-width
# of its 95 % confidence interval. Here the routing part at 8 sessions/s; the command line is
# `mooncake-gym compare --env routing --rates 8 --seeds 5`.

# %%
[setting] = routing_settings(rates=(8.0,), episode_requests=REQUESTS)
run_setting(setting, policies_for("routing", {}), SEEDS)
print(setting.label)
print(format_setting(setting))

# %% [markdown]
# **Exercise `ci95`.** Write the function behind the ± : the mean of a list of per-seed values and
# the half-width of the 95 % confidence interval of that mean. With few seeds the normal
# distribution's 1.96 is wrong; use Student's t (`scipy.stats.t.ppf(0.975, n - 1)` if you have
# scipy, or a table: 12.71, 4.30, 3.18, 2.78 for n = 2..5; 2.26 for n = 10).

# %%
T975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 10: 2.262}


def my_ci95(values):
    x = np.asarray(values, float)
    return x.mean(), 1.96 * x.std() / np.sqrt(len(x))  # your code: this is the large-sample normal version


lab.check("ci95", my_ci95)

# %% [markdown]
# ## Paired comparisons
#
# Two policies ran on the same episodes, so compare them episode by episode: "is A better than B"
# is a question about the per-seed difference, and its interval is usually narrower than the two
# policies' intervals put together, because part of the workload's own variation (a heavy episode
# is heavy for everyone) cancels in the difference.

# %%
ttft = {name: [e["mean_ttft_s"] for e in setting.episodes[name]] for name in ("cache", "kvcentric")}
difference = [c - k for c, k in zip(ttft["cache"], ttft["kvcentric"])]
for name, values in [*ttft.items(), ("cache - kvcentric", difference)]:
    mean, half = mean_ci95(values)
    print(f"{name:18} {mean:6.3f} ± {half:.3f} s")

# %% [markdown]
# Is `kvcentric` better than `cache` here? Which of the two intervals answers that question?
#
# ## The tail
#
# The SLO concerns every request, so the tail matters. `evaluate(..., keep_result=True)` keeps each
# episode's per-request arrays (`result.ttft_s`, `result.queue_s`, ...).
#
# **Exercise `p90-ttft`.** The P90 TTFT of `kvcentric` on the routing environment at 8
# sessions/s, one episode with seed 0 (1,000 requests, the environment's default).

# %%
run = evaluate(ENV, make_policy("routing", "kvcentric"), seeds=[0], keep_result=True, rate=8.0)[0]
per_request = run["result"].ttft_s
print(f"{len(per_request)} requests; mean {per_request.mean():.3f} s, max {per_request.max():.2f} s")
p90 = None  # your answer, from per_request
if p90 is not None:
    lab.check("p90-ttft", p90)

# %% [markdown]
# Where do the slow requests come from? Plot `per_request` against the request index, or against
# `run["result"].queue_s`: is the tail queueing, or long prompts that miss the cache?
