"""Readers: any supported trace file → one `RawTrace` of canonical columns, not yet cleaned.

Every format is a *preset*: the container (CSV / JSONL / Parquet), which source column feeds which
canonical column, and the unit of the arrival clock. Known formats are presets; the generic
containers take the mapping from params (default: the canonical names themselves, so llmcap's own
outputs read back). Files are parsed by pyarrow in bulk; Python only looks at individual lines on the
degraded path, to name and quarantine records pyarrow could not parse.

Values that cannot be parsed become nulls here, and cleaning quarantines them with a reason; a file
that cannot be used at all raises one `InputFileError` naming the file, line and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from llmcap.errors import InputFileError
from llmcap.trace._json import read_json_document, read_jsonl
from llmcap.trace._lines import LineIndex
from llmcap.trace.arrivals import generate_arrivals
from llmcap.trace.detect import Sniff, detect_format
from llmcap.trace.params import CANONICAL_MAPPABLE, ArrivalSpec, TraceParams
from llmcap.trace.timestamps import arrival_seconds, resolve_time_unit, to_float

REQUIRED = ("isl", "osl")


@dataclass(frozen=True)
class Preset:
    container: str
    columns: dict[str, str]  # canonical -> source column
    time_unit: str  # s | ms | us | ns | datetime | auto
    block_size: int | None = None
    zero_osl_reason: str = "osl_below_1"  # BurstGPT marks failed requests with 0 response tokens


PRESETS: dict[str, Preset] = {
    "mooncake": Preset(
        "jsonl",
        {"arrival": "timestamp", "isl": "input_length", "osl": "output_length", "hash_ids": "hash_ids"},
        "ms",
        block_size=512,
    ),
    "azure": Preset("csv", {"arrival": "TIMESTAMP", "isl": "ContextTokens", "osl": "GeneratedTokens"}, "datetime"),
    "burstgpt": Preset(
        "csv",
        {
            "arrival": "Timestamp",
            "isl": "Request tokens",
            "osl": "Response tokens",
            "model": "Model",
            "tenant": "Log Type",
        },
        "s",
        zero_osl_reason="failed_request",
    ),
    "lengths": Preset("csv", {"isl": "num_prefill_tokens", "osl": "num_decode_tokens"}, "s"),
    # `vllm bench serve --save-result --save-detailed`: start_times are perf_counter seconds at send (newer
    # vLLM); a failed request has 0 output tokens. The file keeps no request's max_tokens (only the lengths it
    # measured), so its caps read as unknown
    "vllm-bench": Preset(
        "json",
        {"arrival": "start_times", "isl": "input_lens", "osl": "output_lens"},
        "s",
        zero_osl_reason="failed_request",
    ),
    # guidellm's request data (its synthetic/preprocessed datasets): lengths only, arrivals generated. guidellm sends
    # output_tokens_count as the request's max_tokens with ignore_eos (backends/openai/request_handlers.py): it is the
    # cap and, the end of sequence ignored, the output too
    "guidellm": Preset(
        "jsonl", {"isl": "prompt_tokens_count", "osl": "output_tokens_count", "max_tokens": "output_tokens_count"}, "s"
    ),
}

_DEFAULT_GENERIC = {"arrival": "arrival_s", **{c: c for c in CANONICAL_MAPPABLE if c != "arrival"}}


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
    preset = _preset_for(fmt, params, canonical)
    source_cols = {canon: src for canon, src in preset.columns.items()}
    if fmt not in PRESETS:  # generic: only the mapped columns that exist; required ones must
        source_cols = {c: s for c, s in source_cols.items() if s in found.fields or c in params.columns}
    for canon in REQUIRED:
        if canon not in source_cols or source_cols[canon] not in found.fields:
            wanted = source_cols.get(canon, _DEFAULT_GENERIC[canon])
            raise InputFileError(
                path,
                f"required column for '{canon}' is missing (have: {', '.join(found.fields)})",
                line=1,
                field=wanted,
            )
    if fmt == "vllm-bench" and "start_times" not in found.fields:
        del source_cols["arrival"]  # older vLLM wrote no send times: a length-only file, arrivals generated (and said)
    if "arrival" in source_cols and source_cols["arrival"] not in found.fields:
        if fmt in PRESETS or "arrival" in params.columns:
            raise InputFileError(
                path,
                f"the arrival-time column is missing (have: {', '.join(found.fields)})",
                line=1,
                field=source_cols["arrival"],
            )
        del source_cols["arrival"]
    if fmt not in PRESETS and "max_tokens" not in source_cols:
        cap = _cap_column(path, found)
        if cap is not None:
            source_cols["max_tokens"] = cap
    if fmt not in PRESETS and "arrival" not in source_cols:
        clock = _clock_column(path, found, params.generate_arrivals)
        if clock is not None:
            source_cols["arrival"] = clock

    _require_unique_columns(path, found, source_cols)
    reader = {"csv": _read_csv, "jsonl": read_jsonl, "json": read_json_document, "parquet": _read_parquet}[
        preset.container
    ]
    table, parse_errors, raw_text, line_index, lines = reader(path, found, source_cols)
    _require_scalar_types(path, table, source_cols)
    if table.num_rows == 0 and not parse_errors:
        raise InputFileError(
            path, "no data rows (only a header or empty records)", line=2 if preset.container == "csv" else 1
        )

    n = table.num_rows + len(parse_errors)
    ok_rows = np.setdiff1d(
        np.arange(n, dtype=np.int64), np.fromiter(parse_errors, dtype=np.int64, count=len(parse_errors))
    )
    error = np.full(n, None, dtype=object)
    for r, why in parse_errors.items():
        error[r] = why

    def scatter_float(name: str) -> np.ndarray:
        out = np.full(n, np.nan)
        if name in source_cols:
            out[ok_rows] = to_float(table.column(source_cols[name]))
        return out

    labels: dict[str, pa.Array] = {}
    for name in ("model", "adapter", "tenant", "session", "feature", "request_id"):
        if name in source_cols:
            labels[name] = _scatter_arrow(
                pc.cast(table.column(source_cols[name]), pa.string()), ok_rows, n, pa.string()
            )
    for name in ("deadline_s", "max_tokens", "priority"):
        if name in source_cols:
            labels[name] = pa.array(scatter_float(name), from_pandas=True)
    block_size = params.block_size or preset.block_size
    if "hash_ids" in source_cols and table.column(source_cols["hash_ids"]).null_count == table.num_rows:
        del source_cols["hash_ids"]  # an all-null column (a canonical trace of a source without hashes) is no hashes
    if "hash_ids" in source_cols:
        hashes = table.column(source_cols["hash_ids"])
        if not pa.types.is_list(hashes.type) or not (
            pa.types.is_integer(hashes.type.value_type) or pa.types.is_null(hashes.type.value_type)
        ):
            raise InputFileError(
                path, f"hash_ids must be a list of integers, got {hashes.type}", field=source_cols["hash_ids"]
            )
        labels["hash_ids"] = _scatter_arrow(_hash_ids_as_int64(hashes), ok_rows, n, pa.list_(pa.int64()))
        if block_size is None:
            raise InputFileError(
                path,
                "the trace has prefix hashes but no block size: pass --hash-block-size (trace.block_size)",
                field=source_cols["hash_ids"],
            )

    generated = "arrival" not in source_cols
    arrival_unit = None
    if generated:
        arrival_s = generate_arrivals(n, params.arrivals, np.random.default_rng(params.arrivals.seed))
        start = "+0.000s"
    else:
        column = table.column(source_cols["arrival"])
        arrival_unit = resolve_time_unit(path, source_cols["arrival"], column, preset.time_unit)
        values, start = arrival_seconds(path, source_cols["arrival"], column, arrival_unit, lines[ok_rows])
        arrival_s = np.full(n, np.nan)
        arrival_s[ok_rows] = values
    if canonical is not None:  # an llmcap trace read back: its clock is already relative to its recorded start
        start = canonical.get(b"llmcap.start", b"+0.000s").decode()
        generated = canonical.get(b"llmcap.arrivals", b"file") == b"generated"

    return RawTrace(
        path=path,
        format=canonical.get(b"llmcap.source_format", b"parquet").decode() if canonical is not None else fmt,
        arrival_s=arrival_s,
        isl=scatter_float("isl"),
        osl=scatter_float("osl"),
        labels=labels,
        source_row=np.arange(n, dtype=np.int64),
        line=lines,
        parse_error=error,
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


def _require_unique_columns(path: Path, found: Sniff, source_cols: dict[str, str]) -> None:
    """A mapped column whose name appears twice in the header is ambiguous: which one is meant is not guessed."""
    for canon, name in source_cols.items():
        where = [i + 1 for i, f in enumerate(found.fields) if f == name]
        if len(where) > 1:
            raise InputFileError(
                path,
                f"the header names '{name}' {len(where)} times (columns {', '.join(map(str, where))}), so which one is "
                f"'{canon}' is ambiguous: rename or drop one",
                line=1 if found.container != "parquet" else None,
                field=name,
            )


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


#: Column names a generic file's arrival clock goes by (lower-cased), besides the canonical `arrival_s`.
CLOCK_NAME = re.compile(
    r"(arrival|arrived|timestamp|time|ts|t|created|created_at|start|start_time|started_at|request_time|"
    r"send_time|sent_at|submit_time|submitted_at)(_(s|ms|us|ns|sec|secs|seconds|time|timestamp|at))?"
)


def _clock_column(path: Path, found: Sniff, generate: bool) -> str | None:
    """The arrival clock of a generic file without an `arrival_s` column: the one column whose name
    says it is a clock, or None when arrivals are to be generated (asked for). Anything else is an
    error naming the candidates: an arrival process is never invented silently."""
    candidates = [f for f in found.fields if CLOCK_NAME.fullmatch(f.strip().lower())]
    if generate:
        if candidates:
            raise InputFileError(
                path,
                f"arrivals were asked to be generated, but the file has a clock column ({', '.join(candidates)}): "
                "drop --generate-arrivals or map it with -c arrival=COLUMN",
                line=1,
                field=candidates[0],
            )
        return None
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise InputFileError(
            path,
            f"several columns could be the arrival clock ({', '.join(candidates)}): map one with "
            "-c arrival=COLUMN (trace.columns.arrival)",
            line=1,
            field="arrival_s",
        )
    raise InputFileError(
        path,
        f"no arrival-time column (have: {', '.join(found.fields)}): map one with -c arrival=COLUMN "
        "(trace.columns.arrival), or pass --generate-arrivals (trace.generate_arrivals) to draw them from trace.arrivals",
        line=1,
        field="arrival_s",
    )


#: What OpenAI-style request bodies call the cap on output tokens: `max_tokens`, and `max_completion_tokens`, which
#: OpenAI's chat API now documents in its place (vLLM reads either).
CAP_NAMES = ("max_tokens", "max_completion_tokens")


def _cap_column(path: Path, found: Sniff) -> str | None:
    """A generic file's max_tokens column when it is not named `max_tokens` at the top level: the one field whose
    name, or the last part of its dotted path (`request.max_completion_tokens`), is a cap's name; None when there is
    none; an error naming them when there are several (which one the engine honoured is not guessed)."""
    candidates = [f for f in found.fields if f.rsplit(".", 1)[-1] in CAP_NAMES]
    if len(candidates) > 1:
        raise InputFileError(
            path,
            f"several columns could be max_tokens ({', '.join(candidates)}): map one with -c max_tokens=COLUMN",
            line=1,
            field=candidates[0],
        )
    return candidates[0] if candidates else None


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


def _preset_for(fmt: str, params: TraceParams, canonical: dict[bytes, bytes] | None) -> Preset:
    if fmt in PRESETS:
        return PRESETS[fmt]
    block_size = params.block_size
    if canonical is not None and block_size is None and canonical.get(b"llmcap.block_size"):
        block_size = int(canonical[b"llmcap.block_size"])
    return Preset(fmt, {**_DEFAULT_GENERIC, **params.columns}, params.time_unit, block_size)


# ---------------------------------------------------------------------------------------------
# containers: each returns (table of the mapped source columns for parseable records,
#             {record index: error} for unparseable ones, {record index: raw text}, LineIndex|None,
#             1-based line number per record)


def _read_csv(path: Path, found: Sniff, cols: dict[str, str]):
    wanted = list(dict.fromkeys(cols.values()))
    # Header names are matched with surrounding spaces stripped ("arrival_s, isl, osl" is a common
    # export); pyarrow sees the names as written, so ask for those and rename back.
    as_written = dict(zip(found.fields, found.raw_fields, strict=True))
    bad_lines: list[tuple[int | None, str, int, int]] = []

    def on_invalid(row) -> str:
        bad_lines.append((row.number, row.text, row.expected_columns, row.actual_columns))
        return "skip"

    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 24),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(
                include_columns=[as_written[c] for c in wanted],
                column_types={
                    as_written[c]: pa.binary() for c in wanted
                },  # text checked per column below, so a bad byte is one row's fault
                strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise InputFileError(path, f"cannot parse CSV: {_arrow_msg(exc)}") from None
    table = table.rename_columns(wanted)
    index = LineIndex(path)
    record_lines = index.nonempty_lines[1:]  # line 1 (first non-empty) is the header
    n = record_lines.size
    bad_line_nos = {ln for ln, *_ in bad_lines if ln is not None}
    if len(bad_line_nos) != len(bad_lines):  # pyarrow could not number a row: fall back to matching text
        bad_texts = {t for _, t, *_ in bad_lines}
        bad_line_nos = {int(ln) for ln in record_lines.tolist() if index.text(int(ln)) in bad_texts}
    errors, raw = {}, {}
    pos = {int(ln): i for i, ln in enumerate(record_lines.tolist()) if int(ln) in bad_line_nos}
    for ln, text, expected, actual in bad_lines:
        i = pos.get(ln) if ln is not None else None
        if i is None:
            continue
        errors[i] = f"malformed record: expected {expected} columns, got {actual}"
        raw[i] = text
    if table.num_rows + len(errors) != n:
        line = index.first_open_quote_line()
        raise InputFileError(
            path,
            "a quoted field runs onto the next line (quoted newlines are not supported: one record per line)"
            if line is not None
            else f"record count mismatch: parsed {table.num_rows} + {len(errors)} malformed of {n} lines",
            line=line,
        )
    table = _utf8_columns(table, errors, raw, index, record_lines)
    return table, errors, raw, index, record_lines.astype(np.int64)


def _utf8_columns(
    table: pa.Table, errors: dict[int, str], raw: dict[int, str], index: LineIndex, record_lines: np.ndarray
) -> pa.Table:
    """The CSV's binary columns as text. A record with bytes that are not UTF-8 is quarantined (malformed,
    named by column) rather than failing the file; only such a column is looked at value by value."""
    bad_rows: dict[int, str] = {}
    columns = {}
    for name in table.column_names:
        try:
            columns[name] = pc.cast(table.column(name), pa.string())
            continue
        except pa.ArrowInvalid:
            pass
        values = []
        for row, value in enumerate(table.column(name).to_pylist()):
            try:
                values.append(None if value is None else value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                values.append(None)
                bad_rows.setdefault(
                    row, f"malformed record: not UTF-8 text in column '{name}' (byte 0x{value[exc.start]:02x})"
                )
        columns[name] = pa.chunked_array([pa.array(values, pa.string())])
    table = pa.table(columns)
    if not bad_rows:
        return table
    parsed = np.setdiff1d(
        np.arange(record_lines.size), np.fromiter(errors, dtype=np.int64, count=len(errors))
    )  # record index per table row
    for row, why in bad_rows.items():
        record = int(parsed[row])
        errors[record] = why
        raw[record] = index.text(int(record_lines[record]))
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(bad_rows)] = False
    return table.filter(pa.array(keep))


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


def _arrow_msg(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]
