"""Cleaning: RawTrace → canonical trace + quarantine, with exact accounting.

Each row gets at most one reason: the first check it fails, in the order of `REASONS`. Kept rows are
sorted by arrival (stable, so ties keep file order), re-based so the first kept request arrives at 0,
and numbered. rows_in = rows_kept + rows_quarantined is checked, not assumed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import LlmcapError
from llmcap.trace import schema
from llmcap.trace.params import CleanParams
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded
from llmcap.trace.readers import RawTrace

log = logging.getLogger(__name__)

#: Every reason a row can be quarantined for, in the order they are checked.
REASONS: tuple[str, ...] = (
    "malformed_record",
    "invalid_arrival",
    "isl_missing",
    "isl_not_finite",
    "isl_negative",
    "isl_zero",
    "isl_not_integer",
    "osl_missing",
    "osl_not_finite",
    "osl_not_integer",
    "failed_request",
    "osl_below_1",
    "max_tokens_invalid",
    "osl_above_max_tokens",
    "priority_invalid",
    "hash_ids_invalid",
    "exceeds_max_context",
    "outside_window",
    "test_traffic",
    "duplicate",
)


@dataclass(frozen=True)
class CleanReport:
    source_file: str
    source_format: str
    rows_in: int
    rows_kept: int
    rows_quarantined: int
    by_reason: dict[str, int]
    out_of_order_rows: int  # kept rows that arrived earlier than a row before them in the file
    start: str
    duration_s: float
    block_size: int | None
    generated_arrivals: bool
    arrival_column: str | None  # the source column the arrival clock came from (None: generated)
    arrival_unit: str | None  # s | ms | us | ns | datetime
    arrival_process: str | None  # generated arrivals: how they were drawn
    duplicates: str  # the duplicate policy applied (CleanParams.duplicates)
    warnings: tuple[str, ...] = ()  # kept-but-suspicious input, said once each (a clock that changes units, reused ids)
    prefix_scope: str = (
        ""  # prefix hashes re-numbered apart by model/adapter/tenant (`llmcap.trace.scope`); "" when not
    )
    accounting_ok: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "accounting_ok", self.rows_in == self.rows_kept + self.rows_quarantined)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CleanResult:
    trace: pa.Table
    quarantine: pa.Table
    report: CleanReport

    def require_rows(self) -> None:
        """Fail clearly when nothing survived cleaning (after the quarantine has been written)."""
        if self.report.rows_kept == 0:
            top = ", ".join(f"{k}={v}" for k, v in sorted(self.report.by_reason.items(), key=lambda kv: -kv[1])[:3])
            raise LlmcapError(f"{self.report.source_file}: all {self.report.rows_in} rows were quarantined ({top})")


def clean_trace(raw: RawTrace, params: CleanParams) -> CleanResult:
    reason, detail = _quarantine_reasons(raw, params)
    keep = reason == None  # noqa: E711
    kept_rows = np.flatnonzero(keep)
    order = kept_rows[np.argsort(raw.arrival_s[kept_rows], kind="stable")]
    trace = _canonical(raw, order)
    quarantine = _quarantine(raw, np.flatnonzero(~keep), reason, detail)
    report = _report(raw, params, trace, quarantine, reason[~keep], kept_rows, order)
    if not report.accounting_ok:  # an internal bug, never a user error: fail loudly
        raise AssertionError(
            f"row accounting broken: {raw.rows} in, {trace.num_rows} kept, {quarantine.num_rows} quarantined"
        )
    trace = trace.replace_schema_metadata(
        schema.metadata(
            source_format=raw.format,
            source_file=raw.path.name,
            block_size=raw.block_size,
            start=report.start,
            generated_arrivals=raw.generated_arrivals,
        )
    )
    by_reason = report.by_reason
    log.info(
        "%s: %d rows in, %d kept, %d quarantined%s",
        report.source_file,
        report.rows_in,
        report.rows_kept,
        report.rows_quarantined,
        f" ({', '.join(f'{r} {c}' for r, c in by_reason.items())})" if by_reason else "",
    )
    return CleanResult(trace=trace, quarantine=quarantine, report=report)


def _quarantine_reasons(raw: RawTrace, params: CleanParams) -> tuple[np.ndarray, np.ndarray]:
    """(reason, detail) per source row, None where the row is kept: the rules in order, each row quarantined by the
    first rule it breaks."""
    n = raw.rows
    reason = np.full(n, None, dtype=object)
    detail = np.full(n, None, dtype=object)

    def flag(mask: np.ndarray, why: str, text: str | np.ndarray | Callable | None = None) -> None:
        new = np.flatnonzero(mask & (reason == None))  # noqa: E711 — elementwise on an object array
        if new.size == 0:
            return
        reason[new] = why
        if callable(text):
            detail[new] = np.array(text(new), dtype=object)
        elif text is not None:
            detail[new] = text[new] if isinstance(text, np.ndarray) else text

    has_error = raw.parse_error != None  # noqa: E711
    flag(has_error, "malformed_record", raw.parse_error)
    flag(~np.isfinite(raw.arrival_s), "invalid_arrival", "missing or unparseable arrival time")
    _flag_lengths(flag, "isl", raw.isl)
    _flag_lengths(flag, "osl", raw.osl, zero_reason=raw.zero_osl_reason)
    if "max_tokens" in raw.labels:
        _flag_max_tokens(flag, raw.labels["max_tokens"].to_numpy(zero_copy_only=False), raw.osl)
    if "priority" in raw.labels:
        priority = raw.labels["priority"].to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            flag(
                ~np.isnan(priority) & (np.isinf(priority) | (priority != np.floor(priority))),
                "priority_invalid",
                _fmt("priority=", priority),
            )
    if "hash_ids" in raw.labels:
        flag(
            pc.is_null(raw.labels["hash_ids"]).to_numpy(zero_copy_only=False),
            "hash_ids_invalid",
            "hash_ids missing or not a list of integers",
        )
    with np.errstate(invalid="ignore"):
        total = raw.isl + raw.osl
        flag(
            total > params.max_context_tokens,
            "exceeds_max_context",
            _fmt("ISL+OSL=", total, f" > {params.max_context_tokens}"),
        )
        if params.window_start_s is not None:
            flag(
                raw.arrival_s < params.window_start_s,
                "outside_window",
                f"before window_start_s={params.window_start_s}",
            )
        if params.window_end_s is not None:
            flag(raw.arrival_s >= params.window_end_s, "outside_window", f"at/after window_end_s={params.window_end_s}")
    for rule in params.exclude:
        matched = _exclude_matches(raw, rule.field, rule.pattern)
        if matched is not None:
            flag(matched, "test_traffic", f"{rule.field} matches {rule.pattern!r}")
    if params.duplicates == "identical" or (params.duplicates == "by_id" and "request_id" in raw.labels):
        flag(_duplicates(raw, reason == None), "duplicate", "exact duplicate of an earlier row")  # noqa: E711

    return reason, detail


def _report(
    raw: RawTrace,
    params: CleanParams,
    trace: pa.Table,
    quarantine: pa.Table,
    quarantined: np.ndarray,
    kept_rows: np.ndarray,
    order: np.ndarray,
) -> CleanReport:
    """What cleaning did: rows in, kept (`kept_rows`, `order` by arrival) and quarantined (`quarantined`: each one's
    reason), out-of-order rows, the clock and the warnings."""
    arrival = raw.arrival_s[kept_rows]
    out_of_order = int((arrival < np.maximum.accumulate(arrival)).sum()) if arrival.size else 0
    counts = pd.Series(quarantined, dtype=object).value_counts()
    by_reason = {r: int(counts[r]) for r in REASONS if r in counts.index}
    arrivals = trace.column("arrival_s").to_numpy()
    return CleanReport(
        source_file=raw.path.name,
        source_format=raw.format,
        rows_in=raw.rows,
        rows_kept=trace.num_rows,
        rows_quarantined=quarantine.num_rows,
        by_reason=by_reason,
        out_of_order_rows=out_of_order,
        start=_start_of(raw, order),
        duration_s=float(arrivals[-1]) if arrivals.size else 0.0,
        block_size=raw.block_size,
        generated_arrivals=raw.generated_arrivals,
        arrival_column=raw.arrival_column,
        arrival_unit=raw.arrival_unit,
        arrival_process=raw.arrival_process,
        duplicates=params.duplicates,
        warnings=tuple(w for w in (_clock_jump(raw, kept_rows), _reused_ids(raw, kept_rows)) if w),
    )


#: Typical inter-arrival gaps that differ this many decades between the start and the end of a file
#: (about 1000×: seconds against milliseconds) point at a clock that changes units part-way.
CLOCK_JUMP_DECADES = 2.5
MIN_GAPS_EACH_SIDE = 10


def _clock_jump(raw: RawTrace, kept: np.ndarray) -> str | None:
    """A warning when the typical gap (geometric mean) before some line and after it differ ~1000×.
    Prefix and suffix means of log-gaps come from cumulative sums, so every split is judged in one pass."""
    if raw.generated_arrivals:
        return None
    gaps = np.diff(raw.arrival_s[kept])
    positive = np.flatnonzero(gaps > 0)
    side = max(MIN_GAPS_EACH_SIDE, positive.size // 20)
    if positive.size < 2 * side:
        return None
    logs = np.log10(gaps[positive])
    total = np.cumsum(logs)
    k = np.arange(side, positive.size - side + 1)  # split after the first k positive gaps
    before = total[k - 1] / k
    after = (total[-1] - total[k - 1]) / (positive.size - k)
    best = int(np.argmax(np.abs(after - before)))
    if abs(after[best] - before[best]) < CLOCK_JUMP_DECADES:
        return None
    line = int(raw.line[kept[positive[k[best]] + 1]])
    return (
        f"typical gap between arrivals changes {10 ** abs(after[best] - before[best]):,.0f}x at line {line} "
        f"({10 ** before[best]:.3g} s before, {10 ** after[best]:.3g} s after): does the clock switch units part-way? "
        "The plan's rate follows the clock as read"
    )


def _reused_ids(raw: RawTrace, kept: np.ndarray) -> str | None:
    """A warning when kept rows share a request id: not exact copies (those are duplicates), so kept."""
    if "request_id" not in raw.labels or kept.size < 2:
        return None
    ids = pd.Series(raw.labels["request_id"].take(pa.array(kept)).to_numpy(zero_copy_only=False))
    reused = ids.notna() & ids.duplicated(keep="first")
    if not reused.any():
        return None
    first = ids[reused].iloc[0]
    lines = raw.line[kept[(ids == first).to_numpy()]][:3].tolist()
    return (
        f"{int(reused.sum()):,} kept rows reuse an earlier row's request_id with different fields (e.g. {first!r} at lines "
        f"{', '.join(map(str, lines))}); each is kept as its own request"
    )


def _exclude_matches(raw: RawTrace, field: str, pattern: str) -> np.ndarray | None:
    """Rows whose `field` matches `pattern` in full (None when the trace has no such field). The
    pattern runs on Arrow's RE2, which lacks some of Python's syntax (look-arounds, back-references):
    a pattern either engine rejects is the user's error, named."""
    try:
        re.compile(pattern)
        if field not in raw.labels:
            return None
        matched = pc.match_substring_regex(raw.labels[field], f"^(?:{pattern})$")
    except (re.error, pa.ArrowInvalid) as exc:
        raise LlmcapError(
            f"exclude rule {field}={pattern!r}: not a usable regular expression ({str(exc).splitlines()[0]})"
        ) from None
    return matched.fill_null(False).to_numpy(zero_copy_only=False)


