"""Routing rules of production LLM routers, reimplemented over :class:`~mooncake_gym.sim.routing.RoutingView`.

Each class follows the published rule of one router, read from that router's own repository (the
docstrings name the file and the version read; no code was copied). Every rule trades prefix
overlap against load with hand-set constants; the constants are constructor arguments with the
published defaults, and ``KNOBS`` lists a grid around each default for tuning.

The simulator models prefill instances only (Mooncake's disaggregated prefill pool), so signals
these routers read from decode-capable engines are mapped onto what a prefill instance has; each
docstring states its mapping. The common ones:

* running / in-flight / pending requests -> ``view.queued_requests`` (dispatched, not finished,
  including the one in service);
* waiting (queued, not running) requests -> ``queued_requests - 1`` on a busy instance, else 0;
* active prefill tokens -> ``view.queued_tokens`` (computed prompt tokens of those requests);
* active KV blocks ("decode blocks") -> the distinct prompt blocks of the requests the router sent
  to an instance that have not finished (:class:`ActiveBlocks`: a prefill instance holds no
  decoding sequence, its KV memory in use is its in-flight prompts; requests sharing a prefix
  share its blocks, as in Dynamo's active-sequence tracker and vLLM's block pool);
* KV-cache utilisation -> those active blocks / ``cache_blocks`` (vLLM counts only blocks
  referenced by requests as used, cached-but-free blocks as free);
* prefix match -> ``view.hit_blocks`` / ``view.hit_tokens`` (the exact local hit: what a router
  with KV events from the instances sees; approximate indexes are an observation-mode question).

Blocks are Mooncake's 512-token blocks. None of these routers pulls a prefix from another instance
(that is Mooncake's own Algorithm 1, ``kvcentric``). Exact ties are broken at random with the
policy's seeded generator (:class:`baselines.routing._Seeded`), as the routers do.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

from mooncake_gym.model.costmodel import BLOCK_TOKENS
from mooncake_gym.sim.routing import Route, RoutingView

from mooncake_gym.baselines.routing import _Seeded


def _waiting(view: RoutingView) -> list[int]:
    """Requests waiting behind the one in service on each instance."""
    return [n - 1 if n > 0 else 0 for n in view.queued_requests]


class ActiveBlocks:
    """The distinct prompt blocks of the requests a router dispatched to each instance that have
    not finished, kept by the router itself as Dynamo's active-sequence tracker does (freed on
    completion): a block shared by several in-flight requests counts once. A request sent to
    instance ``i`` finishes at ``now + queue_s[i] + prefill_s[i]`` (exact in this simulator; none
    of these routers pulls)."""

    def __init__(self, n_instances: int):
        self.n_instances = n_instances
        self.refs: list[dict[int, int]] = [{} for _ in range(n_instances)]  # block -> in-flight requests
        self._finishing: list[tuple[float, int, int, tuple]] = []  # heap of (finish, order, instance, blocks)
        self._order = 0

    def expire(self, now: float) -> None:
        """Free the blocks of the requests finished by ``now``."""
        heap = self._finishing
        while heap and heap[0][0] <= now:
            _, _, i, ids = heapq.heappop(heap)
            refs = self.refs[i]
            for b in ids:
                if refs[b] == 1:
                    del refs[b]
                else:
                    refs[b] -= 1

    def add(self, view: RoutingView, i: int) -> None:
        """Record the view's request as sent to instance ``i``."""
        refs = self.refs[i]
        for b in view.block_ids:
            refs[b] = refs.get(b, 0) + 1
        heapq.heappush(self._finishing, (view.now + view.queue_s[i] + view.prefill_s[i], self._order, i,
                                         view.block_ids))
        self._order += 1

    def blocks(self) -> list[int]:
        """Distinct active blocks of each instance."""
        return [len(r) for r in self.refs]

    def new_blocks(self, block_ids) -> list[int]:
        """How many of ``block_ids`` each instance does not yet hold active."""
        return [sum(1 for b in block_ids if b not in r) for r in self.refs]


