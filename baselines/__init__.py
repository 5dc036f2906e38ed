"""Hand-coded scheduling policies, installed as ``mooncake_gym.baselines``.

``ROUTING_POLICIES`` (prefill routing, including the production routers' rules of ``production``) and ``ADMISSION_POLICIES`` (overload admission) map the
names the command line uses to policy factories; :func:`make_policy` builds one by name.
"""

from mooncake_gym.baselines.admission import (ADMISSION_POLICIES, ADMISSION_V1_POLICIES, BaselineAdmission, DistributionPredictiveRejection, EarlyRejection,
                        PredictiveRejection)
from mooncake_gym.baselines.routing import ROUTING_POLICIES, CacheAware, KVCentric, LoadBalancing, RandomRouting
from mooncake_gym.baselines.production import PRODUCTION_ROUTING_POLICIES

ROUTING_POLICIES.update(PRODUCTION_ROUTING_POLICIES)  # production routers' rules (baselines/production.py)

POLICIES = {"routing": ROUTING_POLICIES, "admission": ADMISSION_POLICIES, "admission-v1": ADMISSION_V1_POLICIES}


def make_policy(problem: str, name: str, **kwargs):
    """A fresh policy of ``problem`` ('routing' or 'admission') by ``name``, e.g. ('routing', 'cache')."""
    if problem not in POLICIES:
        raise ValueError(f"problem: expected one of {sorted(POLICIES)}, got {problem!r}")
    registry = POLICIES[problem]
    if name not in registry:
        raise ValueError(f"policy: unknown {problem} policy {name!r}; expected one of {sorted(registry)}")
    return registry[name](**kwargs)


__all__ = ["ROUTING_POLICIES", "ADMISSION_POLICIES", "ADMISSION_V1_POLICIES", "POLICIES", "BaselineAdmission", "EarlyRejection",
           "PredictiveRejection", "DistributionPredictiveRejection", "make_policy", "RandomRouting", "LoadBalancing", "CacheAware",
           "KVCentric"]
