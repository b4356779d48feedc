"""Prefix reuse on hand-made hash lists (expected values worked out by hand in the comments)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from llmcap.trace.prefix import hit_tokens, leading_reuse_lru, leading_reuse_unbounded, summarise_prefix

HASHES = pa.array(
    [
        [1, 2, 3],  # r0: nothing seen yet → 0
        [1, 2, 4],  # r1: 1, 2 seen (r0), 4 new → 2
        [5, 1, 2],  # r2: 5 new → 0 (only a *leading* run counts)
        [1, 2, 4, 6],  # r3: 1, 2, 4 seen → 3
        [],  # r4: no blocks → 0
        None,  # r5: unknown → 0
        [7, 7],  # r6: 7 is not in an *earlier* request → 0
    ],
    pa.list_(pa.int64()),
)


def test_unbounded_leading_reuse() -> None:
    assert leading_reuse_unbounded(HASHES).tolist() == [0, 2, 0, 3, 0, 0, 0]


def test_lru_reuse_with_eviction() -> None:
    # capacity 3: after r0 cache=[1,2,3]; r1 hits 1,2 → 2, inserts 4 → evict 3 → [1,2,4];
    # r2: 5 misses → 0; cache after = [4,5,1,2] → evict 4 → [5,1,2];
    # r3: 1, 2 hit, 4 evicted → 2; a large cache behaves like the unbounded one.
    assert leading_reuse_lru(HASHES, 3).tolist()[:4] == [0, 2, 0, 2]
    assert leading_reuse_lru(HASHES, 1_000).tolist() == leading_reuse_unbounded(HASHES).tolist()


def test_hit_tokens_capped_by_prompt() -> None:
    assert hit_tokens(np.array([0, 2, 3]), np.array([100, 1_500, 1_200]), 512).tolist() == [0, 1_024, 1_200]


def test_summary_ratios() -> None:
    hashes = pa.array([[1, 2], [1, 2], [1, 3]], pa.list_(pa.int64()))
    isl = np.array([1_024, 1_000, 1_024])
    s = summarise_prefix(hashes, isl, 512, [1])
    # reuse blocks [0, 2, 1] → tokens [0, min(1024,1000)=1000, 512] over ISL 3048
    assert s.ideal_hit_ratio == (1_000 + 512) / 3_048
    assert s.ideal_block_hit_ratio == 3 / 6
    assert (s.requests_reusing_ge1_block, s.requests_reusing_ge2_blocks) == (2 / 3, 1 / 3)
    assert (s.unique_blocks, s.total_blocks) == (3, 6)
    # LRU of one block: r1 looks up 1 → evicted (cache holds 2) → 0; r2 looks up 1 → cache holds 2 → 0
    assert s.lru_hit_ratio == {1: 0.0}


def _lru_reference(lists: list[list[int]], capacity: int) -> list[int]:
    """The cache itself, block by block: look every block of a request up, then touch them in order."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for blocks in lists:
        k = 0
        for h in blocks:
            if h not in cache:
                break
            k += 1
        out.append(k)
        for h in blocks:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return out


def test_stack_distances_give_the_lru_of_every_capacity() -> None:
    from llmcap.trace.prefix import reuse_at, stack_distances

    rng = np.random.default_rng(3)
    for trial in range(20):
        lists = [rng.integers(0, 12 + trial, int(rng.integers(0, 8))).tolist() for _ in range(60)]
        arr = pa.array(lists, pa.list_(pa.int64()))
        distances, offsets = stack_distances(arr)
        for capacity in (1, 2, 3, 5, 8, 13, 40):
            assert reuse_at(distances, offsets, capacity).tolist() == _lru_reference(lists, capacity), (trial, capacity)