def _flag_lengths(flag, name: str, values: np.ndarray, zero_reason: str | None = None) -> None:
    with np.errstate(invalid="ignore"):
        flag(np.isnan(values), f"{name}_missing", f"{name} missing or not a number")
        flag(np.isinf(values), f"{name}_not_finite", _fmt(f"{name}=", values))
        if name == "isl":
            flag(values < 0, "isl_negative", _fmt("isl=", values))
            flag(values == 0, "isl_zero", "isl=0")
            flag(values != np.floor(values), "isl_not_integer", _fmt("isl=", values))
        else:
            flag(values != np.floor(values), "osl_not_integer", _fmt("osl=", values))
            flag(values == 0, zero_reason or "osl_below_1", "osl=0")
            flag(values < 1, "osl_below_1", _fmt("osl=", values, " < 1"))


def _flag_max_tokens(flag, cap: np.ndarray, osl: np.ndarray) -> None:
    """A cap is optional (NaN: none), but one that is given must be a whole number ≥ 1 and hold the output it capped."""
    with np.errstate(invalid="ignore"):
        given = ~np.isnan(cap)
        flag(
            given & (np.isinf(cap) | (cap < 1) | (cap != np.floor(cap))), "max_tokens_invalid", _fmt("max_tokens=", cap)
        )
        flag(
            given & (osl > cap),
            "osl_above_max_tokens",
            lambda rows: [f"osl={o:.6g} > max_tokens={c:.6g}" for o, c in zip(osl[rows], cap[rows], strict=True)],
        )


