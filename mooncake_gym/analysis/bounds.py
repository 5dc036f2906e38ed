"""Lower bounds on the mean TTFT any routing policy can reach on a trace, and an upper bound on the
token goodput of any admission policy (:func:`admission_goodput_bound`, at the end).

:func:`ttft_lower_bound` returns the larger of two bounds, each proved below for the routing
simulator (:mod:`mooncake_gym.sim.routing`: FIFO prefill instances, prefix caches filled at dispatch,
optional pulls over RDMA; every policy, learned or hand-coded, only chooses instance and pull).

**Per request (isolated).** Request *j* (``n`` prompt tokens) can only hit blocks that some
instance cached, and an instance caches only the blocks of requests dispatched before *j*, i.e.
earlier in the trace. So its hit, local or pulled, is at most ``k*_j`` leading blocks, where
``k*_j`` is the longest prefix of *j*'s blocks all of which appear in earlier requests (the union
over the trace: infinite caches, pulled for free). Its TTFT is queue + transfer + prefill >=
``prefill_s(n, hit)``, and the hit is ``cost.hit_tokens(k, n)`` for some ``k <= k*_j``, hence
``TTFT_j >= w_j = min over k in 0..k*_j of prefill_s(n, hit_tokens(k, n))``. (The minimum, not the
value at ``k*_j``: with layer-wise overlap, prefill time *rises* with the hit once loading the
cached KV takes longer than computing the rest, so the largest hit is not always the fastest.)
Summing, ``sum_j TTFT_j >= sum_j w_j``.

**Whole cluster (fast single machine).** Let ``m`` be the number of instances. Take the schedule
any policy produces: request *j* is served on one instance during ``[S_j, C_j]`` (``C_j`` = its
arrival ``a_j`` + TTFT), for ``C_j - S_j >= w_j`` seconds, one request at a time per instance.
Run a single machine of speed ``m`` that, at every instant, works at rate 1 on each request
that is in service in the real schedule and has received less than ``w_j`` there: at most ``m``
requests at once, so the rate ``m`` suffices, and request *j* receives ``w_j`` units of work by
``S_j + w_j <= C_j``. This is a feasible preemptive (processor-sharing) schedule of jobs with
release dates ``a_j`` and sizes ``w_j`` on one machine of speed ``m``; processor sharing is a limit
of preemptive schedules with finer and finer slices, and shortest remaining processing time (SRPT)
minimises the total completion time over all preemptive schedules of one machine with release
dates (Schrage, Operations Research 16, 1968). So ``sum_j C_j^SRPT <= sum_j C_j`` and
``sum_j (C_j^SRPT - a_j) <= sum_j TTFT_j``. This bound captures queueing: it grows when the
cluster's total work approaches its capacity, where the per-request bound does not.

Both are lower bounds on the same sum, so their maximum is one; divided by the number of requests,
it bounds the mean TTFT.

**Heterogeneous pools** (``RoutingConfig(instances=...)``: instances of several speeds). Let
``w_j^g`` be the per-request bound on an instance of kind *g* (its own cost model) and
``w_j = min_g w_j^g``, so ``TTFT_j >= w_j`` wherever *j* runs. In the fast-machine argument, the
machine works on request *j* in service on instance *i* (kind *g*) at rate ``w_j / w_j^g <= 1``:
*j* receives ``w_j`` by ``S_j + w_j^g <= C_j``, and the total rate never exceeds
``speed = sum_i max_j (w_j / w_j^{g(i)})``. With one kind every ratio is 1 and ``speed = m``, the
bound above.

**Admission: an upper bound on token goodput.** On the cluster simulator (:mod:`mooncake_gym.sim.cluster`,
a ``batching`` preset) ``token_goodput`` counts the output tokens ``o_r`` of the requests *r* that
complete with TTFT <= ``S_ttft``, TBT <= ``S_tbt`` and decode start ``s_r <= H``, H the last
arrival. Whatever a policy does (admission, prefill instance, decode instance), such a request
needs:

1. *Its own feasibility.* It fits in one decode instance (``i_r + o_r <= capacity``); its fastest
   prefill ``w_r`` (:func:`min_service_s`: any prefix hit it could have) is <= ``S_ttft`` and ends
   by H (``a_r + w_r <= H``, as its decode starts after its prefill); and, if it has token
   intervals (``o_r >= 2``), ``fixed(1) + c i_r <= S_tbt``: every one of its intervals is at least
   one iteration with its own context on the instance, ``fixed(b) + c K`` (``CostModel.
   decode_step_coefficients``), so otherwise its TBT exceeds the SLO.
2. *Prefill time.* Its prefill runs within ``[a_r, H]`` on one of P instances, one request at a
   time, for at least ``w_r``: over the good requests, ``sum w_r <= P (H - t0)``, t0 the first
   arrival. (In a pool of several GPU kinds, ``w_r`` is the least over the kinds.)
3. *Decode time.* TBT is the mean of the slowest ``ceil(n / 10)`` of its n = ``o_r - 1`` token
   intervals; if it is <= ``S_tbt`` the slowest of the other intervals is too, so all n intervals
   sum to at most ``n S_tbt`` and its last token comes by ``d_r = H + (o_r - 1) S_tbt`` (its first
   token, the prefill's end, comes before its decode start <= H). It takes part in ``o_r - 1``
   iterations holding ``i_r + m`` tokens of context in the m-th (m = 0 .. o_r - 2); an iteration of
   b requests with K tokens of context takes ``fixed(b) + c K >= a1 b + c K``, ``a1`` =
   ``fixed(b) / b`` for large b (the per-request compute and all-reduce, whose part of ``fixed``
   is linear in b; the weights' read is dropped). Summing over a decode instance's iterations, each
   request in them is charged ``u_r = sum_m (a1 + c (i_r + m))`` seconds of that instance's time,
   and the instance's iterations run one after the other from t0 on. Hence, for every time T,
   ``sum of u_r over the good requests with d_r <= T  <=  D (T - t0)``, D decode instances.

Relax "request r is good" (0 or 1) to ``x_r`` in [0, 1]. Maximising ``sum o_r x_r`` under (2) and the
chain of constraints (3) is a linear programme whose value bounds the token goodput of every policy.
Weak Lagrangian duality on (2): for any ``lam >= 0`` its value is at most ``lam P (H - t0) + max sum
(o_r - lam w_r) x_r`` under (3) alone. Under (3) alone the feasible set of ``y_r = u_r x_r`` is a
polymatroid (nested capacities, a laminar family, with ``y_r <= u_r``), on which the greedy
algorithm (take requests in decreasing ``(o_r - lam w_r) / u_r``, each as far as every constraint
containing it allows) is optimal (Edmonds, 1970). Every ``lam`` gives an upper bound; we report the
least over a grid of ``lam``. The same with ``o_r`` replaced by 1 bounds ``goodput_requests``.
It is loose where the model's coupling is: the weights' read per iteration, KV memory, the TTFT of
queued requests and the decode check are left out.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.routing import RoutingConfig
from mooncake_gym.model.workload import Trace


@dataclass(frozen=True)
class TTFTBound:
    """``mean_ttft_s`` = max(``isolated_mean_s``, ``srpt_mean_s``); ``min_service_s`` holds each
    request's ``w_j`` (a lower bound on its own TTFT)."""

    mean_ttft_s: float
    isolated_mean_s: float
    srpt_mean_s: float
    min_service_s: np.ndarray


