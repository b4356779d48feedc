"""Paged KV blocks of one replica, with a prefix cache over trace block hashes and optional offload tiers.

Only counts are kept, never block ids: the simulator needs how many blocks are free and which
prefixes are cached, not where they live.

Prefix cache. The trace gives one chain hash per trace block of `trace_block` tokens (Mooncake: 512);
a chain hash names the whole prefix up to its block, so equal hashes mean equal prefixes. Engine block
i (tokens [i·bs, (i+1)·bs)) belongs to the trace block holding its last token; the engine blocks of
one trace block form a *segment* keyed by that hash (bs=16, trace 512: 32 blocks a segment; bs larger
than the trace block: one engine block keyed by its last trace block). Only full prompt blocks are
cacheable. Segments are the unit of sharing: a segment (`Seg`) is either in use (ref count > 0, shared
by every request that hit or registered it) or free and evictable, in an LRU: `order` lists segments
oldest first, one entry each time one became evictable, and `queued` counts a segment's entries there.
An entry is live only for a segment that is evictable, still cached, and has no newer entry (its
`queued` drops to 0 as the entry leaves the head); other entries are stale and skipped (a deque rather
than an OrderedDict LRU, and a compiled class rather than [ref, blocks, tick] lists: no boxed ints per
update; `make bench` times the simulator).
Allocation takes never-cached free blocks first and then evicts whole LRU segments from the head
(vLLM evicts block by block from one free queue; whole segments are the coarser, conservative version).
Offload tiers (host DRAM, local SSD, a remote store: `EngineConfig.offload_tiers()`, nearest first) each
keep their own LRU with a capacity in blocks. A segment evicted from HBM moves to the first tier; one a
tier evicts moves to the next, and leaves the last. A segment lives in one place at a time: loading it
back to HBM takes it off its tier, and one recomputed while a copy sat on a tier replaces that copy.

Singletons. A hash no other request of the trace has (`workload.singleton_suffixes`) names a segment
only its own request can ever hit, and only on recompute after a preemption. A finished request's
segments past its last shared hash (in a chain-hashed trace, all its singletons: a later chain hash
names a longer prefix) enter the LRU as ONE entry, a `Run`, instead of one `Seg` each, and are never
in `segments`; eviction takes its members one by one, tail first, exactly as it would take the
separate entries the request's tail-first release would have queued (same order, same counts:
byte-identical results, checked by tests/sim against the reference mode, which publishes every
segment). A preempted request publishes them as plain segments (it may hit them). Half the hashes of
the Mooncake traces are singletons, so this keeps the LRU about half as long.

A request's own blocks past its hashed prefix (unhashed prompt tail, generated tokens) are private: when
it is preempted they are kept as a private segment only it can hit on recompute, as vLLM's cached
output blocks are.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable


class Seg:
    """One cached prefix segment: `blocks` engine blocks, `ref` requests holding it."""

    __slots__ = ("key", "ref", "blocks", "queued", "gone")

    def __init__(self, key: Hashable, ref: int, blocks: int) -> None:
        self.key = key
        self.ref = ref
        self.blocks = blocks
        self.queued = 0  # entries in KVCache.order
        self.gone = False  # evicted or taken back: every entry left is stale


class Run(Seg):
    """A finished request's singleton segments j in [lo, hi) of its chain (`keys`, block ends `block_ends`), one
    LRU entry: evicted from member hi - 1 down (the oldest first), members of no block skipped; `blocks`
    are those of the members left."""

    __slots__ = ("keys", "block_ends", "lo", "hi")

    def __init__(self, keys: list[int], block_ends: list[int], lo: int, hi: int, blocks: int) -> None:
        super().__init__(None, 0, blocks)
        self.keys = keys
        self.block_ends = block_ends
        self.lo = lo
        self.hi = hi

    def members(self) -> list[tuple[Hashable, int]]:
        """(key, blocks) of the members left, oldest first."""
        block_ends = self.block_ends
        out: list[tuple[Hashable, int]] = []
        for j in range(self.hi - 1, self.lo - 1, -1):
            nb = block_ends[j] - (block_ends[j - 1] if j else 0)
            if nb > 0:
                out.append((self.keys[j], nb))
        return out


class Tier:
    """One offload tier's segments: key -> blocks, least recently offloaded first."""

    __slots__ = ("entries", "capacity", "used")

    def __init__(self, capacity: int) -> None:
        self.entries: OrderedDict[Hashable, int] = OrderedDict()
        self.capacity = capacity
        self.used = 0


