"""Prefill routing: a cluster of prefill instances with local prefix caches and KV transfer.

The simulator is step-able: it pauses at each request arrival with a read-only
:class:`RoutingView` and resumes with a :class:`Route` (instance, whether to pull the best prefix
there first). :func:`simulate` is a loop over it, and the Gym environment
``mooncake_gym/PrefillRouting-v0`` is a thin adapter over the same object.

Model (Mooncake v3 §6, Algorithm 1):

* Each instance serves requests one at a time in FIFO order (``prefill.PrefillInstance``) and has
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
* The KV store's tiers (``RoutingConfig.ssd_cache_blocks``, ``kv_store``; off by default): an SSD
  tier below each DRAM cache takes what it evicts, and with ``kv_store="global"`` (Mooncake Store)
  any instance reads any instance's blocks over RDMA; each hit's tiers are priced by
  :class:`TierEstimates` and shown in the view's ``hit_tier_tokens``. ``eviction="rlt"``: the DRAM
  caches evict a random leaf of their prefix tree (``prefixcache``), drawn from ``seed``.

Since service is FIFO and deterministic, each request's TTFT is known at dispatch:
``TTFT = queue + transfer + prefill``, where queue is the work already queued on the instance.

With ``batching=PrefillBatching(B)`` each instance batches its queue per iteration
instead (chunked prefill, ``prefill.PrefillEngine``): a request's TTFT is then known only once the
iteration holding its last chunk is formed (it depends on what arrives later), the pull runs on the
NICs while the instance computes others (the request is ready for its iterations when it arrives),
and the view's ``queue_s`` and the row's TTFT at dispatch are estimates (the formed iterations'
end + each queued prompt's time served alone) until :meth:`RoutingSimulator.sync` forms the
iterations; the results hold the real TTFTs.

A pool may be heterogeneous (``RoutingConfig(instances="4xH800+4xA800")``, per-instance
``cache_blocks``): each instance prefills at its own GPU's speed (its own ``CostModel``). What the
policy sees is the exact view by default; ``observation=`` (``mooncake_gym.sim.observation``) puts
what a deployed router would see between the exact view and the policy (stale load, a router-side
prefix index, noisy estimates), while every dispatched request is still served exactly.
"""

from __future__ import annotations

import copy
import heapq
import math
from typing import Any, Callable, Sequence, cast

import numpy as np

from mooncake_gym import _engine
from mooncake_gym._engine import routing as _native_routing
from mooncake_gym.sim.prefill import PrefillEngine, PrefillInstance, pool_load
from mooncake_gym.model.costmodel import NODE_TIER_BANDWIDTH, PREFILL_MEMO_SIZE, CostModel
from mooncake_gym._native import mypyc_attr
from mooncake_gym.sim.observation import Observer, as_observation, observation_rng
from mooncake_gym.sim.policy import feedback_of, policy_name, reset_policy
from mooncake_gym.sim.prefixcache import SSD, PrefixCache, eviction_rng, match_all, match_tiers, pool_tiers
from mooncake_gym.sim.views import ROUTING_VIEW_FIELDS, Route, RoutingView, check_route
from mooncake_gym.model.presets import PrefillBatching, RoutingConfig, parse_instances  # noqa: F401 (data)
from mooncake_gym.model.workload import Trace


_new_tuple = tuple.__new__


