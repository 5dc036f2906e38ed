"""The LRU prefix cache: exact behaviour, a property test against a naive model, and orphans."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_gym.sim.prefixcache import PrefixCache


# --- exact behaviour on hand-made sequences ---------------------------------------------------------
def test_match_counts_leading_cached_blocks_and_stops_at_the_first_miss():
    cache = PrefixCache(None)
    cache.insert([1, 2, 3])
    assert cache.match([1, 2, 3, 4]) == 3
    assert cache.match([1, 2, 9, 3]) == 2  # 3 is cached but comes after a miss
    assert cache.match([9, 1, 2]) == 0
    assert cache.match([]) == 0
    assert cache.match([1]) == 1


def test_match_does_not_touch():
    cache = PrefixCache(None)
    cache.insert([1, 2])
    cache.insert([3])
    before = cache.blocks_lru_first()
    cache.match([2, 1])
    cache.match([1, 2])
    assert cache.blocks_lru_first() == before


def test_insert_runs_last_to_first_so_a_prefix_is_more_recent_than_its_extension():
    cache = PrefixCache(None)
    cache.insert([1, 2, 3])
    assert cache.blocks_lru_first() == [3, 2, 1]
    cache.insert([1, 2, 4, 5])
    assert cache.blocks_lru_first() == [3, 5, 4, 2, 1]
    cache.insert([6])
    assert cache.blocks_lru_first() == [3, 5, 4, 2, 1, 6]


def test_insert_first_n_blocks_only():
    cache = PrefixCache(None)
    cache.insert([1, 2, 3, 4], n_blocks=2)
    assert cache.blocks_lru_first() == [2, 1]
    cache.insert([7, 8], n_blocks=0)
    assert cache.blocks_lru_first() == [2, 1]


def test_eviction_order_is_least_recently_used_first():
    cache = PrefixCache(4)
    cache.insert([1, 2])      # 2 1
    cache.insert([3, 4])      # 2 1 4 3
    cache.insert([1])         # 2 4 3 1
    assert cache.blocks_lru_first() == [2, 4, 3, 1] and cache.evictions == 0
    cache.insert([5, 6])      # 2 4 3 1 6 5 -> evict 2, 4
    assert cache.blocks_lru_first() == [3, 1, 6, 5]
    assert cache.evictions == 2
    assert 2 not in cache and 4 not in cache and 3 in cache
    assert cache.match([1, 2]) == 1 and cache.match([3, 4]) == 1


def test_a_request_longer_than_the_cache_keeps_its_prefix():
    cache = PrefixCache(3)
    cache.insert([1, 2, 3, 4, 5])
    assert cache.blocks_lru_first() == [3, 2, 1]
    assert cache.match([1, 2, 3, 4, 5]) == 3
    assert cache.evictions == 2


def test_capacity_zero_caches_nothing():
    cache = PrefixCache(0)
    cache.insert([1, 2, 3])
    assert len(cache) == 0 and cache.match([1]) == 0 and cache.evictions == 3


def test_unbounded_cache_never_evicts():
    cache = PrefixCache(None)
    for start in range(0, 10_000, 100):
        cache.insert(list(range(start, start + 100)))
    assert len(cache) == 10_000 and cache.evictions == 0


def test_clear():
    cache = PrefixCache(2)
    cache.insert([1, 2, 3])
    cache.clear()
    assert len(cache) == 0 and cache.evictions == 0 and cache.match([1]) == 0


@pytest.mark.parametrize("capacity", [-1, 2.5, "10"])
def test_invalid_capacity_names_the_parameter(capacity):
    with pytest.raises(ValueError, match="^capacity_blocks:"):
        PrefixCache(capacity)


# --- property test against a naive model ---------------------------------------------------------
class NaiveLRU:
    """The documented rule, written as plainly as possible: a list from least to most recently used;
    insert touches the given blocks from last to first, then drops from the front down to capacity."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.order = []
        self.evictions = 0

    def match(self, ids):
        k = 0
        while k < len(ids) and ids[k] in self.order:
            k += 1
        return k

    def insert(self, ids, n_blocks=None):
        ids = list(ids) if n_blocks is None else list(ids)[:n_blocks]
        for b in reversed(ids):
            if b in self.order:
                self.order.remove(b)
            self.order.append(b)
        while self.capacity is not None and len(self.order) > self.capacity:
            self.order.pop(0)
            self.evictions += 1


