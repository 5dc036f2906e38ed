"""Statistics over seeds, from SciPy (``scipy.stats``) rather than written here.

- :func:`mean_ci95`: a mean and the half-width of its 95 % confidence interval (Student's t,
  ``scipy.stats.t``).
- :func:`iqm`: the interquartile mean (the mean of the middle 50 %, ``scipy.stats.trim_mean`` with
  a quarter cut at each end), the robust aggregate Agarwal et al. recommend for few runs ("Deep
  Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS 2021; their ``rliable``
  computes it the same way); :func:`iqm_ci95` its stratified bootstrap interval.
- :func:`paired_ratio_ci95`: the ratio of two policies' means over the same seeds (common random
  numbers: the same workloads) with a paired bootstrap interval, the seeds resampled together.

The bootstrap intervals are ``scipy.stats.bootstrap``'s percentile intervals over
``BOOTSTRAP_RESAMPLES`` resamples drawn from a generator seeded with ``BOOTSTRAP_SEED``: the same
values give the same interval. Several samples given to it are resampled each within itself:
a stratified bootstrap (one stratum per task, e.g. per scenario).
"""

from __future__ import annotations

import math

import numpy as np

# scipy.stats is imported where it is used: importing it costs about a second, which every command
# that imports the problem registry (the whole command line) would pay before any work

#: Resamples of each bootstrap interval, and the seed of their generator.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def _finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], float)


def mean_ci95(values) -> tuple[float, float]:
    """Mean and half-width of its 95 % confidence interval (NaN for a single value: no spread to see)."""
    x = _finite(values)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) == 1:
        return float(x[0]), float("nan")
    from scipy import stats

    t = float(stats.t.ppf(0.975, len(x) - 1))
    return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(len(x)))


def iqm(values) -> float:
    """The interquartile mean of ``values`` (NaN for none)."""
    from scipy import stats

    x = _finite(values)
    return float(stats.trim_mean(x, 0.25)) if len(x) else float("nan")


def _interval(samples: tuple, statistic, paired: bool) -> tuple[float, float]:
    """The percentile interval of ``statistic(*samples, axis=-1)``, which takes a batch of resamples
    along the last axis (``scipy.stats.bootstrap``'s ``vectorized``: one call for all of them)."""
    if any(len(s) < 2 for s in samples) or all(np.ptp(s) == 0 for s in samples):
        value = float(statistic(*samples))
        return value, value  # no spread: the interval is the value
    from scipy import stats

    res = stats.bootstrap(samples, statistic, paired=paired, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES,
                          method="percentile", random_state=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def iqm_ci95(*strata) -> tuple[float, tuple[float, float]]:
    """The IQM of every value of ``strata`` (one list per task, e.g. per scenario) and its 95 %
    stratified bootstrap interval ``(low, high)``: each stratum is resampled within itself."""
    samples = tuple(_finite(s) for s in strata)
    if not samples or any(len(s) == 0 for s in samples):
        return float("nan"), (float("nan"), float("nan"))

    from scipy import stats

    def pooled(*xs, axis=-1):  # over the last axis: every resample in one call (each as if alone)
        return stats.trim_mean(np.concatenate(xs, axis=axis), 0.25, axis=axis)

    return float(pooled(*samples)), _interval(samples, pooled, paired=False)


def paired_ratio_ci95(values, reference) -> tuple[float, tuple[float, float]]:
    """``mean(values) / mean(reference)``, the two measured on the same seeds (position by
    position), and its 95 % paired bootstrap interval ``(low, high)``. ``ValueError`` if the
    lengths differ; NaN if a value is missing or the reference's mean is 0."""
    a, b = np.asarray(values, float), np.asarray(reference, float)
    if a.shape != b.shape:
        raise ValueError(f"paired_ratio_ci95: expected values on the same seeds, got {len(a)} and {len(b)}")
    if len(a) == 0 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or b.mean() == 0:
        return float("nan"), (float("nan"), float("nan"))

    def ratio(x, y, axis=-1):
        return x.mean(axis=axis) / y.mean(axis=axis)

    return float(ratio(a, b)), _interval((a, b), ratio, paired=True)