class PrefixEstimates:
    """The view fields that follow from each instance's prefix hit, through the cost model.

    ``estimate(hit_blocks, input_tokens)`` returns the view's ``(hit_tokens, prefill_s, transfer_s,
    pull_prefill_s, best_hit_tokens, best_instance)`` from ``hit_blocks[i]``, the leading blocks of
    the request held by instance ``i``. The simulator makes its exact view with the caches' true
    hits, and the observation layer (``mooncake_gym.sim.observation``) a router's view with the hits its
    prefix index believes in: one formula for both. Each instance prefills at the
    speed of its own cost model (``costs[i]``); the block size and the RDMA transfer are the first's
    (the same for every instance of a cluster).
    """

    __slots__ = ("hit_tokens", "transfer_s", "prefill", "group", "homogeneous")

    def __init__(self, costs: Sequence[CostModel]):
        kinds: dict[CostModel, int] = {}
        self.group = tuple(kinds.setdefault(c, len(kinds)) for c in costs)  # instance -> index of its cost model
        # cost.prefill_s(n, h), constants bound (h <= n - 1 here), remembered by (n, h)
        self.prefill = [c.prefill_time().cached for c in kinds]
        self.homogeneous = len(kinds) == 1
        self.hit_tokens, self.transfer_s = costs[0].hit_tokens, costs[0].transfer_s

    def estimate(self, ks: list[int], n_in: int) -> tuple:
        # The hot path of every decision. Everything about an instance but its queue follows from
        # its hit length (and its speed), and most instances share a hit (0, or the system prompt),
        # so the cost model is called once per distinct hit (and kind of instance).
        hit_tokens, transfer_s = self.hit_tokens, self.transfer_s
        best_blocks = max(ks)
        best = hit_tokens(best_blocks, n_in)
        if self.homogeneous:
            prefill_s = self.prefill[0]
            pull_prefill = prefill_s(n_in, best)
            # blocks -> hit, prefill, transfer, after pull
            by_hit = {best_blocks: (best, pull_prefill, 0.0, pull_prefill)}
            for k in set(ks):
                if k != best_blocks:
                    h = hit_tokens(k, n_in)
                    p = prefill_s(n_in, h)
                    by_hit[k] = (h, p, transfer_s(best - h), pull_prefill) if h < best else (h, p, 0.0, p)
            if len(by_hit) == 1:  # every instance holds the same prefix (often: the system prompt, or none)
                h, p, t, pp = by_hit[best_blocks]
                n = len(ks)
                hits, prefills, transfers, pulls = (h,) * n, (p,) * n, (t,) * n, (pp,) * n
            else:
                hits, prefills, transfers, pulls = zip(*map(by_hit.__getitem__, ks))
        else:  # a heterogeneous pool: the same, per kind of instance
            pull = [f(n_in, best) for f in self.prefill]
            by_kind: dict[tuple[int, int], tuple[int, float, float, float]] = {}
            rows = []
            for k, g in zip(ks, self.group):
                row = by_kind.get((k, g))
                if row is None:
                    h = hit_tokens(k, n_in)
                    p = self.prefill[g](n_in, h)
                    row = by_kind[k, g] = (h, p, transfer_s(best - h), pull[g]) if h < best else (h, p, 0.0, p)
                rows.append(row)
            hits, prefills, transfers, pulls = zip(*rows)
        return hits, prefills, transfers, pulls, best, ks.index(best_blocks) if best_blocks else -1