class _Picker(_Seeded):
    """Helpers shared by the production rules: argmax with random ties, choice among a subset."""

    def _argmax(self, scores) -> int:
        return self._argmin([-s for s in scores])

    def _pick(self, candidates: list[int]) -> int:
        return candidates[0] if len(candidates) == 1 else candidates[int(self.rng.integers(len(candidates)))]

    def _least(self, values, among=None) -> int:
        """Index with the smallest value (among ``among`` if given), ties at random."""
        idx = range(len(values)) if among is None else among
        best = min(values[i] for i in idx)
        return self._pick([i for i in idx if values[i] == best])

    def _active(self, view: RoutingView) -> ActiveBlocks:
        """This router's :class:`ActiveBlocks`, with what finished by ``view.now`` freed."""
        active = getattr(self, "_active_blocks", None)
        if active is None or active.n_instances != view.n_instances:
            active = self._active_blocks = ActiveBlocks(view.n_instances)
        active.expire(view.now)
        return active

    def reset(self, rng) -> None:
        super().reset(rng)
        self._active_blocks = None

    def __repr__(self) -> str:
        knobs = getattr(type(self), "KNOBS", {})
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in knobs)
        return f"{type(self).__name__}({args})"


def _check(name: str, value, ok: bool, expected: str):
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


class DynamoKV(_Picker):
    """``dynamo``: NVIDIA Dynamo's KV router (``ai-dynamo/dynamo``,
    ``lib/kv-router/src/scheduling/selector/default.rs``, ``DefaultWorkerScorer::worker_logit``, read
    at commit 07a6c9ce; defaults in ``lib/kv-router/src/scheduling/config.rs``, read at 0243c51b).

    For each worker, in blocks: ``cost = overlap_weight * max(0, (active_prefill_tokens + ISL) / B
    - credit * cached_blocks) + decode_blocks + active_request_weight * active_requests``; the
    lowest cost wins, ties at random. With ``temperature > 0`` a worker is sampled with probability
    proportional to ``exp(-(cost - min) / ((max - min) * temperature))`` (uniform when all costs are
    equal), Dynamo's softmax over normalised costs. ``overlap_weight`` is the ``prefill_load_scale``
    (formerly ``--kv-overlap-score-weight``), default 1; ``credit`` the device-hit credit
    ``overlap_score_credit``, default 1, in [0, 1] as Dynamo validates it (host/disk tiers and
    shared caches carry no extra credit here: every cached block is on the instance);
    ``active_request_weight`` (``decode_active_request_weight``) default 0; temperature default 0.
    Dynamo's router-side queue (``router_queue_threshold``: hold requests while every worker is
    busy) is not modelled: every request is dispatched on arrival, as the simulator requires.

    Mapping: active prefill tokens = ``queued_tokens``; cached blocks = ``hit_tokens / B`` (the
    local hit, B = 512); decode blocks = the worker's distinct active blocks plus the request's
    blocks it does not hold active yet (:class:`ActiveBlocks`, Dynamo's "active blocks + blocks
    projected for the incoming request"); active requests = ``queued_requests``.

    Dynamo's docs (``docs/components/router``, "Example calculation with overlap_score_weight =
    1.0") route a 10-block request among workers with 2/5/8 cached blocks and 10/5/9 decode blocks
    to worker 2 (costs 18, 10, 11); the unit tests replay it through :meth:`costs` and
    :meth:`choose`.
    """

    name = "dynamo"
    KNOBS = {"overlap_weight": [0.25, 0.5, 1.0, 2.0, 4.0], "temperature": [0.0, 0.1, 0.5, 1.0]}

    def __init__(self, overlap_weight: float = 1.0, temperature: float = 0.0, credit: float = 1.0,
                 active_request_weight: float = 0.0):
        super().__init__()
        self.overlap_weight = _check("overlap_weight", overlap_weight, overlap_weight >= 0, "a weight >= 0")
        self.temperature = _check("temperature", temperature, temperature >= 0, "a temperature >= 0")
        self.credit = _check("credit", credit, 0 <= credit <= 1, "a credit in [0, 1]")
        self.active_request_weight = _check("active_request_weight", active_request_weight,
                                            active_request_weight >= 0, "a weight >= 0")

    def costs(self, view: RoutingView, decode_blocks) -> list[float]:
        """Each worker's cost given its decode blocks."""
        b = BLOCK_TOKENS
        isl = view.input_tokens
        return [self.overlap_weight * max(0.0, (qt + isl) / b - self.credit * h / b) + d
                + self.active_request_weight * nq
                for qt, h, d, nq in zip(view.queued_tokens, view.hit_tokens, decode_blocks, view.queued_requests)]

    def choose(self, costs: list[float]) -> int:
        """The lowest cost (ties at random), or a softmax sample when ``temperature > 0``."""
        if self.temperature == 0:
            return self._argmin(costs)
        lo, hi = min(costs), max(costs)
        if hi == lo:
            return int(self.rng.integers(len(costs)))
        scale = (hi - lo) * self.temperature
        weights = [math.exp(-(c - lo) / scale) for c in costs]
        u = self.rng.random() * sum(weights)
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if u < acc:
                return i
        return len(weights) - 1

    def __call__(self, view: RoutingView) -> Route:
        active = self._active(view)
        decode = [a + new for a, new in zip(active.blocks(), active.new_blocks(view.block_ids))]
        i = self.choose(self.costs(view, decode))
        active.add(view, i)
        return Route(i)


