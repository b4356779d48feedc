"""Readers: any supported trace file → one `RawTrace` of canonical columns, not yet cleaned.

Every format is a *preset* (`llmcap.trace.presets`): the container (CSV / JSONL / Parquet), which source
column feeds which canonical column, and the unit of the arrival clock. Files are parsed by pyarrow in bulk;
Python only looks at individual lines on the degraded path, to name and quarantine records pyarrow could not
parse.

Values that cannot be parsed become nulls here, and cleaning quarantines them with a reason; a file
that cannot be used at all raises one `InputFileError` naming the file, line and field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmcap.errors import InputFileError
from llmcap.trace._csv import read_csv
from llmcap.trace._json import read_json_document, read_jsonl
from llmcap.trace._lines import LineIndex
from llmcap.trace.arrivals import generate_arrivals
from llmcap.trace.detect import Sniff, detect_format
from llmcap.trace.params import ArrivalSpec, TraceParams
from llmcap.trace.presets import Preset, preset_for, source_columns
from llmcap.trace.timestamps import arrival_seconds, resolve_time_unit, to_float


@dataclass
class RawTrace:
    """Canonical columns as read (one entry per source record, in file order), before cleaning."""

    path: Path
    format: str
    arrival_s: np.ndarray  # float64 seconds from the earliest parseable arrival; NaN when unparseable
    isl: np.ndarray  # float64; NaN when missing/unparseable
    osl: np.ndarray
    labels: dict[
        str, pa.Array
    ]  # model/adapter/tenant/session/feature (string), deadline_s, max_tokens and priority (float64), hash_ids (list)
    source_row: np.ndarray  # int64, 0-based record index
    line: np.ndarray  # int64 1-based line in the file (row index + 1 for Parquet)
    parse_error: np.ndarray  # object: None, or why the record could not be parsed
    raw_text: dict[int, str] = field(default_factory=dict)  # source_row -> raw record, for unparsable records
    start: str = "+0.000s"
    block_size: int | None = None
    zero_osl_reason: str = "osl_below_1"
    generated_arrivals: bool = False
    arrival_column: str | None = None  # the source column the clock was read from (None: generated)
    arrival_unit: str | None = None  # its unit: s | ms | us | ns | datetime
    arrival_process: str | None = None  # how generated arrivals were drawn, e.g. "poisson at 2 req/s, seed 0"
    line_index: LineIndex | None = None

    @property
    def rows(self) -> int:
        return int(self.source_row.size)

    def raw(self, rows: np.ndarray) -> list[str | None]:
        """The original text of the given source rows (for the quarantine file)."""
        out: list[str | None] = []
        for r, ln in zip(rows.tolist(), self.line[rows].tolist(), strict=True):
            if r in self.raw_text:
                out.append(self.raw_text[r])
            elif self.line_index is not None:
                out.append(self.line_index.text(ln))
            else:
                out.append(None)
        return out


def read_trace(path: str | Path, params: TraceParams | None = None) -> RawTrace:
    """Read `path` (format auto-detected unless `params.format` forces one) into a `RawTrace`."""
    path = Path(path)
    params = params or TraceParams(file=str(path))
    fmt, found = detect_format(path, params.format)
    canonical = _canonical_metadata(path, found)
    preset = preset_for(fmt, params, canonical)
    source_cols = source_columns(path, fmt, found, preset, params)
    reader = {"csv": read_csv, "jsonl": read_jsonl, "json": read_json_document, "parquet": _read_parquet}[
        preset.container
    ]
    table, parse_errors, raw_text, line_index, lines = reader(path, found, source_cols)
    _require_scalar_types(path, table, source_cols)
    if table.num_rows == 0 and not parse_errors:
        raise InputFileError(
            path, "no data rows (only a header or empty records)", line=2 if preset.container == "csv" else 1
        )
    rows = _Records(table, source_cols, parse_errors)
    block_size = params.block_size or preset.block_size
    labels = _labels(path, rows, block_size)
    arrival_s, start, generated, arrival_unit = _arrivals(path, rows, params, preset, lines)
    if canonical is not None:  # an llmcap trace read back: its clock is already relative to its recorded start
        start = canonical.get(b"llmcap.start", b"+0.000s").decode()
        generated = canonical.get(b"llmcap.arrivals", b"file") == b"generated"
    return RawTrace(
        path=path,
        format=canonical.get(b"llmcap.source_format", b"parquet").decode() if canonical is not None else fmt,
        arrival_s=arrival_s,
        isl=rows.floats("isl"),
        osl=rows.floats("osl"),
        labels=labels,
        source_row=np.arange(rows.n, dtype=np.int64),
        line=lines,
        parse_error=rows.errors(),
        raw_text=raw_text,
        start=start,
        block_size=block_size if "hash_ids" in labels else None,
        zero_osl_reason=preset.zero_osl_reason,
        generated_arrivals=generated,
        arrival_column=source_cols.get("arrival"),
        arrival_unit=arrival_unit,
        arrival_process=_describe(params.arrivals) if generated and canonical is None else None,
        line_index=line_index,
    )


class _Records:
    """The container's table of parseable records (`source_cols` maps canonical -> its column) placed back among
    every record of the file: `n` records, those in `parse_errors` unparseable."""

    def __init__(self, table: pa.Table, source_cols: dict[str, str], parse_errors: dict[int, str]):
        self.table, self.source_cols, self.parse_errors = table, source_cols, parse_errors
        self.n = table.num_rows + len(parse_errors)
        self.ok_rows = np.setdiff1d(
            np.arange(self.n, dtype=np.int64), np.fromiter(parse_errors, dtype=np.int64, count=len(parse_errors))
        )

    def errors(self) -> np.ndarray:
        """Per record: None, or why it could not be parsed."""
        error = np.full(self.n, None, dtype=object)
        for r, why in self.parse_errors.items():
            error[r] = why
        return error

    def floats(self, name: str) -> np.ndarray:
        """Canonical column `name` as float64 per record; NaN where unmapped or unparseable."""
        out = np.full(self.n, np.nan)
        if name in self.source_cols:
            out[self.ok_rows] = to_float(self.table.column(self.source_cols[name]))
        return out


def _labels(path: Path, rows: _Records, block_size: int | None) -> dict[str, pa.Array]:
    """The mapped label columns per record: text labels, numeric ones (deadline_s, max_tokens, priority) and the prefix
    hash ids (which need a block size)."""
    source_cols, table = rows.source_cols, rows.table
    labels: dict[str, pa.Array] = {}
    for name in ("model", "adapter", "tenant", "session", "feature", "request_id"):
        if name in source_cols:
            labels[name] = _scatter_arrow(
                pc.cast(table.column(source_cols[name]), pa.string()), rows.ok_rows, rows.n, pa.string()
            )
    for name in ("deadline_s", "max_tokens", "priority"):
        if name in source_cols:
            labels[name] = pa.array(rows.floats(name), from_pandas=True)
    column = source_cols.get("hash_ids")
    if column is None or table.column(column).null_count == table.num_rows:
        return labels  # an all-null column (a canonical trace of a source without hashes) is no hashes
    hashes = table.column(column)
    if not pa.types.is_list(hashes.type) or not (
        pa.types.is_integer(hashes.type.value_type) or pa.types.is_null(hashes.type.value_type)
    ):
        raise InputFileError(path, f"hash_ids must be a list of integers, got {hashes.type}", field=column)
    labels["hash_ids"] = _scatter_arrow(_hash_ids_as_int64(hashes), rows.ok_rows, rows.n, pa.list_(pa.int64()))
    if block_size is None:
        raise InputFileError(
            path,
            "the trace has prefix hashes but no block size: pass --hash-block-size (trace.block_size)",
            field=column,
        )
    return labels


def _arrivals(
    path: Path, rows: _Records, params: TraceParams, preset: Preset, lines: np.ndarray
) -> tuple[np.ndarray, str, bool, str | None]:
    """(arrival seconds per record, the clock's start, whether generated, the clock's unit): read from the mapped clock
    column (NaN where unparseable), or generated by `params.arrivals` when the file has none."""
    if "arrival" not in rows.source_cols:
        arrival_s = generate_arrivals(rows.n, params.arrivals, np.random.default_rng(params.arrivals.seed))
        return arrival_s, "+0.000s", True, None
    name = rows.source_cols["arrival"]
    column = rows.table.column(name)
    unit = resolve_time_unit(path, name, column, preset.time_unit)
    values, start = arrival_seconds(path, name, column, unit, lines[rows.ok_rows])
    arrival_s = np.full(rows.n, np.nan)
    arrival_s[rows.ok_rows] = values
    return arrival_s, start, False, unit


#: Canonical columns read as numbers (the arrival clock may also be a date-time).
NUMERIC = ("arrival", "isl", "osl", "max_tokens", "priority", "deadline_s")


def _require_scalar_types(path: Path, table: pa.Table, source_cols: dict[str, str]) -> None:
    """Typed containers (Parquet, JSON) can hold anything in a column; a column of lists, structs or
    booleans where a number or a label belongs is unusable as a whole, and said so (True is not 1 token)."""
    for canon, name in source_cols.items():
        if canon == "hash_ids" or name not in table.column_names:
            continue
        typ = table.column(name).type
        text = (
            pa.types.is_string(typ)
            or pa.types.is_large_string(typ)
            or pa.types.is_dictionary(typ)
            or pa.types.is_null(typ)
        )
        number = pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
        clock = canon == "arrival" and (pa.types.is_timestamp(typ) or pa.types.is_date(typ))
        if text or number or clock or (canon not in NUMERIC and pa.types.is_boolean(typ)):
            continue
        wanted = "a number per request" if canon in NUMERIC else "a text label per request"
        raise InputFileError(path, f"column holds {typ} values, expected {wanted} for '{canon}'", field=name)


def _describe(spec: ArrivalSpec) -> str:
    shape = "" if spec.process == "poisson" else f" cv {spec.cv:g}"
    return f"{spec.process}{shape} at {spec.rate_rps:g} req/s, seed {spec.seed}"


def _canonical_metadata(path: Path, found: Sniff) -> dict[bytes, bytes] | None:
    """The schema metadata of a Parquet trace llmcap wrote (`trace clean`, `trace synth`), else None."""
    if found.container != "parquet":
        return None
    metadata = pq.read_schema(path).metadata or {}
    return metadata if b"llmcap.schema" in metadata else None


def _hash_ids_as_int64(hashes: pa.ChunkedArray) -> pa.ChunkedArray:
    """Hash ids are identities, not numbers: unsigned 64-bit ids (real hashes are often >= 2^63) keep
    their bits as int64 (two's complement), so equal ids stay equal and different ones different."""
    if pa.types.is_uint64(hashes.type.value_type):
        chunks = []
        for chunk in hashes.chunks:
            values = chunk.values.to_numpy(zero_copy_only=False).view(np.int64)
            offsets = chunk.offsets
            chunks.append(pa.ListArray.from_arrays(offsets, pa.array(values), mask=chunk.is_null()))
        return pa.chunked_array(chunks, pa.list_(pa.int64()))
    return pc.cast(hashes, pa.list_(pa.int64()))


# ---------------------------------------------------------------------------------------------
# containers (CSV in `_csv`, JSON in `_json`): each returns (table of the mapped source columns for parseable
#             records, {record index: error} for unparseable ones, {record index: raw text}, LineIndex|None,
#             1-based line number per record)


def _read_parquet(path: Path, found: Sniff, cols: dict[str, str]):
    table = pq.read_table(path, columns=list(dict.fromkeys(cols.values())))
    n = table.num_rows
    return table, {}, {}, None, np.arange(1, n + 1, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# value coercion


def _scatter_arrow(col: pa.ChunkedArray, ok_rows: np.ndarray, n: int, typ: pa.DataType) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if ok_rows.size == n:
        return arr
    # put parsed values at their record positions; unparseable records get null
    idx = np.full(n, -1, dtype=np.int64)
    idx[ok_rows] = np.arange(ok_rows.size)
    return pc.take(arr, pa.array(np.where(idx >= 0, idx, 0), mask=idx < 0)).cast(typ)
