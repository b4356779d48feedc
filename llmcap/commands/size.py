"""`llmcap size`: the GPU count for a trace and its SLOs, with the evidence (step 4 outside the pipeline).

Reads and cleans the trace, enumerates candidates for the model on the given GPUs, searches each
shortlisted candidate's max feasible rate by simulation, sizes the cheapest deployment for the target
rate with headroom by risk, and writes the capacity table + Markdown/HTML report (`--out`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from llmcap.candidates import EnumerationSpec, SchedulerGrid, enumerate_candidates, workload_context_lengths
from llmcap.catalog import load_model
from llmcap.commands._common import print_json, user_errors
from llmcap.report.capacity import write_report
from llmcap.sizing.executor import make_executor
from llmcap.sizing.params import ComputeParams, SearchParams, SizeParams, SloParams
from llmcap.sizing.plan import size_deployments
from llmcap.trace import ingest


def _lengths_summary(isl: np.ndarray, osl: np.ndarray) -> dict:
    def stats(x: np.ndarray) -> dict:
        p = np.percentile(x, [50, 90, 99])
        return {"mean": float(x.mean()), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]), "max": float(x.max())}

    return {"isl": stats(isl), "osl": stats(osl)}


@user_errors
def size(
    trace: Annotated[Path, typer.Option("--trace", "-t", help="Request trace (any format `llmcap trace inspect` reads).")],
    model: Annotated[str, typer.Option("--model", "-m", help="Catalog model name or a path to config.json / its directory.")],
    slo_ttft_p99: Annotated[float, typer.Option("--slo-ttft-p99", min=0.001, help="TTFT target (ms) that 99% (--attainment) of requests must meet.")],
    slo_itl_p99: Annotated[float, typer.Option("--slo-itl-p99", min=0.001, help="Per-request P99 inter-token latency target (ms).")],
    target_rps: Annotated[float | None, typer.Option("--target-rps", min=1e-9, help="Planning rate (req/s); default: the trace's mean rate.")] = None,
    ttft_per_1k_isl: Annotated[float, typer.Option("--slo-ttft-per-1k-isl", min=0, help="Extra TTFT allowance (ms) per 1,000 prompt tokens.")] = 0.0,
    attainment: Annotated[float, typer.Option(min=0.01, max=1.0, help="Share of requests that must meet every SLO.")] = 0.99,
    gpu: Annotated[list[str], typer.Option("--gpu", "-g", help="GPU(s) to consider (repeat the option).")] = ["H100-SXM-80GB", "H200-SXM-141GB"],  # noqa: B006
    weight_quant: Annotated[list[str], typer.Option(help="Weight formats to consider.")] = ["bf16", "fp8"],  # noqa: B006
    tp: Annotated[list[int], typer.Option(help="TP degrees to consider.")] = [1, 2, 4, 8],  # noqa: B006
    pd: Annotated[bool, typer.Option("--pd/--no-pd", help="Also size disaggregated prefill/decode deployments.")] = True,
    shortlist: Annotated[int, typer.Option(min=1, help="Aggregated candidates to simulate.")] = 4,
    excerpt: Annotated[int, typer.Option(min=10, help="Requests replayed per search evaluation.")] = 1500,
    workers: Annotated[int, typer.Option(min=1, help="Local worker processes for the search.")] = 1,
    dask_address: Annotated[str | None, typer.Option(help="Run the search on this Dask scheduler instead.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write capacity.parquet/.md/.html here.")] = None,
    json_out: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Size a deployment for a trace under TTFT/ITL SLOs: candidates, simulated max rates, GPU count, cost."""
    cleaned = ingest(trace)
    cleaned.require_rows()
    table = cleaned.trace
    spec = load_model(model)
    isl, osl = table.column("isl").to_numpy(), table.column("osl").to_numpy()
    workload = _lengths_summary(isl, osl)
    grid = EnumerationSpec(
        gpus=gpu, weight_quants=weight_quant, kv_dtypes=["bf16", "fp8"], parallel={"tp": tp},
        modes=["aggregated", "disaggregated"] if pd else ["aggregated"],
        aggregated=SchedulerGrid(max_num_batched_tokens=[2048, 8192]),
        max_context_len=workload_context_lengths(workload)["max"],
    )  # fmt: skip
    candidates = enumerate_candidates(spec, grid, workload_context_lengths(workload)).table
    params = SizeParams(
        slo=SloParams(ttft_ms=slo_ttft_p99, ttft_ms_per_1k_isl=ttft_per_1k_isl, itl_ms=slo_itl_p99, itl_stat="p99",
                      attainment_target=attainment, warmup_frac=0.1, drain_frac=0.1),
        search=SearchParams(seeds=(0, 1), rel_tol=0.05), target_rps=target_rps, shortlist=shortlist,
        pd_shortlist=1 if pd else 0, excerpt_requests=excerpt, compute=ComputeParams(workers=workers, dask_address=dask_address),
    )  # fmt: skip
    console = Console(stderr=True, quiet=json_out)
    with make_executor(params.compute) as executor, console.status("sizing ...") as status:
        outcome = size_deployments(table, candidates, spec, params, executor, workload_id=trace.name, progress=lambda m: status.update(m))
    paths = write_report(outcome.report, out) if out is not None else {}
    summary = outcome.summary | {"report": {k: str(v) for k, v in paths.items()}}
    if json_out:
        print_json(summary)
        return
    t = Table(title=f"{spec.name}: capacity for {summary['target_rps']:.3g} req/s")
    for col in ("candidate", "mode", "P:D", "max RPS/unit", "goodput/GPU", "GPUs", "$/h", "search"):
        t.add_column(col)
    for r in outcome.table.to_pylist():
        t.add_row(r["candidate"], r["mode"], r["pd_ratio"] or "–", f"{r['max_rps']:.3g}",
                  "–" if r["goodput_per_gpu"] is None else f"{r['goodput_per_gpu']:.3g}",
                  "–" if r["gpus"] is None else str(r["gpus"]), "–" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:,.0f}",
                  r["search_status"])  # fmt: skip
    Console().print(t)
    print(f"chosen: {summary['chosen']} ({summary['mode']}): {summary['gpus']} GPUs, ${summary['usd_per_hour']:,.0f}/h")
    for risk, h in summary["headroom"].items():
        print(f"  +{h['instances']} {risk}: {h['reasoning']}")
    for path in paths.values():
        print(f"  wrote {path}", file=sys.stderr)
