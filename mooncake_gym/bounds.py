"""Lower bounds on the mean TTFT any routing policy can reach on a trace.

:func:`ttft_lower_bound` returns the larger of two bounds, each proved below for the routing
simulator (:mod:`mooncake_gym.routing`: FIFO prefill instances, prefix caches filled at dispatch,
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
it bounds the mean TTFT. In a heterogeneous pool (``RoutingConfig(instances=...)``) ``w_j`` is the
smallest over the kinds of instance: every step above holds with it, each instance doing at most one
unit of that work per second.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel
from .routing import RoutingConfig
from .workload import Trace


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
        raise ValueError(f"trace: expected a mooncake_gym.workload.Trace, got {type(trace).__name__}")
    if len(trace) == 0:
        raise ValueError("trace: expected at least one request")
    config = config or RoutingConfig()
    cost = cost or CostModel()
    # a heterogeneous pool: a request's service is at least its fastest over the kinds of instance,
    # and each instance does at most one second of that (fastest-kind) work per second
    w = np.min([min_service_s(trace, c) for c in set(config.instance_costs(cost))], axis=0)
    isolated = float(w.mean())
    srpt = float(srpt_flow_times(trace.arrival_s, w, float(config.n_instances)).mean())
    return TTFTBound(max(isolated, srpt), isolated, srpt, w)