class LlmD(_Picker):
    """``llmd``: the llm-d inference scheduler's default profile (``llm-d/llm-d-inference-scheduler``,
    ``pkg/epp/config/loader/defaults.go``, read at commit 159e739b: queue-scorer weight 2,
    kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker; scorers described in
    ``pkg/epp/framework/plugins/scheduling/scorer/{queuedepth,kvcacheutilization,prefix}/README.md``).

    Score = ``prefix_weight * matched/total blocks + queue_weight * (Qmax - Q)/(Qmax - Qmin) +
    kv_weight * (1 - KV%)``, highest wins, ties at random (the queue score is 1 for every instance
    when all queues are equal).

    Mapping: Q = waiting requests (``queued_requests - 1`` on a busy instance, the scorer reads
    vLLM's waiting-queue size); KV% = distinct blocks of the instance's in-flight requests
    (:class:`ActiveBlocks`) / ``cache_blocks``; matched blocks = ``hit_blocks`` (the default
    scorer's own index is approximate; here it is exact).
    """

    name = "llmd"
    KNOBS = {"prefix_weight": [1.0, 2.0, 3.0, 5.0], "queue_weight": [1.0, 2.0, 4.0], "kv_weight": [0.0, 1.0, 2.0]}

    def __init__(self, prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 2.0):
        super().__init__()
        for key, w in (("prefix_weight", prefix_weight), ("queue_weight", queue_weight), ("kv_weight", kv_weight)):
            setattr(self, key, _check(key, w, w >= 0, "a weight >= 0"))

    def scores(self, view: RoutingView, kv_usage) -> list[float]:
        """Each instance's weighted score given its KV-cache utilisation in [0, 1]."""
        q = _waiting(view)
        qmax, qmin = max(q), min(q)
        queue = [1.0] * len(q) if qmax == qmin else [(qmax - x) / (qmax - qmin) for x in q]
        total = len(view.block_ids)
        prefix = [k / total if total else 0.0 for k in view.hit_blocks]
        return [self.prefix_weight * p + self.queue_weight * s + self.kv_weight * (1.0 - u)
                for p, s, u in zip(prefix, queue, kv_usage)]

    def __call__(self, view: RoutingView) -> Route:
        active = self._active(view)
        kv = [min(1.0, a / c) if c > 0 else float(a > 0) for a, c in zip(active.blocks(), view.cache_blocks)]
        i = self._argmax(self.scores(view, kv))
        active.add(view, i)
        return Route(i)


class LlmDPrecise(LlmD):
    """``llmd_precise``: llm-d's "precise prefix-cache aware" profile (``llm-d/llm-d``,
    ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``, read at
    commit 019a3f3f:
    precise-prefix-cache-scorer weight 2, kv-cache-utilization-scorer 1, queue-scorer 1). Same
    scorers and mapping as :class:`LlmD`; the precise scorer reads the instances' KV events, which
    is what the exact view gives."""

    name = "llmd_precise"
    KNOBS = {"prefix_weight": [1.0, 2.0, 4.0], "queue_weight": [0.5, 1.0, 2.0], "kv_weight": [0.0, 1.0, 2.0]}

    def __init__(self, prefix_weight: float = 2.0, queue_weight: float = 1.0, kv_weight: float = 1.0):
        super().__init__(prefix_weight, queue_weight, kv_weight)


