"""Per-request prefix segments (llmcap.sim.segments) against the definition in llmcap.sim.workload:
segment b of a request ends at engine block min(((b+1)·T) // bs, isl // bs)."""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa
import pytest

from llmcap.sim.workload import workload_from_table
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
