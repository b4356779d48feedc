"""Random workloads and configs for the simulator's property tests (seeded, small, fast)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from llmcap.perf.model import LinearStepModel
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig
from llmcap.trace.schema import metadata

ROUTERS = ("round_robin", "least_outstanding_tokens", "power_of_two", "prefix_aware")
ADMISSIONS = ("vllm", "trtllm-guaranteed-no-evict", "trtllm-max-utilization", "sglang")
MODEL = LinearStepModel(
    overhead_s=0.01,
    per_prefill_token_s=1e-4,
    per_pair_s=1e-7,
    per_prefill_seq_s=1e-3,
    per_decode_seq_s=5e-4,
    per_context_token_s=1e-6,
)


def table(rows: dict, trace_block: int | None = None) -> pa.Table:
    """A canonical-enough trace from columns (hash_ids optional)."""
    n = len(rows["isl"])
    cols = {"request_id": np.arange(n), "arrival_s": np.asarray(rows.get("arrival_s", np.zeros(n)), dtype=np.float64)}
    cols["isl"], cols["osl"] = np.asarray(rows["isl"]), np.asarray(rows["osl"])
    if "hash_ids" in rows:
        cols["hash_ids"] = pa.array(rows["hash_ids"], pa.list_(pa.int64()))
    if "max_tokens" in rows:
        cols["max_tokens"] = pa.array(np.asarray(rows["max_tokens"], dtype=np.int64))
    if "adapter" in rows:
        cols["adapter"] = pa.array(rows["adapter"], pa.string())
    t = pa.table(cols)
    return t.replace_schema_metadata(
        metadata(source_format="test", source_file="test", block_size=trace_block, start="+0.000s")
    )


def random_trace(rng: np.random.Generator, n: int, trace_block: int = 32) -> pa.Table:
    """Poisson arrivals, joint-random lengths, and prompts that share leading blocks within a few groups."""
    isl = rng.integers(1, 300, n)
    hashes, next_id = [], 10_000
    for i in range(n):
        blocks = -(-int(isl[i]) // trace_block)
        group = int(rng.integers(0, 4))
        shared = min(blocks, int(rng.integers(0, 4)))
        hashes.append([group * 100 + j for j in range(shared)] + list(range(next_id, next_id + blocks - shared)))
        next_id += blocks
    rows = {
        "arrival_s": np.cumsum(rng.exponential(0.05, n)),
        "isl": isl,
        "osl": rng.integers(1, 60, n),
        "hash_ids": hashes,
    }
    return table(rows, trace_block)


def random_config(rng: np.random.Generator, seed: int, reference: bool = False) -> SimConfig:
    engine = EngineConfig(
        num_blocks=int(rng.integers(25, 120)),
        block_size=int(rng.choice([8, 16, 32, 64])),
        max_num_seqs=int(rng.integers(2, 16)),
        max_num_batched_tokens=int(rng.integers(16, 256)),
        enable_prefix_caching=bool(seed % 5 != 4),
        host_blocks=int(rng.choice([0, 50])),
        kv_bytes_per_token=1000.0,
        host_bandwidth_bytes_s=1e8,
        admission_policy=ADMISSIONS[(seed // 2) % 4],
    )
    pd = None
    if seed % 3 == 0:
        link = LinkConfig(bandwidth_bytes_s=1e8, latency_s=0.001)
        pd = PDConfig(
            prefill_replicas=int(rng.integers(1, 3)),
            decode_replicas=int(rng.integers(1, 3)),
            link=link,
            first_token_from="decode" if seed % 2 else "prefill",
        )
    return SimConfig(
        engine=engine,
        replicas=int(rng.integers(1, 4)),
        router=ROUTERS[seed % 4],
        pd=pd,
        reference=reference,
        timeseries_resolution_s=0.1,
    )


def canonical(t: pa.Table) -> pa.Table:
    """Fill the canonical columns a test trace leaves out (so `load_trace` accepts it)."""
    from llmcap.trace.schema import CANONICAL_SCHEMA

    n = t.num_rows
    cols = {}
    for f in CANONICAL_SCHEMA:
        if f.name in t.column_names:
            cols[f.name] = t.column(f.name).cast(f.type)
        elif f.name == "source_row":
            cols[f.name] = pa.array(np.arange(n), pa.int64())
        else:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.Table.from_pydict(cols, schema=CANONICAL_SCHEMA.with_metadata(t.schema.metadata))
