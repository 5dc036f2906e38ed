"""Observation wrappers that give an agent more of what good hand-written rules read.

Routing
-------
:class:`RoutingRuleFeatures` appends to ``PrefillRouting-v0``'s observation, or ``PrefillRouting-v1``'s
(the cluster's; the features read its prefill pool's view), which it leaves as it is, first, the quantities of Mooncake's Algorithm 1 and of a size-aware rule, per instance and for
the request. It reads them from the env's decision view (``env.unwrapped.decision_view()``, what
the hand-coded baselines read), so under an observation mode it shows what that mode shows.

Appended after the env's ``5 N + 2`` entries (N instances; ``T(s)`` is the env's time scaling,
``min(1, log1p(s / 0.1) / log1p(10 SLO / 0.1))``, SLO = ``ttft_slo_s``):

| index (after the env's) | feature | scaling |
|---|---|---|
| 4i | Algorithm 1's TTFT estimate on i minus the smallest over instances | T(s) |
| 4i+1 | 1 if i has that smallest estimate (``kvcentric``'s choice; every tied instance) | 0 or 1 |
| 4i+2 | 1 if the estimate on i assumes pulling the best prefix there first (Algorithm 1's transfer branch, threshold 1) | 0 or 1 |
| 4i+3 | the request's service time on i (transfer + prefill, of that branch): its own work, at i's speed | T(s) |
| 4N | the request's smallest service time over instances (its size) | T(s) |
| 4N+1 | mean queued prefill work over instances (the cluster's load) | T(s) |

:class:`RoutingRelativeFeatures` gives the same entries, except that the three that measure work
in seconds (4i+3, 4N, 4N+1) are relative to the running mean of the episode's earlier requests'
smallest service times (``mooncake_gym/baselines/sizesplit.py`` ``ServiceScale``), scaled ``R(x) = min(1,
log1p(x) / log1p(32))``: "this request is 5 times the recent mean", "2 mean requests are queued per
instance". An agent that reads sizes this way is not misled by a workload whose prompts are all
longer (Mooncake's trace: 15k tokens on average) the way an absolute threshold in seconds is.

Admission
---------
An observation wrapper that gives an admission agent what the good hand-written admission rules read.

:class:`AdmissionRuleFeatures` replaces ``OverloadAdmission-v1``'s observation (made with
``prediction=True``) by the quantities the context and footprint rules of
``mooncake_gym/baselines/admission.py`` decide on, plus the decode pool's state, the prefill queue, an estimate
of the offered load and the rules' own decisions. It reads them from the env's decision view
(``env.unwrapped.decision_view()``, what the baselines read), so under an observation mode it shows
what that mode shows. ``out`` is the predicted output length (``view.predicted_output_tokens``),
``load`` is :func:`~mooncake_gym.baselines.admission.decode_load_with` with ``input + out`` (the
emptiest decode instance's KV use and iteration time over the TBT SLO with this request, the
greater), SLO the preset's TTFT SLO.

| index | feature | scaling |
|---|---|---|
| 0 | ``load`` | / 2 |
| 1 | KV used on the emptiest decode instance, now | tokens / capacity |
| 2 | its predicted iteration time with this request | s / (2 TBT SLO) |
| 3 | requests in its batch | count / 256 |
| 4 | the request's context ``input + out`` (the context rule's size) | tokens / 20,000 |
| 5 | its decode footprint ``(input + out) x out`` (the footprint rule's size) | log1p / log1p(1e8) |
| 6 | ``out`` | log1p / log1p(4096) |
| 7 | predicted TTFT on the default route (time to decode start) | s / (1.5 SLO) |
| 8 | requests in prefill | count / (20 x prefill instances) |
| 9 | offered load: arrivals per second (exponential moving average of the inter-arrival times over about 50 arrivals, bias-corrected) | / (4 x the cluster's saturation throughput) |
| 10-12 | the context rule's decision at ``(low, high, max)`` = (0.7, 0.9, 8,000) (defaults), (0.5, 0.8, 8,000) and (0.5, 0.9, 12,000) (tuned at loads 3 and 2, ``docs/admission-v1.md``) | 0 or 1 |
| 13 | ``early``'s decision at threshold 0.9 | 0 or 1 |

With ``growth=True`` four features of the request's opportunity cost follow (18 in all), on the
same decode instance (the emptiest); ``b`` is its batch, ``u`` its KV use, ``cap`` its capacity:

| index | feature | scaling |
|---|---|---|
| 14 | the iteration time this request adds, ``decode_step_with_s - decode_step_s`` (what every running request pays per token while it decodes) | s / (0.02 TBT SLO) |
| 15 | the instance's KV at the end of the request's residence if the batch grows one token per running request per iteration for ``min(out, mean output)`` iterations and nobody leaves: ``u + input + out + b x min(out, mean output)`` | tokens / cap |
| 16 | the pool's KV use now (every decode instance) | used / capacity |
| 17 | the slowest decode instance's current iteration time | s / (2 TBT SLO) |

Every feature is clipped to [0, 1]. After the last request the observation is all zeros.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from mooncake_gym.baselines.admission import ContextRule, EarlyRejection, decode_load_with
from mooncake_gym.baselines.routing import KVCentric
from mooncake_gym.baselines.sizesplit import ServiceScale
from mooncake_gym.envs.common import clip01
from mooncake_gym.envs.features import OUTPUT_TOKENS_CAP, QUEUE_CAP_SLO, TIME_UNIT_S, TTFT_CAP_SLO

#: Features appended per instance, and for the request.
RULE_FEATURES_PER_INSTANCE = 4
RULE_FEATURES_REQUEST = 2


#: The ratio (to the running mean service time) at which the relative features reach 1.
RELATIVE_CAP = 32.0


def rule_features(view, ttft_slo_s: float, sizes=None) -> list[float]:
    """The appended features of :class:`RoutingRuleFeatures` for one decision view (table above);
    with ``sizes`` (a ``ServiceScale``) those of :class:`RoutingRelativeFeatures`, and the request
    is counted in ``sizes``."""
    scale = 1.0 / math.log1p(QUEUE_CAP_SLO * ttft_slo_s / TIME_UNIT_S)

    def t(s: float) -> float:
        return min(1.0, math.log1p(s / TIME_UNIT_S) * scale) if s > 0 else 0.0

    costs, pulls = KVCentric().estimates(view)
    best = min(costs)
    services = [c - q for c, q in zip(costs, view.queue_s)]
    size = t
    if sizes is not None:
        # the first request of an episode is its own reference (ratio 1, as ServiceScale.ratio says)
        mean = sizes.mean_s or min(services)
        sizes.ratio(min(services))
        rel = 1.0 / math.log1p(RELATIVE_CAP)

        def size(s: float) -> float:
            return min(1.0, math.log1p(s / mean) * rel) if s > 0 and mean > 0 else 0.0
    vals: list[float] = []
    for c, pull, s in zip(costs, pulls, services):
        vals += [t(c - best), 1.0 if c == best else 0.0, 1.0 if pull else 0.0, size(s)]
    vals += [size(min(services)), size(sum(view.queue_s) / len(view.queue_s))]
    return vals


def _pool_view(view):
    """The prefill pool's routing view of a decision view: v0's view itself, v1's ``view.routing``."""
    return getattr(view, "routing", view)


