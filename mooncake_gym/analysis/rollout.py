"""A look-ahead reference for prefill routing: Bertsekas' rollout over a base rule.

At each decision the rollout policy tries every instance on a copy of the simulator's state
(``snapshot()`` / ``restore()``: native on the engine, a deep copy on the reference), lets the base
rule route the next ``horizon`` requests after it, and keeps the instance whose trial has the
smallest sum of TTFTs (the request's own and those ``horizon`` requests'); the base rule's own
answer is one of the trials and wins ties, so a decision leaves the base rule only for a strictly
better trial. With ``horizon=0`` a trial is the request's own TTFT, so the rollout is the greedy
choice whatever the base (kvcentric's, where Algorithm 1's estimate is the exact TTFT; the base's
answer then only breaks ties). Each instance is tried with the pull that shortens the request's
own service there (``transfer_s + pull_prefill_s < prefill_s``); the base rule's answer keeps its
own pull.

Since a prefill instance serves in FIFO order and deterministically, a trial's TTFTs are exact
(the requests that arrive after the last one of the trial are not counted: a truncated horizon).
This is a reference, not a deployable router: it reads the future requests (their arrival times,
lengths and prefixes) from the trace. By the rollout's cost improvement property (Bertsekas,
"Rollout, Policy Iteration, and Distributed Reinforcement Learning", 2020, §2.1), with an
infinite horizon it is never worse than its base rule; with a finite one it usually is better,
not provably so. ``compare --rollout BASE[:H]`` shows it as a ``reference`` row.

Runs on :class:`~mooncake_gym.sim.routing.RoutingSimulator` and its native twin
(:class:`~mooncake_gym._engine.stepper.NativeRoutingSimulator`, where a native base rule's trials
run in the engine: ``decide``), and on the cluster simulator of ``PrefillRouting-v1``
(:class:`~mooncake_gym.sim.cluster.ClusterSimulator`, either engine: the ``routing-cluster``
scenarios), where the base rule acts on the :class:`~mooncake_gym.sim.views.ClusterView` (a routing
baseline behind ``OnRoutingView``) and every request is admitted with the default decode rule. There
a prompt's TTFT is final once its last prefill iteration is formed; a trial's requests whose prompts
are still queued when it ends are charged the TTFT estimated at their dispatch (the truncated
rollout's terminal cost). Same numbers on both engines (tests/test_rollout.py).

**Admission** (``OverloadAdmission-v1``, and ``Conductor-v1``'s admission decision with the default
route and decode rule): :func:`admission_trials` tries admit and reject at each arriving request on
a snapshot of the environment (``ClusterEnv.snapshot`` / ``restore``, either engine), lets the base
admission rule decide the next ``horizon`` arrivals, and keeps the trial with the larger sum of
the environment's rewards over those steps: the output tokens of the requests that completed
within both SLOs in that time (each request's tokens paid at its completion, in units of the mean
output), less the waste penalty on the prefill wasted in it (rejected after prefill or
preempted); the env's own objective, so that a trial cannot buy goodput with wasted prefill
without paying for it. The base rule's answer is tried first and wins ties. A request whose
predicted TTFT on the default route (exact: Algorithm 1's estimate) exceeds the TTFT SLO is
rejected without trials: it can never count, and admitting it only takes capacity. The horizon
truncates: a request still decoding at the trial's end earns nothing in it, so the look-ahead
must be long against the requests' decode times (at load 2, 128 arrivals are about 10 s of
arrivals, and the rollout over H=128 is worse than its base); ``compare --rollout BASE`` runs it
to the episode's end (:data:`ADMISSION_HORIZON`), Bertsekas' rollout without truncation, never
worse than its base. :func:`env_trials` is the one entry for both decisions (the rollout policy
of ``compare``, ``evaluation.episodes.RolloutPolicy``).
"""

from __future__ import annotations

import copy

from mooncake_gym._engine.routing import native_policy, policy_spec, production_unsupported, rng_state
from mooncake_gym.sim.cluster import ClusterSimulator
from mooncake_gym.sim.policy import feedback_of, policy_name
from mooncake_gym.sim.views import Route, check_route