class TierEstimates:
    """The view's prefix fields under the KV store's tiers (``RoutingConfig.tiered``: an SSD tier
    below each node's DRAM cache, or the global store), through the cost model.

    Each block of a hit is read from where the node finds it (``prefixcache.match_tiers``): its own
    DRAM and SSD tiers load layer by layer, overlapped with the compute
    (``CostModel.tier_load_s`` and ``PrefillTime.with_load``: demo 1's formula, the SSD part at
    ``ssd_read_bandwidth``); another node's blocks are copied over RDMA first
    (``CostModel.remote_read_s``) into the node's DRAM and load from there.

    - ``kv_store="local"``: ``hit_tokens[i]`` is node i's own-tier hit; a pull copies the blocks it
      lacks from ``best_instance``'s tiers (``transfer_s``), then they load from DRAM
      (``pull_prefill_s``).
    - ``kv_store="global"`` (Mooncake Store): every node reads the pool's longest prefix;
      ``prefill_s[i]`` is the RDMA copy of the blocks node i does not hold plus its prefill;
      nothing is left to pull (``transfer_s`` 0). The copy's sender is the other node holding the
      longest leading run of the prefix itself (one sender per request: a simplification).

    ``estimate`` also returns, per instance, what a dispatch there does: (copy s, prefill s after
    it, tokens copied, sender, the copy's bytes on the NIC).
    """

    __slots__ = ("costs", "prefill", "ssd_bandwidth", "global_store", "_compute")

    def __init__(self, costs: Sequence[CostModel], config: RoutingConfig):
        self.costs = costs
        self.prefill = [c.prefill_time() for c in costs]
        self.ssd_bandwidth = config.ssd_read_bandwidth
        self.global_store = config.kv_store == "global"
        self._compute: dict[tuple[int, int, int], float] = {}  # (instance, n, h) -> compute s

    def _compute_s(self, i: int, n: int, h: int) -> float:
        key = (i, n, h)
        c = self._compute.get(key)
        if c is None:
            if len(self._compute) >= PREFILL_MEMO_SIZE:
                self._compute.clear()
            c = self._compute[key] = self.prefill[i].compute(n, h)
        return c

    @staticmethod
    def split(tiers: list[int], hit: int, block: int, start: int = 0) -> list[int]:
        """Tokens of the hit's blocks ``start..`` by tier (prefixcache's DRAM, SSD, REMOTE_DRAM,
        REMOTE_SSD): block j holds ``min(block, hit - j x block)`` of the ``hit`` tokens."""
        out = [0, 0, 0, 0]
        for j in range(start, len(tiers)):
            t = hit - j * block
            if t <= 0:
                break
            out[tiers[j]] += t if t < block else block
        return out

    def estimate(self, caches: Sequence[PrefixCache], ids: Sequence[int], n_in: int) -> tuple:
        n = len(caches)
        c0 = self.costs[0]
        block = c0.block_tokens
        bw = self.ssd_bandwidth
        pool = pool_tiers(caches, ids) if self.global_store else None
        tiers = [match_tiers(c, ids, pool) for c in caches]
        own = [_own_run(t) for t in tiers]  # leading blocks each node holds itself
        best_own = max(own)
        holder = own.index(best_own) if best_own else -1
        hits, prefills, transfers, pulls, tier_tokens, extra = [], [], [], [], [], []
        if pool is not None:
            k = len(pool)
            h = c0.hit_tokens(k, n_in)
            for i in range(n):
                d, s, rd, rs = split = self.split(tiers[i], h, block)
                cost = self.costs[i]
                r = cost.remote_read_s(rd, rs, bw)
                p = self.prefill[i].with_load(self._compute_s(i, n_in, h), cost.tier_load_s(d + rd + rs, s, bw))
                sender = holder
                if sender == i:  # the longest run of another node
                    rest = own[:i] + [-1] + own[i + 1:]
                    sender = rest.index(max(rest)) if n > 1 else -1
                extra.append((r, p, rd + rs, sender, cost.remote_read_bytes(rd, rs, bw)))
                hits.append(h)
                prefills.append(r + p)
                transfers.append(0.0)
                pulls.append(r + p)
                tier_tokens.append(tuple(split))
            return (tuple(hits), tuple(prefills), tuple(transfers), tuple(pulls), h, holder, (k,) * n,
                    tuple(tier_tokens), extra)
        best = c0.hit_tokens(best_own, n_in)
        for i in range(n):
            cost, prefill = self.costs[i], self.prefill[i]
            h = cost.hit_tokens(own[i], n_in)
            d, s, _, _ = split = self.split(tiers[i], h, block)
            p = prefill.with_load(self._compute_s(i, n_in, h), cost.tier_load_s(d, s, bw))
            if h < best:  # a pull copies blocks own[i].. of the holder's, from its tiers
                pd, ps, _, _ = self.split(tiers[holder], best, block, own[i])
                transfers.append(cost.remote_read_s(pd, ps, bw))
                pulls.append(prefill.with_load(self._compute_s(i, n_in, best), cost.tier_load_s(d + pd + ps, s, bw)))
                extra.append(cost.remote_read_bytes(pd, ps, bw))
            else:
                transfers.append(0.0)
                pulls.append(p)
                extra.append(0.0)
            hits.append(h)
            prefills.append(p)
            tier_tokens.append(tuple(split))
        return (tuple(hits), tuple(prefills), tuple(transfers), tuple(pulls), best, holder, tuple(own),
                tuple(tier_tokens), extra)


def _own_run(tiers: list[int]) -> int:
    """Leading blocks of ``tiers`` in the node's own DRAM or SSD."""
    k = 0
    for t in tiers:
        if t > SSD:
            break
        k += 1
    return k


class RoutingResult:
    """Per-request outcomes and summary metrics of one routing run."""

    def __init__(self, policy: str, trace_name: str, config: RoutingConfig, rows: list[tuple], instances, cost):
        """``rows``: one tuple per dispatched request, its fields in the order of ``_ARRAYS``."""
        # one float64 array in a single conversion, then its columns (token counts and instance
        # indices are far below 2**53: exact)
        table = np.array(rows, dtype=np.float64).reshape(-1, len(_ARRAYS))
        arrays = dict(zip(_ARRAYS, table.T.copy()))  # each column contiguous
        self.policy = policy
        self.trace_name = trace_name
        self.config = config
        self.ttft_s = arrays["ttft_s"]
        self.prefill_s = arrays["prefill_s"]
        self.queue_s = arrays["queue_s"]
        self.transfer_s = arrays["transfer_s"]
        self.hit_tokens = arrays["hit_tokens"].astype(np.int64)
        self.fetched_tokens = arrays["fetched_tokens"].astype(np.int64)
        self.input_tokens = arrays["input_tokens"].astype(np.int64)
        self.instance = arrays["instance"].astype(np.int64)
        self.arrival_s = arrays["arrival_s"]
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


