"""The simulator's view of a canonical trace: flat numpy columns, and prefix segments per request.

Segment b of request r (its b-th trace hash) covers engine blocks [hi(b-1), hi(b)) with
hi(b) = min(((b+1)·T) // bs, isl // bs) (T: trace block size, bs: engine block size) — the engine
blocks whose last token lies in trace block b, and only full prompt blocks. Empty segments (bs > T)
are skipped by the engine; the next segment's chain hash still names the whole prefix.

Memory. The hashes are by far the largest column (~24 per request on Mooncake-like traces), so they
are read in place from the trace's Arrow chunks (zero-copy views, one per chunk) and each request's
segment ends are computed when the engine asks for them (once per admission), not stored.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError
from llmcap.sim.segments import SegmentIndex
from llmcap.trace.schema import block_size_of

# what a simulation reads of a canonical trace (`load_trace(path, columns=SIM_COLUMNS)`)
SIM_COLUMNS = ("request_id", "arrival_s", "isl", "osl", "max_tokens", "priority", "adapter", "hash_ids")


@dataclass(frozen=True)
class HashChunk:
    first: int  # row of the trace where this chunk starts
    offsets: np.ndarray  # [rows + 1] into keys (Arrow list offsets: int32, or int64 for large lists)
    keys: np.ndarray  # int64 chain hashes (a view of the Arrow buffer)


@dataclass(frozen=True)
class Workload:
    arrival: np.ndarray  # float64, sorted
    isl: np.ndarray  # int64
    osl: np.ndarray  # int64
    chunks: tuple[HashChunk, ...] | None = None  # None: no prefix hashes
    trace_block: int = 0
    block_size: int = 16
    cap: np.ndarray | None = None  # int64 max_tokens, ≥ osl (the output where a request states none); None: no caps
    adapter: np.ndarray | None = None  # int64 LoRA adapter ids, by name's sort order (-1: none); None: no adapters
    priority: np.ndarray | None = (
        None  # int64 scheduling priorities, lower first (the `priority` queue); None: all equal
    )

    @property
    def n(self) -> int:
        return int(self.arrival.size)

    def segment_index(self, isl: array[int], singletons: bool = False) -> SegmentIndex | None:
        """Per-request segments for the engine (compiled lookups; `isl`: this workload's ISL as an int
        array), or None without hashes. `singletons`: also where each request's singleton suffix starts
        (`singleton_suffixes`)."""
        if self.chunks is None:
            return None
        # Arrow's list offsets are int32 (int64 for large lists): kept at their width
        offsets = [array("i" if c.offsets.itemsize == 4 else "q", c.offsets.tobytes()) for c in self.chunks]
        singles = array("i", singleton_suffixes(self.chunks).tobytes()) if singletons else None
        return SegmentIndex(
            [c.first for c in self.chunks],
            offsets,
            [c.keys for c in self.chunks],
            isl,
            self.trace_block,
            self.block_size,
            singles,
        )


def singleton_suffixes(chunks: tuple[HashChunk, ...]) -> np.ndarray:
    """Per request (int32): the position in its hashes from which every hash is a *singleton* — one that
    occurs once in the whole trace, so no other request can ever hit its segment (its own length when
    the last hash is shared). About half the hashes of the Mooncake traces are singletons; the engine
    keeps a finished request's singleton suffix as one LRU entry (`kvcache.Run`)."""
    if not chunks:
        return np.zeros(0, dtype=np.int32)
    keys = np.concatenate([c.keys[c.offsets[0] : c.offsets[-1]] for c in chunks])  # a copy, sorted in place
    keys.sort()
    edge = np.ones(keys.size + 1, dtype=bool)  # edge[k]: keys[k-1] != keys[k] (both ends count as edges)
    np.not_equal(keys[1:], keys[:-1], out=edge[1:-1])
    shared = keys[edge[:-1] & ~edge[1:]]  # each hash that occurs more than once, once (fewer than the singletons)
    del keys, edge
    out = []
    for c in chunks:
        rows = c.offsets.size - 1
        v = c.keys[c.offsets[0] : c.offsets[-1]]
        at = np.minimum(np.searchsorted(shared, v), max(shared.size - 1, 0))
        is_shared = shared[at] == v if shared.size else np.zeros(v.size, dtype=bool)
        lengths = np.diff(c.offsets).astype(np.int64)
        starts = (c.offsets[:-1] - c.offsets[0]).astype(np.int64)
        # 1 + the position of a request's last shared hash (0 without one): a max per row
        last = np.zeros(v.size + 1, dtype=np.int32)
        last[:-1] = np.where(is_shared, np.arange(v.size) - np.repeat(starts, lengths) + 1, 0)
        first = np.maximum.reduceat(last, np.minimum(starts, v.size)) if rows else np.zeros(0, dtype=np.int32)
        out.append(np.where(lengths > 0, first, 0).astype(np.int32))
    return np.concatenate(out)


