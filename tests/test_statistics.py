"""evaluation/statistics.py: the interquartile mean, the paired ratio and the bootstrap intervals
(scipy.stats), on hand-made values."""

import math

import numpy as np
import pytest

from mooncake_gym.evaluation.statistics import iqm, iqm_ci95, mean_ci95, paired_ratio_ci95


def test_iqm_is_the_mean_of_the_middle_half():
    # 8 values: a quarter (2) cut at each end of -50, 1, 2, 3, 4, 5, 6, 100: the mean of 2, 3, 4, 5
    assert iqm([100.0, 1.0, 3.0, 4.0, 5.0, 6.0, 2.0, -50.0]) == 3.5
    assert math.isnan(iqm([]))
    # no spread: the interval is the value
    assert iqm_ci95([2.0, 2.0, 2.0, 2.0]) == (2.0, (2.0, 2.0))


def test_paired_ratio_and_its_interval():
    ref = [1.0, 2.0, 3.0, 4.0]
    # a constant 0.8x on every seed: ratio 0.8 and every paired resample says 0.8
    ratio, (low, high) = paired_ratio_ci95([0.8 * x for x in ref], ref)
    assert ratio == pytest.approx(0.8, rel=1e-15) and low == pytest.approx(0.8) and high == pytest.approx(0.8)
    # the seeds differ a lot but the pairs little: the paired interval is narrow, inside (0.7, 0.9)
    rng = np.random.default_rng(3)
    base = rng.uniform(1, 10, 10)
    ratio, (low, high) = paired_ratio_ci95(base * rng.uniform(0.75, 0.85, 10), base)
    assert 0.7 < low < ratio < high < 0.9
    assert paired_ratio_ci95(base * 0.8, base) == paired_ratio_ci95(base * 0.8, base)  # seeded: same interval
    with pytest.raises(ValueError, match="same seeds"):
        paired_ratio_ci95([1.0, 2.0], [1.0])
    assert math.isnan(paired_ratio_ci95([1.0], [0.0])[0])


def test_stratified_iqm_resamples_within_each_stratum():
    # two strata with no spread inside each: every stratified resample is the pooled sample itself
    value, (low, high) = iqm_ci95([1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0])
    assert value == 2.0 and (low, high) == (2.0, 2.0)
    value, (low, high) = iqm_ci95([1.0, 2.0, 3.0, 4.0], [10.0, 11.0, 12.0, 13.0])
    assert low <= value <= high and value == pytest.approx(np.mean([3.0, 4.0, 10.0, 11.0]))


def test_mean_ci95_uses_students_t():
    m, h = mean_ci95([1.0, 2.0, 3.0])
    # with 2 degrees of freedom t(p) = (2p - 1) / sqrt(2 p (1 - p)) in closed form
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert m == 2.0 and h == pytest.approx(t * 1.0 / math.sqrt(3), rel=1e-12)
