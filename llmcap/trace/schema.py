"""The canonical trace schema every reader produces and every later step consumes.

One row per request, sorted by arrival. Columns:

| column            | type           | meaning                                                                 |
|-------------------|----------------|-------------------------------------------------------------------------|
| request_id        | int64          | 0..n-1 in cleaned arrival order                                         |
| arrival_s         | float64        | seconds since the first kept request (the absolute start is metadata)  |
| isl               | int64          | input (prompt) tokens, ≥ 1                                             |
| osl               | int64          | output (generated) tokens, ≥ 1                                          |
| max_tokens        | int64          | the client's cap on output tokens (≥ osl), null when unknown            |
| priority          | int64          | scheduling priority (vLLM's request `priority`: lower first), null when none |
| hash_ids          | list<int64>    | prefix block hashes (one per `block_size` tokens), null when unknown    |
| prefix_hit_tokens | int64          | leading tokens reusable from earlier requests (infinite cache), null when no hashes |
| model             | string         | model name, null when unknown                                           |
| adapter           | string         | LoRA adapter, null when none/unknown                                    |
| tenant            | string         | tenant / traffic class, null when unknown                               |
| session           | string         | conversation/session id, null when unknown                              |
| feature           | string         | the request's feature class (structured output, logprobs, beam, speculative decoding, multimodal, …), null when none/unknown |
| deadline_s        | float64        | per-request end-to-end deadline (s), null when none                     |
| source_row        | int64          | 0-based record index in the source file (header excluded)              |

Schema metadata (all strings): `llmcap.schema` (version), `llmcap.source_format`, `llmcap.source_file`
(base name only, so outputs do not depend on where a checkout lives), `llmcap.block_size` (empty when no
hashes), `llmcap.start` (absolute time of the first kept request, ISO 8601, or the offset in the
source's own relative clock, e.g. `+0.000s`), `llmcap.arrivals` (`file`, or `generated` when the arrival
times were drawn from an arrival process rather than read).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = (
    "trace/3"  # trace/2 added max_tokens, trace/3 feature and priority (an older file reads with them null)
)

#: Columns an older canonical trace lacks, by the version that added them: read back as null.
ADDED_SINCE = {"max_tokens": "trace/2", "feature": "trace/3", "priority": "trace/3"}

FIELDS: list[pa.Field] = [
    pa.field("request_id", pa.int64(), nullable=False),
    pa.field("arrival_s", pa.float64(), nullable=False),
    pa.field("isl", pa.int64(), nullable=False),
    pa.field("osl", pa.int64(), nullable=False),
    pa.field("max_tokens", pa.int64()),
    pa.field("priority", pa.int64()),
    pa.field("hash_ids", pa.list_(pa.int64())),
    pa.field("prefix_hit_tokens", pa.int64()),
    pa.field("model", pa.string()),
    pa.field("adapter", pa.string()),
    pa.field("tenant", pa.string()),
    pa.field("session", pa.string()),
    pa.field("feature", pa.string()),
    pa.field("deadline_s", pa.float64()),
    pa.field("source_row", pa.int64(), nullable=False),
]

CANONICAL_SCHEMA = pa.schema(FIELDS)
CANONICAL_COLUMNS: list[str] = [f.name for f in FIELDS]

#: Optional string columns a reader may fill.
LABEL_COLUMNS: tuple[str, ...] = ("model", "adapter", "tenant", "session", "feature")

#: Quarantine = canonical columns as read (lengths still float, may be null), plus why and the raw text.
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source_row", pa.int64(), nullable=False),
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
        pa.field("arrival_s", pa.float64()),
        pa.field("isl", pa.float64()),
        pa.field("osl", pa.float64()),
        pa.field("model", pa.string()),
        pa.field("tenant", pa.string()),
        pa.field("raw", pa.string()),
    ]
)


def metadata(
    *, source_format: str, source_file: str, block_size: int | None, start: str, generated_arrivals: bool = False
) -> dict[bytes, bytes]:
    """Schema metadata for a canonical trace (see module docstring)."""
    return {
        b"llmcap.schema": SCHEMA_VERSION.encode(),
        b"llmcap.source_format": source_format.encode(),
        b"llmcap.source_file": source_file.encode(),
        b"llmcap.block_size": b"" if block_size is None else str(block_size).encode(),
        b"llmcap.start": start.encode(),
        b"llmcap.arrivals": b"generated" if generated_arrivals else b"file",
    }


def block_size_of(table: pa.Table) -> int | None:
    """The prefix block size recorded in a canonical trace's metadata (None when it has no hashes)."""
    raw = (table.schema.metadata or {}).get(b"llmcap.block_size", b"")
    return int(raw) if raw else None
