"""The block pool: plain blocks first, then whole LRU segments, oldest first; the host tier keeps evictions."""

from __future__ import annotations

from llmcap.sim.kvcache import KVCache


def test_lru_eviction_order_and_host_tier() -> None:
    kv = KVCache(10, host_blocks=4)
    kv.alloc(6)  # a request takes 6 blocks and publishes two segments of 2
    assert kv.register(1, 2) and kv.register(2, 2) and not kv.register(1, 2)
    kv.drop(2)  # freed tail first, as vLLM frees a request's blocks in reverse
    kv.drop(1)
    kv.release(2)  # its 2 unhashed blocks
    assert (kv.free, kv.plain, list(kv.lru)) == (10, 6, [2, 1])
    kv.alloc(7)  # 6 plain, then segment 2 (the oldest) goes whole: 1 block left plain
    assert (kv.free, kv.plain, list(kv.lru), list(kv.host or {})) == (3, 1, [1], [2])
    kv.acquire(1, kv.segments[1])  # a hit takes the segment out of the free pool
    assert (kv.free, kv.used) == (1, 9) and 1 not in kv.lru
    assert kv.host_take(2) == 2 and kv.host_take(2) == 0


def test_private_segment_round_trip() -> None:
    kv = KVCache(8)
    kv.alloc(5)
    kv.keep_private(("p", 0), 3)
    kv.release(2)
    assert (kv.free, kv.plain) == (8, 5)
    assert kv.take_private(("p", 0)) == 3 and (kv.free, kv.plain) == (5, 5)
