"""`llmcap trace …`: inspect, clean and synthesise request traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from llmcap.commands._common import err_console, print_json, user_errors
from llmcap.config import ArrivalSpec, CharacteriseParams, CleanParams, ExcludeRule, TraceParams
from llmcap.errors import LlmcapError
from llmcap.trace import characterise, ingest, load_trace, scale_rate, synthesize, write_table
from llmcap.trace.clean import CleanResult

app = typer.Typer(help="Inspect, clean and synthesise request traces.", no_args_is_help=True)

FileArg = Annotated[Path, typer.Argument(help="trace file (Mooncake JSONL, Azure/BurstGPT/length CSV, generic CSV/JSONL/Parquet)")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="auto|mooncake|azure|burstgpt|lengths|csv|jsonl|parquet")]
TimeUnitOpt = Annotated[str, typer.Option("--time-unit", help="arrival clock of generic formats: auto|s|ms|us|ns|datetime")]
ColumnOpt = Annotated[
    list[str] | None, typer.Option("--column", "-c", help="generic formats: CANONICAL=SOURCE, e.g. -c isl=prompt_tokens")
]
MaxContextOpt = Annotated[int, typer.Option("--max-context", help="quarantine rows with ISL+OSL above this")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]


def _params(model, **values):
    try:
        return model(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise LlmcapError(f"invalid option {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def _trace_params(file: Path, fmt: str, time_unit: str, columns: list[str] | None, block_size: int | None = None) -> TraceParams:
    mapping = {}
    for item in columns or []:
        canon, sep, source = item.partition("=")
        if not sep:
            raise LlmcapError(f"--column expects CANONICAL=SOURCE, got {item!r}")
        mapping[canon.strip()] = source.strip()
    return _params(TraceParams, file=str(file), format=fmt, time_unit=time_unit, columns=mapping, block_size=block_size)


def _ingest(file: Path, trace: TraceParams, clean: CleanParams) -> CleanResult:
    with err_console.status(f"reading {file.name} …"):
        return ingest(file, trace, clean)


@app.command()
@user_errors
def inspect(
    file: FileArg,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    max_context: MaxContextOpt = CleanParams().max_context_tokens,
    lru_blocks: Annotated[list[int] | None, typer.Option("--lru-blocks", help="LRU prefix-cache sizes (blocks)")] = None,
    drop_duplicates: Annotated[
        bool, typer.Option("--drop-duplicates/--keep-duplicates", help="describe the file as is (default) or as `clean` keeps it")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Characterise a trace: rates, lengths, correlation, burstiness, prefix reuse (invalid rows left out)."""
    clean_params = _params(CleanParams, max_context_tokens=max_context, drop_duplicates=drop_duplicates)
    result = _ingest(file, _trace_params(file, fmt, time_unit, column), clean_params)
    result.require_rows()
    char = CharacteriseParams() if lru_blocks is None else _params(CharacteriseParams, lru_cache_blocks=lru_blocks)
    summary = characterise(result.trace, char)
    summary["format"] = result.report.source_format
    summary["accounting"] = {k: getattr(result.report, k) for k in ("rows_in", "rows_kept", "rows_quarantined", "by_reason")}
    if json_out:
        print_json(summary)
    else:
        _print_summary(file, summary)


