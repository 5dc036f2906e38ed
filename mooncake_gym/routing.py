"""Prefill routing: a cluster of prefill instances with local prefix caches and KV transfer.

The simulator is step-able: it pauses at each request arrival with a read-only
:class:`RoutingView` and resumes with a :class:`Route` (instance, whether to pull the best prefix
there first). :func:`simulate` is a loop over it, and the Gym environment
``mooncake_gym/PrefillRouting-v0`` is a thin adapter over the same object.

Model (Mooncake v3 §6, Algorithm 1):

* Each instance serves requests one at a time in FIFO order (``cluster.PrefillInstance``) and has
  an LRU prefix cache of ``cache_blocks`` 512-token blocks in its DRAM (``prefixcache``).
* A request dispatched to instance *i* with a local prefix hit of *h* tokens takes
  ``cost.prefill_s(input, h)``: the cached part is loaded from local DRAM with layer-wise overlap;
  at least one token is always computed.
* With a pull, the blocks between *i*'s hit and the longest prefix held anywhere are first copied
  from their holder over RDMA (``cost.transfer_s``); the copy is part of the request's service on
  *i* (so it adds to its TTFT, as Algorithm 1 estimates) and the copied blocks are inserted into
  *i*'s cache, so hot prefixes replicate.
* After dispatch all of the request's blocks are in *i*'s cache: FIFO service makes this exact for
  every later request sent to *i*.

Since service is FIFO and deterministic, each request's TTFT is known at dispatch:
``TTFT = queue + transfer + prefill``, where queue is the work already queued on the instance.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .cluster import PrefillInstance
from .costmodel import CostModel
from .limits import check
from .policy import policy_name, reset_policy
from .prefixcache import match_all
from .workload import Trace


@dataclass(frozen=True)
class RoutingConfig:
    """Cluster shape and SLO of the routing problem.

    n_instances: prefill instances (default 8, as in lecture demo 2 and Mooncake Figure 8).
    cache_blocks: capacity of each instance's local prefix cache in 512-token blocks (default 3,000).
    ttft_slo_s: TTFT service-level objective for attainment (default 5 s, as in the lecture).
    """

    n_instances: int = 8
    cache_blocks: int = 3000
    ttft_slo_s: float = 5.0

    def __post_init__(self):
        for name in ("n_instances", "cache_blocks", "ttft_slo_s"):
            check(name, getattr(self, name))  # the ranges of mooncake_gym.limits


class Route(NamedTuple):
    """A routing action: the prefill instance, and whether to pull the best prefix there first."""

    instance: int
    pull: bool = False


def check_route(action, n_instances: int) -> tuple[int, bool]:
    """The one check of a routing answer (simulator, ``evaluate`` and the env alike): an instance
    ``0 <= i < n_instances`` (a Python or numpy integer, not a bool) or ``Route(i, pull)`` / a pair
    ``(i, pull)`` with ``pull`` a bool, numpy bool or the integer 0 or 1. Returns ``(i, pull)``;
    ``TypeError`` for a wrong type, ``ValueError`` for a value out of range. Nothing is coerced:
    ``Route(1, 'no')`` is an error, not a pull."""
    if isinstance(action, tuple):  # Route or (instance, pull)
        if len(action) != 2:
            raise ValueError(f"action: expected an instance or (instance, pull), got {action!r}")
        inst, pull = action
        if isinstance(pull, (bool, np.bool_)):
            pull = bool(pull)
        elif isinstance(pull, (int, np.integer)) and (pull == 0 or pull == 1):
            pull = bool(pull == 1)
        else:
            raise TypeError(f"action: pull must be True or False (or 0 or 1), got {type(pull).__name__} {pull!r}")
    else:
        inst, pull = action, False
    if isinstance(inst, (bool, np.bool_)) or not isinstance(inst, (int, np.integer)):
        raise TypeError(f"action: instance must be an integer, got {type(inst).__name__} {inst!r}")
    if not 0 <= inst < n_instances:
        raise ValueError(f"action: instance must be in 0..{n_instances - 1}, got {inst}")
    return int(inst), pull


#: The fields of :class:`RoutingView`, in order.
ROUTING_VIEW_FIELDS = ("now", "index", "input_tokens", "output_tokens", "block_ids", "n_instances", "queue_s",
                       "queued_requests", "hit_tokens", "prefill_s", "best_hit_tokens", "best_instance",
                       "transfer_s", "pull_prefill_s", "queued_tokens", "cache_blocks", "hit_blocks")


class RoutingView(namedtuple("RoutingViewFields", ROUTING_VIEW_FIELDS)):
    """What a routing policy sees at one arrival (read-only; tuples are indexed by instance).

    A named tuple: a policy cannot change what the simulator recorded (setting a field raises
    ``AttributeError``), and building one is a single tuple allocation on the hot path.

    now: current time (s), the request's arrival.
    index: the request's position in the trace.
    input_tokens, output_tokens, block_ids: the request.
    queue_s: work queued on each instance (s), Algorithm 1's T_queue.
    queued_requests: requests dispatched to each instance and not finished (including the one in service).
    queued_tokens: computed (uncached) prompt tokens of those requests (Dynamo's "active prefill tokens").
    cache_blocks: each instance's prefix-cache capacity in blocks.
    hit_tokens: each instance's local prefix hit for this request (tokens).
    hit_blocks: each instance's local prefix hit in blocks (leading blocks of ``block_ids`` it holds).
    prefill_s: estimated prefill time on each instance given its local hit.
    best_hit_tokens, best_instance: the longest prefix held anywhere and who holds it (-1 if none).
    transfer_s: time to pull the part of the best prefix each instance lacks (0 where none is missing).
    pull_prefill_s: prefill time on each instance after such a pull (with the best hit).
    """

    __slots__ = ()

    def ttft_s(self, instance: int, pull: bool = False) -> float:
        """Estimated TTFT on ``instance`` (exact in this simulator): queue + transfer + prefill."""
        if pull:
            return self.queue_s[instance] + self.transfer_s[instance] + self.pull_prefill_s[instance]
        return self.queue_s[instance] + self.prefill_s[instance]

    def __repr__(self) -> str:
        return (f"RoutingView(now={self.now:.3f}, index={self.index}, input={self.input_tokens}, "
                f"hits={self.hit_tokens}, queue_s={tuple(round(q, 3) for q in self.queue_s)})")


_new_tuple = tuple.__new__


class RoutingResult:
    """Per-request outcomes and summary metrics of one routing run."""

    def __init__(self, policy: str, trace_name: str, config: RoutingConfig, rows: list[tuple], instances, cost):
        """``rows``: one tuple per dispatched request, its fields in the order of ``_ARRAYS``."""
        arrays = dict(zip(_ARRAYS, zip(*rows))) if rows else {k: () for k in _ARRAYS}
        self.policy = policy
        self.trace_name = trace_name
        self.config = config
        self.ttft_s = np.asarray(arrays["ttft_s"], dtype=np.float64)
        self.prefill_s = np.asarray(arrays["prefill_s"], dtype=np.float64)
        self.queue_s = np.asarray(arrays["queue_s"], dtype=np.float64)
        self.transfer_s = np.asarray(arrays["transfer_s"], dtype=np.float64)
        self.hit_tokens = np.asarray(arrays["hit_tokens"], dtype=np.int64)
        self.fetched_tokens = np.asarray(arrays["fetched_tokens"], dtype=np.int64)
        self.input_tokens = np.asarray(arrays["input_tokens"], dtype=np.int64)
        self.instance = np.asarray(arrays["instance"], dtype=np.int64)
        self.arrival_s = np.asarray(arrays["arrival_s"], dtype=np.float64)
        self.metrics = self._metrics(instances, cost)

    def _metrics(self, instances, cost: CostModel) -> dict:
        n = len(self.ttft_s)
        t = self.ttft_s
        total_in = int(self.input_tokens.sum())
        hit = int(self.hit_tokens.sum())
        fetched = int(self.fetched_tokens.sum())
        if n:
            span = float((self.arrival_s + self.ttft_s).max() - self.arrival_s.min())
        else:
            span = 0.0
        p50, p90, p99 = np.percentile(t, [50, 90, 99]).tolist() if n else [float("nan")] * 3
        return {
            "requests": n,
            "mean_ttft_s": float(t.mean()) if n else float("nan"),
            "p50_ttft_s": p50,
            "p90_ttft_s": p90,
            "p99_ttft_s": p99,
            "slo_attainment": float((t <= self.config.ttft_slo_s).mean()) if n else float("nan"),
            "hit_ratio": hit / total_in if total_in else float("nan"),
            "input_tokens": total_in,
            "hit_tokens": hit,
            "computed_tokens": total_in - hit,
            "fetched_tokens": fetched,
            "fetched_bytes": cost.kv_bytes(fetched),
            "utilisation": [inst.busy_s / span if span > 0 else 0.0 for inst in instances],
            "request_share": [inst.requests / n if n else 0.0 for inst in instances],
        }


_IDLE_LOAD = (0, 0)  # queued requests and tokens of an idle instance

_ARRAYS = ("arrival_s", "input_tokens", "instance", "ttft_s", "queue_s", "transfer_s", "prefill_s",
           "hit_tokens", "fetched_tokens")


class RoutingSimulator:
    """A step-able prefill-routing simulation of one trace.

    ``reset()`` returns the view of the first arrival; ``step(action)`` dispatches the current
    request and returns the next view, or ``None`` once every request has been dispatched.
    ``last`` holds the dispatched request's outcome (``ttft_s``, ``hit_tokens``, ...).
    """

    def __init__(self, trace: Trace, config: RoutingConfig | None = None, cost: CostModel | None = None):
        if not isinstance(trace, Trace):
            raise ValueError(f"trace: expected a mooncake_gym.workload.Trace, got {type(trace).__name__}")
        if len(trace) == 0:
            raise ValueError("trace: expected at least one request")
        self.trace = trace
        self.config = config or RoutingConfig()
        self.cost = cost or CostModel()
        self._arrival, self._input, self._output, self._blocks = trace.columns()
        self._prefill_s = self.cost.prefill_time()  # cost.prefill_s(n, h), constants bound (h <= n - 1 here)
        self.reset()

    # -- stepping -------------------------------------------------------------------------------
    def reset(self) -> RoutingView:
        c = self.config
        self.instances = [PrefillInstance(i, c.cache_blocks) for i in range(c.n_instances)]
        self._caches = [inst.cache for inst in self.instances]
        self._cache_blocks = (c.cache_blocks,) * c.n_instances
        self._i = 0
        self._rows: list[tuple] = []  # one outcome per dispatched request (fields of _ARRAYS)
        self.last: dict | None = None
        self._view = self._make_view()
        return self._view

    @property
    def done(self) -> bool:
        return self._view is None

    @property
    def view(self) -> RoutingView | None:
        """The pending decision's view (None when the trace is exhausted)."""
        return self._view

    def _make_view(self) -> RoutingView | None:
        # The hot path of every decision. Everything about an instance but its queue follows from
        # its hit length, and most instances share a hit (0, or the system prompt), so the cost
        # model is called once per distinct hit; an idle instance's queue is not walked.
        i = self._i
        if i >= len(self._arrival):
            return None
        now = self._arrival[i]
        n_in = self._input[i]
        ids = self._blocks[i]
        cost = self.cost
        hit_tokens = cost.hit_tokens
        instances = self.instances
        ks = match_all(self._caches, ids)
        best_blocks = max(ks)
        best = hit_tokens(best_blocks, n_in)
        prefill_s = self._prefill_s
        pull_prefill = prefill_s(n_in, best)
        by_hit = {best_blocks: (best, pull_prefill, 0.0, pull_prefill)}  # blocks -> hit, prefill, transfer, after pull
        for k in ks:
            if k not in by_hit:
                h = hit_tokens(k, n_in)
                p = prefill_s(n_in, h)
                by_hit[k] = (h, p, cost.transfer_s(best - h), pull_prefill) if h < best else (h, p, 0.0, p)
        n = len(ks)
        if len(by_hit) == 1:  # every instance holds the same prefix (often: the system prompt, or none)
            h, p, t, pp = by_hit[best_blocks]
            hits, prefills, transfers, pulls = (h,) * n, (p,) * n, (t,) * n, (pp,) * n
        else:
            hits, prefills, transfers, pulls = zip(*[by_hit[k] for k in ks])
        queue = tuple([inst.busy_until - now if inst.busy_until > now else 0.0 for inst in instances])
        queued, queued_tokens = zip(*[
            (inst.queued_requests(now), inst.queued_tokens) if q else _IDLE_LOAD for inst, q in zip(instances, queue)])
        # the fields in the order of ROUTING_VIEW_FIELDS, as one tuple (read-only for the policy)
        return _new_tuple(RoutingView, (now, i, n_in, self._output[i], ids, n, queue, queued, hits, prefills, best,
                                        ks.index(best_blocks) if best_blocks else -1, transfers, pulls,
                                        queued_tokens, self._cache_blocks, tuple(ks)))

    def _parse(self, action) -> tuple[int, bool]:
        return check_route(action, len(self.instances))

    def step(self, action) -> RoutingView | None:
        """Dispatch the pending request to ``action`` (an instance, or ``Route(instance, pull)``)."""
        if self._view is None:
            raise RuntimeError("step: the trace is exhausted; call reset()")
        return self.dispatch(*self._parse(action))

    def dispatch(self, i: int, pull: bool) -> RoutingView | None:
        """``step`` for an already valid action: instance ``i`` (0 <= i < n), pull or not."""
        v = self._view
        inst = self.instances[i]
        hit = v.hit_tokens[i]
        transfer = 0.0
        fetched = 0
        if pull and v.best_hit_tokens > hit:
            transfer = v.transfer_s[i]
            fetched = v.best_hit_tokens - hit
            hit = v.best_hit_tokens
            prefill = v.pull_prefill_s[i]
        else:
            prefill = v.prefill_s[i]
        queue = v.queue_s[i]
        inst.dispatch(v.now, transfer + prefill, v.input_tokens - hit)
        inst.cache.insert(v.block_ids)
        ttft = queue + transfer + prefill  # = finish - arrival, without the rounding of absolute times
        self._rows.append((v.now, v.input_tokens, i, ttft, queue, transfer, prefill, hit, fetched))
        self.last = {"index": v.index, "instance": i, "pull": fetched > 0, "ttft_s": ttft, "queue_s": queue,
                     "transfer_s": transfer, "prefill_s": prefill, "hit_tokens": hit, "fetched_tokens": fetched,
                     "input_tokens": v.input_tokens}
        self._i += 1
        self._view = self._make_view()
        return self._view

    def result(self, policy: str = "?") -> RoutingResult:
        return RoutingResult(policy, self.trace.name, self.config, self._rows, self.instances, self.cost)


def simulate(trace: Trace, policy: Callable, config: RoutingConfig | None = None, cost: CostModel | None = None,
             seed: int = 0) -> RoutingResult:
    """Route every request of ``trace`` with ``policy`` (``policy(view) -> action``) and return the metrics."""
    sim = RoutingSimulator(trace, config, cost)
    reset_policy(policy, seed)
    view = sim.view
    while view is not None:
        view = sim.step(policy(view))
    return sim.result(policy_name(policy))


def run_routing_baselines(trace: Trace, names=None, config: RoutingConfig | None = None,
                          cost: CostModel | None = None, seed: int = 0, threshold: float | None = None) -> dict:
    """Run routing baselines (all by default) on the same trace: ``{name: RoutingResult}``.

    ``threshold`` sets kvcentric's ``kvcache_balancing_threshold`` (its default otherwise).
    """
    from mooncake_gym.baselines import ROUTING_POLICIES, make_policy

    names = list(ROUTING_POLICIES) if names is None else list(names)
    results = {}
    for name in names:
        kwargs = {"threshold": threshold} if name == "kvcentric" and threshold is not None else {}
        results[name] = simulate(trace, make_policy("routing", name, **kwargs), config, cost, seed)
    return results
