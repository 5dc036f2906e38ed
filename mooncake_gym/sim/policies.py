"""The cluster's default policies: what decides when a policy leaves a decision to the cluster.

- :class:`KVCentric`: the default prefill router of :class:`mooncake_gym.sim.cluster.ClusterSimulator`
  (Mooncake's Algorithm 1); ``mooncake_gym.baselines`` registers it as the routing baseline
  ``kvcentric``.
- :class:`LeastQueue`: the lecture's prefill rule, the instance with the least queued work (ties:
  the lowest index), deterministic.

They live in the core (not in ``mooncake_gym/baselines/``) so that the cluster never imports upward.
"""

from __future__ import annotations

import numpy as np

from mooncake_gym.sim.views import Route, RoutingView


class _Seeded:
    """Holds the generator used for random choices and tie-breaks; ``reset(rng)`` replaces it."""

    name = "?"

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def reset(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def _argmin(self, costs) -> int:
        best = min(costs)
        if costs.count(best) == 1:  # no tie (the common case): no list of ties
            return costs.index(best)
        ties = [i for i, c in enumerate(costs) if c == best]
        return ties[int(self.rng.integers(len(ties)))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class KVCentric(_Seeded):
    """``kvcentric``: Mooncake's Algorithm 1 (v3 §6) with hot-spot replication.

    For each instance p: if ``best_len / p.prefix_len > threshold`` (a prefix_len of 0 counts as an
    infinite ratio when some prefix exists) the estimate assumes the best prefix is pulled there,
    ``TTFT_p = T_transfer + T_queue + T_prefill(best_len)``; otherwise
    ``TTFT_p = T_queue + T_prefill(p.prefix_len)``. The request goes to the argmin, and if the
    chosen instance took the transfer branch its missing blocks are copied from the holder
    (replication of hot prefixes). The paper publishes no value of ``kvcache_balancing_threshold``
    ("adjusted manually"). The default 1.0 (pull whenever another instance holds a longer prefix and
    the estimate says it pays) was the best of 1, 1.25, 1.5, 2 and 4 on the synthetic workload at 8
    sessions/s (mean TTFT 0.417 s against 0.419-0.503 s); on Mooncake's public synthetic trace at
    twice its speed 1.25-4 are 2 % better (4.44 s against 4.55 s). Measured with
    ``mooncake-gym replay [--rate 8 | --trace ... --speed 2] --policy kvcentric --threshold T``.
    """

    name = "kvcentric"
    #: The knob ``mooncake-gym tune`` searches (the values of the measurement above).
    KNOBS = {"threshold": [1.0, 1.25, 1.5, 2.0, 4.0]}

    def __init__(self, threshold: float = 1.0):
        super().__init__()
        if not threshold >= 1.0:
            raise ValueError(f"threshold: expected kvcache_balancing_threshold >= 1, got {threshold!r}")
        self.threshold = float(threshold)

    def estimates(self, view: RoutingView) -> tuple[list[float], list[bool]]:
        """Each instance's TTFT estimate of Algorithm 1 and whether it took the transfer branch."""
        best = view.best_hit_tokens
        thr = self.threshold
        pulls = [best > h and (h == 0 or best / h > thr) for h in view.hit_tokens]
        costs = [q + tr + pp if transfer_branch else q + p for q, p, tr, pp, transfer_branch
                 in zip(view.queue_s, view.prefill_s, view.transfer_s, view.pull_prefill_s, pulls)]
        return costs, pulls

    def __call__(self, view: RoutingView) -> Route:
        costs, pulls = self.estimates(view)
        i = self._argmin(costs)
        return Route(i, pulls[i])

    def __repr__(self) -> str:
        return f"KVCentric(threshold={self.threshold:g})"


class LeastQueue:
    """The lecture's prefill rule: the instance with the least queued work, the lowest index among
    equals (no randomness, no prefix cache)."""

    name = "least_queue"

    def __call__(self, view: RoutingView) -> Route:
        q = view.queue_s
        return Route(min(range(len(q)), key=q.__getitem__))

    def __repr__(self) -> str:
        return "LeastQueue()"
