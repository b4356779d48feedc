"""How every command reads its trace: the same options, the same reader and cleaning
(`llmcap.trace.ingest`), and the same one-line account of what was read — rows in, kept, quarantined
by reason, duplicates dropped, where the arrival times came from. Output paths are checked before
any work starts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

from llmcap.commands._common import err_console
from llmcap.config import CleanParams, TraceParams
from llmcap.errors import LlmcapError
from llmcap.trace import ingest
from llmcap.trace.clean import CleanReport, CleanResult

FormatOpt = Annotated[
    str,
    typer.Option("--format", "-f", help="auto|mooncake|azure|burstgpt|lengths|vllm-bench|guidellm|csv|jsonl|parquet"),
]
TimeUnitOpt = Annotated[
    str, typer.Option("--time-unit", help="arrival clock of generic formats: auto|s|ms|us|ns|datetime")
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option("--column", "-c", help="generic formats: CANONICAL=SOURCE, e.g. -c isl=prompt_tokens -c arrival=ts"),
]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--hash-block-size",
        min=1,
        help="tokens per prefix hash block of hash_ids (default: the format's own, Mooncake 512)",
    ),
]
GenerateArrivalsOpt = Annotated[
    bool,
    typer.Option("--generate-arrivals", help="a file without a clock column: draw Poisson arrivals at --arrival-rate"),
]
ArrivalRateOpt = Annotated[
    float, typer.Option("--arrival-rate", help="req/s of generated arrivals (length-only files, --generate-arrivals)")
]
DuplicatesOpt = Annotated[
    str,
    typer.Option(
        "--duplicates",
        help="by_id: drop rows equal in every field to an earlier one, a request-id column included (default; without "
        "ids nothing is dropped) | identical: also without ids | keep",
    ),
]
PrefixScopeOpt = Annotated[
    str | None,
    typer.Option(
        "--prefix-scope",
        help="labels whose values never share prefix KV, a comma list of model, adapter, tenant (default model,adapter: other "
        "weights; add tenant where tenants are isolated; none = the trace's hashes as given)",
    ),
]
MaxContextOpt = Annotated[int, typer.Option("--max-context", min=1, help="quarantine rows with ISL+OSL above this")]

DEFAULT_MAX_CONTEXT = CleanParams().max_context_tokens


def validated(model: type[BaseModel], **values: Any) -> Any:
    """A params model from option values; a bad value is one line naming the option."""
    try:
        return model(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or ", ".join(
            sorted(values)
        )  # a check across options has no single field
        raise LlmcapError(f"invalid option {where}: {err['msg']}") from None


def prefix_scope(value: str | None) -> dict[str, list[str]]:
    """CleanParams' `prefix_scope` from --prefix-scope (empty: the default)."""
    if value is None:
        return {}
    items = [v.strip() for v in value.split(",") if v.strip()]
    return {"prefix_scope": [] if items == ["none"] else items}


def trace_params(
    file: Path,
    fmt: str = "auto",
    time_unit: str = "auto",
    columns: list[str] | None = None,
    block_size: int | None = None,
    generate_arrivals: bool = False,
    arrival_rate: float = 1.0,
) -> TraceParams:
    mapping = {}
    for item in columns or []:
        canon, sep, source = item.partition("=")
        if not sep:
            raise LlmcapError(f"--column expects CANONICAL=SOURCE, got {item!r}")
        mapping[canon.strip()] = source.strip()
    positive("--arrival-rate", arrival_rate)
    return validated(
        TraceParams,
        file=str(file),
        format=fmt,
        time_unit=time_unit,
        columns=mapping,
        block_size=block_size,
        generate_arrivals=generate_arrivals,
        arrivals={"rate_rps": arrival_rate},
    )


def read_input(file: Path, trace: TraceParams, clean: CleanParams, *, announce: bool = True) -> CleanResult:
    """Read and clean `file`; print the one-line account on stderr (unless `announce` is off, e.g. for
    --json, whose output carries `input_accounting` instead); fail clearly when no row survived."""
    with err_console.status(f"reading {file.name} …"):
        result = ingest(file, trace, clean)
    if announce:
        err_console.print(account_line(result.report), highlight=False, markup=False, soft_wrap=True)
    warn(file, result.report)
    result.require_rows()
    return result


