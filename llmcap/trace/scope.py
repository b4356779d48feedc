"""Prefix hashes scoped to what may share a KV cache.

Two requests reuse each other's prefix KV only if they run the same weights: different models never share
blocks, LoRA adapters change the keys and values (vLLM and SGLang key their prefix caches by adapter), and a
tenant's isolation may forbid reuse across the boundary. A trace's hash ids say only that two prompts start
with the same tokens, so equal blocks of different models, adapters or isolated tenants are re-numbered apart
here, and each request's `prefix_hit_tokens` is counted again on the scoped ids: every consumer (the simulator's
cache, the prefix-aware router, the characterisation, the canonical trace's own column) then counts only reuse that
can happen. A trace with one scope keeps its ids unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded
from llmcap.trace.schema import block_size_of

SCOPE_LABELS = ("model", "adapter", "tenant")


def _present(trace: pa.Table, labels: Sequence[str]) -> list[str]:
    return [name for name in labels if name in trace.column_names and trace.column(name).null_count < trace.num_rows]


def scope_prefix_hashes(trace: pa.Table, labels: Sequence[str]) -> tuple[pa.Table, str]:
    """`trace` with hash_ids re-numbered so that equal blocks match only within one value of each of `labels`
    (a missing label is one value of its own), and a line saying what was done ("" when nothing was)."""
    present = _present(trace, labels)
    if "hash_ids" not in trace.column_names or not present or trace.num_rows == 0:
        return trace, ""
    keys = pc.binary_join_element_wise(
        *[pc.fill_null(trace.column(n).cast(pa.string()), "\x00") for n in present], "\x1f"
    )
    scope = pc.dictionary_encode(keys).combine_chunks().indices.to_numpy().astype(np.int64)
    scopes = int(scope.max()) + 1
    if scopes == 1:
        return trace, ""
    hashes = trace.column("hash_ids").combine_chunks()
    values = pc.list_flatten(hashes).to_numpy(zero_copy_only=False).astype(np.int64)
    owner = scope[pc.list_parent_indices(hashes).to_numpy()]
    pairs = np.stack([owner, values], axis=1)
    _, renumbered = np.unique(pairs, axis=0, return_inverse=True)  # one id per (scope, block): ordered, deterministic
    scoped = pa.ListArray.from_arrays(
        hashes.offsets, pa.array(renumbered.reshape(-1).astype(np.int64)), type=hashes.type, mask=hashes.is_null()
    )
    shared = int(np.unique(values).size)
    line = (
        f"prefix hashes scoped by {' + '.join(present)}: {scopes} scopes; {shared:,} distinct blocks become "
        f"{int(renumbered.max()) + 1 if renumbered.size else 0:,} (reuse across scopes no longer counts)"
    )
    out = trace.set_column(trace.schema.get_field_index("hash_ids"), "hash_ids", scoped)
    block_size = block_size_of(trace)
    if (
        "prefix_hit_tokens" in out.column_names and block_size
    ):  # the hits counted before scoping included reuse across scopes
        hits = hit_tokens(leading_reuse_unbounded(scoped), out.column("isl").to_numpy(), block_size)
        out = out.set_column(
            out.schema.get_field_index("prefix_hit_tokens"), "prefix_hit_tokens", pa.array(hits, pa.int64())
        )
    return out, line