class SGLangCacheAware(_Picker):
    """``sglang``: the SGLang router's cache-aware policy (``sgl-project/sglang``,
    ``sgl-model-gateway/src/policies/cache_aware.rs``, read at commit 053b63ff).

    With L = each worker's load: if ``max L - min L > balance_abs_threshold`` (64) and ``max L >
    balance_rel_threshold * min L`` (1.5) the load is imbalanced and the least loaded worker
    wins. Otherwise the worker with the longest prefix match is taken if the match rate (matched /
    request length) exceeds ``cache_threshold`` (0.3), else the least loaded worker. The version
    read falls back to the least loaded worker; its header comment and older builds say "the
    worker with the smallest tree" (most free cache), which this class does not model.

    Mapping: L = ``queued_requests`` (the router's pending-request count); match = ``hit_tokens /
    input_tokens`` (the router's approximate radix tree matches characters; the exact view is used
    here). Ties at random.
    """

    name = "sglang"
    KNOBS = {"cache_threshold": [0.1, 0.3, 0.5, 0.7], "balance_abs_threshold": [4, 16, 64],
             "balance_rel_threshold": [1.1, 1.5, 2.0]}

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5):
        super().__init__()
        self.cache_threshold = _check("cache_threshold", cache_threshold, 0 <= cache_threshold <= 1,
                                      "a match rate in [0, 1]")
        self.balance_abs_threshold = _check("balance_abs_threshold", balance_abs_threshold,
                                            balance_abs_threshold >= 0, "a request count >= 0")
        self.balance_rel_threshold = _check("balance_rel_threshold", balance_rel_threshold,
                                            balance_rel_threshold >= 1, "a ratio >= 1")

    def __call__(self, view: RoutingView) -> Route:
        load = view.queued_requests
        lmax, lmin = max(load), min(load)
        if lmax - lmin > self.balance_abs_threshold and lmax > self.balance_rel_threshold * lmin:
            return Route(self._least(load))
        hits = view.hit_tokens
        best = self._argmax(hits)
        if view.input_tokens and hits[best] / view.input_tokens > self.cache_threshold:
            return Route(best)
        return Route(self._least(load))


class _QPSWindow(_Picker):
    """Requests this router sent to each instance in the last ``window_s`` seconds (vLLM
    production-stack's request stats: ``--request-stats-window``, default 60 s)."""

    window_s = 60.0

    def reset(self, rng) -> None:
        super().reset(rng)
        self._sent: list[deque] | None = None

    def _qps_counts(self, view: RoutingView) -> list[int]:
        if getattr(self, "_sent", None) is None or len(self._sent) != view.n_instances:
            self._sent = [deque() for _ in range(view.n_instances)]
        start = view.now - self.window_s
        for d in self._sent:
            while d and d[0] <= start:
                d.popleft()
        return [len(d) for d in self._sent]

    def _lowest_qps(self, view: RoutingView) -> int:
        return self._least(self._qps_counts(view))

    def _sent_to(self, view: RoutingView, i: int) -> Route:
        self._qps_counts(view)
        self._sent[i].append(view.now)
        return Route(i)


class VLLMPrefix(_QPSWindow):
    """``vllm_prefix``: vLLM production-stack's prefix-aware router (``vllm-project/production-stack``,
    ``src/vllm_router/routers/routing_logic.py``, ``PrefixAwareRouter``, and
    ``src/vllm_router/prefix/hashtrie.py``; read at commit 008a23bd).

    The request goes to an instance with the longest prefix match, chosen at random among those
    with that match; with no match anywhere every instance ties (the trie returns all available
    endpoints), so the choice is uniform. Load is not considered. Newer releases add
    ``--prefix-min-match-length``: below it the router falls back to the endpoint with the lowest
    QPS; ``min_match_tokens`` (default 0: the version read) models it, with QPS counted over the
    router's 60-s request-stats window.

    Mapping: prefix match = ``hit_blocks`` (the router's hash trie holds every prompt it routed and
    never evicts; the exact view is used here).
    """

    name = "vllm_prefix"
    KNOBS = {"min_match_tokens": [0, 512, 2048, 8192]}

    def __init__(self, min_match_tokens: int = 0):
        super().__init__()
        self.min_match_tokens = _check("min_match_tokens", min_match_tokens, min_match_tokens >= 0, "tokens >= 0")

    def __call__(self, view: RoutingView) -> Route:
        hits = view.hit_blocks
        best = max(hits)
        if self.min_match_tokens and best * BLOCK_TOKENS < self.min_match_tokens:
            return self._sent_to(view, self._lowest_qps(view))
        return self._sent_to(view, self._pick([i for i, k in enumerate(hits) if k == best]))


