"""The ``reserve`` decode model's saturation: measured by the backlog simulation (as before the one
core), and its closed form ``decode_capacity_rate`` (lecture demo 3) where the two agree."""

from __future__ import annotations

import pytest

from mooncake_gym.model.presets import PRESETS
from mooncake_gym.model.workload import Trace, synthetic_trace
from mooncake_gym.sim.cluster import decode_capacity_rate, overload_workload, saturation

#: 2 decode instances of 1,000 tokens each, 0.05 s per output token (and the lecture's prefill pool).
SMALL = PRESETS["lecture"].with_(n_decode=2, decode_capacity_tokens=1000, tbt_s=0.05, cache_blocks=0)


def trace_of(rows) -> Trace:
    """A trace from (arrival_s, input_tokens, output_tokens) rows (one made-up block each)."""
    return Trace([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [[k] for k in range(len(rows))],
                 name="hand-made")


def test_the_measured_rate_is_the_closed_form_where_packing_leaves_no_room_idle():
    """Every request alike, (50 + 200) tokens, four of them filling an instance exactly: both
    instances hold four requests from time 0, all end together after 200 x 0.05 = 10 s and four more
    take their place, so the pool completes 8 requests every 10 s, 0.8/s: the closed form
    2 x 1,000 / (250 tokens x 10 s). (320 requests: the quartiles fall on batch boundaries.)"""
    tr = trace_of([(0.1 * k, 50, 200) for k in range(20)])
    closed = decode_capacity_rate(tr, SMALL)
    assert closed == 2 * 1000 / (250 * 10.0) == 0.8
    assert saturation(tr, SMALL, n_requests=320).decode_per_s == pytest.approx(closed, rel=1e-12)


def test_packing_whole_requests_keeps_the_measured_rate_below_the_closed_form():
    """Requests of 300 tokens: three fit in 1,000, the last 100 tokens of each instance stay idle, so
    the measured rate is 3/4 of the closed form's (which counts the pool's KV as always full:
    2 x 1,000 / (300 x 10 s) = 2/3 per s against 2 x 3 / 10 s = 0.6 per s measured)."""
    tr = trace_of([(0.1 * k, 100, 200) for k in range(20)])
    closed = decode_capacity_rate(tr, SMALL)
    measured = saturation(tr, SMALL, n_requests=300).decode_per_s
    assert closed == pytest.approx(2 / 3, rel=1e-12)
    assert measured == pytest.approx(0.6, rel=1e-12) and measured < closed


def test_the_lecture_pool_on_demo3s_base_trace_keeps_its_measured_rate():
    """The synthetic base trace (seed 0, 4 sessions/s): the lecture preset's saturation is the
    backlog measure (5.4208 requests/s, as before the one core), below the closed form (6.4882):
    a backlog taken in trace order leaves room idle behind a long request that does not fit yet, and
    between whole requests. Demo 3's load (``pool="decode"``) is still the closed form; the cluster's
    (``pool="cluster"``) is the measure."""
    base = synthetic_trace(0, rate=4.0)
    sat = saturation(base, "lecture")
    assert sat.decode_per_s == pytest.approx(5.4207887247594515, rel=1e-12)
    assert sat.cluster_per_s == sat.decode_per_s and sat.bottleneck == "decode"
    closed = decode_capacity_rate(base, "lecture")
    assert closed == pytest.approx(6.488238472959162, rel=1e-12) and sat.decode_per_s < closed
    trace, demo3 = overload_workload(base, 2.0, 1000, seed=1)  # the default: demo 3's definition
    assert demo3.decode_per_s == closed and trace.rate == pytest.approx(2 * closed, rel=0.1)
    trace, cluster = overload_workload(base, 2.0, 1000, seed=1, preset="lecture", pool="cluster")
    assert cluster == sat and trace.rate == pytest.approx(2 * sat.cluster_per_s, rel=0.1)
