"""Hand-coded scheduling policies, installed as ``mooncake_gym.baselines``.

``ROUTING_POLICIES`` (prefill routing, including the production routers' rules of ``production``,
the size splits of ``sizesplit`` and the learned router of ``lbgr``) and ``ADMISSION_POLICIES`` (overload admission) map the
names the command line uses to policy factories; :func:`make_policy` builds one by name and
:func:`run_baselines` runs a problem's baselines on one trace.
"""

from mooncake_gym.sim.admission import simulate as _simulate_admission
from mooncake_gym.sim.policy import is_policy_spec, load_policy
from mooncake_gym.sim.routing import simulate as _simulate_routing

from mooncake_gym.baselines.admission import (ADMISSION_POLICIES, ADMISSION_V1_POLICIES, BaselineAdmission, DistributionPredictiveRejection, EarlyRejection,
                        PredictiveRejection)
from mooncake_gym.baselines.routing import ROUTING_POLICIES, CacheAware, KVCentric, LoadBalancing, RandomRouting
from mooncake_gym.baselines.production import PRODUCTION_ROUTING_POLICIES

from mooncake_gym.baselines.sizesplit import RelativeSizeSplit, SizeSplit
from mooncake_gym.baselines.lbgr import LBGR

ROUTING_POLICIES.update(PRODUCTION_ROUTING_POLICIES)  # production routers' rules (mooncake_gym/baselines/production.py)
# the strongest rules the routing agents met (issue 13: the size splits) and the learned router LBGR
ROUTING_POLICIES.update({"sizesplit": SizeSplit, "relsplit": RelativeSizeSplit, "lbgr": LBGR})

POLICIES = {"routing": ROUTING_POLICIES, "admission": ADMISSION_POLICIES, "admission-v1": ADMISSION_V1_POLICIES}


def make_policy(problem: str, name: str, **kwargs):
    """A fresh policy of ``problem`` ('routing' or 'admission') by ``name``, e.g. ('routing', 'cache'),
    or a user's own policy named ``FILE.py:NAME`` or ``MODULE:NAME`` (:func:`mooncake_gym.sim.policy.load_policy`)."""
    if problem not in POLICIES:
        raise ValueError(f"problem: expected one of {sorted(POLICIES)}, got {problem!r}")
    if is_policy_spec(name):
        if kwargs:
            raise ValueError(f"policy {name}: a user's policy takes no knobs, got {sorted(kwargs)}")
        return load_policy(name)
    registry = POLICIES[problem]
    if name not in registry:
        raise ValueError(f"policy: unknown {problem} policy {name!r}; expected one of {sorted(registry)}")
    return registry[name](**kwargs)


#: The simulator each problem's baselines run on alone (the lecture's two problems):
#: ``function(trace, policy, config, cost, seed, observation) -> result``.
SIMULATORS = {
    "routing": _simulate_routing,
    "admission": lambda trace, policy, config, cost, seed, observation: _simulate_admission(trace, policy, config,
                                                                                            cost, seed),
}


def run_baselines(problem: str, trace, names=None, config=None, cost=None, seed: int = 0,
                  threshold: float | None = None, observation=None) -> dict:
    """Run ``problem``'s baselines named ``names`` (default all, in registry order) on the same
    ``trace``: ``{name: result}``.

    - ``"routing"``: the prefill pool of :mod:`mooncake_gym.sim.routing` (``config`` a
      ``RoutingConfig``); ``threshold`` sets kvcentric's ``kvcache_balancing_threshold``,
      ``observation`` what the routers see (default exact).
    - ``"admission"``: the lecture's admission problem (:func:`mooncake_gym.sim.admission.simulate`,
      ``config`` an ``OverloadConfig``).
    """
    if problem not in SIMULATORS:
        raise ValueError(f"problem: expected one of {sorted(SIMULATORS)}, got {problem!r}")
    registry, simulate = POLICIES[problem], SIMULATORS[problem]
    names = list(registry) if names is None else list(names)
    for name in names:
        if name not in registry and not is_policy_spec(name):
            raise ValueError(f"policy: unknown {problem} policy {name!r}; expected one of {sorted(registry)} or 'all'")
    knobs = {"kvcentric": {"threshold": threshold}} if threshold is not None else {}
    return {name: simulate(trace, make_policy(problem, name, **knobs.get(name, {})), config, cost, seed, observation)
            for name in names}


__all__ = ["run_baselines", "ROUTING_POLICIES", "ADMISSION_POLICIES", "ADMISSION_V1_POLICIES", "POLICIES", "BaselineAdmission", "EarlyRejection",
           "PredictiveRejection", "DistributionPredictiveRejection", "make_policy", "RandomRouting", "LoadBalancing", "CacheAware",
           "KVCentric"]
