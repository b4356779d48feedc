"""`llmcap trace …`: inspect, clean and synthesise request traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from llmcap.commands._common import err_console, out_console, print_json, user_errors
from llmcap.commands._trace_input import (
    DEFAULT_MAX_CONTEXT,
    ArrivalRateOpt,
    BlockSizeOpt,
    ColumnOpt,
    DuplicatesOpt,
    FormatOpt,
    GenerateArrivalsOpt,
    MaxContextOpt,
    PrefixScopeOpt,
    TimeUnitOpt,
    account_json,
    account_line,
    check_outputs,
    plausible_rate,
    positive,
    prefix_scope,
    read_input,
    read_trace_input,
    trace_params,
    validated,
    warn,
)
from llmcap.config import ArrivalSpec, CharacteriseParams, CleanParams, ExcludeRule
from llmcap.errors import LlmcapError
from llmcap.trace import characterise, ingest, scale_rate, synthesize, write_table

app = typer.Typer(help="Inspect, clean and synthesise request traces.", no_args_is_help=True)

FileArg = Annotated[
    Path,
    typer.Argument(
        help="trace file (Mooncake JSONL, Azure/BurstGPT/length CSV, generic CSV/JSONL/Parquet; .gz/.bz2/.xz/.zst or a pipe)"
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout")]


@app.command()
@user_errors
def inspect(
    file: FileArg,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    max_context: MaxContextOpt = DEFAULT_MAX_CONTEXT,
    scope: PrefixScopeOpt = None,
    lru_blocks: Annotated[
        list[int] | None, typer.Option("--lru-blocks", help="LRU prefix-cache sizes (blocks)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Characterise a trace: rates, lengths, correlation, burstiness, prefix reuse (invalid rows left out)."""
    clean_params = validated(CleanParams, max_context_tokens=max_context, duplicates=duplicates, **prefix_scope(scope))
    trace = trace_params(file, fmt, time_unit, column, block_size, generate_arrivals, arrival_rate)
    result = read_input(file, trace, clean_params, announce=False)
    char = CharacteriseParams() if lru_blocks is None else validated(CharacteriseParams, lru_cache_blocks=lru_blocks)
    summary = characterise(result.trace, char)
    summary["format"] = result.report.source_format
    summary["accounting"] = account_json(result.report)
    if json_out:
        print_json(summary)
    else:
        _print_summary(file, summary, account_line(result.report))


