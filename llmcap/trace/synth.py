"""What-if synthesis from a canonical trace (seeded; the RNG is always passed in).

- `scale_rate`: stretch/compress the arrival clock so the mean rate hits a target, keeping the burst
  shape (every gap scales by the same factor).
- `resample_joint`: draw whole requests with replacement, so (ISL, OSL, prefix) stay together —
  never the marginals independently, which would destroy their correlation.
- `synthesize`: resampled requests on a fresh arrival process (Poisson / gamma / diurnal).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.config import ArrivalSpec
from llmcap.errors import LlmcapError
from llmcap.trace import schema
from llmcap.trace.arrivals import generate_arrivals
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded


def mean_rate(table: pa.Table) -> float:
    arrival = table.column("arrival_s").to_numpy()
    duration = float(arrival[-1] - arrival[0])
    if duration <= 0:
        raise LlmcapError("the trace spans zero seconds: its mean rate is undefined")
    return table.num_rows / duration


def scale_rate(table: pa.Table, target_rps: float) -> pa.Table:
    """The same requests with every inter-arrival gap scaled so rows ÷ duration = target_rps."""
    if target_rps <= 0:
        raise LlmcapError(f"target rate must be positive, got {target_rps}")
    factor = mean_rate(table) / target_rps
    arrival = table.column("arrival_s").to_numpy() * factor
    return table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arrival))


def resample_joint(table: pa.Table, n: int, rng: np.random.Generator) -> pa.Table:
    """`n` requests drawn with replacement as whole rows (ISL, OSL, hashes, labels together).

    Block hashes are rewritten so a resampled request shares with earlier requests exactly the
    leading blocks its source request shared (its reusable prefix), and the rest of its blocks are
    fresh: copying hash lists verbatim would turn every repeat draw into a full-prompt cache hit.
    """
    if table.num_rows == 0:
        raise LlmcapError("cannot resample an empty trace")
    picks = rng.integers(0, table.num_rows, size=n)
    out = table.take(pa.array(picks))
    block_size = schema.block_size_of(table)
    hashes = table.column("hash_ids")
    if block_size and hashes.null_count < len(hashes):
        out = _rewrite_hashes(table, out, picks, block_size)
    return out


def _rewrite_hashes(source: pa.Table, out: pa.Table, picks: np.ndarray, block_size: int) -> pa.Table:
    src = source.column("hash_ids").combine_chunks()
    shared = leading_reuse_unbounded(src)[picks]
    lists = src.take(pa.array(picks))
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy()
    flat = lists.flatten().to_numpy().astype(np.int64).copy()
    position = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    fresh = position >= np.repeat(shared, lengths)
    fresh_base = int(pc.max(src.flatten()).as_py() or 0) + 1
    flat[fresh] = fresh_base + np.arange(int(fresh.sum()))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    new_lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    isl = out.column("isl").to_numpy()
    out = out.set_column(out.schema.get_field_index("hash_ids"), "hash_ids", new_lists)
    hits = hit_tokens(leading_reuse_unbounded(new_lists), isl, block_size)
    return out.set_column(out.schema.get_field_index("prefix_hit_tokens"), "prefix_hit_tokens", pa.array(hits))


def synthesize(table: pa.Table, n: int, arrivals: ArrivalSpec, rng: np.random.Generator) -> pa.Table:
    """`n` jointly resampled requests on a fresh arrival process; ids and source rows renumbered."""
    out = resample_joint(table, n, rng)
    times = generate_arrivals(n, arrivals, rng)
    out = out.set_column(out.schema.get_field_index("arrival_s"), "arrival_s", pa.array(times))
    out = out.set_column(out.schema.get_field_index("request_id"), "request_id", pa.array(np.arange(n, dtype=np.int64)))
    meta = dict(table.schema.metadata or {})
    meta[b"llmcap.source_format"] = b"synthetic"
    meta[b"llmcap.start"] = b"+0.000s"
    return out.replace_schema_metadata(meta)