def _hash_chunks(column: pa.ChunkedArray) -> tuple[HashChunk, ...]:
    out, first = [], 0
    for lists in column.chunks:
        if lists.null_count:
            lists = pc.fill_null(lists, pa.scalar([], pa.list_(pa.int64())))
        offsets = lists.offsets.to_numpy()  # into the whole child array: a sliced chunk starts past 0
        keys = lists.values.to_numpy(zero_copy_only=False)
        out.append(HashChunk(first, offsets, keys))
        first += len(lists)
    return tuple(out)


def workload_from_table(table: pa.Table, block_size: int, use_hashes: bool = True) -> Workload:
    """Columns of a canonical trace (arrival_s, isl, osl, optional hash_ids + block-size metadata)."""
    for col in ("arrival_s", "isl", "osl"):
        if col not in table.column_names:
            raise LlmcapError(f"trace has no '{col}' column: not a canonical llmcap trace")
    arrival = np.ascontiguousarray(table.column("arrival_s").to_numpy(), dtype=np.float64)
    isl = np.ascontiguousarray(table.column("isl").to_numpy(), dtype=np.int64)
    osl = np.ascontiguousarray(table.column("osl").to_numpy(), dtype=np.int64)
    if arrival.size and (not np.all(np.isfinite(arrival)) or np.any(np.diff(arrival) < 0)):
        raise LlmcapError("trace arrivals must be finite and sorted")
    if np.any(isl < 1) or np.any(osl < 1):
        raise LlmcapError("trace isl and osl must be >= 1")
    cap, adapter, priority = _caps(table, osl), _adapters(table), _priorities(table)
    trace_block = block_size_of(table) if "hash_ids" in table.column_names else None
    if not use_hashes or trace_block is None or table.num_rows == 0:
        return Workload(arrival, isl, osl, cap=cap, adapter=adapter, priority=priority)
    return Workload(
        arrival, isl, osl, _hash_chunks(table.column("hash_ids")), trace_block, block_size, cap, adapter, priority
    )


def _priorities(table: pa.Table) -> np.ndarray | None:
    """Each request's scheduling priority (vLLM's request `priority`: lower first; none stated = 0), or None
    when the table has no `priority` column or states none."""
    if "priority" not in table.column_names or table.column("priority").null_count == table.num_rows:
        return None
    stated = table.column("priority").to_numpy(zero_copy_only=False).astype(np.float64)
    if not np.all(np.isfinite(stated[~np.isnan(stated)])) or np.any(stated[~np.isnan(stated)] % 1):
        raise LlmcapError("a request's priority must be a whole number")
    return np.ascontiguousarray(np.where(np.isnan(stated), 0, stated).astype(np.int64))


def _adapters(table: pa.Table) -> np.ndarray | None:
    """Each request's LoRA adapter as an id (names in sorted order; -1: none), or None when no request has one."""
    if "adapter" not in table.column_names or table.column("adapter").null_count == table.num_rows:
        return None
    names = table.column("adapter").to_numpy(zero_copy_only=False)
    given = names != None  # noqa: E711 — elementwise on an object array
    out = np.full(names.size, -1, dtype=np.int64)
    _, codes = np.unique(names[given].astype(str), return_inverse=True)
    out[given] = codes
    return out


def _caps(table: pa.Table, osl: np.ndarray) -> np.ndarray | None:
    """The requests' max_tokens (the output where a request states none), or None when none states one."""
    if "max_tokens" not in table.column_names or table.column("max_tokens").null_count == table.num_rows:
        return None
    stated = table.column("max_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
    cap = np.where(np.isnan(stated), osl, stated).astype(np.int64)
    if np.any(cap < osl):
        raise LlmcapError("a request's max_tokens is below its output length: not a cleaned trace")
    return np.ascontiguousarray(cap)