class VLLMKVAware(_QPSWindow):
    """``vllm_kvaware``: vLLM production-stack's KV-aware router (``vllm-project/production-stack``,
    ``src/vllm_router/routers/routing_logic.py``, ``KvawareRouter``; read at commit 008a23bd).

    The router asks LMCache's controller which instance holds the longest prefix of the prompt.
    If one does and it matched at least ``ISL - kv_aware_threshold`` tokens (default 2,000), the
    request goes there; otherwise it falls back to session affinity (no session ids reach the view)
    or, without a session, to the endpoint with the lowest QPS (an endpoint that received nothing
    in the request-stats window, 60 s, counts as lowest).

    Mapping: LMCache lookup = the instance caches (``hit_tokens``; among several holders of the
    longest prefix one is taken at random); QPS = requests this router sent to each instance in
    the last 60 s.
    """

    name = "vllm_kvaware"
    KNOBS = {"kv_aware_threshold": [500, 1000, 2000, 4000, 8000]}

    def __init__(self, kv_aware_threshold: int = 2000):
        super().__init__()
        self.kv_aware_threshold = _check("kv_aware_threshold", kv_aware_threshold, kv_aware_threshold >= 0,
                                         "tokens >= 0")

    def __call__(self, view: RoutingView) -> Route:
        best = view.best_hit_tokens
        if best > 0 and best >= max(view.input_tokens - self.kv_aware_threshold, 0):
            return self._sent_to(view, self._pick([i for i, h in enumerate(view.hit_tokens) if h == best]))
        return self._sent_to(view, self._lowest_qps(view))


