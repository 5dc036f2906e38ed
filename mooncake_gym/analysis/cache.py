"""Cache analysis: token hit rate versus capacity of one global prefix cache.

The first question asked of a KV-cache trace: how much prefill could caching save, and how much
capacity does it take? (Mooncake v3, Table 1.) For each capacity this module
replays the trace through one global cache under each eviction policy and reports the token hit
rate, beside the ceiling of an infinite cache:

``lru``
    :class:`~mooncake_gym.sim.prefixcache.PrefixCache`, the same cache the routing simulator uses.
``fifo``
    The same class with ``eviction="fifo"``.
``rlt`` (on request, not in the default set)
    The same class with ``eviction="rlt"``: randomized leaf eviction (ICLR'26, arXiv 2601.18999).
``optimal``
    Belady's rule on the prefix tree, an upper bound for eviction policies (see
    :func:`_replay_optimal` for the exact rule).
``ceiling``
    An infinite cache: every block seen before is a hit.

Semantics are those of ``kvcache-simulator`` (``pip install kvcache-simulator``, the Mooncake team's
hit-rate tool); the tests compare every figure with it:

* A request hits the longest run of its leading blocks that are cached; hit tokens =
  ``min(hit_blocks * block_tokens, input_length)`` (the last block may be partial).
* Blocks are nodes of the trace's *prefix tree*: a block is identified by its id together with the
  path before it. For prefix-hashed traces (Mooncake's) this is the block id itself; for a trace
  whose ids are not prefix hashes, the same id after different prefixes is a different block.
* ``window="second-half"`` warms the cache on the first ``floor(n / 2)`` requests and measures the
  rest (the oracle's convention); ``window="all"`` measures every request from an empty cache.
  Requests without blocks (``input_length`` 0) are left out of ``n``, as the oracle skips them.
* ``full_before_window`` says whether the cache filled up during the warm-up half. The oracle omits
  a capacity whose cache did not ("not under memory pressure yet"), and every larger one; we
  report the figure and carry the flag (the table marks it with ``*``).

Known difference from the oracle's LRU: when the blocks one request inserts overflow a cache that
holds nothing but that request's own leading blocks, the oracle evicts the block it has just
inserted (the only evictable leaf), finds the next block's parent gone and stops, so it keeps one
block fewer than the capacity; our LRU keeps ``capacity`` leading blocks. This needs a request at
least as long as the cache; at capacities above the longest request, every practical case, the
figures are identical (the tests check both).

Python use (notebooks, tests)::

    from mooncake_gym.model.workload import read_trace
    from mooncake_gym.analysis.cache import analyze_cache
    a = analyze_cache(read_trace("trace.jsonl"), blocks=[3000, 10000], window="second-half")
    a.hit_rates("lru"), a.ceiling.hit_rate, a.rows()
"""

from __future__ import annotations

import heapq
import math
import operator
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from mooncake_gym.model.costmodel import BLOCK_TOKENS, get_model
from mooncake_gym.model.limits import LIMITS, check
from mooncake_gym.sim.prefixcache import PrefixCache, eviction_rng

POLICIES = ("lru", "fifo", "optimal")
#: Every policy the analysis knows: :data:`POLICIES` (the default set) and, on request, ``rlt``
#: (randomized leaf eviction, ``PrefixCache(eviction="rlt")``, its draws from ``eviction_rng(0)``).
KNOWN_POLICIES = POLICIES + ("rlt",)
WINDOWS = ("all", "second-half")
DEFAULT_BLOCKS = (1000, 3000, 10000, 30000)
DEFAULT_MODEL = "llama2-70b"
BYTES_PER_GIB = 2**30


