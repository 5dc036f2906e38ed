"""Observation wrappers that give a routing agent more of what good hand-written rules read.

:class:`RoutingRuleFeatures` appends to ``PrefillRouting-v0``'s observation (which it leaves as it
is, first) the quantities of Mooncake's Algorithm 1 and of a size-aware rule, per instance and for
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
smallest service times (``baselines/sizesplit.py`` ``ServiceScale``), scaled ``R(x) = min(1,
log1p(x) / log1p(32))``: "this request is 5 times the recent mean", "2 mean requests are queued per
instance". An agent that reads sizes this way is not misled by a workload whose prompts are all
longer (Mooncake's trace: 15k tokens on average) the way an absolute threshold in seconds is.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from mooncake_gym.envs.prefill_routing import QUEUE_CAP_SLO, TIME_UNIT_S

#: Features appended per instance, and for the request.
RULE_FEATURES_PER_INSTANCE = 4
RULE_FEATURES_REQUEST = 2


#: The ratio (to the running mean service time) at which the relative features reach 1.
RELATIVE_CAP = 32.0


def rule_features(view, ttft_slo_s: float, sizes=None) -> list[float]:
    """The appended features of :class:`RoutingRuleFeatures` for one decision view (table above);
    with ``sizes`` (a ``ServiceScale``) those of :class:`RoutingRelativeFeatures`, and the request
    is counted in ``sizes``."""
    from mooncake_gym.baselines.routing import KVCentric

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


class RoutingRuleFeatures(gym.ObservationWrapper):
    """``PrefillRouting-v0``'s observation followed by Algorithm 1's estimates relative to the best,
    its choice and transfer branch, the request's service time per instance, its size and the
    cluster's load (module docstring). After the last request the appended part is zeros."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        base = env.observation_space
        if not (isinstance(base, spaces.Box) and len(base.shape) == 1 and hasattr(env.unwrapped, "decision_view")):
            raise ValueError(f"env: RoutingRuleFeatures wraps a PrefillRouting-v0 env (a flat Box observation and "
                             f"decision_view()), got {env.unwrapped}")
        n = env.unwrapped.config.n_instances
        self._slo = float(env.unwrapped.config.ttft_slo_s)
        self._extra = RULE_FEATURES_PER_INSTANCE * n + RULE_FEATURES_REQUEST
        self.observation_space = spaces.Box(0.0, 1.0, (base.shape[0] + self._extra,), np.float32)

    def observation(self, observation):
        view = self.env.unwrapped.decision_view()
        extra = np.zeros(self._extra, np.float32) if view is None else np.asarray(rule_features(view, self._slo),
                                                                                  np.float32)
        return np.concatenate([np.asarray(observation, np.float32), extra])


class RoutingRelativeFeatures(RoutingRuleFeatures):
    """:class:`RoutingRuleFeatures` with the work features relative to the episode's running mean
    service time (module docstring); the running mean restarts at each ``reset``."""

    def __init__(self, env: gym.Env, memory: float = 1000.0):
        from mooncake_gym.baselines.sizesplit import ServiceScale

        super().__init__(env)
        self._scale = ServiceScale(memory)

    def reset(self, **kwargs):
        self._scale.reset()
        return super().reset(**kwargs)

    def observation(self, observation):
        view = self.env.unwrapped.decision_view()
        extra = (np.zeros(self._extra, np.float32) if view is None
                 else np.asarray(rule_features(view, self._slo, self._scale), np.float32))
        return np.concatenate([np.asarray(observation, np.float32), extra])
