"""The block pool: plain blocks first, then whole LRU segments, oldest first; the host tier keeps evictions."""

from __future__ import annotations

import pytest

from llmcap.sim.kvcache import KVCache, Run


def test_lru_eviction_order_and_host_tier() -> None:
    kv = KVCache(10, host_blocks=4)
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
    assert (kv.free, kv.plain, [k for k, _ in kv.evictable()], list(kv.host or {})) == (3, 1, [1], [2])
    kv.acquire(kv.segments[1])  # a hit takes the segment out of the free pool
    assert (kv.free, kv.used) == (1, 9) and kv.evictable() == []
    assert kv.host_take(2) == 2 and kv.host_take(2) == 0


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
        assert (lazy.free, lazy.plain, lazy.n_lru, lazy.evictions) == (plain.free, plain.plain, plain.n_lru, plain.evictions)
        assert any(isinstance(s, Run) and not s.gone for s in lazy.order) == (n == 12)