class AIBrixPrefixCache(_Picker):
    """``aibrix``: AIBrix's prefix-cache router (``vllm-project/aibrix``,
    ``pkg/plugins/gateway/algorithms/prefix_cache.go``, ``routeOriginal``; read at commit 01de8a51).

    With R = each pod's running requests:

    1. load gate: if ``max R > imbalance_factor * (mean R + 1)`` (2.0) and ``max R - min R >=
       imbalance_min_gap`` (8), prefix matching is restricted to the pods with the fewest requests;
    2. pods with a prefix match are sorted by match percentage (descending), then R (ascending),
       ties shuffled; the first with ``R <= mean R + std_factor * std R`` wins (std_factor 1; mean
       and sample standard deviation over all pods);
    3. otherwise the pod with the fewest running requests (over all pods), ties at random.

    README and code disagree: ``algorithms/README.md`` describes an absolute gate ("max - min
    running requests > ABS_RUNNING_REQUEST_COUNT", default 16 in its text, 8 in its pseudo-code,
    routing straight to the least loaded pod) and a standard-deviation factor of 2; the code read
    uses the relative gate above with factor 2.0 and minimum gap 8, and factor 1. This class follows
    the code.

    Mapping: R = ``queued_requests``; match percentage = ``100 * hit_blocks / blocks`` (integer,
    as the router's).
    """

    name = "aibrix"
    KNOBS = {"imbalance_factor": [1.5, 2.0, 4.0], "imbalance_min_gap": [2, 4, 8, 16], "std_factor": [0.5, 1.0, 2.0]}

    def __init__(self, imbalance_factor: float = 2.0, imbalance_min_gap: int = 8, std_factor: float = 1.0):
        super().__init__()
        self.imbalance_factor = _check("imbalance_factor", imbalance_factor, imbalance_factor > 0, "a factor > 0")
        self.imbalance_min_gap = _check("imbalance_min_gap", imbalance_min_gap, imbalance_min_gap >= 0,
                                        "a request count >= 0")
        self.std_factor = _check("std_factor", std_factor, std_factor >= 0, "a factor >= 0")

    def __call__(self, view: RoutingView) -> Route:
        r = view.queued_requests
        n = len(r)
        mean = sum(r) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1)) if n > 1 else 0.0
        rmin, rmax = min(r), max(r)
        candidates = range(n)
        if rmax > self.imbalance_factor * (mean + 1) and rmax - rmin >= self.imbalance_min_gap:
            candidates = [i for i in range(n) if r[i] == rmin]
        total = len(view.block_ids)
        percent = [100 * k // total if total else 0 for k in view.hit_blocks]
        matched = [i for i in candidates if percent[i] > 0]
        order = [matched[j] for j in self.rng.permutation(len(matched))] if len(matched) > 1 else matched
        order.sort(key=lambda i: (-percent[i], r[i]))  # stable: shuffled ties stay shuffled
        limit = mean + self.std_factor * std
        for i in order:
            if r[i] <= limit:
                return Route(i)
        return Route(self._least(r))


class PrebleE2(_Picker):
    """``preble``: Preble's E2 scheduling (Srivatsa et al., "Preble: Efficient Distributed Prompt
    Scheduling for LLM Serving", ICLR 2025, §3; ``WukLab/preble``,
    ``multi_node/global_scheduler_with_time.py``, ``GlobalSchedulerWithTime.runtime_selector``, read
    at commit 0c962c4c).

    Exploit: if the longest cached prefix of the request is longer than its uncached rest, the
    request goes to an instance holding that prefix (the least loaded holder). Explore: otherwise
    to the instance with the least ``load + prefill cost``, where load is the prefill time of what
    it was sent within the last ``window_s`` seconds (180 s: Preble's 3-minute sliding-window
    histogram) and prefill cost is this request's prefill time there. Rebalancing: Preble moves
    prefixes off a GPU whose load runs ahead of the others; here an exploit whose holder's load
    exceeds ``rebalance_ratio`` (1.5) times the least load explores instead.

    Simplifications: the eviction cost term (prefill time of cached prefixes the request would
    evict, weighted by their recent hits) is left out; load counts prefill only (no decode here).

    Mapping: prefix = ``hit_tokens`` / ``best_hit_tokens``; prefill cost = ``prefill_s``; the
    window's load is this router's own record of the prefill times it dispatched.
    """

    name = "preble"
    KNOBS = {"window_s": [30.0, 60.0, 180.0, 600.0], "rebalance_ratio": [1.25, 1.5, 2.0, 4.0]}

    def __init__(self, window_s: float = 180.0, rebalance_ratio: float = 1.5):
        super().__init__()
        self.window_s = _check("window_s", window_s, window_s > 0, "seconds > 0")
        self.rebalance_ratio = _check("rebalance_ratio", rebalance_ratio, rebalance_ratio >= 1, "a ratio >= 1")
        self._history: deque | None = None

    def reset(self, rng) -> None:
        super().reset(rng)
        self._history = None

    def _loads(self, view: RoutingView) -> list[float]:
        if self._history is None or len(self._load) != view.n_instances:
            self._history = deque()  # (time, instance, prefill s) of each dispatch in the window
            self._load = [0.0] * view.n_instances
            self._count = [0] * view.n_instances
        start = view.now - self.window_s
        h = self._history
        while h and h[0][0] <= start:
            _, i, s = h.popleft()
            self._count[i] -= 1
            # an instance with nothing left in the window has load 0 exactly (no rounding residue)
            self._load[i] = self._load[i] - s if self._count[i] else 0.0
        return self._load

    def __call__(self, view: RoutingView) -> Route:
        load = self._loads(view)
        best = view.best_hit_tokens
        i = -1
        if best > view.input_tokens - best:
            holders = [j for j, h in enumerate(view.hit_tokens) if h == best]
            i = self._least(load, holders)
            if load[i] > self.rebalance_ratio * min(load):
                i = -1
        if i < 0:
            i = self._argmin([w + p for w, p in zip(load, view.prefill_s)])
        self._history.append((view.now, i, view.prefill_s[i]))
        load[i] += view.prefill_s[i]
        self._count[i] += 1
        return Route(i)


class LMetric(_Picker):
    """``lmetric``: the hyper-parameter-free LMetric rule as AIBrix implements it
    (``vllm-project/aibrix``, ``pkg/plugins/gateway/algorithms/l_metric_local.go``, router
    ``l-metric-local``, read at commit 2519ad59).

    ``score = (pending uncached tokens + this request's uncached tokens) * (pending requests + 1)``,
    lowest wins, ties at random.

    Mapping: pending uncached tokens = ``queued_tokens``; this request's uncached tokens =
    ``input_tokens - hit_tokens``; pending requests = ``queued_requests``.
    """

    name = "lmetric"

    def __call__(self, view: RoutingView) -> Route:
        n = view.input_tokens
        return Route(self._argmin([(qt + n - h) * (nq + 1) for qt, h, nq in
                                   zip(view.queued_tokens, view.hit_tokens, view.queued_requests)]))


class PowerOfTwoChoices(_Picker):
    """``p2c``: the power of d choices (Mitzenmacher 2001; Envoy's ``LEAST_REQUEST`` load balancer
    samples ``choice_count`` = 2 hosts and takes the one with fewer active requests): ``choices``
    distinct instances drawn uniformly, the one with the fewest ``queued_requests`` wins (ties at
    random). Ignores caches: a load-only reference."""

    name = "p2c"
    KNOBS = {"choices": [2, 3, 4]}

    def __init__(self, choices: int = 2):
        super().__init__()
        self.choices = _check("choices", choices, isinstance(choices, int) and choices >= 1, "an integer >= 1")

    def __call__(self, view: RoutingView) -> Route:
        d = min(self.choices, view.n_instances)
        sample = [int(i) for i in self.rng.choice(view.n_instances, size=d, replace=False)]
        return Route(self._least(view.queued_requests, sample))


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a fixed, platform-independent 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class ConsistentHashBoundedLoad(_Picker):
    """``chbl``: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, SODA 2018,
    arXiv 1608.01350; HAProxy's ``hash-balance-factor``). Each instance has ``virtual_nodes`` points
    on a hash ring; the request's key is the id of its ``prefix_blocks``-th block (with prefix
    hashing that id names the whole leading prefix, so requests sharing it share a key). Walking the
    ring clockwise from the key, the first instance whose load is below ``ceil(balance * (L + 1) /
    n)`` (L = total load) takes the request. ``balance`` 1.25 is the paper's example and HAProxy's
    recommended 125; ``prefix_blocks`` has no published default (1 here). Deterministic: no ties.

    Mapping: load = ``queued_requests``.
    """

    name = "chbl"
    KNOBS = {"balance": [1.1, 1.25, 1.5, 2.0], "prefix_blocks": [1, 2, 4, 8]}

    def __init__(self, balance: float = 1.25, prefix_blocks: int = 1, virtual_nodes: int = 100):
        super().__init__()
        self.balance = _check("balance", balance, balance >= 1, "a factor >= 1")
        self.prefix_blocks = _check("prefix_blocks", prefix_blocks,
                                    isinstance(prefix_blocks, int) and prefix_blocks >= 1, "an integer >= 1")
        self.virtual_nodes = _check("virtual_nodes", virtual_nodes,
                                    isinstance(virtual_nodes, int) and virtual_nodes >= 1, "an integer >= 1")
        self._ring: tuple[int, list[int], list[int]] | None = None  # (instances, point hashes, owners)

    def _ring_for(self, n: int) -> tuple[list[int], list[int]]:
        if self._ring is None or self._ring[0] != n:
            points = sorted((_mix64(i * 1_000_003 + v), i) for i in range(n) for v in range(self.virtual_nodes))
            self._ring = (n, [p for p, _ in points], [i for _, i in points])
        return self._ring[1], self._ring[2]

    def __call__(self, view: RoutingView) -> Route:
        n = view.n_instances
        keys, owners = self._ring_for(n)
        ids = view.block_ids
        key = _mix64(ids[min(self.prefix_blocks, len(ids)) - 1]) if ids else 0
        load = view.queued_requests
        cap = math.ceil(self.balance * (sum(load) + 1) / n)
        start = bisect.bisect_left(keys, key)
        for step in range(len(keys)):
            i = owners[(start + step) % len(keys)]
            if load[i] < cap:
                return Route(i)
        raise AssertionError("unreachable: some instance is below the bounded-load capacity")


PRODUCTION_ROUTING_POLICIES = {
    "dynamo": DynamoKV,
    "llmd": LlmD,
    "llmd_precise": LlmDPrecise,
    "sglang": SGLangCacheAware,
    "vllm_prefix": VLLMPrefix,
    "vllm_kvaware": VLLMKVAware,
    "aibrix": AIBrixPrefixCache,
    "preble": PrebleE2,
    "lmetric": LMetric,
    "p2c": PowerOfTwoChoices,
    "chbl": ConsistentHashBoundedLoad,
}
