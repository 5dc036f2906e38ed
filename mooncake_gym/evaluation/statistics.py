"""Statistics over seeds: a mean and the half-width of its 95 % confidence interval (Student's t)."""

from __future__ import annotations

import math

import numpy as np

# two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30 (standard tables)
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def mean_ci95(values) -> tuple[float, float]:
    """Mean and half-width of its 95 % confidence interval (NaN for a single value: no spread to see)."""
    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) == 1:
        return float(x[0]), float("nan")
    t = _T975[len(x) - 2] if len(x) - 1 <= len(_T975) else 1.96
    return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(len(x)))