def _fmt(prefix: str, values: np.ndarray, suffix: str = ""):
    """Detail text for the flagged rows only (formatting every row would put Python on the hot path)."""
    return lambda rows: [f"{prefix}{v:.6g}{suffix}" for v in values[rows]]


def _duplicates(raw: RawTrace, candidates: np.ndarray) -> np.ndarray:
    """Rows identical to an earlier candidate row in every canonical field (the first one is kept)."""
    cols = {"arrival_s": raw.arrival_s, "isl": raw.isl, "osl": raw.osl}
    for name, arr in raw.labels.items():
        if name != "hash_ids":  # request_id included: with ids, only a repeated id can be a duplicate
            cols[name] = arr.to_numpy(zero_copy_only=False)
    frame = pd.DataFrame(cols)[candidates]
    dup = np.zeros(raw.rows, dtype=bool)
    maybe = frame.duplicated(keep=False)
    if not maybe.any():
        return dup
    # Scalar fields tie: compare the (few) tied rows' hash lists exactly.
    tied = frame[maybe]
    if "hash_ids" in raw.labels:
        hashes = raw.labels["hash_ids"].take(pa.array(tied.index.to_numpy())).to_pylist()
        tied = tied.assign(
            _hashes=[tuple(h) for h in hashes]
        )  # no candidate's list is null: those were hash_ids_invalid
    repeated = tied.duplicated(keep="first")
    dup[tied.index[repeated.to_numpy()].to_numpy()] = True
    return dup


