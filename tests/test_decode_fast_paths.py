"""The fast paths of the decode side give exactly the numbers of the reference computations:
``tail_means`` (per-request in-place sorts) equals the one-lexsort formulation, and
``BatchingDecodeInstance.tbt_within`` (plain-Python SLO check of the v1 rewards) decides every
finished request as its exact numpy TBT does, answering None only within rounding of the SLO."""

import math

import numpy as np

from mooncake_gym.sim.decode import TBT_TAIL_SHARE, BatchingDecodeInstance, tail_means
from mooncake_gym.model.presets import get_preset

COST = get_preset("mooncake").decode_cost


def _tail_means_lexsort(offsets, intervals, share=TBT_TAIL_SHARE):
    """The reference: one lexsort by (request, interval), then per-request reduceat sums."""
    m = np.diff(offsets)
    groups = np.repeat(np.arange(len(m)), m)
    v = intervals[np.lexsort((intervals, groups))]
    k = np.ceil(share * m - 1e-9).astype(np.int64)
    ends = offsets[1:]
    padded = np.concatenate((v, [0.0]))
    top = np.add.reduceat(padded, np.stack((ends - k, ends), axis=1).ravel())[::2]
    total = np.add.reduceat(padded, np.stack((offsets[:-1], ends), axis=1).ravel())[::2]
    some = m > 0
    return (np.where(some, top / np.maximum(k, 1), 0.0), np.where(some, v[np.maximum(ends - 1, 0)], 0.0),
            np.where(some, total / np.maximum(m, 1), 0.0))


def test_tail_means_equals_the_lexsort_formulation_bit_for_bit():
    rng = np.random.default_rng(1)
    m = rng.integers(0, 300, 200)
    m[:5] = [0, 1, 9, 10, 11]
    offsets = np.concatenate(([0], np.cumsum(m)))
    # ascending runs (as the iterations between events make) with ties and a few shuffled entries
    intervals = np.round(np.concatenate([np.sort(rng.gamma(2.0, 0.02, n)) for n in m]), 4)
    swap = rng.integers(0, len(intervals), 50)
    intervals[swap] = intervals[swap[::-1]]
    got, want = tail_means(offsets, intervals), _tail_means_lexsort(offsets, intervals)
    for a, b in zip(got, want):
        assert a.tobytes() == b.tobytes()


def _run_instance(seed: int, n: int = 400):
    """One decode instance fed random requests; returns it after every request has finished."""
    rng = np.random.default_rng(seed)
    inst = BatchingDecodeInstance(0, COST, 2_000_000, 0.1)
    now = 0.0
    for r in range(n):
        now += float(rng.exponential(0.3))
        while inst.next_event_s <= now:
            inst.on_event(inst.next_event_s)
        inst.join(r, now, int(rng.integers(100, 20_000)), int(rng.integers(1, 600)), now - float(rng.uniform(0, 0.2)))
    while inst.next_event_s < math.inf:
        inst.on_event(inst.next_event_s)
    return inst


def test_tbt_within_decides_every_request_as_the_exact_tbt():
    inst = _run_instance(0)
    rows = inst.finished
    assert len(rows) > 300
    _, offsets, intervals = inst.token_intervals(rows)
    tbt = tail_means(offsets, intervals)[0]
    # SLOs at, just around and away from the exact TBTs, and the TBTs' own values
    for q, row in enumerate(rows):
        for slo in (tbt[q], tbt[q] * (1 + 1e-12), tbt[q] * (1 - 1e-12), tbt[q] * 1.01, tbt[q] * 0.99, 0.1):
            got = inst.tbt_within(row, slo)
            if got is None:  # undecided only within rounding of the SLO
                assert abs(tbt[q] - slo) <= 1e-9 * slo
            else:
                assert got == bool(tbt[q] <= slo), (q, slo)
        assert inst.tbt_within(row, tbt[q] * 1.01) is True
        assert inst.tbt_within(row, tbt[q] * 0.99) is (False if tbt[q] > 0 else True)