def warn(file: Path, report: CleanReport) -> None:
    """The input's warnings on stderr, also under --json (whose output carries them too): never silent."""
    for warning in report.warnings:
        err_console.print(f"warning: {file}: {warning}", style="yellow", highlight=False, markup=False, soft_wrap=True)


def read_trace_input(
    file: Path,
    fmt: str,
    time_unit: str,
    columns: list[str] | None,
    block_size: int | None,
    generate_arrivals: bool,
    arrival_rate: float,
    duplicates: str,
    *,
    announce: bool,
    scope: str | None = None,
) -> CleanResult:
    """`read_input` from the input options every trace-reading command takes."""
    trace = trace_params(file, fmt, time_unit, columns, block_size, generate_arrivals, arrival_rate)
    return read_input(
        file, trace, validated(CleanParams, duplicates=duplicates, **prefix_scope(scope)), announce=announce
    )


def account_line(r: CleanReport) -> str:
    """`trace.csv (csv): 600 rows in = 600 kept + 0 quarantined; duplicates by_id: 0 dropped; arrivals from 'arrival_s' (s)`."""
    reasons = {k: v for k, v in r.by_reason.items() if k != "duplicate"}
    why = f" ({', '.join(f'{k} {v:,}' for k, v in reasons.items())})" if reasons else ""
    if r.generated_arrivals:
        how = f": {r.arrival_process} (--arrival-rate sets the rate)" if r.arrival_process else ""
        clock = f"arrivals GENERATED{how}; the file has no arrival times"
    else:
        clock = (
            f"arrivals from '{r.arrival_column}' ({r.arrival_unit})" if r.arrival_column else "arrivals from the file"
        )
    return (
        f"{r.source_file} ({r.source_format}): {r.rows_in:,} rows in = {r.rows_kept:,} kept + {r.rows_quarantined:,} "
        f"quarantined{why}; duplicates {r.duplicates}: {r.by_reason.get('duplicate', 0):,} dropped; {clock}"
        + (f"; {r.prefix_scope}" if r.prefix_scope else "")
    )


def account_json(r: CleanReport) -> dict[str, Any]:
    keys = (
        "source_file",
        "source_format",
        "rows_in",
        "rows_kept",
        "rows_quarantined",
        "by_reason",
        "duplicates",
        "generated_arrivals",
        "arrival_process",
        "arrival_column",
        "arrival_unit",
        "block_size",
        "warnings",
    )
    return {k: getattr(r, k) for k in keys} | ({"prefix_scope": r.prefix_scope} if r.prefix_scope else {})


def positive(option: str, value: float | None) -> None:
    """Rates, scales and targets: a positive, finite number (inf and nan are typos, never plans)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise LlmcapError(f"{option} must be a positive finite number, got {value}")


#: Planning rates outside these (req/s) are typos, not workloads: one request in 11.6 days, ten million a second.
RATE_BOUNDS = (1e-6, 1e7)


def plausible_rate(what: str, rps: float) -> None:
    lo, hi = RATE_BOUNDS
    if not lo <= rps <= hi:
        raise LlmcapError(f"{what} would be {rps:.3g} req/s, outside the plausible {lo:g}..{hi:g} req/s")


def check_outputs(inputs: list[Path], outputs: list[Path]) -> None:
    """Before any work: every output can be written, none is an input, none is written twice."""
    seen: dict[Path, Path] = {}
    sources = {_identity(p) for p in inputs if p.exists()}
    for out in outputs:
        if out.is_dir():
            raise LlmcapError(f"{out}: is a directory; give a file path to write")
        ident = _identity(out)
        if ident in sources:
            raise LlmcapError(f"{out}: is the input file; writing it would overwrite the source trace")
        if ident in seen:
            raise LlmcapError(f"{out}: given for two outputs ({seen[ident]} and {out}); they need different paths")
        seen[ident] = out
        parent = next((p for p in out.absolute().parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise LlmcapError(f"{out}: cannot be written (no writable directory {parent or out.parent})")
        if out.exists() and not os.access(out, os.W_OK):
            raise LlmcapError(f"{out}: cannot be written (permission denied)")


def _identity(path: Path) -> Path:
    return Path(os.path.realpath(path))