def tree_paths(max_depth=6, fanout=3):
    """Requests as paths in a prefix tree: a list of branch choices; the id of a block is the id of
    the path that leads to it, so ids obey prefix-hash semantics."""
    return st.lists(st.integers(0, fanout - 1), min_size=0, max_size=max_depth)


class TreeIds:
    def __init__(self):
        self.ids = {}

    def __call__(self, path):
        return [self.ids.setdefault(tuple(path[: i + 1]), len(self.ids)) for i in range(len(path))]

    def parent(self):
        return {b: (self.ids[p[:-1]] if len(p) > 1 else None) for p, b in self.ids.items()}


operations = st.lists(
    st.tuples(st.sampled_from(["insert", "insert_n", "match"]), tree_paths(), st.integers(0, 6)),
    min_size=1, max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.one_of(st.none(), st.integers(0, 12)), ops=operations)
def test_cache_agrees_with_the_naive_model(capacity, ops):
    cache, model, ids_of = PrefixCache(capacity), NaiveLRU(capacity), TreeIds()
    for op, path, n in ops:
        ids = ids_of(path)
        if op == "match":
            assert cache.match(ids) == model.match(ids)
        elif op == "insert":
            cache.insert(ids)
            model.insert(ids)
        else:
            cache.insert(ids, n_blocks=n)
            model.insert(ids, n_blocks=n)
        assert cache.blocks_lru_first() == model.order
        assert cache.evictions == model.evictions
        assert len(cache) <= (capacity if capacity is not None else len(cache))


@settings(max_examples=300, deadline=None)
@given(capacity=st.one_of(st.none(), st.integers(0, 12)), ops=operations)
def test_no_cached_block_is_orphaned_when_ids_follow_prefix_semantics(capacity, ops):
    """With ids from a prefix tree, every cached block's predecessor is cached too: last-to-first
    insertion keeps every prefix more recent than its extensions, so LRU evicts leaves first."""
    cache, ids_of = PrefixCache(capacity), TreeIds()
    for op, path, n in ops:
        ids = ids_of(path)
        if op == "match":
            cache.match(ids)
        else:
            cache.insert(ids, n_blocks=None if op == "insert" else n)
        parent = ids_of.parent()
        order = cache.blocks_lru_first()
        rank = {b: i for i, b in enumerate(order)}
        for b in order:
            p = parent[b]
            assert p is None or p in cache, f"block {b} cached without its predecessor {p}"
            # the stronger invariant behind it: a predecessor is more recent than its extension
            assert p is None or rank[p] > rank[b]
        # so a cached block is always reachable: matching its path hits every block up to it
        for path_tuple, b in ids_of.ids.items():
            if b in cache:
                assert cache.match(ids_of(list(path_tuple))) == len(path_tuple)


def test_ids_that_break_prefix_semantics_can_leave_an_orphan():
    """The guarantee above needs prefix-hash ids. If one id appears after two different prefixes
    (a trace that violates Mooncake's format), LRU can keep it after evicting one of its prefixes."""
    cache = PrefixCache(2)
    cache.insert([1, 2])   # 2 1
    cache.insert([3, 2])   # 1 2 3 -> evicts 1
    assert cache.blocks_lru_first() == [2, 3]
    assert cache.match([1, 2]) == 0  # block 2 as the successor of 1 can no longer be hit


@pytest.mark.parametrize("eviction", ["lru", "fifo"])
def test_a_cache_of_no_blocks_holds_nothing_and_evicts_every_insert(eviction):
    # the admission problem's prefill pool (cache_blocks=0): what the general path would count
    cache = PrefixCache(0, eviction=eviction)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4, 5], n_blocks=3)
    assert cache.match([1, 2, 3]) == 0 and cache.evictions == 6
