"""The block pool: plain blocks first, then whole LRU segments, oldest first; the offload tiers keep evictions, each
passing what it evicts to the next."""

from __future__ import annotations

import pytest

from llmcap.sim.kvcache import KVCache, Run


def test_lru_eviction_order_and_host_tier() -> None:
    kv = KVCache(10, tier_blocks=(4,))
    kv.alloc(6)  # a request takes 6 blocks and publishes two segments of 2
    kv.register(1, 2)
    kv.register(2, 2)
    with pytest.raises(KeyError, match="cached already"):
        kv.register(1, 2)
    kv.drop(2)  # freed tail first, as vLLM frees a request's blocks in reverse
    kv.drop(1)
    kv.release(2)  # its 2 unhashed blocks
    assert (kv.free, kv.plain, [k for k, _ in kv.evictable()]) == (10, 6, [2, 1])
    kv.alloc(7)  # 6 plain, then segment 2 (the oldest) goes whole: 1 block left plain
    assert (kv.free, kv.plain, [k for k, _ in kv.evictable()], list(kv.tiers[0].entries)) == (3, 1, [1], [2])
    kv.acquire(kv.segments[1])  # a hit takes the segment out of the free pool
    assert (kv.free, kv.used) == (1, 9) and kv.evictable() == []
    assert kv.tier_take(2, 0) == 2 and kv.tier_take(2, 0) == 0


def _evicted(kv: KVCache, *keys: int) -> None:
    """Publish each key as a 2-block segment, free it, and evict it from HBM (in that order)."""
    for key in keys:
        kv.alloc(2)
        kv.register(key, 2)
        kv.drop(key)
        kv.alloc(kv.free)  # takes the plain blocks and evicts the segment
        kv.release(kv.num_blocks)


def test_tiers_cascade_nearest_first_and_a_segment_lives_in_one_place() -> None:
    kv = KVCache(2, tier_blocks=(4, 2))  # host holds two 2-block segments, the SSD one
    _evicted(kv, 1, 2, 3)  # host [1, 2] is full: 3 pushes 1 down to the SSD
    assert [list(t.entries) for t in kv.tiers] == [[2, 3], [1]]
    _evicted(kv, 4)  # 2 goes down, pushing 1 off the end
    assert [list(t.entries) for t in kv.tiers] == [[3, 4], [2]] and [t.used for t in kv.tiers] == [4, 2]
    m = kv.match_prefix([3, 2, 9], [2, 4, 6], cap=6)  # 3 from the host, 2 from the SSD, 9 nowhere
    assert [(k, nb, level) for k, nb, level in m.host_hits] == [(3, 2, 0), (2, 2, 1)]
    assert (m.tier_blocks, m.searched, m.chained, m.host_blocks) == ([2, 2], 2, False, 4)
    assert kv.match_prefix([4], [2], cap=2).searched == 1  # found on the first tier: the second is not asked
    _evicted(kv, 2)  # recomputed while its copy sat on the SSD: the copy goes, the new one is on the host
    assert [list(t.entries) for t in kv.tiers] == [[4, 2], [3]]


def test_private_segment_round_trip() -> None:
    kv = KVCache(8)
    kv.alloc(5)
    kv.keep_private(("p", 0), 3)
    kv.release(2)
    assert (kv.free, kv.plain) == (8, 5)
    assert kv.take_private(("p", 0)) == 3 and (kv.free, kv.plain) == (5, 5)


def test_lru_skips_stale_entries_and_compacts() -> None:
    kv = KVCache(100_000)
    kv.alloc(90_000)
    for key in range(30_000):  # evictable, then taken back by a hit, many times: stale entries pile up
        kv.register(key, 3)
        kv.drop(key)
        if key % 3:
            kv.acquire(kv.segments[key])
    live = [k for k in range(30_000) if k % 3 == 0]
    assert [k for k, _ in kv.evictable()] == live
    assert len(kv.order) <= 2 * kv.n_lru + 4096 and kv.n_lru == len(live)  # compacted along the way
    kv.drop(1)  # back to evictable: now the newest
    assert kv.evictable()[-1] == (1, 3) and kv.evictable()[0] == (0, 3)
    kv.alloc(kv.plain + 4)  # evicts the two oldest live segments, skipping stale entries
    assert [k for k, _ in kv.evictable()][:2] == [live[2], live[3]] and 0 not in kv.segments and 3 not in kv.segments


def test_a_singleton_run_evicts_like_its_separate_segments() -> None:
    # one request's chain (block ends his) freed two ways: five segments published and dropped tail first,
    # or its last three (singletons) as one Run; eviction must go the same way, member by member
    his = [2, 4, 4, 7, 9]  # the third segment is empty (bs larger than the trace block)
    keys = [10, 11, 12, 13, 14]
    plain, lazy = KVCache(20), KVCache(20)
    for kv in (plain, lazy):
        kv.alloc(9)
        kv.register(10, 2)
        kv.register(11, 2)
    for key, nb in ((13, 3), (14, 2)):
        plain.register(key, nb)
    for key in (14, 13, 11, 10):
        plain.drop(key)
    lazy.unpin_run(Run(keys, his, 2, 5, 5), 2)
    lazy.drop(11)
    lazy.drop(10)
    assert lazy.evictable() == plain.evictable() == [(14, 2), (13, 3), (11, 2), (10, 2)]
    assert (lazy.free, lazy.plain, lazy.n_lru) == (plain.free, plain.plain, plain.n_lru) == (20, 11, 4)
    # 11 plain blocks: take 12 (evicts one run member), then 3 (the rest of the run, its empty member skipped),
    # then 2 (a published segment)
    for n, left in ((12, [13, 11, 10]), (3, [11, 10]), (2, [10])):
        for kv in (plain, lazy):
            kv.alloc(n)
        assert [k for k, _ in lazy.evictable()] == [k for k, _ in plain.evictable()] == left
        assert (lazy.free, lazy.plain, lazy.n_lru, lazy.evictions) == (
            plain.free,
            plain.plain,
            plain.n_lru,
            plain.evictions,
        )
        assert any(isinstance(s, Run) and not s.gone for s in lazy.order) == (n == 12)