#: The look-ahead of the reference row by default: requests routed by the base rule after a trial.
DEFAULT_HORIZON = 128
#: The admission rollout's by default: the largest, to the end of any scenario's episode (a trial
#: counts a request's tokens only if it completes within it: shorter look-aheads favour short
#: requests, docs/admission-v1.md "The rollout reference").
ADMISSION_HORIZON = 10_000


def default_horizon(problem: str) -> int:
    """``compare --rollout BASE``'s look-ahead on a table of ``problem`` (admission-v1: the admission
    and Conductor scenarios; else routing)."""
    return ADMISSION_HORIZON if problem == "admission-v1" else DEFAULT_HORIZON


def check_horizon(horizon) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or not 0 <= horizon <= 10_000:
        raise ValueError(f"horizon: expected an integer in [0, 10000], got {horizon!r}")
    return horizon


def check_base(base) -> None:
    """A base rule must be a routing rule without the feedback channel (a trial cannot wait for
    measurements)."""
    if not callable(base):
        raise ValueError(f"base: expected a routing rule (a callable on the view), got {type(base).__name__}")
    if feedback_of(base) is not None:
        raise ValueError(f"base: {policy_name(base)} learns from feedback (observe); a rollout's trials cannot "
                         "deliver it: choose a rule without it")


def trials(view, base_route: tuple[int, bool]) -> list[tuple[int, bool]]:
    """The actions a decision tries: the base rule's answer first, then every instance with the
    pull that shortens the request's own service there."""
    out = [base_route]
    for i in range(view.n_instances):
        pull = view.transfer_s[i] + view.pull_prefill_s[i] < view.prefill_s[i]
        if (i, pull) != base_route:
            out.append((i, pull))
    return out


def _trial_native(sim, route, spec_of, rng_of, horizon: int) -> float:
    sim.serve(*route)
    total = sim.last_ttft_s()
    spec, rng = spec_of(), rng_of()
    for _ in range(horizon):
        if sim.done:
            break
        sim.serve(*sim.decide(spec, rng))
        total += sim.last_ttft_s()
    return total


def _trial_python(sim, route, base, horizon: int) -> float:
    rule = copy.deepcopy(base)  # its running state (generator, scales) as it is at the decision
    n = sim.view.n_instances
    view = sim.dispatch(*route)
    total = sim.last["ttft_s"]
    for _ in range(horizon):
        if view is None:
            break
        view = sim.dispatch(*check_route(rule(view), n))
        total += sim.last["ttft_s"]
    return total


def _trial_cluster(sim, route, base, horizon: int) -> float:
    rule = copy.deepcopy(base)  # its running state as it is at the decision
    n = sim.preset.n_prefill
    served = [sim.view.index]
    sim.apply(True, Route(*route), None)
    for _ in range(horizon):
        if sim.done:
            break
        view = sim.view
        served.append(view.index)
        sim.apply(True, check_route(rule(view), n), None)
    ttft = sim.ttft_s  # (final where the prompt's last iteration is formed, else the estimate at dispatch)
    total = 0.0
    for r in served:
        total += ttft[r]
    return float(total)


def rollout_route(sim, base, horizon: int = DEFAULT_HORIZON, snapshot=None) -> tuple[Route, list[float]]:
    """The rollout's answer at ``sim``'s pending decision, and each trial's TTFT sum (in the order
    of :func:`trials`). ``base`` sees the pending view once (its state advances as if it routed
    this request); ``sim`` is left in the state of ``snapshot`` (default: the state it is in)."""
    tried, costs = rollout_trials(sim, base, horizon, snapshot)
    i, pull = tried[best_trial(costs)]
    return Route(i, pull), costs


def best_trial(costs: list[float]) -> int:
    """The kept trial: the smallest TTFT sum, ties to the earliest (the base rule's answer)."""
    return min(range(len(costs)), key=lambda k: (costs[k], k))