class RoutingRuleFeatures(gym.ObservationWrapper):
    """``PrefillRouting-v0``'s observation followed by Algorithm 1's estimates relative to the best,
    its choice and transfer branch, the request's service time per instance, its size and the
    cluster's load (module docstring). After the last request the appended part is zeros."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        base = env.observation_space
        u = env.unwrapped
        if not (isinstance(base, spaces.Box) and len(base.shape) == 1 and hasattr(u, "decision_view")
                and getattr(u, "KIND", "routing") == "routing"):
            raise ValueError(f"env: RoutingRuleFeatures wraps a PrefillRouting-v0 or -v1 env (a flat Box observation "
                             f"and decision_view()), got {u}")
        # v0: the prefill pool's config; v1: the cluster's preset (its prefill pool's view is view.routing)
        cfg = getattr(u, "config", None) or u.preset
        n = cfg.n_instances if hasattr(cfg, "n_instances") else cfg.n_prefill
        self._slo = float(cfg.ttft_slo_s)
        self._extra = RULE_FEATURES_PER_INSTANCE * n + RULE_FEATURES_REQUEST
        self.observation_space = spaces.Box(0.0, 1.0, (base.shape[0] + self._extra,), np.float32)

    def observation(self, observation):
        view = _pool_view(self.env.unwrapped.decision_view())
        extra = np.zeros(self._extra, np.float32) if view is None else np.asarray(rule_features(view, self._slo),
                                                                                  np.float32)
        return np.concatenate([np.asarray(observation, np.float32), extra])


class RoutingRelativeFeatures(RoutingRuleFeatures):
    """:class:`RoutingRuleFeatures` with the work features relative to the episode's running mean
    service time (module docstring); the running mean restarts at each ``reset``."""

    def __init__(self, env: gym.Env, memory: float = 1000.0):
        super().__init__(env)
        self._scale = ServiceScale(memory)

    def reset(self, **kwargs):
        self._scale.reset()
        return super().reset(**kwargs)

    def observation(self, observation):
        view = _pool_view(self.env.unwrapped.decision_view())
        extra = (np.zeros(self._extra, np.float32) if view is None
                 else np.asarray(rule_features(view, self._slo, self._scale), np.float32))
        return np.concatenate([np.asarray(observation, np.float32), extra])

#: Scales of :class:`AdmissionRuleFeatures` (the module docstring's admission table).
CONTEXT_CAP_TOKENS = 20_000
FOOTPRINT_LOG_CAP = math.log1p(1e8)
OUTPUT_LOG_CAP = math.log1p(OUTPUT_TOKENS_CAP)
RATE_EMA = 0.02  # weight of the newest inter-arrival time (about 50 arrivals)
#: The rules whose decisions are features 10-13: context rules (low, high, max_footprint), then early's threshold.
CONTEXT_RULES = ((0.7, 0.9, 8000), (0.5, 0.8, 8000), (0.5, 0.9, 12000))
EARLY_THRESHOLD = 0.9
N_FEATURES = 14
#: Features added by ``growth=True`` (the module docstring's admission table).
N_GROWTH_FEATURES = 4
MARGINAL_STEP_SLO = 0.02  # feature 14's scale, in TBT SLOs


class AdmissionRuleFeatures(gym.ObservationWrapper):
    """``OverloadAdmission-v1`` (``prediction=True``) seen through the admission rules' quantities
    (the module docstring's admission table): ``Box(0, 1, (14,), float32)``, or ``(18,)`` with
    ``growth=True`` (the request's opportunity cost: its marginal iteration time, the batch's KV
    growth over its residence, the pool's KV use and slowest iteration)."""

    def __init__(self, env: gym.Env, growth: bool = False):
        super().__init__(env)
        base = env.unwrapped
        if not (hasattr(base, "decision_view") and getattr(base, "prediction", False) and hasattr(base, "saturation")):
            raise ValueError(f"env: AdmissionRuleFeatures wraps OverloadAdmission-v1 made with prediction=True, got {base}")

        self._rules = [ContextRule(lo, hi, mx, length="predicted") for lo, hi, mx in CONTEXT_RULES]
        self._early = EarlyRejection(EARLY_THRESHOLD)
        self._rate_den = 4.0 * base.saturation.cluster_per_s
        self._n_prefill = base.preset.n_prefill
        if not isinstance(growth, bool):
            raise ValueError(f"growth: expected True or False, got {growth!r}")
        self.growth = growth
        self._n = N_FEATURES + (N_GROWTH_FEATURES if growth else 0)
        self.observation_space = spaces.Box(0.0, 1.0, (self._n,), np.float32)
        self._last_now, self._ema, self._weight = None, 0.0, 0.0

    def reset(self, **kwargs):
        self._last_now, self._ema, self._weight = None, 0.0, 0.0
        return super().reset(**kwargs)

    def _rate(self, now: float) -> float:
        """Arrivals per second: the bias-corrected moving average of the inter-arrival times, inverted."""
        if self._last_now is not None:
            self._ema = (1 - RATE_EMA) * self._ema + RATE_EMA * (now - self._last_now)
            self._weight = (1 - RATE_EMA) * self._weight + RATE_EMA
        self._last_now = now
        if self._weight == 0.0:
            return 0.0
        mean_gap = self._ema / self._weight
        return 1.0 / mean_gap if mean_gap > 0 else float("inf")

    def observation(self, observation):
        view = self.env.unwrapped.decision_view()
        if view is None:
            return np.zeros(self._n, np.float32)

        out = float(view.predicted_output_tokens)
        context = view.input_tokens + out
        load = decode_load_with(view, context)
        cap = view.decode_capacity_per_instance
        j = min(range(len(view.decode_used_per_instance)), key=lambda i: view.decode_used_per_instance[i])
        vals = [load / 2, view.decode_used_per_instance[j] / cap, view.decode_step_with_s[j] / (2 * view.tbt_slo_s),
                view.decode_batch[j] / 256, context / CONTEXT_CAP_TOKENS,
                math.log1p(context * out) / FOOTPRINT_LOG_CAP, math.log1p(out) / OUTPUT_LOG_CAP,
                view.predicted_ttft_s / (TTFT_CAP_SLO * view.ttft_slo_s),
                view.requests_in_prefill / (20 * self._n_prefill), self._rate(view.now) / self._rate_den]
        vals += [1.0 if rule(view) else 0.0 for rule in self._rules]
        vals.append(1.0 if self._early(view) else 0.0)
        if self.growth:
            slo = view.tbt_slo_s
            grown = (view.decode_used_per_instance[j] + context
                     + view.decode_batch[j] * min(out, float(view.mean_output_tokens)))
            vals += [(view.decode_step_with_s[j] - view.decode_step_s[j]) / (MARGINAL_STEP_SLO * slo),
                     grown / cap, view.decode_load, max(view.decode_step_s) / (2 * slo)]
        return np.asarray([clip01(float(v)) for v in vals], np.float32)