_ARRAYS = ("arrival_s", "input_tokens", "instance", "ttft_s", "queue_s", "transfer_s", "prefill_s",
           "hit_tokens", "fetched_tokens")


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py), it can still be subclassed in Python
class RoutingSimulator:
    """A step-able prefill-routing simulation of one trace.

    ``reset()`` returns the view of the first arrival; ``step(action)`` dispatches the current
    request and returns the next view, or ``None`` once every request has been dispatched.
    ``last`` holds the dispatched request's outcome (``ttft_s``, ``hit_tokens``, ...).

    ``observation``: what the views show (None or ``"exact"``: the exact state; otherwise an
    :class:`~mooncake_gym.sim.observation.ObservationConfig`, a mode string or a dict of its fields);
    ``exact_view`` is always the truth, which dispatch follows. ``rng``: the generator of the
    observation's noise (``simulate`` spawns one from its seed). ``seed``: the ``"rlt"`` eviction's
    draws (``prefixcache.eviction_rng``, anew at each ``reset``).

    The KV store (``RoutingConfig``'s ``ssd_cache_blocks``, ``kv_store``, ``eviction``): each
    instance's DRAM cache evicts by ``eviction`` and demotes what it evicts to an SSD tier of
    ``ssd_cache_blocks``; the view's prefix fields then come from :class:`TierEstimates` and say
    where each hit is (``hit_tier_tokens``); the exact observation only.
    """

    def __init__(self, trace: Any, config: RoutingConfig | None = None, cost: CostModel | None = None,  # trace: checked
                 observation=None, rng: np.random.Generator | None = None, batching: PrefillBatching | None = None,
                 seed: Any = 0):
        if not isinstance(trace, Trace):
            raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
        if len(trace) == 0:
            raise ValueError("trace: expected at least one request")
        self.trace = trace
        self.config = config or RoutingConfig()
        self.cost = cost or CostModel()
        self.costs = self.config.instance_costs(self.cost)  # each instance's cost model
        self.observation = as_observation(observation)
        self._rng = rng if rng is not None else np.random.default_rng(0)  # the observation's noise only
        self._arrival, self._input, self._output, self._blocks = trace.columns()
        self._estimates = PrefixEstimates(self.costs)
        self._seed = seed
        self._tiers: TierEstimates | None = TierEstimates(self.costs, self.config) if self.config.tiered else None
        self._global: bool = self.config.kv_store == "global"
        if self._tiers is not None and not self.observation.exact:
            raise ValueError("observation: the KV store's tiers (ssd_cache_blocks, kv_store='global') are shown in "
                             "the exact view only")
        self._prefill0: list[float] | None = None  # uncached_prefill_s of a homogeneous pool, once asked
        if batching is not None and not isinstance(batching, PrefillBatching):
            raise ValueError(f"batching: expected a PrefillBatching or None, got {type(batching).__name__}")
        self.batching = batching
        self._budget: int = 0 if batching is None else batching.token_budget
        if self._budget:
            for i, c in enumerate(self.costs):
                if not c.instance.realistic:
                    raise ValueError(f"prefill_token_budget: batching needs realistic cost models (CostModel.realistic); "
                                     f"instance {i}'s is not")
        self._listeners: list[Callable] = []  # the policies' observe (listen), kept across resets
        self.reset()

    def listen(self, policy: Callable) -> None:
        """Tell ``policy`` (if it has ``observe``: :mod:`mooncake_gym.sim.policy`) each dispatched
        request's measured TTFT when its prefill completes, before the next decision after that."""
        observe = feedback_of(policy)
        if observe is not None:
            self._listeners.append(observe)

    def _deliver(self) -> None:
        """Feedback: every pending completion up to the next arrival (all of them once done)."""
        t = self._arrival[self._i] if self._i < len(self._arrival) else math.inf
        pending = self._feedback
        while pending and pending[0][0] <= t:
            end, k, i, ttft = heapq.heappop(pending)
            for observe in self._listeners:
                observe(k, i, ttft, end)

    # -- stepping -------------------------------------------------------------------------------
    def reset(self) -> RoutingView | None:
        self.instances = [PrefillInstance(i, b) for i, b in enumerate(self.config.instance_cache_blocks())]
        cfg = self.config
        if cfg.tiered or cfg.eviction != "lru":  # the KV store's tiers and eviction
            draws = eviction_rng(self._seed) if cfg.eviction == "rlt" else None
            for inst, b in zip(self.instances, cfg.instance_cache_blocks()):
                inst.cache = PrefixCache(b, cfg.eviction, PrefixCache(cfg.ssd_cache_blocks) if cfg.ssd_cache_blocks
                                         else None, draws)
        self._caches = cast("list[PrefixCache]", [inst.cache for inst in self.instances])  # all cached
        self._cache_blocks = self.config.instance_cache_blocks()
        self._dispatch_tiers: list = []  # tier path: what a dispatch on each instance does (TierEstimates)
        self.tier_hit_tokens = [0, 0, 0, 0]  # tier path: the dispatched hits' tokens by tier
        self._batched: bool = self._budget > 0
        if self._batched:
            for inst, c in zip(self.instances, self.costs):
                inst.engine = PrefillEngine(self._budget, c.prefill_time(), inst)
        depth = 1 if self.batching is None else self.batching.pipeline_nodes
        self._pipelined: bool = depth > 1
        if self._pipelined:  # groups of consecutive instances; each instance's own first
            engines = [cast(PrefillEngine, inst.engine) for inst in self.instances]
            for i, (engine, c) in enumerate(zip(engines, self.costs)):
                g = i - i % depth
                group = [engine] + [engines[j] for j in range(g, min(g + depth, len(engines))) if j != i]
                # activations of the chunk's tokens (d_model BF16 values each) over the RDMA NIC
                engine.set_pipeline(group, cast(PrefillBatching, self.batching).pipeline_min_tokens,
                                    c.model.d_model * 2 / NODE_TIER_BANDWIDTH["rdma"], c.transfer_latency_s,
                                    c.instance.iteration_overhead_s)
        self._row_of: dict[int, int] = {}  # batching: request -> its row in _rows, until its TTFT is known
        self.prefill_ends: list[tuple[int, float]] = []  # batching: (request, first token time) since last read
        # batching driven from outside (the cluster's event loop forms each iteration: ``form``), and
        # pulls left to it (``pulls``: (request, holder, instance, bytes) to copy; ``pull_arrived``)
        self.external_clock = False
        self.defer_pulls = False
        self.pulls: list[tuple[int, int, int, float]] = []  # (request, holder, instance, bytes)
        # every cache holds 0 blocks (the lecture's pool): no instance ever has a prefix hit
        self._uncached: bool = not any(self._cache_blocks) and not self._batched and not cfg.tiered
        self._i = 0
        self._rows: list[tuple] = []  # one outcome per dispatched request (fields of _ARRAYS)
        self._feedback: list[tuple[float, int, int, float]] = []  # heap of (prefill end, request, instance, ttft)
        self._last_row: tuple | None = None  # the last dispatched request's row of _rows (None after a skip)
        self._last_index = -1
        self._exact: RoutingView | None = None
        self._view: RoutingView | None = None
        self._built = False
        exact = self.observation.exact
        self._observer = None if exact else Observer(self.observation, self.instances, self._estimates, self._rng)
        self._next_view()
        return self.view

    @property
    def done(self) -> bool:
        return self._i >= len(self._arrival)

    # -- snapshots ------------------------------------------------------------------------------
    #: What a snapshot shares with the simulator instead of copying (set at construction, never changed).
    _SHARED = ("trace", "config", "cost", "costs", "observation", "_arrival", "_input", "_output", "_blocks",
               "_estimates", "_prefill0", "batching", "_budget", "_cache_blocks")

    def _shared_memo(self) -> dict:
        return {id(self.__dict__[k]): self.__dict__[k] for k in self._SHARED if k in self.__dict__}

    def snapshot(self) -> dict:
        """A copy of the whole simulation state (instances, caches, rows, pending view, the
        observation's state and generator), for :meth:`restore`: a deep copy of everything but the
        trace and the pool's set-up (the reference's; the native engine's is
        ``mooncake_gym._engine.stepper.NativeRoutingSimulator.snapshot``)."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in self._SHARED}, self._shared_memo())

    def restore(self, snapshot: dict) -> RoutingView | None:
        """Back to the state of ``snapshot`` (from :meth:`snapshot` of this simulator; it stays
        valid for more restores); returns the pending view."""
        if not isinstance(snapshot, dict) or "_i" not in snapshot:
            raise ValueError(f"snapshot: expected a snapshot of this simulator, got {type(snapshot).__name__}")
        self.__dict__.update(copy.deepcopy(snapshot, self._shared_memo()))
        return self.view

    @property
    def view(self) -> RoutingView | None:
        """The pending decision's view (None when the trace is exhausted): what the policy sees,
        the exact state unless an ``observation`` mode says otherwise."""
        if not self._built:
            self._build_view()
        return self._view

    @property
    def exact_view(self) -> RoutingView | None:
        """The pending decision's exact view (the simulator's truth; the same object as ``view``
        with the default exact observation)."""
        if not self._built:
            self._build_view()
        return self._exact

    @property
    def last(self) -> dict | None:
        """The last dispatched request's outcome (None after a skip or before any dispatch): a
        fresh dict at each read, made from its row of the run's outcomes."""
        row = self._last_row
        if row is None:
            return None
        _, n_in, i, ttft, queue, transfer, prefill, hit, fetched = row
        return {"index": self._last_index, "instance": i, "pull": fetched > 0, "ttft_s": ttft, "queue_s": queue,
                "transfer_s": transfer, "prefill_s": prefill, "hit_tokens": hit, "fetched_tokens": fetched,
                "input_tokens": n_in}

    def _build_view(self) -> None:
        if self._observer is not None:  # (a caller's clock: the observed view made when read, _defer)
            self._next_view()
            return
        self._exact = self._view = self._make_view()
        self._built = True

    def _next_view(self) -> None:
        """Make the next decision's exact view and, through the observer if any, the policy's. With
        the exact observation the view is made on first read (``view``, ``exact_view``, a dispatch
        that needs it): its fields depend only on the instances and their caches, which nothing
        changes before the next dispatch, so it is the same whenever it is made, and a caller that
        never reads it (the lecture's admission problem) never pays for it."""
        obs = self._observer
        if obs is None:
            self._built = False
            return
        if self._i < len(self._arrival):
            if self._batched:
                self.sync(self._arrival[self._i])
            obs.scrape(self._arrival[self._i])  # before anything reads the instances at the new time
        self._exact = v = self._make_view()
        self._view = None if v is None else obs.observe(v)
        self._built = True

    def uncached_prefill_s(self, i: int) -> list[float]:
        """Every request's prefill time on instance ``i`` without a prefix hit: its view's
        ``prefill_s[i]`` in a pool that caches nothing (``cache_blocks`` 0), for the whole trace."""
        est = self._estimates
        if est.homogeneous and self._prefill0 is not None:
            return self._prefill0
        prefill = est.prefill[est.group[i]]
        memo: dict[int, float] = {}  # (resampled traces repeat prompt lengths)
        times = [memo[n] if n in memo else memo.setdefault(n, prefill(n, 0)) for n in self._input]
        if est.homogeneous:  # remembered: the fast path of serve reads it
            self._prefill0 = times
        return times

    def _make_view(self) -> RoutingView | None:
        # The hot path of every decision: the prefix fields come from PrefixEstimates (one cost-model
        # call per distinct hit), the load fields from cluster.pool_load.
        i = self._i
        if i >= len(self._arrival):
            return None
        now = self._arrival[i]
        if self._batched:
            self.sync(now)
        ids = self._blocks[i]
        n_in = self._input[i]
        if self._tiers is not None:
            hits, prefills, transfers, pulls, best, best_instance, ks, tiers, self._dispatch_tiers = \
                self._tiers.estimate(self._caches, ids, n_in)
            queue, queued, queued_tokens = pool_load(self.instances, now)
            return _new_tuple(RoutingView, (now, i, n_in, self._output[i], ids, len(ks), queue, queued, hits,
                                            prefills, best, best_instance, transfers, pulls, queued_tokens,
                                            self._cache_blocks, ks, tiers))
        ks = match_all(self._caches, ids)
        hits, prefills, transfers, pulls, best, best_instance = self._estimates.estimate(ks, n_in)
        queue, queued, queued_tokens = pool_load(self.instances, now)
        # the fields in the order of ROUTING_VIEW_FIELDS, as one tuple (read-only for the policy)
        return _new_tuple(RoutingView, (now, i, n_in, self._output[i], ids, len(ks), queue, queued, hits, prefills,
                                        best, best_instance, transfers, pulls, queued_tokens, self._cache_blocks,
                                        tuple(ks), None))

    def _parse(self, action) -> tuple[int, bool]:
        return check_route(action, len(self.instances))

    def step(self, action) -> RoutingView | None:
        """Dispatch the pending request to ``action`` (an instance, or ``Route(instance, pull)``)."""
        if self._i >= len(self._arrival):  # done
            raise RuntimeError("step: the trace is exhausted; call reset()")
        inst, pull = self._parse(action)
        self.serve(inst, pull)
        if not self._built:  # view, inlined
            self._build_view()
        if self._feedback:
            self._deliver()
        return self._view

    def dispatch(self, i: int, pull: bool) -> RoutingView | None:
        """``step`` for an already valid action: instance ``i`` (0 <= i < n), pull or not."""
        self.serve(i, pull)
        if not self._built:  # view, inlined
            self._build_view()
        if self._feedback:
            self._deliver()
        return self._view

    def serve(self, i: int, pull: bool) -> None:
        """``dispatch`` without making the next view (the cluster simulator's prefill pool: its
        caller reads the view only if its policy does)."""
        if not self._built and self._uncached and self._observer is None:
            # no cache anywhere (the lecture's pool): no hit, nothing to pull, and the view's fields
            # for instance i computed alone: queue_s(now) is pool_load's queue, prefill the
            # estimate's prefill(n, 0); then the dispatch below
            k = self._i
            if k >= len(self._arrival):
                raise AssertionError("dispatch: the trace is exhausted")
            now = self._arrival[k]
            n_in = self._input[k]
            p0 = self._prefill0
            if p0 is not None:
                prefill = p0[k]
            else:
                est = self._estimates
                prefill = est.prefill[est.group[i]](n_in, 0)
            inst = self.instances[i]
            queue = inst.busy_until - now  # inst.queue_s(now), inlined
            if not queue > 0.0:
                queue = 0.0
            inst.dispatch(now, 0.0 + prefill, n_in)
            self._caches[i].insert(self._blocks[k])  # a cache of 0 blocks: counts its evictions
            self._last_row = row = (now, n_in, i, queue + 0.0 + prefill, queue, 0.0, prefill, 0, 0)
            self._rows.append(row)
            if self._listeners:
                heapq.heappush(self._feedback, (inst.busy_until, k, i, row[3]))
            self._last_index = k
            self._i = k + 1
            return
        v = self._exact if self._built else self.exact_view  # the real service follows the exact state
        assert v is not None, "dispatch: the trace is exhausted"
        k, now, n_in = v.index, v.now, v.input_tokens
        hit = v.hit_tokens[i]
        transfer = 0.0
        fetched = 0
        holder = v.best_instance
        if self._global:  # the global store: the blocks held elsewhere copied first, whatever the pull says
            transfer, prefill, fetched, holder, _ = self._dispatch_tiers[i]
        elif pull and v.best_hit_tokens > hit:
            transfer = v.transfer_s[i]
            fetched = v.best_hit_tokens - hit
            hit = v.best_hit_tokens
            prefill = v.pull_prefill_s[i]
        else:
            prefill = v.prefill_s[i]
        queue = v.queue_s[i]
        engine = self.instances[i].engine
        if engine is None:
            self.instances[i].dispatch(now, transfer + prefill, n_in - hit)
        else:  # queued for batching: the pull runs on the NICs meanwhile; TTFT known when formed
            self._row_of[k] = len(self._rows)
            if fetched and self.defer_pulls:  # ready when the caller says its copy arrived
                nbytes = self.cost.kv_bytes(fetched) if self._tiers is None else (
                    self._dispatch_tiers[i][4] if self._global else self._dispatch_tiers[i])
                self.pulls.append((k, holder, i, nbytes))
                engine.add(k, now, math.inf, n_in, hit, prefill)
            else:
                engine.add(k, now, now + transfer, n_in, hit, prefill)
        self._caches[i].insert(v.block_ids)  # inst.cache
        if self._tiers is None:
            ttft = queue + transfer + prefill  # = finish - arrival, without the rounding of absolute times
        else:
            # (the global store's view shows transfer + prefill as its prefill_s)
            ttft = queue + (transfer + prefill) if self._global else queue + transfer + prefill
            by_tier = cast(RoutingView, v).tier_tokens(i)
            counts = self.tier_hit_tokens
            for t in range(4):
                counts[t] += by_tier[t]
            if fetched and not self._global:  # a pull: its tokens come from another node
                counts[2] += fetched
        self._last_row = row = (now, n_in, i, ttft, queue, transfer, prefill, hit, fetched)
        self._rows.append(row)
        if self._listeners and engine is None:  # batching: told when its iterations are formed (_collect)
            heapq.heappush(self._feedback, (self.instances[i].busy_until, k, i, ttft))
        self._last_index = k
        self._i = k + 1
        if self._observer is None:  # the exact view is the policy's (the hot path): made when read
            self._built = False
        else:
            self._observer.dispatched(i, pull)
            if self.external_clock:  # the caller runs the pool to the next arrival before the view
                self._built = False
            else:
                self._next_view()

    def skip(self) -> RoutingView | None:
        """Pass over the pending request without dispatching it (the cluster simulator's admission
        rejected it): it takes no prefill and touches no cache; returns the next view."""
        self.pass_over()
        view = self.view
        if self._feedback:
            self._deliver()
        return view

    def pass_over(self) -> None:
        """``skip`` without making the next view."""
        if self._i >= len(self._arrival):
            raise RuntimeError("skip: the trace is exhausted; call reset()")
        self._last_row = None
        self._i += 1
        if self._observer is None or self.external_clock:  # the view made when read (_next_view then)
            self._built = False
        else:
            self._next_view()

    def sync(self, t: float) -> None:
        """Batching: form every prefill iteration that starts before ``t`` on every instance; each
        request they end gets its real TTFT in the results and is listed in ``prefill_ends``
        (request, first token time). Nothing without batching."""
        if not self._batched or self.external_clock:
            return
        if self._pipelined:  # the engines hold one another: every iteration in one order of time
            engines = [cast(PrefillEngine, inst.engine) for inst in self.instances]
            while True:
                best, best_s = -1, t
                for i, engine in enumerate(engines):
                    if engine.waiting:
                        s = engine.next_start()
                        if s < best_s:
                            best, best_s = i, s
                if best < 0:
                    break
                self.form(best, best_s)
            for engine in engines:
                engine.advance(t)  # (nothing left before t: the estimates at t)
            return
        for inst in self.instances:
            one = inst.engine
            assert one is not None
            if one.waiting:
                one.advance(t)
                if one.ended:
                    self._collect(one)

    def form(self, i: int, s: float) -> float:
        """Batching driven from outside: form instance ``i``'s iteration starting at ``s``; returns
        its end (the requests it ends are listed in ``prefill_ends``)."""
        engine = self.instances[i].engine
        assert engine is not None
        end = engine.form(s)
        if engine.ended:
            self._collect(engine)
        return end

    def pull_arrived(self, k: int, i: int, t: float) -> None:
        """Request ``k``'s deferred pull reached instance ``i`` at ``t``: it is ready to prefill."""
        engine = self.instances[i].engine
        assert engine is not None
        engine.ready(k, t)

    def _collect(self, engine: PrefillEngine) -> None:
        """The real TTFTs of the requests ``engine`` ended, into their rows and ``prefill_ends``."""
        rows, row_of, ends = self._rows, self._row_of, self.prefill_ends
        for k, end in engine.ended:
            pos = row_of.pop(k)
            now, n_in, i, _, _, transfer, prefill, hit, fetched = rows[pos]
            ttft = end - now
            wait = ttft - transfer - prefill
            row = (now, n_in, i, ttft, wait if wait > 0.0 else 0.0, transfer, prefill, hit, fetched)
            rows[pos] = row
            if pos == len(rows) - 1 and self._last_row is not None:
                self._last_row = row
            ends.append((k, end))
            if self._listeners:
                heapq.heappush(self._feedback, (end, k, i, ttft))
        engine.ended.clear()

    def finish(self) -> None:
        """Batching: form every remaining iteration (the pool drains); nothing without batching."""
        self.sync(math.inf)

    def result(self, policy: str = "?") -> RoutingResult:
        self.finish()
        res = RoutingResult(policy, self.trace.name, self.config, self._rows, self.instances, self.cost)
        if self._tiers is not None:  # where the hits came from: own DRAM, own SSD, another node's
            d, s, rd, rs = self.tier_hit_tokens
            res.metrics.update(dram_hit_tokens=d, ssd_hit_tokens=s, remote_hit_tokens=rd + rs,
                               ssd_evictions=sum(c.lower.evictions for c in self._caches if c.lower is not None))
        return res