def seen_prefix_blocks(trace: Trace) -> np.ndarray:
    """For each request, the number of its leading blocks that all appear in earlier requests."""
    seen: set[int] = set()
    out = np.zeros(len(trace), dtype=np.int64)
    for j, ids in enumerate(trace.block_ids):
        k = 0
        for b in ids:
            if b not in seen:
                break
            k += 1
        out[j] = k
        seen.update(ids)
    return out


def min_service_s(trace: Trace, cost: CostModel | None = None) -> np.ndarray:
    """``w_j`` of every request: its fastest prefill with any hit of at most ``k*_j`` blocks."""
    cost = cost or CostModel()
    prefill = cost.prefill_time()
    out = np.empty(len(trace), dtype=np.float64)
    for j, (n, k_max) in enumerate(zip(trace.input_tokens.tolist(), seen_prefix_blocks(trace).tolist())):
        out[j] = min(prefill(n, cost.hit_tokens(k, n)) for k in range(k_max + 1))
    return out


def srpt_flow_times(arrival_s: np.ndarray, work_s: np.ndarray, speed: float) -> np.ndarray:
    """Flow times (completion - arrival) of SRPT on one preemptive machine of ``speed``; ``work_s``
    in seconds at speed 1, ``arrival_s`` non-decreasing. Times are kept relative to the start of
    each busy period, so a request served alone gets exactly ``work / speed``."""
    n = len(arrival_s)
    flow = np.empty(n, dtype=np.float64)
    heap: list[tuple[float, int]] = []  # (remaining work, request)
    arrivals = arrival_s.tolist()
    works = work_s.tolist()
    origin = arrivals[0] if n else 0.0  # start of the current busy period
    t = 0.0  # time since origin
    for j in range(n + 1):
        horizon = arrivals[j] - origin if j < n else float("inf")
        while heap and t < horizon:  # serve the shortest remaining job until the next arrival
            rem, i = heap[0]
            done = t + rem / speed
            if done <= horizon:
                heapq.heappop(heap)
                t = done
                flow[i] = t - (arrivals[i] - origin)
            else:
                heapq.heapreplace(heap, (rem - (horizon - t) * speed, i))
                t = horizon
        if j < n:
            if not heap:  # idle until this arrival: a new busy period starts
                origin, t = arrivals[j], 0.0
            heapq.heappush(heap, (works[j], j))
    return flow