@app.command()
@user_errors
def clean(
    file: FileArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="canonical trace (Parquet) to write")],
    quarantine: Annotated[
        Path | None, typer.Option("--quarantine", "-q", help="default: OUT with .quarantine.parquet")
    ] = None,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    max_context: MaxContextOpt = DEFAULT_MAX_CONTEXT,
    window_start: Annotated[float | None, typer.Option("--window-start", help="s from first request")] = None,
    window_end: Annotated[float | None, typer.Option("--window-end", help="s from first request")] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option("--exclude", help="test traffic: FIELD=REGEX (model/adapter/tenant/session/feature)"),
    ] = None,
    scope: PrefixScopeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Clean a trace into the canonical Parquet schema; invalid rows go to a quarantine file with reasons."""
    rules = []
    for item in exclude or []:
        field, sep, pattern = item.partition("=")
        if not sep:
            raise LlmcapError(f"--exclude expects FIELD=REGEX, got {item!r}")
        rules.append(validated(ExcludeRule, field=field, pattern=pattern))
    params = validated(
        CleanParams,
        max_context_tokens=max_context,
        window_start_s=window_start,
        window_end_s=window_end,
        exclude=rules,
        duplicates=duplicates,
        **prefix_scope(scope),
    )
    quarantine = quarantine or out.with_name(out.name.removesuffix(".parquet") + ".quarantine.parquet")
    check_outputs([file], [out, quarantine])
    with err_console.status(f"reading {file.name} …"):
        result = ingest(
            file, trace_params(file, fmt, time_unit, column, block_size, generate_arrivals, arrival_rate), params
        )
    warn(file, result.report)
    write_table(result.trace, out)
    write_table(result.quarantine, quarantine)
    report = result.report.as_dict() | {"out": str(out), "quarantine": str(quarantine)}
    if json_out:
        print_json(report)
    else:
        r = result.report
        out_console().print(f"{account_line(r)} → {out} / {quarantine}", highlight=False, markup=False, soft_wrap=True)
        for reason, count in r.by_reason.items():
            out_console().print(f"  {reason:<22} {count:>8,}")
    result.require_rows()


@app.command()
@user_errors
def synth(
    file: FileArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="synthetic canonical trace (Parquet)")],
    rate: Annotated[float, typer.Option("--rate", help="target mean arrival rate (req/s)")],
    requests: Annotated[
        int | None, typer.Option("--requests", "-n", help="requests to draw (default: as many as the source)")
    ] = None,
    arrivals: Annotated[
        str,
        typer.Option("--arrivals", help="trace (keep the source clock, rescaled) | poisson | gamma | mmpp (bursts)"),
    ] = "trace",
    cv: Annotated[float, typer.Option("--cv", help="gamma inter-arrival CV (burstiness; 1 = Poisson)")] = 1.0,
    burst_factor: Annotated[
        float, typer.Option("--burst-factor", help="mmpp: rate in a burst ÷ rate between bursts")
    ] = ArrivalSpec().burst_factor,
    burst_share: Annotated[
        float, typer.Option("--burst-share", help="mmpp: share of time in bursts (peaks ≈ mean ÷ share)")
    ] = ArrivalSpec().burst_share,
    burst_s: Annotated[
        float, typer.Option("--burst-s", help="mmpp: mean burst length, seconds")
    ] = ArrivalSpec().burst_s,
    diurnal_amplitude: Annotated[float, typer.Option("--diurnal-amplitude", help="0..1 sinusoidal rate swing")] = 0.0,
    diurnal_period: Annotated[float, typer.Option("--diurnal-period", help="seconds")] = 86_400.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    block_size: BlockSizeOpt = None,
    duplicates: DuplicatesOpt = "by_id",
    json_out: JsonOpt = False,
) -> None:
    """What-if trace: rescale the source to a target rate, or resample requests jointly onto new arrivals."""
    positive("--rate", rate)
    plausible_rate("--rate", rate)
    if requests is not None and requests < 1:
        raise LlmcapError(f"--requests must be at least 1, got {requests}")
    check_outputs([file], [out])
    source = read_trace_input(
        file, fmt, time_unit, column, block_size, False, 1.0, duplicates, announce=not json_out
    ).trace
    if arrivals == "trace":
        if requests not in (None, source.num_rows):
            raise LlmcapError("--arrivals trace keeps the source requests; drop --requests or pick poisson/gamma")
        table = scale_rate(source, rate)
    elif arrivals in ("poisson", "gamma", "mmpp"):
        spec = validated(
            ArrivalSpec,
            process=arrivals,
            rate_rps=rate,
            cv=cv,
            burst_factor=burst_factor,
            burst_share=burst_share,
            burst_s=burst_s,
            diurnal_amplitude=diurnal_amplitude,
            diurnal_period_s=diurnal_period,
            seed=seed,
        )
        table = synthesize(source, requests or source.num_rows, spec, np.random.default_rng(seed))
    else:
        raise LlmcapError(f"--arrivals must be trace, poisson, gamma or mmpp, got {arrivals!r}")
    write_table(table, out)
    summary = characterise(table, CharacteriseParams(lru_cache_blocks=[]))
    brief = {
        "out": str(out),
        "rows": summary["rows"],
        "mean_rps": summary["mean_rps"],
        "corr_spearman": summary["corr_spearman"],
    }
    if json_out:
        print_json(brief)
    else:
        out_console().print(f"wrote {brief['rows']:,} requests at {brief['mean_rps']:.3f} req/s → {out}")


def _print_summary(file: Path, s: dict, account: str) -> None:
    console = out_console()
    console.print(account, highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"[bold]{escape(file.name)}[/] ({s['format']}): {s['rows']:,} requests over {s['duration_s']:,.1f} s, "
        + (f"mean {s['mean_rps']:.3f} req/s" if s["mean_rps"] else "mean rate undefined (every request at one instant)")
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
        f"corr(ISL,OSL): Pearson {_num(s['corr_pearson'])}, Spearman {_num(s['corr_spearman'])};  "
        f"inter-arrival CV {_num(s['interarrival_cv'])}"
    )
    rates = Table(title="Arrival rate per window (req/s)")
    for col in ("window", "windows", "p50", "p90", "p99", "max", "CV", "peak/mean"):
        rates.add_column(col, justify="right")
    for w, r in s["rps_windows"].items():
        if r.get("windows", 0) == 0:
            rates.add_row(w, "0", *["–"] * 6)
            continue
        rates.add_row(
            w, str(r["windows"]), *(f"{r[k]:.2f}" for k in ("p50", "p90", "p99", "max", "cv", "peak_to_mean"))
        )
    console.print(rates)
    if "prefix" in s:
        p = s["prefix"]
        lru = ", ".join(f"{int(k):,} blocks {v:.1%}" for k, v in p["lru_hit_ratio"].items())
        console.print(
            f"prefix (block {p['block_size']}): ideal token hit {p['ideal_hit_ratio']:.1%}; requests reusing ≥1 block "
            f"{p['requests_reusing_ge1_block']:.2%}, ≥2 blocks {p['requests_reusing_ge2_blocks']:.1%}; LRU: {lru}"
        )
    for label, shares in s["mix"].items():
        shown = ", ".join(f"{_clip(k)} {v:.1%}" for k, v in list(shares.items())[:8])
        console.print(f"{label} mix: {shown}", highlight=False, markup=False, soft_wrap=True)


#: Label values longer than this are cut in the console (the JSON keeps them whole): a free-text field
#: can be megabytes, and laying out such a line costs time quadratic in its length.
LABEL_CHARS = 48


def _clip(value: str) -> str:
    return value if len(value) <= LABEL_CHARS else f"{value[: LABEL_CHARS - 1]}…"


def _num(value: float | None) -> str:
    """A statistic that can be undefined (a correlation of constant lengths, one request's CV)."""
    return "undefined" if value is None or not np.isfinite(value) else f"{value:.3f}"