class PrefixMatch:
    """What `KVCache.match_prefix` found of a prompt's prefix chain."""

    __slots__ = (
        "hits",
        "host_hits",
        "hit_blocks",
        "lru_blocks",
        "host_blocks",
        "tier_blocks",
        "searched",
        "matched",
        "chained",
    )

    def __init__(self, tiers: int) -> None:
        self.hits: list[Seg] = []  # cached segments, in chain order
        self.host_hits: list[tuple[Hashable, int, int]] = []  # (key, blocks, tier) on the offload tiers, after the hits
        self.hit_blocks = 0  # block end of the last hit
        self.lru_blocks = 0  # blocks of hits that are evictable now (taking them removes them from the free pool)
        self.host_blocks = 0  # blocks of host_hits, every tier
        self.tier_blocks = [0] * tiers  # ... per tier
        self.searched = 0  # tiers looked up (a lookup costs its latency whether it finds anything or not)
        self.matched = 0  # chain positions matched (empty segments included)
        self.chained = True  # the whole chain up to `cap` matched


class KVCache:
    __slots__ = ("num_blocks", "free", "plain", "segments", "order", "n_lru", "tiers", "evictions")

    def __init__(self, num_blocks: int, tier_blocks: tuple[int, ...] = ()) -> None:
        self.num_blocks = num_blocks
        self.free = num_blocks  # free blocks: never-cached (`plain`) + those of evictable LRU segments
        self.plain = num_blocks
        self.segments: dict[Hashable, Seg] = {}
        self.order: deque[Seg] = deque()  # an entry each time a segment became evictable, oldest first
        self.n_lru = 0  # evictable segments
        self.tiers = [Tier(blocks) for blocks in tier_blocks]  # nearest first
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
        seen: set[int] = set()
        out: list[tuple[Hashable, int]] = []
        for seg in reversed(self.order):  # a segment's newest entry is its live one
            if id(seg) not in seen:
                seen.add(id(seg))
                if isinstance(seg, Run):
                    if not seg.gone:
                        out.extend(reversed(seg.members()))
                elif seg.ref == 0 and not seg.gone:
                    out.append((seg.key, seg.blocks))
        out.reverse()
        return out

    def unpin(self, seg: Seg) -> None:
        """The segment's last reference went: it becomes the newest evictable one (the caller counts its
        blocks as free)."""
        seg.queued += 1
        self.order.append(seg)
        self.n_lru += 1
        if len(self.order) > 2 * self.n_lru + 4096:  # mostly stale entries: keep the live ones, in order
            live: deque[Seg] = deque()
            for s in self.order:
                s.queued -= 1
                if s.queued == 0 and s.ref == 0 and not s.gone:
                    live.append(s)
            for s in live:
                s.queued = 1
            self.order = live

    def unpin_run(self, run: Run, members: int) -> None:
        """A finished request's singleton segments (`members` of them, non-empty) become the newest
        evictable entry; their blocks are free."""
        self.unpin(run)
        self.n_lru += members - 1
        self.free += run.blocks

    def _evict_run(self, run: Run, n: int) -> None:
        """Evict the run's members, oldest first, until n blocks are plain (or none is left)."""
        block_ends, j, lo = run.block_ends, run.hi, run.lo
        while self.plain < n and j > lo:
            j -= 1
            nb = block_ends[j] - (block_ends[j - 1] if j else 0)
            if nb > 0:
                self.plain += nb
                run.blocks -= nb
                self.n_lru -= 1
                self.evictions += 1
        while j > lo and block_ends[j - 1] == (block_ends[j - 2] if j > 1 else 0):  # empty members: nothing to evict
            j -= 1
        run.hi = j
        if j == lo:
            run.gone = True
        else:  # members left: the entry stays the oldest
            run.queued += 1
            self.order.appendleft(run)

    def _evict(self, n: int) -> None:
        order, segments, offload = self.order, self.segments, len(self.tiers) > 0
        while self.plain < n:
            seg = order.popleft()
            seg.queued -= 1
            if seg.ref != 0 or seg.queued != 0 or seg.gone:  # in use again, evictable since later, or gone
                continue
            if isinstance(seg, Run):
                self._evict_run(seg, n)
                continue
            key = seg.key
            del segments[key]
            seg.gone = True
            nb = seg.blocks
            self.n_lru -= 1
            self.plain += nb
            self.evictions += 1
            if offload and not isinstance(key, tuple):  # private segments are not offloaded
                self._offload(key, nb)

    def _offload(self, key: Hashable, nb: int) -> None:
        """An evicted segment goes to the first tier (recomputed while a copy sat on a tier: that copy goes)."""
        for tier in self.tiers:
            if key in tier.entries:
                tier.used -= tier.entries.pop(key)
                break
        self._put(0, key, nb)

    def _put(self, level: int, key: Hashable, nb: int) -> None:
        """Segment `key` at the most recent end of tier `level`; what that tier evicts goes to the next."""
        tier = self.tiers[level]
        tier.entries[key] = nb
        tier.used += nb
        while tier.used > tier.capacity:
            old, old_nb = tier.entries.popitem(last=False)
            tier.used -= old_nb
            if level + 1 < len(self.tiers):
                self._put(level + 1, old, old_nb)

    def release(self, n: int) -> None:
        """Return n uncacheable blocks."""
        self.plain += n
        self.free += n

    def acquire(self, seg: Seg) -> None:
        """One more reference to a cached segment (a prefix hit)."""
        if seg.ref == 0:
            self.n_lru -= 1
            self.free -= seg.blocks
        seg.ref += 1

    def drop(self, key: Hashable) -> None:
        """One reference fewer; the last one makes the segment evictable (most recently used end)."""
        self.release_segments([self.segments[key]])

    def release_segments(self, segs: list[Seg]) -> None:
        """A request lets go of its segments, tail first (so the LRU evicts a prompt's end before its
        start); those it held the last reference to become evictable, their blocks free."""
        freed = 0
        for seg in reversed(segs):
            seg.ref -= 1
            if seg.ref == 0:
                self.unpin(seg)
                freed += seg.blocks
        self.free += freed

    def publish(self, key: Hashable, nb: int) -> Seg | None:
        """Publish nb blocks their owner holds as the cached segment `key`, referenced by the owner; None
        when another request published that prefix first (the blocks stay the owner's, uncached)."""
        if key in self.segments:
            return None
        seg = self.segments[key] = Seg(key, 1, nb)
        return seg

    def cached_prefix_blocks(self, keys: list[int], block_ends: list[int], cap: int) -> int:
        """Blocks of a prompt with these segments (chain keys, block ends) cached in HBM now, up to `cap`."""
        segs = self.segments
        hit = lo = 0
        for key, hi in zip(keys, block_ends):
            if hi == lo:
                continue
            if hi > cap or key not in segs:
                break
            hit, lo = hi, hi
        return hit

    def match_prefix(self, keys: list[int], block_ends: list[int], cap: int) -> PrefixMatch:
        """The longest run of a prompt's segments (up to block `cap`) this replica holds: cached in HBM, then
        (once one is missing there) on the offload tiers, nearest first. Nothing is taken yet."""
        tiers = self.tiers
        m = PrefixMatch(len(tiers))
        segs = self.segments
        lo = 0
        for key, hi in zip(keys, block_ends):
            if hi == lo:
                m.matched += 1
                continue
            if hi > cap:
                m.chained = False
                break
            seg = segs.get(key)
            if seg is not None and not m.host_hits:
                m.hits.append(seg)
                m.hit_blocks = hi
                if seg.ref == 0:
                    m.lru_blocks += seg.blocks
            else:
                found = -1
                for level in range(len(tiers)):
                    if level >= m.searched:
                        m.searched = level + 1
                    if key in tiers[level].entries:
                        found = level
                        break
                if found < 0:
                    m.chained = False
                    break
                m.host_hits.append((key, hi - lo, found))
                m.host_blocks += hi - lo
                m.tier_blocks[found] += hi - lo
            lo = hi
            m.matched += 1
        return m

    def private_blocks(self, key: Hashable) -> int:
        """Blocks of the private segment `key` kept for its owner's recompute; -1 when there is none."""
        seg = self.segments.get(key)
        return -1 if seg is None else seg.blocks

    def register(self, key: Hashable, nb: int) -> Seg:
        """Publish nb blocks its owner already holds as a cached segment (the key must be new)."""
        if key in self.segments:
            raise KeyError(f"segment {key!r} is cached already")
        seg = self.segments[key] = Seg(key, 1, nb)
        return seg

    def keep_private(self, key: Hashable, nb: int) -> None:
        """Blocks being freed stay cached for their owner only (evictable)."""
        seg = self.segments[key] = Seg(key, 0, nb)
        self.unpin(seg)
        self.free += nb

    def take_private(self, key: Hashable) -> int:
        """Reclaim a private segment (its owner hit it): its blocks become the owner's again."""
        seg = self.segments.pop(key)
        seg.gone = True  # its entry in `order` is stale
        self.n_lru -= 1
        self.free -= seg.blocks
        return seg.blocks

    def tier_take(self, key: Hashable, level: int) -> int:
        """Remove a segment from tier `level` for loading back to HBM (0 if absent)."""
        tier = self.tiers[level]
        nb = tier.entries.pop(key, 0)
        tier.used -= nb
        return nb
