"""A prefix cache of KV blocks with LRU eviction, shared by the routing simulator and the cache analysis.

Semantics (Mooncake's prefix hashing, ``shared/spec/mooncake.md``): a block id names the block
together with every block before it, so a request hits the longest run of its *leading* blocks
that are all cached and a hit stops at the first missing block. A block cached while a block
before it is gone could never be hit again; to avoid leaving such orphans, a request's blocks are
touched and inserted from its last block back to its first, so a prefix is always at least as
recent as anything that extends it and LRU evicts extensions before their prefixes.

Match and insert cost O(blocks touched): the cache is an insertion-ordered dict used as an LRU
list (``move_to_end`` on touch, ``popitem(last=False)`` to evict); nothing scans the whole cache.

``eviction="fifo"`` (for the cache analysis, ``cacheanalysis``) evicts in order of first insertion
instead: a hit renews nothing, and a request's missing blocks enter first to last, the order it
presents them, as the FIFO of ``kvcache-simulator`` (the Mooncake team's hit-rate tool) does. FIFO
therefore *can* evict a prefix before its extension, leaving blocks that can never be hit again
until they age out (one reason FIFO trails LRU on the Mooncake traces).

``eviction="rlt"`` is randomized leaf eviction (Wu, Silwal and Zhang, "Randomization Boosts KV
Caching, Learning Balances Query Load", ICLR'26, arXiv 2601.18999): the cached blocks form a prefix
tree (a block's parent is the block before it in the request that brought it), and eviction removes
a uniformly random *leaf*, a cached block no cached block extends, drawn from the generator ``rng``
(the simulator's, so the same seed gives the same numbers). A request's blocks are all inserted
first, then leaves are evicted until the cache fits (one of them may be the request's own last
block). The leaves are kept in a list with each one's position, so a draw and an eviction cost
O(1). A hit renews nothing (no recency is kept).

KV storage tiers (Mooncake Store: DRAM with an SSD tier below it): a cache built with
``lower=PrefixCache(ssd_blocks)`` (an LRU cache) *demotes* every block it evicts into ``lower``
(in eviction order, each the most recently used there), and ``lower`` evicts by LRU. The tiers are
exclusive: inserting a request's blocks moves those found in ``lower`` back up (promotion), so a
block is in one tier of a node at most. :func:`match_tiers` gives a request's hit across the two
tiers, block by block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

EVICTION_POLICIES = ("lru", "fifo", "rlt")
#: Where a hit block is, for a node reading it (``match_tiers``, the routing view's ``hit_tier_tokens``):
#: its own DRAM, its own SSD, another node's DRAM, another node's SSD (those two over RDMA).
DRAM, SSD, REMOTE_DRAM, REMOTE_SSD = 0, 1, 2, 3


class PrefixCache:
    """A cache of at most ``capacity_blocks`` block ids (``None`` = unbounded); ``eviction`` is
    ``"lru"`` (the default), ``"fifo"`` or ``"rlt"`` (randomized leaf eviction, drawing from
    ``rng``, a numpy Generator); ``lower``: None, or the LRU cache of the tier below (the SSD), which
    takes the blocks this one evicts (see the module docstring)."""

    __slots__ = ("capacity_blocks", "_blocks", "evictions", "eviction", "_fifo", "lower", "_rlt", "_rng",
                 "_parent", "_children", "_leaves", "_leaf_at")

    # (arguments checked here, not typed: compiled, a type would raise TypeError before the check)
    def __init__(self, capacity_blocks: Any, eviction: Any = "lru", lower: Any = None, rng: Any = None):
        if capacity_blocks is not None and (not isinstance(capacity_blocks, int) or capacity_blocks < 0):
            raise ValueError(f"capacity_blocks: expected an integer >= 0 or None, got {capacity_blocks!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction: expected one of {EVICTION_POLICIES}, got {eviction!r}")
        if lower is not None and (not isinstance(lower, PrefixCache) or lower.eviction != "lru"
                                  or lower.lower is not None):
            raise ValueError("lower: expected None or an LRU PrefixCache with no tier below it (the SSD tier)")
        if eviction == "rlt" and not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: eviction='rlt' draws its leaves from a numpy Generator, got {rng!r}")
        if lower is not None and eviction == "fifo":
            raise ValueError("lower: an SSD tier is kept below an 'lru' or 'rlt' cache, not 'fifo'")
        self.capacity_blocks: int | None = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.eviction: str = eviction
        self._fifo = eviction == "fifo"
        self.lower: PrefixCache | None = lower
        self._rlt = eviction == "rlt"
        self._rng = rng
        # rlt: the prefix tree of the cached blocks (parent, cached children) and its leaves
        self._parent: dict[int, int | None] = {}
        self._children: dict[int, int] = {}
        self._leaves: list[int] = []
        self._leaf_at: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def blocks_lru_first(self) -> list[int]:
        """The cached block ids from least to most recently used (for tests and rendering; under
        ``"rlt"`` in the order they were inserted)."""
        return list(self._blocks)

    def leaves(self) -> list[int]:
        """``"rlt"``: the cached blocks no cached block extends (the blocks eviction draws from)."""
        return sorted(self._leaves)

    def match(self, block_ids: Sequence[int]) -> int:
        """Number of leading blocks of ``block_ids`` that are cached. Does not touch anything."""
        return match_all((self,), block_ids)[0]

    def insert(self, block_ids: Sequence[int], n_blocks: int | None = None) -> None:
        """Touch or insert the first ``n_blocks`` of ``block_ids`` (all by default), last to first,
        then evict least recently used blocks until the cache fits its capacity.

        With ``eviction="fifo"``: add the missing ones first to last (cached ones keep their place),
        each evicting the oldest insertion when the cache is full. The check is made block by block,
        so a block this request found cached but that its own earlier insertions pushed out is
        added again (kvcache-simulator's order; it decides a few hits on small caches)."""
        ids = block_ids if n_blocks is None else block_ids[:n_blocks]
        if self.capacity_blocks == 0:  # holds nothing (the admission problem's pool): all evicted at once
            self.evictions += len(ids) if self._fifo else len(set(ids))
            if self.lower is not None:  # straight down, in the order LRU would evict them
                self.lower._demote(list(dict.fromkeys(reversed(ids))))
            return
        if self._fifo:
            return self._insert_fifo(block_ids, n_blocks)
        lower = self.lower
        if lower is not None:  # promotion: the request's blocks leave the tier below
            below = lower._blocks
            for b in ids:
                if b in below:
                    del below[b]
        if self._rlt:
            return self._insert_rlt(ids)
        blocks = self._blocks
        for b in reversed(ids):
            if b in blocks:
                blocks.move_to_end(b)
            else:
                blocks[b] = None
        cap = self.capacity_blocks
        if cap is not None and len(blocks) > cap:
            excess = len(blocks) - cap
            popitem = blocks.popitem
            if lower is None:
                for _ in range(excess):
                    popitem(last=False)
            else:
                lower._demote([popitem(last=False)[0] for _ in range(excess)])
            self.evictions += excess

    def _insert_rlt(self, ids: Sequence[int]) -> None:
        blocks, parent, children = self._blocks, self._parent, self._children
        leaves, leaf_at = self._leaves, self._leaf_at
        prev = None
        for b in ids:  # first to last: a block's parent is in the cache before it
            if b not in blocks:
                blocks[b] = None
                parent[b] = prev
                children[b] = 0
                leaf_at[b] = len(leaves)
                leaves.append(b)
                if prev is not None:
                    c = children[prev]
                    children[prev] = c + 1
                    if c == 0:
                        self._unleaf(prev)
            prev = b
        cap = self.capacity_blocks
        if cap is None or len(blocks) <= cap:
            return
        demoted = []
        integers = self._rng.integers
        while len(blocks) > cap:
            b = leaves[int(integers(len(leaves)))]
            self._unleaf(b)
            del blocks[b]
            del children[b]
            p = parent.pop(b)
            if p is not None:
                c = children[p] - 1
                children[p] = c
                if c == 0:
                    leaf_at[p] = len(leaves)
                    leaves.append(p)
            demoted.append(b)
            self.evictions += 1
        if self.lower is not None:
            self.lower._demote(demoted)

    def _unleaf(self, b: int) -> None:
        leaves, leaf_at = self._leaves, self._leaf_at
        k = leaf_at.pop(b)
        last = leaves.pop()
        if last != b:
            leaves[k] = last
            leaf_at[last] = k

    def _demote(self, evicted: list[int]) -> None:
        """Take the blocks the tier above evicted, in its eviction order, each the most recently
        used here; then evict least recently used blocks until the cache fits."""
        blocks = self._blocks
        for b in evicted:
            blocks[b] = None
            blocks.move_to_end(b)
        cap = self.capacity_blocks
        if cap is not None and len(blocks) > cap:
            excess = len(blocks) - cap
            for _ in range(excess):
                blocks.popitem(last=False)
            self.evictions += excess

    def _insert_fifo(self, block_ids: Sequence[int], n_blocks: int | None) -> None:
        blocks = self._blocks
        cap = self.capacity_blocks
        for b in block_ids if n_blocks is None else block_ids[:n_blocks]:
            if b not in blocks:
                blocks[b] = None
                if cap is not None and len(blocks) > cap:
                    blocks.popitem(last=False)
                    self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.evictions = 0
        self._parent.clear()
        self._children.clear()
        self._leaves.clear()
        self._leaf_at.clear()
        if self.lower is not None:
            self.lower.clear()


def match_all(caches: Sequence[PrefixCache], block_ids: Sequence[int]) -> list[int]:
    """``[cache.match(block_ids) for cache in caches]`` in one call: the routing simulator matches
    every instance's cache at each arrival, and this is its hot path."""
    hits = []
    for cache in caches:
        blocks = cache._blocks
        k = 0
        for b in block_ids:
            if b not in blocks:
                break
            k += 1
        hits.append(k)
    return hits


def match_tiers(own: PrefixCache, block_ids: Sequence[int], pool: Sequence[int] | None = None) -> list[int]:
    """The tier of each leading block of ``block_ids`` that node ``own`` can read, up to the first
    it cannot: :data:`DRAM` (in ``own``), :data:`SSD` (in ``own.lower``) and, with ``pool`` (the
    global store's tiers of the same blocks, :func:`pool_tiers`), the remote tier where ``own`` holds
    neither. Touches nothing."""
    mine = own._blocks
    below = own.lower._blocks if own.lower is not None else None
    tiers: list[int] = []
    for j, b in enumerate(block_ids if pool is None else block_ids[:len(pool)]):
        if b in mine:
            tiers.append(DRAM)
        elif below is not None and b in below:
            tiers.append(SSD)
        elif pool is not None:
            tiers.append(pool[j])
        else:
            break
    return tiers


def pool_tiers(pool: Sequence[PrefixCache], block_ids: Sequence[int]) -> list[int]:
    """The global store's view of a request: for each leading block held by some node of ``pool``,
    :data:`REMOTE_DRAM` if some node holds it in DRAM, else :data:`REMOTE_SSD`; up to the first block
    no node holds (the ``pool`` argument of :func:`match_tiers`)."""
    tiers: list[int] = []
    for b in block_ids:
        if any(b in c._blocks for c in pool):
            tiers.append(REMOTE_DRAM)
        elif any(c.lower is not None and b in c.lower._blocks for c in pool):
            tiers.append(REMOTE_SSD)
        else:
            break
    return tiers


def eviction_rng(seed) -> np.random.Generator:
    """The generator of a run's ``"rlt"`` eviction draws: spawned from ``seed``'s generator apart from
    the observation's noise (``observation.observation_rng``, the first child) and the policy's."""
    parent = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return parent.spawn(2)[1]
