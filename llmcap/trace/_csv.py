"""The CSV container: a file's mapped columns parsed by pyarrow in bulk, its malformed records (a wrong column count,
bytes that are not UTF-8) quarantined by line rather than failing the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from llmcap.errors import InputFileError
from llmcap.trace._lines import LineIndex
from llmcap.trace.detect import Sniff


def read_csv(path: Path, found: Sniff, cols: dict[str, str]):
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


def _arrow_msg(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]
