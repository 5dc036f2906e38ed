"""Hand-coded prefill-routing policies (Mooncake v3 §6 and Figure 8).

Each policy is a callable ``policy(view) -> Route`` over a :class:`mooncake_gym.sim.routing.RoutingView`.
Exact ties are broken uniformly at random with the policy's seeded generator, as production routers
do (e.g. NVIDIA Dynamo's KV router picks among equal costs at random); otherwise an idle cluster
would send everything to instance 0.
"""

from __future__ import annotations

import numpy as np

from mooncake_gym.sim.policies import KVCentric, _Seeded
from mooncake_gym.sim.views import Route, RoutingView


class RandomRouting(_Seeded):
    """``random``: an instance drawn uniformly at random (the paper's "random" scheduler)."""

    name = "random"

    def __call__(self, view: RoutingView) -> Route:
        return Route(int(self.rng.integers(view.n_instances)))


class LoadBalancing(_Seeded):
    """``load``: the instance with the least queued prefill work (the paper's "load-balancing")."""

    name = "load"

    def __call__(self, view: RoutingView) -> Route:
        return Route(self._argmin(view.queue_s))


class CacheAware(_Seeded):
    """``cache``: argmin over instances of queue time + prefill time with that instance's local
    prefix hit (the paper's "cache-aware": Algorithm 1 without the transfer branch)."""

    name = "cache"

    def __call__(self, view: RoutingView) -> Route:
        return Route(self._argmin([q + p for q, p in zip(view.queue_s, view.prefill_s)]))


ROUTING_POLICIES = {
    "random": RandomRouting,
    "load": LoadBalancing,
    "cache": CacheAware,
    "kvcentric": KVCentric,
}
