"""A prefix cache of KV blocks with LRU eviction, shared by the routing simulator and the cache analysis.

Semantics (Mooncake's prefix hashing, ``shared/spec/mooncake.md``): a block id names the block
together with every block before it, so a request hits the longest run of its *leading* blocks
that are all cached and a hit stops at the first missing block. A block cached while a block
before it is gone could never be hit again; to avoid leaving such orphans, a request's blocks are
touched and inserted from its last block back to its first, so a prefix is always at least as
recent as anything that extends it and LRU evicts extensions before their prefixes.

Match and insert cost O(blocks touched): the cache is an insertion-ordered dict used as an LRU
list (``move_to_end`` on touch, ``popitem(last=False)`` to evict); nothing scans the whole cache.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixCache:
    """An LRU cache of at most ``capacity_blocks`` block ids (``None`` = unbounded)."""

    __slots__ = ("capacity_blocks", "_blocks", "evictions")

    def __init__(self, capacity_blocks: int | None):
        if capacity_blocks is not None and (not isinstance(capacity_blocks, int) or capacity_blocks < 0):
            raise ValueError(f"capacity_blocks: expected an integer >= 0 or None, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def blocks_lru_first(self) -> list[int]:
        """The cached block ids from least to most recently used (for tests and rendering)."""
        return list(self._blocks)

    def match(self, block_ids: Sequence[int]) -> int:
        """Number of leading blocks of ``block_ids`` that are cached. Does not touch anything."""
        blocks = self._blocks
        k = 0
        for b in block_ids:
            if b not in blocks:
                break
            k += 1
        return k

    def insert(self, block_ids: Sequence[int], n_blocks: int | None = None) -> None:
        """Touch or insert the first ``n_blocks`` of ``block_ids`` (all by default), last to first,
        then evict least recently used blocks until the cache fits its capacity."""
        blocks = self._blocks
        ids = block_ids if n_blocks is None else block_ids[:n_blocks]
        for b in reversed(ids):
            if b in blocks:
                blocks.move_to_end(b)
            else:
                blocks[b] = None
        cap = self.capacity_blocks
        if cap is not None:
            while len(blocks) > cap:
                blocks.popitem(last=False)
                self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.evictions = 0