# --------------------------------------------------------------------------------------------
# Capacities and argument parsing
# --------------------------------------------------------------------------------------------
def gib_to_blocks(gib: float, model: str = DEFAULT_MODEL, block_tokens: int = BLOCK_TOKENS) -> int:
    """Whole blocks of ``model``'s KV that fit in ``gib`` GiB: floor(GiB * 2**30 / (block_tokens *
    kv_bytes_per_token)), the oracle's rounding (3,000 LLaMA-70B blocks = 468.75 GiB)."""
    check("gib", gib)
    bytes_per_block = block_tokens * get_model(model).kv_bytes_per_token
    return math.floor(gib * BYTES_PER_GIB / bytes_per_block)


def blocks_to_gib(blocks: int, model: str = DEFAULT_MODEL, block_tokens: int = BLOCK_TOKENS) -> float:
    """GiB of ``model``'s KV in ``blocks`` blocks of ``block_tokens`` tokens."""
    return blocks * block_tokens * get_model(model).kv_bytes_per_token / BYTES_PER_GIB


def parse_blocks(text: str | Iterable[int]) -> list[int]:
    """``"1000,3000"`` (or a list) -> sorted distinct positive block counts; ValueError otherwise."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            if isinstance(item, bool):
                raise TypeError(item)
            v = int(item.strip()) if isinstance(item, str) else operator.index(item)  # ints, numpy ints
        except (TypeError, ValueError):
            v = 0
        if not LIMITS["blocks"].lo <= v <= LIMITS["blocks"].hi:
            raise ValueError(f"blocks: expected comma-separated positive integers up to {LIMITS['blocks'].hi:,} "
                             f"(e.g. 1000,3000), got {text!r}")
        out.append(v)
    if not out:
        raise ValueError(f"blocks: expected at least one capacity, got {text!r}")
    return sorted(set(out))


def parse_gib(text: str | Iterable[float]) -> list[float]:
    """``"468.75,1562.5"`` (or a list) -> positive GiB figures; ValueError otherwise."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            v = float(item.strip() if isinstance(item, str) else item)
        except (TypeError, ValueError):
            v = float("nan")
        if not (LIMITS["gib"].lo <= v <= LIMITS["gib"].hi):
            raise ValueError(f"gib: expected comma-separated numbers of GiB in [{LIMITS['gib'].lo:g}, "
                             f"{LIMITS['gib'].hi:g}] (e.g. 468.75,1562.5), got {text!r}")
        out.append(v)
    if not out:
        raise ValueError(f"gib: expected at least one capacity, got {text!r}")
    return out


