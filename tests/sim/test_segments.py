"""Per-request prefix segments (llmcap.sim.segments) against the definition in llmcap.sim.workload:
segment b of a request ends at engine block min(((b+1)·T) // bs, isl // bs)."""

from __future__ import annotations

from array import array
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from llmcap.sim.workload import _hash_chunks, singleton_suffixes, workload_from_table
from tests.sim._workloads import random_trace


@pytest.mark.parametrize(("trace_block", "block_size"), [(32, 8), (32, 32), (32, 64), (48, 16), (48, 32)])
def test_segment_ends_follow_the_definition(trace_block: int, block_size: int) -> None:
    t = random_trace(np.random.default_rng(trace_block * 100 + block_size), 300, trace_block)
    # three Arrow chunks, so the index has to find the chunk of a row
    t = pa.Table.from_batches(t.to_batches(max_chunksize=120), schema=t.schema)
    assert t.column("hash_ids").num_chunks == 3
    work = workload_from_table(t, block_size)
    index = work.segment_index(array_of(work.isl))
    assert index is not None
    hashes = t.column("hash_ids").to_pylist()
    for i in range(t.num_rows):
        keys, his = index.of(i)
        cap = int(work.isl[i]) // block_size
        assert keys == hashes[i]
        assert his == [min((b + 1) * trace_block // block_size, cap) for b in range(len(keys))], i


def test_no_hashes_no_index() -> None:
    t = random_trace(np.random.default_rng(0), 10).drop_columns(["hash_ids"])
    work = workload_from_table(t, 16)
    assert work.segment_index(array_of(work.isl)) is None


def array_of(x: np.ndarray) -> array:
    return array("q", x.astype(np.int64).tobytes())


def singleton_suffix(rows: list) -> list[int]:
    """The definition: after a request's last hash that occurs more than once in `rows` (0 without one)."""
    counts = Counter(h for r in rows for h in (r or []))
    return [max((j + 1 for j, h in enumerate(r or []) if counts[h] > 1), default=0) for r in rows]


def test_singleton_suffixes_follow_the_definition() -> None:
    # shared hashes may come after singletons: a trace need not be chained
    rows = [[1, 2, 3], [1, 2, 4, 5], [], [6, 7, 1], None, [8], [9, 9], [10, 11], [11, 12, 13]]
    t = pa.table({"hash_ids": pa.array(rows, pa.list_(pa.int64()))})
    t = pa.Table.from_batches(t.to_batches(max_chunksize=4), schema=t.schema)  # three chunks
    chunks = _hash_chunks(t.column("hash_ids"))
    assert len(chunks) == 3
    assert singleton_suffixes(chunks).tolist() == singleton_suffix(rows) == [2, 2, 0, 3, 0, 0, 2, 2, 1]
    # a slice of the trace: counts are over what the simulator gets (sliced chunks start past 0)
    part = t.slice(1, 6)
    assert (
        singleton_suffixes(_hash_chunks(part.column("hash_ids"))).tolist()
        == singleton_suffix(rows[1:7])
        == [1, 0, 3, 0, 0, 2]
    )


def test_the_index_gives_singleton_suffixes_only_when_asked() -> None:
    t = random_trace(np.random.default_rng(3), 200)
    work = workload_from_table(t, 16)
    plain, lazy = work.segment_index(array_of(work.isl)), work.segment_index(array_of(work.isl), singletons=True)
    assert plain is not None and lazy is not None and plain.singles is None
    expect = singleton_suffix(t.column("hash_ids").to_pylist())
    assert [lazy.single_from(i) for i in range(t.num_rows)] == expect and sum(expect) > 0
