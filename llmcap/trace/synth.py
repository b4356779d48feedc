"""What-if synthesis from a canonical trace (seeded; the RNG is always passed in).

- `scale_rate`: stretch/compress the arrival clock so the mean rate hits a target, keeping the burst
  shape (every gap scales by the same factor).
- `resample_joint`: draw whole requests with replacement, so (ISL, OSL, prefix) stay together —
  never the marginals independently, which would destroy their correlation.
- `synthesize`: resampled requests on a fresh arrival process (Poisson / gamma / diurnal).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError
from llmcap.trace import schema
from llmcap.trace.arrivals import generate_arrivals
from llmcap.trace.params import ArrivalSpec
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded


def mean_rate(table: pa.Table) -> float:
    arrival = table.column("arrival_s").to_numpy()
    duration = float(arrival[-1] - arrival[0])
    if duration <= 0:
        raise LlmcapError("the trace spans zero seconds: its mean rate is undefined")
    return table.num_rows / duration


def scale_rate(table: pa.Table, target_rps: float) -> pa.Table:
    """The same requests with every inter-arrival gap scaled so rows ÷ duration = target_rps."""
    if not (math.isfinite(target_rps) and target_rps > 0):
        raise LlmcapError(f"target rate must be a positive number of requests per second, got {target_rps}")
    factor = mean_rate(table) / target_rps
    arrival = table.column("arrival_s").to_numpy() * factor
    return table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arrival))


def resample_joint(table: pa.Table, n: int, rng: np.random.Generator) -> pa.Table:
    """`n` requests drawn with replacement as whole rows: (ISL, OSL, reusable prefix, labels) together.

    The reusable prefix is part of the drawn tuple. Hash ids are rebuilt so each synthetic request
    can reuse exactly its source's number of leading blocks (see `_rebuild_hashes`); copying hash
    lists verbatim would instead make every repeated draw a free full-prompt cache hit.
    """
    if table.num_rows == 0:
        raise LlmcapError("cannot resample an empty trace")
    if n < 1:
        raise LlmcapError(f"the number of requests to draw must be at least 1, got {n}")
    picks = rng.integers(0, table.num_rows, size=n)
    out = table.take(pa.array(picks))
    block_size = schema.block_size_of(table)
    hashes = table.column("hash_ids")
    if block_size and hashes.null_count < len(hashes):
        out = _rebuild_hashes(table, out, picks, block_size)
    return out


def _rebuild_hashes(source: pa.Table, out: pa.Table, picks: np.ndarray, block_size: int) -> pa.Table:
    """Synthetic hash lists whose leading-block reuse follows the source's, request by request.

    Requests are grouped by their source's first block (the shared system prompt / conversation
    root). Synthetic request j with source reuse k takes its first k blocks from the most recent
    earlier synthetic request of its group that is at least k blocks long (else the longest prefix
    it can get) and fresh blocks for the rest; the first request of a group starts cold, as a new
    replica would. Python work is per request (a few dict/list operations over ≤ 64 length classes);
    inheritance chains are resolved by vectorised pointer jumping.
    """
    src = pc.fill_null(source.column("hash_ids").combine_chunks(), pa.scalar([], pa.list_(pa.int64())))
    src_len = pc.list_value_length(src).to_numpy().astype(np.int64)
    first_block = _first_blocks(src, src_len)
    reuse = leading_reuse_unbounded(src)
    lengths = src_len[picks]
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    parent = np.arange(offsets[-1], dtype=np.int64)  # each block points at the block it copies
    # group -> [most recent synthetic request per length class (bit length of its block count)]
    recent: dict[int, list[int]] = {}
    lengths_list = lengths.tolist()
    for j, s in enumerate(picks.tolist()):
        group = int(first_block[s])
        if group < 0:
            continue
        classes = recent.setdefault(group, [-1] * 64)
        k = int(reuse[s])
        if k > 0:
            cls = k.bit_length()
            longer = max(classes[cls + 1 :])  # every request in a higher class has more than k blocks
            same = classes[cls] if classes[cls] >= 0 and lengths_list[classes[cls]] >= k else -1
            prev = max(longer, same)
            if prev < 0:  # nobody long enough yet: reuse what the longest earlier request offers
                prev = max(classes)
            if prev >= 0:
                take = min(k, lengths_list[prev], lengths_list[j])
                parent[offsets[j] : offsets[j] + take] = np.arange(offsets[prev], offsets[prev] + take)
        classes[lengths_list[j].bit_length()] = j
    while True:  # pointer jumping: every block ends at the original it was copied from
        nxt = parent[parent]
        if np.array_equal(nxt, parent):
            break
        parent = nxt
    new_lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(parent, pa.int64()))
    isl = out.column("isl").to_numpy()
    out = out.set_column(out.schema.get_field_index("hash_ids"), "hash_ids", new_lists)
    hits = hit_tokens(leading_reuse_unbounded(new_lists), isl, block_size)
    return out.set_column(out.schema.get_field_index("prefix_hit_tokens"), "prefix_hit_tokens", pa.array(hits))


def _first_blocks(lists: pa.ListArray, lengths: np.ndarray) -> np.ndarray:
    offsets = lists.offsets.to_numpy().astype(np.int64)
    flat = lists.flatten().to_numpy().astype(np.int64)
    first = np.full(lengths.size, -1, dtype=np.int64)
    has = lengths > 0
    first[has] = flat[offsets[:-1][has] - offsets[0]]
    return first


def synthesize(table: pa.Table, n: int, arrivals: ArrivalSpec, rng: np.random.Generator) -> pa.Table:
    """`n` jointly resampled requests on a fresh arrival process; ids and source rows renumbered."""
    out = resample_joint(table, n, rng)
    times = generate_arrivals(n, arrivals, rng)
    out = out.set_column(out.schema.get_field_index("arrival_s"), "arrival_s", pa.array(times))
    out = out.set_column(out.schema.get_field_index("request_id"), "request_id", pa.array(np.arange(n, dtype=np.int64)))
    meta = dict(table.schema.metadata or {})
    meta[b"llmcap.source_format"] = b"synthetic"
    meta[b"llmcap.start"] = b"+0.000s"
    meta[b"llmcap.arrivals"] = b"generated"
    return out.replace_schema_metadata(meta)


def spread_ties(table: pa.Table, rng: np.random.Generator, min_tie_share: float = 0.5) -> pa.Table:
    """Undo timestamp quantisation: when most arrivals share their timestamp with the previous one (a trace
    logged at a coarse tick, e.g. Mooncake's whole seconds), spread each tick's requests uniformly at
    random over [t, t + tick) — tick = the smallest positive gap — keeping their order. Without this, a
    rate-scaled trace keeps every tick's requests simultaneous at any rate: bursts no real client sends.
    Returns the table unchanged when ties are rare (below `min_tie_share` of gaps)."""
    arrival = table.column("arrival_s").to_numpy()
    gaps = np.diff(arrival)
    if gaps.size == 0 or np.mean(gaps == 0) < min_tie_share or not np.any(gaps > 0):
        return table
    tick = float(gaps[gaps > 0].min())
    spread = np.sort(arrival + rng.uniform(0.0, tick, arrival.size))  # same-tick requests stay within their tick
    return table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(spread))
