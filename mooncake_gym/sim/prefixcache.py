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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

EVICTION_POLICIES = ("lru", "fifo")


class PrefixCache:
    """A cache of at most ``capacity_blocks`` block ids (``None`` = unbounded); ``eviction`` is
    ``"lru"`` (the default) or ``"fifo"`` (see the module docstring)."""

    __slots__ = ("capacity_blocks", "_blocks", "evictions", "eviction", "_fifo")

    # (arguments checked here, not typed: compiled, a type would raise TypeError before the check)
    def __init__(self, capacity_blocks: Any, eviction: Any = "lru"):
        if capacity_blocks is not None and (not isinstance(capacity_blocks, int) or capacity_blocks < 0):
            raise ValueError(f"capacity_blocks: expected an integer >= 0 or None, got {capacity_blocks!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction: expected one of {EVICTION_POLICIES}, got {eviction!r}")
        self.capacity_blocks: int | None = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.eviction: str = eviction
        self._fifo = eviction == "fifo"

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def blocks_lru_first(self) -> list[int]:
        """The cached block ids from least to most recently used (for tests and rendering)."""
        return list(self._blocks)

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
            return
        if self._fifo:
            return self._insert_fifo(block_ids, n_blocks)
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
            for _ in range(excess):
                popitem(last=False)
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
