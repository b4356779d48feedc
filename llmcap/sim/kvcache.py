"""Paged KV blocks of one replica, with a prefix cache over trace block hashes and an optional host tier.

Only counts are kept, never block ids: the simulator needs how many blocks are free and which
prefixes are cached, not where they live.

Prefix cache. The trace gives one chain hash per trace block of `trace_block` tokens (Mooncake: 512);
a chain hash names the whole prefix up to its block, so equal hashes mean equal prefixes. Engine block
i (tokens [i·bs, (i+1)·bs)) belongs to the trace block holding its last token; the engine blocks of
one trace block form a *segment* keyed by that hash (bs=16, trace 512: 32 blocks a segment; bs larger
than the trace block: one engine block keyed by its last trace block). Only full prompt blocks are
cacheable. Segments are the unit of sharing: a segment is either in use (ref count > 0, shared by every
request that hit or registered it) or free and evictable, in an LRU: a segment is `[ref count, blocks,
tick]`, the tick stamped when it last became evictable (-1 once gone), and `order` lists (tick, key, segment)
oldest first; an entry whose segment is in use again, gone, or evictable with a newer tick is stale and
skipped when it reaches the head without a dict lookup (one dict and a deque instead of an OrderedDict
LRU: measured ~2x faster).
Allocation takes never-cached free blocks first and then evicts whole LRU segments from the head
(vLLM evicts block by block from one free queue; whole segments are the coarser, conservative version).
Evicted segments move to the host tier when it exists (its own LRU, capacity in blocks).

A request's own blocks past its hashed prefix (unhashed prompt tail, generated tokens) are private: when
it is preempted they are kept as a private segment only it can hit on recompute, as vLLM's cached
output blocks are.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable


class KVCache:
    __slots__ = ("num_blocks", "free", "plain", "segments", "order", "tick", "n_lru", "host", "host_capacity", "host_used", "evictions")

    def __init__(self, num_blocks: int, host_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.free = num_blocks  # free blocks: never-cached (`plain`) + those of evictable LRU segments
        self.plain = num_blocks
        self.segments: dict[Hashable, list[int]] = {}  # key -> [ref count, blocks, tick]
        self.order: deque[tuple[int, Hashable, list[int]]] = deque()  # (tick, key, segment), oldest first
        self.tick = 0
        self.n_lru = 0  # evictable segments
        self.host: OrderedDict[Hashable, int] | None = OrderedDict() if host_blocks > 0 else None
        self.host_capacity = host_blocks
        self.host_used = 0
        self.evictions = 0

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def alloc(self, n: int) -> None:
        """Take n free blocks (the caller checked n <= free), evicting LRU segments when needed."""
        if n > self.plain:
            self._evict(n)
        self.plain -= n
        self.free -= n

    def evictable(self) -> list[tuple[Hashable, int]]:
        """(key, blocks) of the evictable segments, oldest first."""
        return [(k, seg[1]) for tick, k, seg in self.order if seg[0] == 0 and seg[2] == tick]

    def unpin(self, key: Hashable) -> None:
        """The segment's last reference went: it becomes the newest evictable one (the caller counts its
        blocks as free)."""
        self.tick += 1
        seg = self.segments[key]
        seg[2] = self.tick
        self.order.append((self.tick, key, seg))
        self.n_lru += 1
        if len(self.order) > 2 * self.n_lru + 4096:  # mostly stale entries: drop them, order kept
            self.order = deque(e for e in self.order if e[2][0] == 0 and e[2][2] == e[0])

    def _evict(self, n: int) -> None:
        order, segments, host = self.order, self.segments, self.host
        while self.plain < n:
            tick, key, seg = order.popleft()
            if seg[0] != 0 or seg[2] != tick:  # in use again, or evictable since a later tick
                continue
            del segments[key]
            seg[2] = -1  # gone: its later entries are stale too
            nb = seg[1]
            self.n_lru -= 1
            self.plain += nb
            self.evictions += 1
            if host is not None and not isinstance(key, tuple):  # private segments are not offloaded
                self.host_used -= host.pop(key, 0)  # recomputed while a copy sat on the host
                host[key] = nb
                self.host_used += nb
                while self.host_used > self.host_capacity:
                    self.host_used -= host.popitem(last=False)[1]

    def release(self, n: int) -> None:
        """Return n uncacheable blocks."""
        self.plain += n
        self.free += n

    def acquire(self, key: Hashable, seg: list[int]) -> None:
        """One more reference to a cached segment (a prefix hit)."""
        if seg[0] == 0:
            self.n_lru -= 1
            self.free -= seg[1]
        seg[0] += 1

    def drop(self, key: Hashable) -> None:
        """One reference fewer; the last one makes the segment evictable (most recently used end)."""
        seg = self.segments[key]
        seg[0] -= 1
        if seg[0] == 0:
            self.unpin(key)
            self.free += seg[1]

    def register(self, key: Hashable, nb: int) -> bool:
        """Publish nb blocks its owner already holds as a cached segment; False if the key exists."""
        if key in self.segments:
            return False
        self.segments[key] = [1, nb, 0]
        return True

    def keep_private(self, key: Hashable, nb: int) -> None:
        """Blocks being freed stay cached for their owner only (evictable)."""
        self.segments[key] = [0, nb, 0]
        self.unpin(key)
        self.free += nb

    def take_private(self, key: Hashable) -> int:
        """Reclaim a private segment (its owner hit it): its blocks become the owner's again."""
        seg = self.segments.pop(key)
        seg[2] = -1  # gone: its entry in `order` is stale
        self.n_lru -= 1
        self.free -= seg[1]
        return seg[1]

    def host_take(self, key: Hashable) -> int:
        """Remove a segment from the host tier for loading back (0 if absent)."""
        if self.host is None:
            return 0
        nb = self.host.pop(key, 0)
        self.host_used -= nb
        return nb