def parse_policies(text: str | Iterable[str]) -> list[str]:
    """``"lru,optimal"`` (or a list) -> policy names in the given order, without repeats."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        p = str(item).strip().lower()
        if p not in KNOWN_POLICIES:
            raise ValueError(f"policies: expected a comma-separated subset of {','.join(KNOWN_POLICIES)}, got {text!r}")
        if p not in out:
            out.append(p)
    if not out:
        raise ValueError(f"policies: expected at least one of {','.join(POLICIES)}, got {text!r}")
    return out


# --------------------------------------------------------------------------------------------
# The trace as paths in its prefix tree
# --------------------------------------------------------------------------------------------
class PrefixTree:
    """The requests of a trace as paths of node ids in its prefix tree (node 0 is the root).

    ``paths[r]`` are request r's blocks as nodes (numbered 1, 2, ... in order of first appearance),
    ``parent[node]`` the node before it, ``input_tokens[r]`` its prompt length. Requests without
    blocks are dropped (``kept`` maps back to trace indices). ``next_use`` (built on first use)
    gives, for each block of each request, the index of the next request containing that block
    (``len(paths)`` if none).
    """

    __slots__ = ("paths", "parent", "input_tokens", "kept", "block_tokens", "_next_use")

    def __init__(self, trace, block_tokens: int = BLOCK_TOKENS):
        if not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens: expected a positive integer, got {block_tokens!r}")
        index: dict[tuple[int, int], int] = {}
        parent = [0]
        paths: list[list[int]] = []
        inputs: list[int] = []
        kept: list[int] = []
        for r, (n_in, ids) in enumerate(zip(trace.input_tokens.tolist(), trace.block_ids)):
            if len(ids) != -(-n_in // block_tokens):
                raise ValueError(
                    f"trace: request {r} has {len(ids)} block ids but input_length {n_in} needs "
                    f"ceil({n_in}/{block_tokens}) = {-(-n_in // block_tokens)}"
                )
            if not ids:
                continue
            p = 0
            path = []
            for b in ids:
                key = (p, b)
                node = index.get(key)
                if node is None:
                    node = index[key] = len(parent)
                    parent.append(p)
                path.append(node)
                p = node
            paths.append(path)
            inputs.append(n_in)
            kept.append(r)
        self.paths = paths
        self.parent = parent
        self.input_tokens = inputs
        self.kept = kept
        self.block_tokens = block_tokens
        self._next_use: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def n_blocks(self) -> int:
        """Distinct blocks (nodes of the tree other than the root)."""
        return len(self.parent) - 1

    @property
    def next_use(self) -> list[list[int]]:
        if self._next_use is None:
            never = len(self.paths)
            last = [never] * len(self.parent)
            out: list[list[int]] = [None] * len(self.paths)  # type: ignore[list-item]
            for r in range(len(self.paths) - 1, -1, -1):
                path = self.paths[r]
                out[r] = [last[x] for x in path]
                for x in path:
                    last[x] = r
            self._next_use = out
        return self._next_use

    def warmup_requests(self, window: str) -> int:
        """Requests replayed before the measured window begins."""
        if window not in WINDOWS:
            raise ValueError(f"window: expected one of {', '.join(WINDOWS)}, got {window!r}")
        return len(self.paths) // 2 if window == "second-half" else 0


# --------------------------------------------------------------------------------------------
# The replays
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheResult:
    """One policy at one capacity: measured hit and total tokens, and whether the cache was full
    before the measured window began (``None`` for ``window="all"``, which has no warm-up)."""

    policy: str
    capacity_blocks: int | None
    hit_tokens: int
    total_tokens: int
    full_before_window: bool | None

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "capacity_blocks": self.capacity_blocks,
            "hit_rate": self.hit_rate,
            "hit_tokens": self.hit_tokens,
            "total_tokens": self.total_tokens,
            "full_before_window": self.full_before_window,
        }


def _replay_cache(tree: PrefixTree, capacity: int, warmup: int, eviction: str) -> tuple[int, bool]:
    """LRU, FIFO or RLT through :class:`PrefixCache`: (measured hit tokens, full before the window)."""
    cache = PrefixCache(capacity, eviction=eviction, rng=eviction_rng(0) if eviction == "rlt" else None)
    match, insert = cache.match, cache.insert
    bt = tree.block_tokens
    hit = 0
    full = False
    for r, (path, n_in) in enumerate(zip(tree.paths, tree.input_tokens)):
        k = match(path)
        if r >= warmup:
            if k:
                hit += min(k * bt, n_in)
        insert(path)
        if not full and r < warmup and len(cache) >= capacity:
            full = True
    return hit, full


def _replay_optimal(tree: PrefixTree, capacity: int, warmup: int) -> tuple[int, bool]:
    """Belady's rule on the prefix tree: (measured hit tokens, full before the window).

    Only leaves (cached blocks with no cached extension) may be evicted, so no cached block ever
    loses its prefix. Per request: the leading cached blocks are hits and take the index of their
    next use (the next request containing them) as their key. The missing blocks are then inserted
    first to last; when the cache is full, the victim is the leaf whose next use is farthest (ties:
    the block created last). If the new block's own next use is no sooner than the victim's, it is
    not inserted (bypass), and neither is the rest of the request. These are kvcache-simulator's
    rules, read from its source and checked on thousands of small random traces.

    Why no block of the current request is ever a victim (the oracle protects its hits explicitly;
    here it follows from the keys): the parent of a new block is in every request the new block is
    in, so its next use is no later than the new block's, while a victim's must be strictly later.
    The parent is the only block of this request that can be a leaf (the deepest hit, or the block
    inserted just before), so a victim is always off the request's path.

    Leaves sit in a heap keyed (-next use, -node) with lazy invalidation: an entry is stale when its
    node is gone, has a cached child, or has another key, and is dropped when popped. A node's next
    use only grows, so an entry that is not stale carries the node's current key. Each eviction
    pops stale entries at most once, so a replay costs O(events log events).
    """
    paths, parent, inputs, next_use = tree.paths, tree.parent, tree.input_tokens, tree.next_use
    bt = tree.block_tokens
    n_nodes = len(parent)
    present = bytearray(n_nodes)
    children = [0] * n_nodes
    key = [0] * n_nodes
    heap: list[tuple[int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    size = 0
    hit = 0
    full = False
    for r in range(len(paths)):
        path = paths[r]
        nxt = next_use[r]
        m = len(path)
        k = 0
        while k < m and present[path[k]]:
            key[path[k]] = nxt[k]
            k += 1
        if k:
            if r >= warmup:
                hit += min(k * bt, inputs[r])
            deepest = path[k - 1]
            if not children[deepest]:
                push(heap, (-nxt[k - 1], -deepest))
        for j in range(k, m):
            if size >= capacity:
                while heap:
                    entry = heap[0]
                    victim = -entry[1]
                    if present[victim] and not children[victim] and key[victim] == -entry[0]:
                        break
                    pop(heap)  # stale
                else:
                    break  # nothing to evict (cannot happen with capacity >= 1; kept for safety)
                if key[victim] <= nxt[j]:
                    break  # bypass: the new block is needed no sooner than the victim
                pop(heap)
                present[victim] = 0
                size -= 1
                p = parent[victim]
                children[p] -= 1
                if p and not children[p]:
                    push(heap, (-key[p], -p))
            node = path[j]
            present[node] = 1
            size += 1
            children[parent[node]] += 1
            key[node] = nxt[j]
            push(heap, (-nxt[j], -node))
            if r < warmup and size >= capacity:
                full = True
    return hit, full


def _replay_ceiling(tree: PrefixTree, warmup: int) -> int:
    """Measured hit tokens of an infinite cache."""
    seen = bytearray(len(tree.parent))
    bt = tree.block_tokens
    hit = 0
    for r, (path, n_in) in enumerate(zip(tree.paths, tree.input_tokens)):
        k = 0
        m = len(path)
        while k < m and seen[path[k]]:
            k += 1
        if r >= warmup and k:
            hit += min(k * bt, n_in)
        for x in path[k:]:  # a block seen implies its prefix seen, so the rest are all new
            seen[x] = 1
    return hit


def _measured_tokens(tree: PrefixTree, warmup: int) -> int:
    return sum(tree.input_tokens[warmup:])


def simulate_cache(trace, capacity_blocks: int, policy: str = "lru", window: str = "all",
                   block_tokens: int = BLOCK_TOKENS, tree: PrefixTree | None = None) -> CacheResult:
    """Replay ``trace`` through one global cache of ``capacity_blocks`` blocks under ``policy``."""
    if policy not in KNOWN_POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(KNOWN_POLICIES)}, got {policy!r}")
    if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1:
        raise ValueError(f"capacity_blocks: expected a positive integer, got {capacity_blocks!r}")
    tree = tree if tree is not None else PrefixTree(trace, block_tokens)
    warmup = tree.warmup_requests(window)
    if policy == "optimal":
        hit, full = _replay_optimal(tree, capacity_blocks, warmup)
    else:
        hit, full = _replay_cache(tree, capacity_blocks, warmup, policy)
    return CacheResult(policy, capacity_blocks, hit, _measured_tokens(tree, warmup),
                       full if window == "second-half" else None)


def cache_ceiling(trace, window: str = "all", block_tokens: int = BLOCK_TOKENS,
                  tree: PrefixTree | None = None) -> CacheResult:
    """The infinite cache: the hit rate no capacity or policy can exceed."""
    tree = tree if tree is not None else PrefixTree(trace, block_tokens)
    warmup = tree.warmup_requests(window)
    return CacheResult("ceiling", None, _replay_ceiling(tree, warmup), _measured_tokens(tree, warmup), None)


# --------------------------------------------------------------------------------------------
# The analysis: every capacity x every policy
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CachePoint:
    """All policies at one capacity."""

    capacity_blocks: int
    capacity_gib: float
    results: dict[str, CacheResult]

    def to_dict(self) -> dict:
        return {
            "capacity_blocks": self.capacity_blocks,
            "capacity_gib": self.capacity_gib,
            **{p: {k: v for k, v in r.to_dict().items() if k not in ("policy", "capacity_blocks")}
               for p, r in self.results.items()},
        }


@dataclass(frozen=True)
class CacheAnalysis:
    """Hit rate versus capacity of one trace (see the module docstring)."""

    trace_name: str
    window: str
    policies: tuple[str, ...]
    requests: int
    warmup_requests: int
    measured_tokens: int
    distinct_blocks: int
    block_tokens: int
    model: str
    kv_bytes_per_token: int
    ceiling: CacheResult
    points: list[CachePoint] = field(default_factory=list)

    @property
    def capacities(self) -> list[int]:
        return [pt.capacity_blocks for pt in self.points]

    def hit_rates(self, policy: str) -> list[float]:
        """``policy``'s hit rate at each capacity, in order of :attr:`capacities`."""
        if policy not in self.policies:
            raise ValueError(f"policy: expected one of {', '.join(self.policies)}, got {policy!r}")
        return [pt.results[policy].hit_rate for pt in self.points]

    def rows(self) -> list[dict]:
        """One row per capacity and a last ``infinite`` row: blocks, gib and each policy's hit rate."""
        out = []
        for pt in self.points:
            row = {"blocks": pt.capacity_blocks, "gib": pt.capacity_gib}
            for p in self.policies:
                row[p] = pt.results[p].hit_rate
            out.append(row)
        out.append({"blocks": "infinite", "gib": None, **{p: self.ceiling.hit_rate for p in self.policies}})
        return out

    def to_dict(self) -> dict:
        return {
            "trace": self.trace_name,
            "window": self.window,
            "requests": self.requests,
            "warmup_requests": self.warmup_requests,
            "measured_requests": self.requests - self.warmup_requests,
            "measured_tokens": self.measured_tokens,
            "distinct_blocks": self.distinct_blocks,
            "block_tokens": self.block_tokens,
            "model": self.model,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "policies": list(self.policies),
            "ceiling": {k: v for k, v in self.ceiling.to_dict().items() if k != "policy"},
            "points": [pt.to_dict() for pt in self.points],
        }