def ttft_lower_bound(trace: Trace, config: RoutingConfig | None = None, cost: CostModel | None = None) -> TTFTBound:
    """A lower bound on the mean TTFT of every routing policy on ``trace`` (see the module docstring
    for the proof): the larger of the per-request bound and the fast-single-machine SRPT bound."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
    if len(trace) == 0:
        raise ValueError("trace: expected at least one request")
    config = config or RoutingConfig()
    costs = config.instance_costs(cost or CostModel())
    kinds = list(dict.fromkeys(costs))
    if len(kinds) == 1:
        w = min_service_s(trace, kinds[0])
        speed = float(config.n_instances)
    else:  # a heterogeneous pool (module docstring)
        per_kind = {c: min_service_s(trace, c) for c in kinds}
        w = np.minimum.reduce(list(per_kind.values()))
        speed = float(sum(float(np.max(w / per_kind[c])) for c in costs))
    isolated = float(w.mean())
    srpt = float(srpt_flow_times(trace.arrival_s, w, speed).mean())
    return TTFTBound(max(isolated, srpt), isolated, srpt, w)


def cluster_ttft_bound(trace: Trace, preset="mooncake") -> TTFTBound:
    """A lower bound on the mean TTFT of every routing policy on ``preset``'s whole cluster
    (:mod:`mooncake_gym.sim.cluster`, every request admitted, as in ``PrefillRouting-v1``).

    The cluster refuses at arrival, without a TTFT, the requests whose prompt and output exceed one
    decode instance's KV (``refused_too_long``), and its mean TTFT is over the requests it
    prefilled, the others. Its prefill pool is the routing simulator over exactly those requests (a
    refused request is skipped and caches nothing), with the preset's instances, caches and prefill
    cost model, and a request's TTFT is its prefill's end less its arrival there. So
    :func:`ttft_lower_bound` of the trace restricted to them bounds that mean; ``min_service_s``
    holds their ``w_j`` in trace order."""
    from mooncake_gym.model.presets import get_preset

    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
    p = get_preset(preset)
    fits = np.flatnonzero(p.fits(trace.input_tokens, trace.output_tokens))
    if len(fits) == 0:
        raise ValueError(f"trace: no request fits in one decode instance of preset {p.name!r}, none is prefilled")
    return ttft_lower_bound(trace.take(fits), p.routing_config(), p.prefill_cost)


# ------------------------------------------------------------------------------------------------
# An upper bound on the token goodput of any admission policy (OverloadAdmission-v1, Conductor-v1)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoodputBound:
    """Upper bounds on ``token_goodput`` and ``goodput_requests`` of every admission policy on one
    episode (see the module docstring), and how many requests could be good at all (``feasible``)."""

    token_goodput: float
    goodput_requests: float
    feasible: int


def _chain_greedy(value: np.ndarray, cost: np.ndarray, deadline_idx: np.ndarray, capacity: np.ndarray) -> float:
    """max sum value_r x_r, x in [0, 1], subject to: for every k, the sum of cost_r x_r over the items
    with ``deadline_idx <= k`` is at most ``capacity[k]`` (a chain: the greedy is optimal)."""
    free = cost <= 0
    total = float(value[free & (value > 0)].sum())
    slack = np.asarray(capacity, np.float64).copy()  # slack[k] of constraint k
    order = np.argsort(-np.where(free, -np.inf, value / np.where(free, 1.0, cost)), kind="stable")
    for r in order.tolist():
        if free[r] or value[r] <= 0:
            continue
        k = deadline_idx[r]
        room = slack[k:].min()
        if room <= 0:
            continue
        amount = cost[r] if cost[r] < room else room
        slack[k:] -= amount
        total += value[r] * amount / cost[r]
    return total


def admission_goodput_bound(trace: Trace, preset="mooncake-overload", n_lambda: int = 24) -> GoodputBound:
    """The upper bound on token goodput (and on good requests) of the module docstring for ``trace`` on
    ``preset``'s cluster (a ``batching`` preset)."""
    from mooncake_gym.model.presets import get_preset

    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
    p = get_preset(preset)
    if p.decode_model != "batching":
        raise ValueError(f"preset: the goodput bound needs a 'batching' decode model, {p.name!r} has {p.decode_model!r}")
    arrival = np.asarray(trace.arrival_s, np.float64)
    inputs = np.asarray(trace.input_tokens, np.float64)
    outputs = np.asarray(trace.output_tokens, np.float64)
    t0, horizon = float(arrival[0]), float(arrival[-1])
    # a request's fastest prefill on any instance of the pool (one kind unless prefill_gpus)
    kinds = dict.fromkeys(p.routing_config().instance_costs(p.prefill_cost))
    w = np.minimum.reduce([min_service_s(trace, c) for c in kinds])
    fixed1, c = p.decode_cost.decode_step_coefficients(1)
    big = 1 << 20
    a1 = (p.decode_cost.decode_step_coefficients(2 * big)[0] - p.decode_cost.decode_step_coefficients(big)[0]) / big
    n_int = np.maximum(outputs - 1, 0)
    feasible = ((inputs + outputs <= p.decode_capacity_per_instance) & (w <= p.ttft_slo_s) & (arrival + w <= horizon)
                & ((n_int == 0) | (fixed1 + c * inputs <= p.tbt_slo_s)))
    u = n_int * (a1 + c * inputs) + c * n_int * (n_int - 1) / 2
    deadline = horizon + n_int * p.tbt_slo_s
    idx = np.nonzero(feasible)[0]
    if len(idx) == 0:
        return GoodputBound(0.0, 0.0, 0)
    d_sorted = np.unique(deadline[idx])
    capacity = p.n_decode * (d_sorted - t0)
    k = np.searchsorted(d_sorted, deadline[idx])
    u_f, w_f = u[idx], w[idx]
    prefill_room = p.n_prefill * (horizon - t0)

    def bound(values: np.ndarray) -> float:
        best = _chain_greedy(values, u_f, k, capacity)  # lam = 0
        ratio = values / np.maximum(w_f, 1e-12)
        for lam in np.geomspace(ratio.min() * 0.5 + 1e-12, ratio.max(), n_lambda).tolist():
            best = min(best, lam * prefill_room + _chain_greedy(values - lam * w_f, u_f, k, capacity))
        return best

    return GoodputBound(bound(outputs[idx]), bound(np.ones(len(idx))), int(len(idx)))