def simulate(trace: Trace, policy: Callable, config: RoutingConfig | None = None, cost: CostModel | None = None,
             seed: int = 0, observation=None, engine: str | None = None) -> RoutingResult:
    """Route every request of ``trace`` with ``policy`` (``policy(view) -> action``) and return the metrics.

    ``observation``: what the policy sees (``mooncake_gym.sim.observation``; default exact). Its noise,
    if any, is drawn from a generator spawned from ``seed``, apart from the policy's own.

    ``engine``: ``"native"`` runs the whole loop in the native engine (docs/engine.md; the policies
    of ``mooncake_gym._engine.routing.NATIVE_POLICIES``, the production routers among them, on the
    exact view, else a ``ValueError`` saying why), ``"python"`` this module; None (default) the native engine where the run is native
    (``mooncake_gym.engine()`` says whether it is built) and this module otherwise. Both give the same
    numbers (tests/test_engine_routing.py)."""
    sim = RoutingSimulator(trace, config, cost, observation, observation_rng(seed), seed=seed)
    reset_policy(policy, seed)
    sim.listen(policy)
    chosen = _engine.resolve(engine)
    if chosen == "native":
        why = _native_routing.unsupported(sim, policy)
        if why is None:
            rows, pool = _native_routing.run(sim, policy)
            return RoutingResult(policy_name(policy), sim.trace.name, sim.config, rows, pool, sim.cost)
        if engine == "native":
            raise ValueError(f"engine: 'native' cannot run this: {why}; pass engine='python'")
    view = sim.view
    while view is not None:
        view = sim.step(policy(view))
    return sim.result(policy_name(policy))