def analyze_cache(trace, blocks: Sequence[int] | str | None = None, gib: Sequence[float] | str | None = None,
                  model: str = DEFAULT_MODEL, policies: Sequence[str] | str = POLICIES, window: str = "all",
                  block_tokens: int = BLOCK_TOKENS) -> CacheAnalysis:
    """Hit rate of one global cache of each capacity under each policy, plus the infinite ceiling.

    Capacities are ``blocks`` (block counts) or ``gib`` (GiB of ``model``'s KV, converted with
    :func:`gib_to_blocks`), not both; neither gives :data:`DEFAULT_BLOCKS`. ``window`` is ``"all"``
    or ``"second-half"``. Capacities are sorted and de-duplicated.
    """
    if window not in WINDOWS:
        raise ValueError(f"window: expected one of {', '.join(WINDOWS)}, got {window!r}")
    pols = parse_policies(policies)
    m = get_model(model)
    if blocks is not None and gib is not None:
        raise ValueError("blocks, gib: give the capacities in blocks or in GiB, not both")
    if gib is not None:
        caps = []
        for g in parse_gib(gib):
            b = gib_to_blocks(g, m, block_tokens)
            if b < 1:
                raise ValueError(f"gib: {g:g} GiB holds no whole {block_tokens}-token block of {m.name} "
                                 f"({blocks_to_gib(1, m, block_tokens):g} GiB per block)")
            caps.append(b)
        caps = sorted(set(caps))
    else:
        caps = parse_blocks(DEFAULT_BLOCKS if blocks is None else blocks)
    tree = PrefixTree(trace, block_tokens)
    warmup = tree.warmup_requests(window)
    points = []
    for cap in caps:
        results = {p: simulate_cache(trace, cap, p, window, block_tokens, tree=tree) for p in pols}
        points.append(CachePoint(cap, blocks_to_gib(cap, m, block_tokens), results))
    return CacheAnalysis(
        trace_name=getattr(trace, "name", "trace"),
        window=window,
        policies=tuple(pols),
        requests=len(tree),
        warmup_requests=warmup,
        measured_tokens=_measured_tokens(tree, warmup),
        distinct_blocks=tree.n_blocks,
        block_tokens=block_tokens,
        model=m.name,
        kv_bytes_per_token=m.kv_bytes_per_token,
        ceiling=cache_ceiling(trace, window, block_tokens, tree=tree),
        points=points,
    )


