"""Solutions to the checked exercises of ``04_reading_results.py`` (run: ``python 04_reading_results.py``)."""

import numpy as np

from mooncake_gym.course import lab
from mooncake_gym.baselines import make_policy
from mooncake_gym.evaluation import evaluate

# two-sided 95 % Student-t quantiles t(0.975, df) for df = 1..9 (standard tables)
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262]


def my_ci95(values):
    """Mean and half-width of the 95 % confidence interval of the mean: t x s / sqrt(n), s with ddof=1."""
    x = np.asarray(values, float)
    return x.mean(), T975[len(x) - 2] * x.std(ddof=1) / np.sqrt(len(x))


run = evaluate("mooncake_gym/PrefillRouting-v0", make_policy("routing", "kvcentric"), seeds=[0], keep_result=True,
               rate=8.0)[0]
p90 = float(np.percentile(run["result"].ttft_s, 90))

passed = [lab.check("ci95", my_ci95), lab.check("p90-ttft", p90)]
raise SystemExit(0 if all(passed) else 1)
