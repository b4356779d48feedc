"""The JSON containers: JSON Lines (one request per line) and one JSON document of per-request lists.

A record's nested objects are read under dotted names, so a logged request's fields are mapped like any column: an
OpenAI-style request log line `{"request": {"max_completion_tokens": 256}, "response": {"usage": {"prompt_tokens": 9}}}`
has the columns `request.max_completion_tokens` and `response.usage.prompt_tokens`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from llmcap.errors import InputFileError
from llmcap.trace._lines import LineIndex
from llmcap.trace.detect import Sniff


def flatten(table: pa.Table) -> pa.Table:
    """Struct columns (nested objects) as one column per leaf, named by their dotted path."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


def lookup(obj: dict, dotted: str) -> Any:
    """`obj`'s value at a column name: a top-level key, else the dotted path into nested objects (None when absent)."""
    if dotted in obj:
        return obj[dotted]
    value: Any = obj
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def read_jsonl(path: Path, found: Sniff, cols: dict[str, str]):
    wanted = list(dict.fromkeys(cols.values()))
    index = LineIndex(path)
    record_lines = index.nonempty_lines.astype(np.int64)
    try:
        with path.open("rb") as fh:
            if found.bom:
                fh.seek(3)
            table = flatten(
                pajson.read_json(fh, read_options=pajson.ReadOptions(use_threads=False, block_size=1 << 24))
            )
        missing = [c for c in wanted if c not in table.column_names]
        table = _coerce_json_table(table, wanted, missing)
        if table is not None and table.num_rows == record_lines.size:
            return table, {}, {}, index, record_lines
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    # Degraded path: some records are not valid JSON objects, or types differ between records.
    # Parse line by line so each bad record is named and quarantined instead of failing the file.
    return _read_jsonl_per_line(path, index, record_lines, wanted, list_cols={cols.get("hash_ids")})


def _coerce_json_table(table: pa.Table, wanted: list[str], missing: list[str]) -> pa.Table | None:
    out = {}
    for name in wanted:
        if name in missing:
            out[name] = pa.nulls(table.num_rows)
            continue
        col = table.column(name)
        if pa.types.is_struct(col.type) or (
            pa.types.is_list(col.type)
            and not pa.types.is_integer(col.type.value_type)
            and not pa.types.is_null(col.type.value_type)
        ):
            return None
        out[name] = col
    return pa.table(out)


def _read_jsonl_per_line(path: Path, index: LineIndex, record_lines: np.ndarray, wanted: list[str], list_cols: set):
    values: dict[str, list] = {c: [] for c in wanted}
    errors: dict[int, str] = {}
    raw: dict[int, str] = {}
    for i, ln in enumerate(record_lines.tolist()):
        text = index.text(ln)
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except (json.JSONDecodeError, ValueError) as exc:
            errors[i] = f"malformed record: {getattr(exc, 'msg', str(exc))}"
            raw[i] = text
            continue
        for c in wanted:
            values[c].append(lookup(obj, c))
    columns = {}
    for c, vals in values.items():
        if c in list_cols:  # a hash list that is not a list of integers is unusable: null, quarantined later
            columns[c] = pa.array([_int64_hashes(v) for v in vals], pa.list_(pa.int64()))
        else:
            columns[c] = pa.array(
                [None if v is None or isinstance(v, (list, dict)) else str(v) for v in vals], pa.string()
            )
    return pa.table(columns), errors, raw, index, record_lines


def read_json_document(path: Path, found: Sniff, cols: dict[str, str]):
    """One JSON document whose mapped keys are per-request lists of equal length (one record per index;
    every record's line is the document's first)."""
    doc = json.loads(path.read_bytes())
    wanted = list(dict.fromkeys(cols.values()))
    lengths = {c: len(doc[c]) for c in wanted if isinstance(doc.get(c), list)}
    bad = [c for c in wanted if c not in lengths]
    if bad:
        raise InputFileError(path, "expected a list of per-request values", field=bad[0])
    if len(set(lengths.values())) > 1:
        raise InputFileError(
            path, f"per-request lists differ in length: {lengths}", field=max(lengths, key=lengths.__getitem__)
        )
    table = pa.table(
        {c: pa.array([None if isinstance(v, (list, dict)) else str(v) for v in doc[c]], pa.string()) for c in wanted}
    )
    return table, {}, {}, None, np.ones(table.num_rows, dtype=np.int64)


def _int64_hashes(value: object) -> list[int] | None:
    """A JSON hash list as int64 ids (unsigned 64-bit ids keep their bits, as in `_hash_ids_as_int64`);
    None when it is not a list of integers that fit 64 bits."""
    if not isinstance(value, list) or not all(type(x) is int and -(1 << 63) <= x < (1 << 64) for x in value):
        return None
    return [x - (1 << 64) if x >= (1 << 63) else x for x in value]
