"""The cluster's metric helpers: request outcomes, the load correlation, output-length statistics.

One place for what both the cluster's results and the lecture's load series compute, so that the
core's modules share them instead of importing each other.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Outcome(IntEnum):
    """How a request ended (``result.outcome``, stored as int8)."""

    PENDING = -1  # not ended yet
    COMPLETED = 0
    REJECTED_AT_ARRIVAL = 1  # by the admission policy, before any work
    REJECTED_AFTER_PREFILL = 2  # no decode instance accepted it at its prefill's end: prefill wasted
    PREEMPTED = 3  # evicted from a decode batch (its prefill is counted as wasted)
    REFUSED_TOO_LONG = 4  # its prompt + output can never fit in one decode instance


# the codes as plain ints (the simulators' hot paths compare and store these)
PENDING = int(Outcome.PENDING)
COMPLETED = int(Outcome.COMPLETED)
REJECTED_AT_ARRIVAL = int(Outcome.REJECTED_AT_ARRIVAL)
REJECTED_AFTER_PREFILL = int(Outcome.REJECTED_AFTER_PREFILL)
PREEMPTED = int(Outcome.PREEMPTED)
REFUSED_TOO_LONG = int(Outcome.REFUSED_TOO_LONG)
#: code -> name (``"rejected_after_prefill"``, ...)
OUTCOME_NAMES = {int(o): o.name.lower() for o in Outcome}

#: Output-length classes of the per-class acceptance: (name, smallest, largest output tokens). On the
#: synthetic base mix (seed 0, 4 sessions/s) they hold about 45 %, 45 % and 10 % of the requests.
LENGTH_CLASSES = (("short", 1, 100), ("medium", 101, 400), ("long", 401, None))


def length_class_of(output_tokens) -> np.ndarray:
    """The index in :data:`LENGTH_CLASSES` of each output length (an array of ints)."""
    upper = [hi for _, _, hi in LENGTH_CLASSES[:-1]]
    return np.searchsorted(np.asarray(upper), np.asarray(output_tokens), side="left").astype(np.int64)


def load_correlation(prefill_load, decode_load) -> float:
    """Pearson correlation of two load series (NaN when one is constant or too short)."""
    p = np.asarray(prefill_load, dtype=np.float64)
    d = np.asarray(decode_load, dtype=np.float64)
    if len(p) < 3 or p.std() == 0 or d.std() == 0:
        return float("nan")
    return float(np.corrcoef(p, d)[0, 1])


def quantile_table(output_sorted: np.ndarray, quantile: float) -> list[int]:
    """``table[k]``: the ``quantile`` of the output length among the workload's requests whose
    output exceeds k tokens (a request that has decoded k tokens ends there with probability
    ``quantile``); k + 1 where no request is longer than k. ``output_sorted``: the workload's
    output lengths, sorted (int64)."""
    out = output_sorted
    n = len(out)
    k = np.arange(int(out[-1]) + 1 if n else 1)
    first = np.searchsorted(out, k, side="right")  # index of the first output > k
    longer = n - first
    pos = first + np.minimum(np.floor(quantile * longer).astype(np.int64), np.maximum(longer - 1, 0))
    return np.where(longer > 0, out[np.minimum(pos, max(n - 1, 0))], k + 1).tolist()