def _optional_int(values: pa.Array | None, order: np.ndarray) -> pa.Array:
    """An optional whole-number column of the kept rows (NaN: null), or all null when the source has none."""
    if values is None:
        return pa.nulls(order.size, pa.int64())
    kept = values.to_numpy(zero_copy_only=False)[order]
    return pa.array(np.nan_to_num(kept).astype(np.int64), pa.int64(), mask=np.isnan(kept))


def _canonical(raw: RawTrace, order: np.ndarray) -> pa.Table:
    idx = pa.array(order)
    arrival = raw.arrival_s[order]
    arrival = arrival - arrival[0] if arrival.size else arrival
    columns: dict[str, pa.Array] = {
        "request_id": pa.array(np.arange(order.size, dtype=np.int64)),
        "arrival_s": pa.array(arrival, pa.float64()),
        "isl": pa.array(raw.isl[order].astype(np.int64)),
        "osl": pa.array(raw.osl[order].astype(np.int64)),
        "max_tokens": _optional_int(raw.labels.get("max_tokens"), order),
        "priority": _optional_int(raw.labels.get("priority"), order),
    }
    isl = raw.isl[order].astype(np.int64)
    if "hash_ids" in raw.labels and raw.block_size:
        hashes = raw.labels["hash_ids"].take(idx)
        columns["hash_ids"] = hashes
        columns["prefix_hit_tokens"] = pa.array(hit_tokens(leading_reuse_unbounded(hashes), isl, raw.block_size))
    else:
        columns["hash_ids"] = pa.nulls(order.size, pa.list_(pa.int64()))
        columns["prefix_hit_tokens"] = pa.nulls(order.size, pa.int64())
    for name in schema.LABEL_COLUMNS:
        columns[name] = raw.labels[name].take(idx) if name in raw.labels else pa.nulls(order.size, pa.string())
    columns["deadline_s"] = (
        raw.labels["deadline_s"].take(idx) if "deadline_s" in raw.labels else pa.nulls(order.size, pa.float64())
    )
    columns["source_row"] = pa.array(raw.source_row[order])
    return pa.table(columns, schema=schema.CANONICAL_SCHEMA)


def _quarantine(raw: RawTrace, rows: np.ndarray, reason: np.ndarray, detail: np.ndarray) -> pa.Table:
    idx = pa.array(rows)

    def label(name: str) -> pa.Array:
        return raw.labels[name].take(idx) if name in raw.labels else pa.nulls(rows.size, pa.string())

    return pa.table(
        {
            "source_row": pa.array(raw.source_row[rows]),
            "line": pa.array(raw.line[rows]),
            "reason": pa.array(reason[rows].tolist(), pa.string()),
            "detail": pa.array(detail[rows].tolist(), pa.string()),
            "arrival_s": pa.array(raw.arrival_s[rows], from_pandas=True),
            "isl": pa.array(raw.isl[rows], from_pandas=True),
            "osl": pa.array(raw.osl[rows], from_pandas=True),
            "model": label("model"),
            "tenant": label("tenant"),
            "raw": pa.array(raw.raw(rows), pa.string()),
        },
        schema=schema.QUARANTINE_SCHEMA,
    )


def _start_of(raw: RawTrace, order: np.ndarray) -> str:
    """Absolute start of the cleaned trace: the source start shifted to the first kept request."""
    if order.size == 0:
        return raw.start
    offset = float(raw.arrival_s[order[0]])
    if raw.start.startswith("+"):
        return f"+{float(raw.start[1:-1]) + offset:.3f}s"
    base = np.datetime64(raw.start, "ns") + np.timedelta64(int(round(offset * 1e9)), "ns")
    return str(base)
