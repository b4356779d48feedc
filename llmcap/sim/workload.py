"""The simulator's view of a canonical trace: flat numpy columns, and prefix segments per request.

Segment b of request r (its b-th trace hash) covers engine blocks [hi(b-1), hi(b)) with
hi(b) = min(((b+1)·T) // bs, isl // bs) (T: trace block size, bs: engine block size) — the engine
blocks whose last token lies in trace block b, and only full prompt blocks. Empty segments (bs > T)
are skipped by the engine; the next segment's chain hash still names the whole prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError
from llmcap.trace.schema import block_size_of


@dataclass(frozen=True)
class Workload:
    arrival: np.ndarray  # float64, sorted
    isl: np.ndarray  # int64
    osl: np.ndarray  # int64
    offsets: np.ndarray | None  # int64 [n+1] into keys / seg_hi; None: no prefix hashes
    keys: np.ndarray | None  # int64 chain hashes, flat
    seg_hi: np.ndarray | None  # int64 cumulative engine-block end of each segment, flat

    @property
    def n(self) -> int:
        return int(self.arrival.size)

    def segments(self, i: int) -> tuple[list[int], list[int]]:
        if self.offsets is None:
            return [], []
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.keys[a:b].tolist(), self.seg_hi[a:b].tolist()  # type: ignore[index]


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
    trace_block = block_size_of(table) if "hash_ids" in table.column_names else None
    if not use_hashes or trace_block is None or table.num_rows == 0:
        return Workload(arrival, isl, osl, None, None, None)
    lists = table.column("hash_ids").combine_chunks()
    if lists.null_count:
        lists = pc.fill_null(lists, pa.scalar([], pa.list_(pa.int64())))
    offsets = lists.offsets.to_numpy().astype(np.int64)
    keys = lists.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]
    counts = np.diff(offsets)
    caps = isl // block_size
    seg_hi = np.empty(keys.size, dtype=np.int32)
    chunk = 1 << 16  # requests at a time: bounded temporaries on million-request traces
    for a in range(0, arrival.size, chunk):
        b = min(a + chunk, arrival.size)
        lo, hi = offsets[a], offsets[b]
        c = counts[a:b]
        pos = np.arange(hi - lo, dtype=np.int64) - np.repeat(offsets[a:b] - lo, c)  # position in its own list
        seg_hi[lo:hi] = np.minimum((pos + 1) * trace_block // block_size, np.repeat(caps[a:b], c))
    return Workload(arrival, isl, osl, offsets, keys, seg_hi)