def rollout_trials(sim, base, horizon: int = DEFAULT_HORIZON, snapshot=None) -> tuple[list[tuple[int, bool]], list[float]]:
    """The trials of :func:`rollout_route` (:func:`trials`: the base rule's answer first) and each
    one's TTFT sum."""
    view = sim.view
    if view is None:
        raise RuntimeError("rollout: the trace is exhausted")
    cluster = isinstance(sim, ClusterSimulator)
    routing = view.routing if cluster else view
    first = check_route(base(view), routing.n_instances)
    tried = trials(routing, first)
    snap = sim.snapshot() if snapshot is None else snapshot
    # (a production router holding running state, its window or active blocks, continues it in Python)
    native = (not cluster and hasattr(sim, "decide") and native_policy(base) is not None
              and production_unsupported(base) is None)
    if native:
        from mooncake_gym._engine import native as _native
        state = rng_state(base.rng)  # (the native rules draw their ties from it: each trial the same draws)

        def spec_of():
            return policy_spec(base)

        def rng_of():
            return _native.Pcg64(state)
    costs = []
    try:
        for route in tried:
            sim.restore(snap)
            costs.append(_trial_native(sim, route, spec_of, rng_of, horizon) if native
                         else _trial_cluster(sim, route, base, horizon) if cluster
                         else _trial_python(sim, route, base, horizon))
    finally:
        sim.restore(snap)
    return tried, costs


def admission_trials(env, base, horizon: int = DEFAULT_HORIZON) -> tuple[list[bool], list[float]]:
    """The admission rollout's trials at ``env``'s pending decision (an ``OverloadAdmission-v1`` or
    ``Conductor-v1`` env, unwrapped or not; the module docstring): the answers tried (the base rule's
    first; only reject where the request would miss its TTFT SLO) and each one's cost, minus the
    sum of the env's rewards of the decision and the ``horizon`` steps after it decided by ``base``
    (an admission rule on the view). ``env`` is left in the state it was in."""
    u = env.unwrapped
    view = u.decision_view()
    if view is None or u.sim.done:
        raise RuntimeError("rollout: the trace is exhausted")
    if view.predicted_ttft_s > view.ttft_slo_s:
        return [False], [0.0]
    first = bool(base(view))
    tried = [first, not first]
    snap = u.snapshot()
    costs = []
    try:
        for admit in tried:
            u.restore(snap)
            _, total, done, _, _ = u.step(u.encode_action(admit))
            for _ in range(horizon):
                if done:
                    break
                _, reward, done, _, _ = u.step(u.encode_action(bool(base(u.decision_view()))))
                total += reward
            costs.append(-float(total))
    finally:
        u.restore(snap)
    return tried, costs


def env_trials(env, base, horizon: int = DEFAULT_HORIZON) -> tuple[list, list[float]]:
    """The rollout's trials at ``env``'s pending decision as env actions, and each one's cost (lower
    is better; :func:`best_trial` keeps one): the routing trials of :func:`rollout_trials` (TTFT sums)
    on a routing env (``PrefillRouting-v0``/``-v1``), the admission trials of :func:`admission_trials`
    (minus the reward sums) on ``OverloadAdmission-v1`` and ``Conductor-v1``. ``env`` is left as it was."""
    u = env.unwrapped
    if getattr(u, "KIND", "routing") in ("admission", "conductor"):
        tried, costs = admission_trials(u, base, horizon)
    else:
        sim = getattr(u, "sim", None)
        if not hasattr(sim, "snapshot"):
            raise ValueError(f"rollout: {u.spec.id if u.spec else type(u).__name__}'s simulator has no "
                             "snapshot(); the rollout reference needs one")
        tried, costs = rollout_trials(sim, base, horizon)
    return [u.encode_action(t) for t in tried], costs


def rollout_name(base_name: str, horizon: int) -> str:
    """The table row of the rollout over ``base_name`` with ``horizon``."""
    return f"rollout H={horizon} over {base_name} (reference)"