# --------------------------------------------------------------------------------------------
# Local versus global KV store (FAST'25 Figure 10)
# --------------------------------------------------------------------------------------------
#: The routers :func:`compare_stores` runs by default: the cache-aware router (no pulls: what a node
#: reuses is exactly what its store lets it read) and the two cache-blind ones.
STORE_ROUTERS = ("cache", "load", "random")
#: FAST'25 Figure 10's cluster: 10 prefill nodes, each with about 3 M tokens of DRAM cache.
FIGURE10_PREFILL_NODES = 10


def compare_stores(trace, preset="mooncake", n_prefill: int = FIGURE10_PREFILL_NODES,
                   routers: Sequence[str] | str = STORE_ROUTERS, ssd: Sequence[bool] = (False, True),
                   eviction: str = "lru", seed: int = 0) -> list[dict]:
    """FAST'25 Figure 10 re-measured: each prefill node reading only its own KV store (``"local"``)
    against Mooncake Store's pool, where any node reads any node's cached blocks over RDMA
    (``"global"``), on ``trace``'s own arrivals through ``preset``'s prefill pool resized to
    ``n_prefill`` nodes (its DRAM cache per node; with ``ssd`` True, the SSD tier ``SSD_TIER`` below
    it). One row per (SSD tier, router, store): the token hit ratio, its shares by tier, mean and P90
    TTFT, the mean prefill time (transfer + prefill, queue left out) and the tokens computed."""
    from mooncake_gym.baselines import make_policy
    from mooncake_gym.model.presets import KV_STORES, SSD_TIER, get_preset
    from mooncake_gym.sim.routing import simulate

    p = get_preset(preset)
    names = [r.strip() for r in routers.split(",")] if isinstance(routers, str) else list(routers)
    rows = []
    for with_ssd in ssd:
        for name in names:
            for store in KV_STORES:
                tiers = p.with_(n_prefill=n_prefill, kv_store=store, eviction=eviction,
                                **(SSD_TIER if with_ssd else {"ssd_cache_blocks": 0}))
                res = simulate(trace, make_policy("routing", name), tiers.routing_config(), p.prefill_cost, seed)
                m = res.metrics
                total = m["input_tokens"]
                ssd_hits = m.get("ssd_hit_tokens", 0)
                remote = m.get("remote_hit_tokens", m["fetched_tokens"])
                rows.append({
                    "ssd": bool(with_ssd), "router": name, "store": store,
                    "hit_ratio": m["hit_ratio"],
                    "dram_share": (m["hit_tokens"] - ssd_hits - remote) / total if total else float("nan"),
                    "ssd_share": ssd_hits / total if total else float("nan"),
                    "remote_share": remote / total if total else float("nan"),
                    "mean_ttft_s": m["mean_ttft_s"], "p90_ttft_s": m["p90_ttft_s"],
                    "mean_prefill_s": float((res.prefill_s + res.transfer_s).mean()),
                    "computed_tokens": m["computed_tokens"],
                })
    return rows
