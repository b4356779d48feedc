"""`llmcap reconcile --measured M --predicted P [--metrics SERIES] [--json]`: predictions against
measurements per bucket, the decision per bucket with its reasoning, the corrections, and (with a
metric series) the diagnosis. Exit 0 whatever the decisions: they are the output, not a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from llmcap.commands._common import out_console, print_json, user_errors
from llmcap.errors import LlmcapError
from llmcap.reconcile.diagnose import diagnose
from llmcap.reconcile.metric_schema import schema_for
from llmcap.reconcile.params import DiagnoseParams, ReconcileParams
from llmcap.reconcile.report import accounting_line, bucket_rows, summary
from llmcap.reconcile.run import read_records
from llmcap.reconcile.run import reconcile as run_reconcile
from llmcap.reconcile.series import read_series

DEFAULTS = ReconcileParams()


def _edges(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise LlmcapError(f"--{what}: expected comma-separated token counts like 0,1024,8192, got {text!r}") from None


@user_errors
def reconcile(
    measured: Annotated[
        Path, typer.Option("--measured", "-m", help="measured request records (parquet, llmcap's request schema)")
    ],
    predicted: Annotated[
        Path, typer.Option("--predicted", "-p", help="predicted request records for the same requests")
    ],
    metrics: Annotated[
        Path | None, typer.Option("--metrics", help="engine metric series (parquet/CSV: time_s, name, engine, value)")
    ] = None,
    baseline_metrics: Annotated[
        Path | None, typer.Option("--baseline-metrics", help="a reference series (a healthy run) for hit rate and ITL")
    ] = None,
    engine_version: Annotated[
        str | None, typer.Option(help="vLLM version whose metric names the series carries (default: detected)")
    ] = None,
    isl_edges: Annotated[str, typer.Option(help="lower edges of the ISL ranges of the buckets")] = ",".join(
        map(str, DEFAULTS.isl_edges)
    ),
    osl_edges: Annotated[str, typer.Option(help="lower edges of the OSL ranges")] = ",".join(
        map(str, DEFAULTS.osl_edges)
    ),
    tolerance: Annotated[float, typer.Option(help="|e| up to this is within tolerance (0-1)")] = DEFAULTS.tolerance,
    min_requests: Annotated[int, typer.Option(min=2, help="smaller buckets are not judged")] = DEFAULTS.min_requests,
    window_s: Annotated[float, typer.Option(help="diagnosis window (series seconds)")] = DiagnoseParams().window_s,
    seed: Annotated[int, typer.Option(min=0, help="bootstrap seed")] = DEFAULTS.seed,
    json: Annotated[bool, typer.Option("--json", help="print JSON instead of the summary")] = False,
) -> None:
    """Reconcile predicted with measured request records: e_TTFT / e_ITL per bucket and what to do about them."""
    try:
        params = ReconcileParams(
            isl_edges=_edges(isl_edges, "isl-edges"),
            osl_edges=_edges(osl_edges, "osl-edges"),
            tolerance=tolerance,
            min_requests=min_requests,
            seed=seed,
            diagnose=DiagnoseParams(window_s=window_s),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise LlmcapError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    try:
        rec = run_reconcile(read_records(measured), read_records(predicted), params)
    except LlmcapError as exc:
        raise LlmcapError(f"{measured} vs {predicted}: {exc}") from None
    diagnosis = None
    if metrics is not None:
        schema = schema_for("vllm", engine_version) if engine_version else None
        baseline = read_series(baseline_metrics) if baseline_metrics is not None else None
        diagnosis = diagnose(read_series(metrics), params.diagnose, schema, baseline)
    elif baseline_metrics is not None:
        raise LlmcapError("--baseline-metrics needs --metrics")
    if json:
        print_json(summary(rec, diagnosis))
        return
    _show(rec, diagnosis, params)


def _show(rec, diagnosis, params: ReconcileParams) -> None:
    console = out_console()
    head, rows = bucket_rows(rec, params.percentiles[:2])
    table = Table(
        title=f"e = predicted / measured - 1 (p{rec.percentile:g} decides, tolerance {rec.tolerance:.0%}, 95% bootstrap CI)"
    )
    for h in head:
        table.add_column(h, justify="left" if h in ("bucket", "decision") else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    console.print(accounting_line(rec))
    for d in rec.decisions:
        if d.decision != "within_tolerance":
            console.print(f"[bold]{d.bias.label}[/bold] {d.decision}: {d.reasoning}", highlight=False)
    for c in rec.corrections:
        where = f" for prefills past {c.min_context} tokens" if c.min_context else " (every step)"
        console.print(f"correction: step time x {c.factor:.4g}{where}", highlight=False)
    if not rec.corrections:
        console.print("correction: none")
    if diagnosis is not None:
        console.print(f"diagnosis (metric schema {diagnosis.schema}): {len(diagnosis.findings) or 'no'} finding(s)")
        for f in diagnosis.findings:
            console.print(f"  {f}", highlight=False)
