"""Trace ingestion, cleaning, characterisation and synthesis (step 1 of the loop).

Public API:
    read_trace(path, TraceParams) -> RawTrace          any supported format, auto-detected
    clean_trace(RawTrace, CleanParams) -> CleanResult  canonical trace + quarantine + report
    ingest(path, TraceParams, CleanParams)             both of the above
    characterise(table, CharacteriseParams) -> dict    the workload summary
    plot_workload(...)                                 PNG plots (import llmcap.trace.plots)
    scale_rate / resample_joint / synthesize           what-if traces
    write_table / load_trace                           deterministic Parquet I/O
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.config import CleanParams, TraceParams
from llmcap.errors import InputFileError
from llmcap.trace.clean import REASONS, CleanReport, CleanResult, clean_trace
from llmcap.trace.readers import RawTrace, read_trace
from llmcap.trace.schema import CANONICAL_SCHEMA
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
    """Read and clean a trace file in one call."""
    return clean_trace(read_trace(path, trace), clean or CleanParams())


def write_table(table: pa.Table, path: str | Path) -> Path:
    """Write Parquet deterministically (no timestamps or paths in the file; same table → same bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd", use_dictionary=True, write_statistics=True)
    return path


def load_trace(path: str | Path) -> pa.Table:
    """A canonical trace written by `write_table` (checked against the schema)."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputFileError(path, f"not a readable Parquet trace ({exc})") from None
    missing = [f.name for f in CANONICAL_SCHEMA if f.name not in table.column_names]
    if missing:
        raise InputFileError(path, "not a canonical llmcap trace", field=missing[0])
    return table.select(CANONICAL_SCHEMA.names).cast(CANONICAL_SCHEMA.with_metadata(table.schema.metadata))
