"""A load sweep: a set of baselines over a range of loads on one cluster preset.

Each load is a multiple of the cluster's measured saturation throughput on the base trace's request
mix (:func:`mooncake_gym.sim.cluster.load_reference`, the smaller of the two pools' rates), and at
each load every policy serves the same ``n_requests`` i.i.d. draws from the base trace (common random
numbers). ``decision="routing"``: routing baselines own the prefill instance, every request
admitted; ``"admission"``: admission baselines own the admission decision, the default router
routes. What an operator reads off such a sweep: where mean and P99 TTFT bend up, where TBT
attainment falls, and where goodput stops growing.
"""

from __future__ import annotations

from mooncake_gym.baselines import ADMISSION_POLICIES, ROUTING_POLICIES, make_policy
from mooncake_gym.model.limits import check
from mooncake_gym.model.presets import get_preset
from mooncake_gym.model.workload import Trace, resample_iid
from mooncake_gym.sim import cluster
from mooncake_gym.sim.policy import is_policy_spec, load_policy

#: The decisions a sweep can hand to baselines, and their baselines.
SWEEP_POLICIES = {"routing": ROUTING_POLICIES, "admission": ADMISSION_POLICIES}
#: Default loads (x the measured saturation) per decision.
SWEEP_LOADS = {"routing": (0.5, 0.7, 0.9, 1.1), "admission": (0.5, 1.0, 1.5, 2.0, 3.0)}
#: The metrics a sweep keeps per (load, policy) (``ClusterResult.metrics``' names).
SWEEP_METRICS = ("mean_ttft_s", "p99_ttft_s", "ttft_attainment", "tbt_attainment", "p99_tbt_s",
                 "rejected_at_arrival", "rejected_after_prefill", "good_requests", "token_goodput")


def sweep(base: Trace, preset, decision: str, names, loads, n_requests: int, seed: int = 0,
          fresh_blocks: bool = False) -> dict:
    """Every policy of ``names`` (None: all of ``decision``'s baselines; a name may be a user's
    ``FILE.py:NAME``, :func:`mooncake_gym.sim.policy.load_policy`) at every load of ``loads`` on
    ``preset``; returns ``{"saturation": ..., "rows": [{load, policy, arrival_rate_per_s, metrics...}]}``,
    the metrics :data:`SWEEP_METRICS` and ``token_goodput_per_s`` (token goodput over the run's span to
    the last arrival: what the cluster earns per second at that load)."""
    if decision not in SWEEP_POLICIES:
        raise ValueError(f"decision: expected one of {list(SWEEP_POLICIES)}, got {decision!r}")
    names = list(SWEEP_POLICIES[decision]) if names is None else list(names)
    for name in names:
        if name not in SWEEP_POLICIES[decision] and not is_policy_spec(name):
            raise ValueError(f"policy: expected {decision} baselines of {list(SWEEP_POLICIES[decision])}, got {name!r}")
    loads = [check("load", x) for x in loads]
    check("requests", n_requests)
    for name in names:
        if is_policy_spec(name):
            load_policy(name)  # a user's policy that fails to import fails before any run
    p = get_preset(preset)
    sat, reference = cluster.load_reference(base, p, "cluster")
    rows = []
    for load in loads:
        # overload_workload's draw, the saturation measured once for every load
        trace = resample_iid(base, n_requests, load * reference, seed, fresh_blocks=fresh_blocks)
        for name in names:
            policy = make_policy(decision, name)
            result = cluster.simulate(trace, p, seed=seed, **{decision: policy})
            m = result.metrics
            rows.append({"load": load, "policy": name, "arrival_rate_per_s": load * reference,
                         **{k: m[k] for k in SWEEP_METRICS},
                         "token_goodput_per_s": m["token_goodput"] / m["duration_s"] if m["duration_s"] > 0 else 0.0})
    return {"saturation": sat._asdict(), "rows": rows}
