"""Trace ingestion, cleaning, characterisation and synthesis (step 1 of the loop).

Public API:
    read_trace(path, TraceParams) -> RawTrace          any supported format, auto-detected
    clean_trace(RawTrace, CleanParams) -> CleanResult  canonical trace + quarantine + report
    ingest(path, TraceParams, CleanParams)             both of the above (also pipes, .gz/.bz2/.xz/.zst)
    characterise(table, CharacteriseParams) -> dict    the workload summary
    plot_workload(...)                                 PNG plots (import llmcap.trace.plots)
    scale_rate / resample_joint / synthesize           what-if traces
    write_table / load_trace                           deterministic Parquet I/O
"""

from __future__ import annotations

from llmcap import _native

_native.load("trace")  # first: the compiled LRU pass (if built from these sources) before anything imports it

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.errors import InputFileError, LlmcapError
from llmcap.trace.clean import REASONS, CleanReport, CleanResult, clean_trace
from llmcap.trace.params import CleanParams, TraceParams
from llmcap.trace.readers import RawTrace, read_trace
from llmcap.trace.schema import ADDED_SINCE, CANONICAL_SCHEMA
from llmcap.trace.scope import scope_prefix_hashes
from llmcap.trace.source import local_file
from llmcap.trace.stats import characterise
from llmcap.trace.synth import mean_rate, resample_joint, scale_rate, synthesize

__all__ = [
    "CANONICAL_SCHEMA",
    "REASONS",
    "CleanReport",
    "CleanResult",
    "RawTrace",
    "characterise",
    "clean_trace",
    "ingest",
    "load_trace",
    "mean_rate",
    "read_trace",
    "resample_joint",
    "scale_rate",
    "synthesize",
    "write_table",
]


def ingest(path: str | Path, trace: TraceParams | None = None, clean: CleanParams | None = None) -> CleanResult:
    """Read and clean a trace in one call: any format, a compressed file or a pipe, an llmcap Parquet
    trace included (the one way every command reads its input)."""
    path = Path(path)
    with local_file(path) as local:
        try:
            raw = read_trace(local, trace)
        except InputFileError as exc:
            raise exc.at(path) from None
        raw.path = path
        clean = clean or CleanParams()
        result = clean_trace(raw, clean)
    trace, scoped = scope_prefix_hashes(result.trace, clean.prefix_scope)
    return replace(result, trace=trace, report=replace(result.report, prefix_scope=scoped)) if scoped else result


def write_table(table: pa.Table, path: str | Path) -> Path:
    """Write Parquet deterministically (no timestamps or paths in the file; same table → same bytes)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd", use_dictionary=True, write_statistics=True)
    except OSError as exc:
        raise LlmcapError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path


READ_BATCH_ROWS = (
    1 << 16
)  # Parquet is decoded this many rows at a time: one huge row group never peaks at several times its size


def load_trace(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A canonical trace written by `write_table` (checked against the schema); `columns`: only these
    canonical columns (a simulation reads `llmcap.sim.workload.SIM_COLUMNS`)."""
    path = Path(path)
    names = list(CANONICAL_SCHEMA.names if columns is None else columns)
    unknown = [c for c in names if c not in CANONICAL_SCHEMA.names]
    if unknown:
        raise ValueError(f"not canonical trace columns: {unknown}")
    try:
        pf = pq.ParquetFile(path, pre_buffer=False)
        present = pf.schema_arrow.names
        missing = [f.name for f in CANONICAL_SCHEMA if f.name not in present and f.name not in ADDED_SINCE]
        if missing:
            raise InputFileError(path, "not a canonical llmcap trace", field=missing[0])
        metadata = pf.schema_arrow.metadata
        stored = [c for c in names if c in present]
        batches = list(pf.iter_batches(batch_size=READ_BATCH_ROWS, columns=stored, use_threads=False))
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputFileError(path, f"not a readable Parquet trace ({exc})") from None
    schema = pa.schema([CANONICAL_SCHEMA.field(c) for c in names], metadata=metadata)
    read = pa.Table.from_batches(
        batches, schema=pa.schema([pf.schema_arrow.field(c) for c in stored], metadata=metadata)
    )
    columns = [
        read.column(c) if c in stored else pa.nulls(read.num_rows, CANONICAL_SCHEMA.field(c).type) for c in names
    ]
    return pa.Table.from_arrays(columns, names=names).replace_schema_metadata(metadata).cast(schema)
