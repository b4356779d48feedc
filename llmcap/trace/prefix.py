"""Prefix reuse from per-request block hashes (Mooncake-style `hash_ids`).

For each request, in arrival order, the reusable prefix is the run of *leading* blocks whose hashes
were already seen in earlier requests: a KV prefix cache can only reuse a prefix, so the first miss
ends the run. Two caches: unbounded (the ideal hit ratio) and LRU with a fixed number of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.trace import lru


def _flat(hash_ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = hash_ids.combine_chunks() if isinstance(hash_ids, pa.ChunkedArray) else hash_ids
    arr = pc.fill_null(arr, pa.scalar([], type=arr.type))
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values, offsets - offsets[0]


def leading_reuse_unbounded(hash_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Leading blocks of each request already seen in an earlier request (infinite cache). Vectorised."""
    values, offsets = _flat(hash_ids)
    n = offsets.size - 1
    lengths = np.diff(offsets)
    if values.size == 0:
        return np.zeros(n, dtype=np.int64)
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    _, inverse = np.unique(values, return_inverse=True)
    first_row = np.full(inverse.max() + 1, n, dtype=np.int64)
    np.minimum.at(first_row, inverse, row)
    seen_before = first_row[inverse] < row
    position = np.arange(values.size, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    first_miss = np.where(seen_before, np.iinfo(np.int64).max, position)
    reuse = np.zeros(n, dtype=np.int64)
    nonempty = lengths > 0
    mins = np.minimum.reduceat(first_miss, offsets[:-1][nonempty])
    reuse[nonempty] = np.minimum(mins, lengths[nonempty])
    return reuse


def stack_distances(hash_ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Each block's LRU stack distance at its request's lookup (`llmcap.trace.lru`; -1: not seen before), and
    the request offsets into them."""
    values, offsets = _flat(hash_ids)
    return np.asarray(lru.stack_distances(values.tolist(), offsets.tolist()), dtype=np.int64), offsets


def reuse_at(distances: np.ndarray, offsets: np.ndarray, capacity_blocks: int) -> np.ndarray:
    """Leading blocks of each request found in an LRU cache of `capacity_blocks` blocks, from `stack_distances`."""
    hit = (distances >= 0) & (distances < capacity_blocks)
    starts = offsets[:-1]
    misses = np.flatnonzero(~hit)
    # each request's first miss at or after its start (the end of the trace when none): its leading hits end there
    after = np.searchsorted(misses, starts)
    first_miss = np.append(misses, offsets[-1])[after]
    return np.minimum(first_miss - starts, np.diff(offsets)).astype(np.int64)


def leading_reuse_lru(hash_ids: pa.Array | pa.ChunkedArray, capacity_blocks: int) -> np.ndarray:
    """Leading blocks of each request found in an LRU cache of `capacity_blocks` blocks (every block of a request
    is looked up, then inserted/refreshed in order). For several capacities, call `stack_distances` once."""
    return reuse_at(*stack_distances(hash_ids), capacity_blocks)


def hit_tokens(reuse_blocks: np.ndarray, isl: np.ndarray, block_size: int) -> np.ndarray:
    """Reusable tokens: whole blocks, but never more than the prompt itself."""
    return np.minimum(reuse_blocks * block_size, isl)


@dataclass(frozen=True)
class PrefixSummary:
    block_size: int
    ideal_hit_ratio: float  # Σ hit tokens / Σ ISL, unbounded cache
    ideal_block_hit_ratio: float
    requests_reusing_ge1_block: float
    requests_reusing_ge2_blocks: float
    unique_blocks: int
    total_blocks: int
    lru_hit_ratio: dict[int, float]  # capacity in blocks -> token hit ratio

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["lru_hit_ratio"] = {str(k): v for k, v in self.lru_hit_ratio.items()}
        return out


def summarise_prefix(
    hash_ids: pa.Array | pa.ChunkedArray, isl: np.ndarray, block_size: int, lru_capacities: list[int]
) -> PrefixSummary:
    values, offsets = _flat(hash_ids)
    reuse = leading_reuse_unbounded(hash_ids)
    total_isl = float(isl.sum())
    distances = stack_distances(hash_ids) if lru_capacities else None  # one pass for every capacity
    lru = (
        {c: float(hit_tokens(reuse_at(*distances, c), isl, block_size).sum() / total_isl) for c in lru_capacities}
        if distances
        else {}
    )
    return PrefixSummary(
        block_size=block_size,
        ideal_hit_ratio=float(hit_tokens(reuse, isl, block_size).sum() / total_isl),
        ideal_block_hit_ratio=float(reuse.sum() / max(values.size, 1)),
        requests_reusing_ge1_block=float((reuse >= 1).mean()),
        requests_reusing_ge2_blocks=float((reuse >= 2).mean()),
        unique_blocks=int(np.unique(values).size),
        total_blocks=int(values.size),
        lru_hit_ratio=lru,
    )
