"""Arrival clocks of trace files: the unit of a numeric clock (declared, or told by its magnitude and
spacing), datetimes with or without an offset, and both turned into seconds from the first arrival."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import InputFileError

_UNITS_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}  # divide: exact for integer ms


def to_float(col: pa.ChunkedArray) -> np.ndarray:
    """Numbers as float64; anything unparseable becomes NaN (cleaning quarantines it)."""
    if pa.types.is_null(col.type):
        return np.full(len(col), np.nan)
    try:
        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        series = pd.Series(pc.cast(col, pa.string()).to_numpy(zero_copy_only=False), dtype=object)
        return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def resolve_time_unit(path: Path, name: str, col: pa.ChunkedArray, unit: str) -> str:
    unit = _declared_or_guessed_unit(path, name, col, unit)
    if unit != "datetime":
        _check_epoch_magnitude(path, name, to_float(col), unit)
    return unit


def _declared_or_guessed_unit(path: Path, name: str, col: pa.ChunkedArray, unit: str) -> str:
    if unit != "auto":
        return unit
    for suffix in ("_s", "_ms", "_us", "_ns"):  # a unit in the column name is the author's own statement
        if name.lower().endswith(suffix):
            return suffix[1:]
    if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        return "datetime"
    values = to_float(col)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            return "datetime"
        raise InputFileError(path, "no parseable arrival times", field=name)
    if np.isnan(values).mean() > 0.5:  # mostly non-numeric text: date-time strings
        return "datetime"
    top = float(np.max(np.abs(finite)))
    if top >= 1e8:  # epoch clock: the magnitude says the unit (seconds since 1970 ≈ 1.7e9 today)
        for u in ("s", "ms", "us", "ns"):
            if 1e8 <= top / _UNITS_PER_SECOND[u] < 1e10:
                return u
    span = float(finite.max() - finite.min())
    n = finite.size
    if span > 0 and n > 1:
        plausible = [u for u in ("s", "ms") if 1e-2 <= (n - 1) / (span / _UNITS_PER_SECOND[u]) <= 1e5]
        if len(plausible) == 1:
            return plausible[0]
    raise InputFileError(
        path,
        "cannot tell whether arrival times are seconds or milliseconds; set trace.time_unit (or --time-unit)",
        field=name,
    )


EPOCH_MAX_S = 1e10  # seconds since 1970: year 2286. Beyond it a clock is in a finer unit than it claims.


def _check_epoch_magnitude(path: Path, name: str, values: np.ndarray, unit: str) -> None:
    """A clock whose values would be centuries past 1970 in its stated unit is in another unit (e.g.
    epoch milliseconds in an `arrival_s` column): say which, instead of overflowing a date later."""
    finite = np.abs(values[np.isfinite(values)])
    if finite.size == 0:
        return
    top = float(finite.max())
    if top / _UNITS_PER_SECOND[unit] < EPOCH_MAX_S:
        return
    likely = next((u for u in ("ms", "us", "ns") if 1e8 <= top / _UNITS_PER_SECOND[u] < EPOCH_MAX_S), None)
    hint = (
        f"they look like epoch {_UNIT_WORDS[likely]}: set --time-unit {likely} (trace.time_unit)"
        if likely
        else "set --time-unit"
    )
    raise InputFileError(
        path,
        f"arrival times up to {top:.4g} are not {_UNIT_WORDS[unit]} (that is after the year 2286); {hint}",
        field=name,
    )


_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def arrival_seconds(
    path: Path, name: str, col: pa.ChunkedArray, unit: str, lines: np.ndarray
) -> tuple[np.ndarray, str]:
    """Seconds relative to the earliest parseable arrival, and that start as text."""
    if unit == "datetime":
        ns = _to_epoch_ns(path, name, col, lines)
        valid = ns != np.iinfo(np.int64).min
        if not valid.any():
            return np.full(ns.size, np.nan), "+0.000s"
        origin_ns = int(ns[valid].min())
        rel = np.where(valid, (ns - origin_ns) / 1e9, np.nan)
        return rel, _iso(origin_ns)
    values = to_float(col) / _UNITS_PER_SECOND[unit]
    finite = np.isfinite(values)
    if not finite.any():
        return values, "+0.000s"
    origin = float(values[finite].min())
    if abs(origin) >= 1e8:  # epoch clock: keep the absolute start as a date
        return values - origin, _iso(int(round(origin * 1e9)))
    return values - origin, f"+{origin:.3f}s"


#: An ISO 8601 time with a UTC offset or Z at its end.
_HAS_OFFSET = r"(?:[Zz]|[+-]\d\d(?::?\d\d)?)\s*$"


def _to_epoch_ns(path: Path, name: str, col: pa.ChunkedArray, lines: np.ndarray) -> np.ndarray:
    """Nanoseconds since 1970 (UTC where the text has an offset), int64 min where unparseable.

    Times with UTC offsets are converted to UTC, so a clock that crosses a DST change (-05:00 then
    -04:00) stays monotone. A column mixing times with and without an offset has no single meaning:
    that is an error naming the first line of the rarer kind."""
    if pa.types.is_timestamp(col.type):
        return pc.cast(col, pa.timestamp("ns")).cast(pa.int64()).fill_null(np.iinfo(np.int64).min).to_numpy()
    try:
        ts = pc.cast(col, pa.timestamp("ns"))
        return ts.cast(pa.int64()).fill_null(np.iinfo(np.int64).min).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    text = pc.cast(col, pa.string())
    aware = pc.match_substring_regex(text, _HAS_OFFSET).to_numpy(zero_copy_only=False)
    present = pc.is_valid(text).to_numpy(zero_copy_only=False)
    aware = np.asarray(aware, dtype=object)
    has, lacks = present & (aware == True), present & (aware == False)  # noqa: E712 — elementwise on nullable bools
    if has.any() and lacks.any():
        odd = has if has.sum() < lacks.sum() else lacks
        row = int(np.flatnonzero(odd)[0])
        kind = "has a UTC offset" if odd is has else "has no UTC offset"
        raise InputFileError(
            path,
            f"arrival times mix times with and without a UTC offset; this one {kind}: {text[row]}",
            line=int(lines[row]) if row < lines.size else None,
            field=name,
        )
    series = pd.Series(text.to_numpy(zero_copy_only=False), dtype=object)
    parsed = pd.to_datetime(series, errors="coerce", format="ISO8601", utc=bool(has.any()))
    if has.any():
        parsed = parsed.dt.tz_convert(None)
    return parsed.astype("datetime64[ns]").to_numpy().view(np.int64)


def _iso(epoch_ns: int) -> str:
    seconds, nanos = divmod(epoch_ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None)
    return f"{stamp.isoformat(timespec='seconds')}.{nanos:09d}"