@app.command()
@user_errors
def clean(
    file: FileArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="canonical trace (Parquet) to write")],
    quarantine: Annotated[Path | None, typer.Option("--quarantine", "-q", help="default: OUT with .quarantine.parquet")] = None,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    max_context: MaxContextOpt = CleanParams().max_context_tokens,
    window_start: Annotated[float | None, typer.Option("--window-start", help="s from first request")] = None,
    window_end: Annotated[float | None, typer.Option("--window-end", help="s from first request")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="test traffic: FIELD=REGEX (model/adapter/tenant/session)")] = None,
    keep_duplicates: Annotated[bool, typer.Option("--keep-duplicates", help="do not drop exact duplicate rows")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Clean a trace into the canonical Parquet schema; invalid rows go to a quarantine file with reasons."""
    rules = []
    for item in exclude or []:
        field, sep, pattern = item.partition("=")
        if not sep:
            raise LlmcapError(f"--exclude expects FIELD=REGEX, got {item!r}")
        rules.append(_params(ExcludeRule, field=field, pattern=pattern))
    params = _params(
        CleanParams,
        max_context_tokens=max_context,
        window_start_s=window_start,
        window_end_s=window_end,
        exclude=rules,
        drop_duplicates=not keep_duplicates,
    )
    result = _ingest(file, _trace_params(file, fmt, time_unit, column), params)
    quarantine = quarantine or out.with_name(out.name.removesuffix(".parquet") + ".quarantine.parquet")
    write_table(result.trace, out)
    write_table(result.quarantine, quarantine)
    report = result.report.as_dict() | {"out": str(out), "quarantine": str(quarantine)}
    if json_out:
        print_json(report)
    else:
        r = result.report
        Console().print(
            f"[bold]{r.source_file}[/] ({r.source_format}): {r.rows_in:,} rows in = {r.rows_kept:,} kept + "
            f"{r.rows_quarantined:,} quarantined → {out} / {quarantine}"
        )
        for reason, count in r.by_reason.items():
            Console().print(f"  {reason:<22} {count:>8,}")
    result.require_rows()


@app.command()
@user_errors
def synth(
    file: FileArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="synthetic canonical trace (Parquet)")],
    rate: Annotated[float, typer.Option("--rate", help="target mean arrival rate (req/s)")],
    requests: Annotated[int | None, typer.Option("--requests", "-n", help="requests to draw (default: as many as the source)")] = None,
    arrivals: Annotated[str, typer.Option("--arrivals", help="trace (keep the source clock, rescaled) | poisson | gamma")] = "trace",
    cv: Annotated[float, typer.Option("--cv", help="gamma inter-arrival CV (burstiness; 1 = Poisson)")] = 1.0,
    diurnal_amplitude: Annotated[float, typer.Option("--diurnal-amplitude", help="0..1 sinusoidal rate swing")] = 0.0,
    diurnal_period: Annotated[float, typer.Option("--diurnal-period", help="seconds")] = 86_400.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """What-if trace: rescale the source to a target rate, or resample requests jointly onto new arrivals."""
    source = _load_any(file, fmt, time_unit)
    if arrivals == "trace":
        if requests not in (None, source.num_rows):
            raise LlmcapError("--arrivals trace keeps the source requests; drop --requests or pick poisson/gamma")
        table = scale_rate(source, rate)
    elif arrivals in ("poisson", "gamma"):
        spec = _params(
            ArrivalSpec,
            process=arrivals,
            rate_rps=rate,
            cv=cv,
            diurnal_amplitude=diurnal_amplitude,
            diurnal_period_s=diurnal_period,
            seed=seed,
        )
        table = synthesize(source, requests or source.num_rows, spec, np.random.default_rng(seed))
    else:
        raise LlmcapError(f"--arrivals must be trace, poisson or gamma, got {arrivals!r}")
    write_table(table, out)
    summary = characterise(table, CharacteriseParams(lru_cache_blocks=[]))
    brief = {"out": str(out), "rows": summary["rows"], "mean_rps": summary["mean_rps"], "corr_spearman": summary["corr_spearman"]}
    if json_out:
        print_json(brief)
    else:
        Console().print(f"wrote {brief['rows']:,} requests at {brief['mean_rps']:.3f} req/s → {out}")


def _load_any(file: Path, fmt: str, time_unit: str):
    """A canonical Parquet trace as is, anything else read and cleaned with default params."""
    if file.suffix == ".parquet" and fmt in ("auto", "parquet"):
        try:
            return load_trace(file)
        except LlmcapError:
            pass  # a generic Parquet file, not one of ours: read it like any other trace
    result = _ingest(file, _trace_params(file, fmt, time_unit, None), CleanParams())
    result.require_rows()
    return result.trace


def _print_summary(file: Path, s: dict) -> None:
    console = Console()
    acc = s["accounting"]
    console.print(
        f"[bold]{file.name}[/] ({s['format']}): {s['rows']:,} requests over {s['duration_s']:,.1f} s, "
        f"mean {s['mean_rps'] or 0:.3f} req/s  ({acc['rows_in']:,} read, {acc['rows_quarantined']:,} quarantined)"
    )
    lengths = Table(title="Lengths (tokens)")
    lengths.add_column("")
    keys = [k for k in s["isl"] if k != "min"]
    for k in keys:
        lengths.add_column(k, justify="right")
    for name in ("isl", "osl"):
        lengths.add_row(name.upper(), *(f"{s[name][k]:,.1f}" for k in keys))
    console.print(lengths)
    console.print(
        f"corr(ISL,OSL): Pearson {s['corr_pearson']:.3f}, Spearman {s['corr_spearman']:.3f};  inter-arrival CV "
        f"{s['interarrival_cv'] if s['interarrival_cv'] is None else round(s['interarrival_cv'], 3)}"
    )
    rates = Table(title="Arrival rate per window (req/s)")
    for col in ("window", "windows", "p50", "p90", "p99", "max", "CV", "peak/mean"):
        rates.add_column(col, justify="right")
    for w, r in s["rps_windows"].items():
        if r.get("windows", 0) == 0:
            rates.add_row(w, "0", *["–"] * 6)
            continue
        rates.add_row(w, str(r["windows"]), *(f"{r[k]:.2f}" for k in ("p50", "p90", "p99", "max", "cv", "peak_to_mean")))
    console.print(rates)
    if "prefix" in s:
        p = s["prefix"]
        lru = ", ".join(f"{int(k):,} blocks {v:.1%}" for k, v in p["lru_hit_ratio"].items())
        console.print(
            f"prefix (block {p['block_size']}): ideal token hit {p['ideal_hit_ratio']:.1%}; requests reusing ≥1 block "
            f"{p['requests_reusing_ge1_block']:.2%}, ≥2 blocks {p['requests_reusing_ge2_blocks']:.1%}; LRU: {lru}"
        )
    for label, shares in s["mix"].items():
        console.print(f"{label} mix: " + ", ".join(f"{k} {v:.1%}" for k, v in list(shares.items())[:8]))
