"""The feature encoders of the environments' observations: a decision view -> normalised floats.

:func:`routing_features` is ``PrefillRouting-v0``'s observation and the prefill part of the v1
environments'; the observation wrappers (:mod:`mooncake_gym.envs.wrappers`) scale their own
features with the same constants.
"""

from __future__ import annotations

import math

from mooncake_gym.envs.common import clip01
from mooncake_gym.sim.routing import RoutingView

#: Caps of the normalised features: a value at or above the cap reads 1.
QUEUE_CAP_SLO = 10.0  # queued work and TTFT estimates, in multiples of the TTFT SLO
TIME_UNIT_S = 0.1  # times are log-scaled, log1p(t / 0.1 s) / log1p(cap / 0.1 s): 0.1 s apart stays visible
QUEUED_REQUESTS_CAP = 50
INPUT_TOKENS_CAP = 200_000  # the request length feature is log1p(tokens) / log1p(cap)
PER_INSTANCE_FEATURES = 5
TTFT_CAP_SLO = 1.5  # the predicted TTFT, in multiples of the TTFT SLO
IN_PREFILL_CAP_PER_INSTANCE = 20  # requests in prefill, per prefill instance
OUTPUT_TOKENS_CAP = 4096  # a request's output length (the oracle's feature)
#: Default weight of wasted prefill in the admission environments' rewards, per mean prefill time wasted.
DEFAULT_WASTE_PENALTY = 0.1


def routing_features(v: RoutingView, time_scale: float) -> list[float]:
    """The observation of ``PrefillRouting-v0`` (and the prefill part of the v1 environments'), as
    plain floats: per instance queue, queued requests, local hit, TTFT estimates; then the request.

    The hot path of ``step``: plain Python floats into one list, one float32 array at the end (a
    fresh one each step: the caller may keep it). Each time feature is the documented T(s) inlined:
    every time here is >= 0, so only the cap at 1 is checked, and an idle queue skips the log. An
    idle instance's block depends on its hit alone (nothing queued, TTFT = prefill): idle instances
    with equal hits share it. ``time_scale`` is ``1 / log1p(10 SLO / 0.1 s)``."""
    unit, scale, log1p = TIME_UNIT_S, time_scale, math.log1p
    inv_in = 1.0 / v.input_tokens if v.input_tokens else 0.0
    vals: list[float] = []
    extend = vals.extend
    idle: dict[int, tuple] = {}
    for q, nq, h, p, tr, pp in zip(v.queue_s, v.queued_requests, v.hit_tokens, v.prefill_s, v.transfer_s,
                                   v.pull_prefill_s):
        block = idle.get(h) if q == 0.0 else None
        if block is None:
            t = q + p  # Algorithm 1's TTFT estimates: queue + prefill ...
            tp = q + tr + pp  # ... or queue + transfer + prefill after a pull
            x_q = log1p(q / unit) * scale if q else 0.0
            x_t = log1p(t / unit) * scale
            x_tp = log1p(tp / unit) * scale if tp != t else x_t
            x_n = nq / QUEUED_REQUESTS_CAP
            block = (x_q if x_q < 1.0 else 1.0, x_n if x_n < 1.0 else 1.0, h * inv_in, x_t if x_t < 1.0 else 1.0,
                     x_tp if x_tp < 1.0 else 1.0)
            if q == 0.0:
                idle[h] = block
        extend(block)
    vals.append(clip01(log1p(v.input_tokens) / log1p(INPUT_TOKENS_CAP)))
    vals.append(v.best_hit_tokens * inv_in)
    return vals
