"""`llmcap simulate --trace FILE --model M --gpu G [--tp N] [--replicas R | --pd P:D] ...`: replay a trace
through the request-level serving simulator and print the summary (or JSON with --json).

Step times come from the roofline (`llmcap.perf.build_step_model`, compiled for speed by the simulator);
KV blocks per replica come from the memory plan.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

import llmcap.perf as perf
from llmcap.catalog import get_gpu, load_model
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.commands._common import err_console, print_json, user_errors
from llmcap.commands._trace_input import (
    ArrivalRateOpt,
    BlockSizeOpt,
    ColumnOpt,
    DuplicatesOpt,
    FormatOpt,
    GenerateArrivalsOpt,
    TimeUnitOpt,
    account_json,
    check_outputs,
    plausible_rate,
    positive,
    read_input,
    trace_params,
    validated,
)
from llmcap.config import CleanParams
from llmcap.errors import LlmcapError
from llmcap.memory import MemoryParams, Parallelism, plan_memory
from llmcap.perf.model import StepTimeModel
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig, simulate as run_simulation
from llmcap.sim.config import ROUTERS
from llmcap.trace import mean_rate, scale_rate, write_table
from llmcap.trace.synth import spread_ties

PROGRESS_MIN_REQUESTS = 20_000  # shorter runs finish before a bar is worth drawing


def _pd(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    parts = spec.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise LlmcapError(f"--pd must be P:D with positive integers (e.g. 2:3), got {spec!r}")
    return int(parts[0]), int(parts[1])


def step_model(model: str, gpu: str, tp: int, quant: str, kv_dtype: str) -> StepTimeModel:
    return perf.build_step_model(model, gpu, tp=tp, weight_quant=quant, kv_dtype=kv_dtype)


@user_errors
def simulate(
    trace: Annotated[Path, typer.Option("--trace", "-t", help="trace file: canonical Parquet or any format `llmcap trace` reads")],
    model: Annotated[str, typer.Option("--model", "-m", help="catalog model name or path to config.json")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU name or alias (e.g. h100)")],
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    hash_block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    max_model_len: Annotated[
        int | None, typer.Option(min=1, help="longest prompt + output the engine accepts; longer requests are rejected (default: the model's max_position_embeddings)")
    ] = None,
    tp: Annotated[int, typer.Option(min=1, help="tensor parallel degree of one replica")] = 1,
    replicas: Annotated[int, typer.Option(min=1, help="aggregated replicas (ignored with --pd)")] = 1,
    router: Annotated[str, typer.Option(help="round_robin | least_outstanding_tokens | power_of_two | prefix_aware")] = "least_outstanding_tokens",
    pd: Annotated[str | None, typer.Option("--pd", help="disaggregated: P:D prefill and decode replicas")] = None,
    first_token_from: Annotated[str, typer.Option(help="P/D: first token visible from 'prefill' or 'decode'")] = "prefill",
    link_gbps: Annotated[float, typer.Option(min=0.001, help="P/D: KV link bandwidth per prefill replica, GB/s")] = 50.0,
    link_latency_ms: Annotated[float, typer.Option(min=0.0, help="P/D: link latency, ms")] = 0.0,
    rate_scale: Annotated[float, typer.Option(help="multiply the trace's mean arrival rate by this (gaps shrink by it)")] = 1.0,
    quant: Annotated[str, typer.Option(help="weight format (bf16, fp8, ...)")] = "bf16",
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype")] = "bf16",
    max_num_seqs: Annotated[int, typer.Option(min=1)] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1)] = 8192,
    block_size: Annotated[int, typer.Option(min=1)] = 16,
    num_blocks: Annotated[int | None, typer.Option(min=1, help="KV blocks per replica (default: from the memory plan)")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.01, max=1.0)] = 0.90,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching")] = True,
    host_blocks: Annotated[int, typer.Option(min=0, help="host-memory KV tier, blocks per replica")] = 0,
    host_gbps: Annotated[float, typer.Option(min=0.001, help="host tier load bandwidth, GB/s")] = 25.0,
    seed: Annotated[int, typer.Option(help="seed of the power-of-two router")] = 0,
    resolution: Annotated[float, typer.Option(min=1e-6, help="time-series resolution, s")] = 1.0,
    max_time: Annotated[float | None, typer.Option(min=0.0, help="stop the simulated clock here, s")] = None,
    reference: Annotated[bool, typer.Option("--reference", help="step-by-step reference mode (slow)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write per-request records (Parquet)")] = None,
    timeseries_out: Annotated[Path | None, typer.Option("--timeseries-out", help="write per-replica time series (Parquet)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")] = False,
) -> None:
    """Simulate serving TRACE on REPLICAS x (MODEL on GPU, TP) and report TTFT / ITL / throughput."""
    if router not in ROUTERS:
        raise LlmcapError(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")
    if first_token_from not in ("prefill", "decode"):
        raise LlmcapError(f"--first-token-from must be prefill or decode, got {first_token_from!r}")
    positive("--rate-scale", rate_scale)
    pools = _pd(pd)
    check_outputs([trace], [p for p in (out, timeseries_out) if p is not None])
    spec = load_model(model)
    g = get_gpu(gpu)
    source = trace_params(trace, fmt, time_unit, column, hash_block_size, generate_arrivals, arrival_rate)
    cleaned = read_input(trace, source, validated(CleanParams, duplicates=duplicates), announce=not json_out)
    # A clock coarser than the request rate logs distinct requests at one tick: spread them within it,
    # as the sizing search does, instead of sending every tick's requests at once.
    table = spread_ties(cleaned.trace, np.random.default_rng(seed))
    if rate_scale != 1.0:
        plausible_rate(f"--rate-scale {rate_scale:g} x the trace's {mean_rate(table):.3g} req/s", mean_rate(table) * rate_scale)
        table = scale_rate(table, mean_rate(table) * rate_scale)
    mem = MemoryParams(gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    plan = plan_memory(spec, g, Parallelism(tp=tp), quant, kv_dtype, block_size, mem)
    blocks = num_blocks if num_blocks is not None else plan.kv_blocks_per_rank
    if blocks < 1:
        raise LlmcapError(f"{spec.name} does not fit on {g.name} with TP={tp}: no memory left for KV blocks")
    try:
        engine = EngineConfig(
            num_blocks=blocks, block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=prefix_caching, host_blocks=host_blocks, host_bandwidth_bytes_s=host_gbps * 1e9,
            kv_bytes_per_token=spec.kv_bytes_per_token(kv_dtype_bytes(kv_dtype)),
            max_model_len=max_model_len or spec.max_position_embeddings,
        )  # fmt: skip
        pd_cfg = None
        if pools is not None:
            link = LinkConfig(bandwidth_bytes_s=link_gbps * 1e9, latency_s=link_latency_ms / 1e3)
            pd_cfg = PDConfig(prefill_replicas=pools[0], decode_replicas=pools[1], link=link, first_token_from=first_token_from)  # type: ignore[arg-type]
        cfg = SimConfig(
            engine=engine, replicas=replicas, router=router, pd=pd_cfg, reference=reference,  # type: ignore[arg-type]
            timeseries_resolution_s=resolution, max_time_s=max_time if max_time else math.inf,
        )  # fmt: skip
    except ValidationError as exc:
        err = exc.errors()[0]
        raise LlmcapError(f"invalid option {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    step = step_model(model, gpu, tp, quant, kv_dtype)
    rng = np.random.default_rng(seed)
    if json_out or table.num_rows < PROGRESS_MIN_REQUESTS:
        result = run_simulation(table, step, cfg, rng)
    else:
        with Progress("simulating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True) as bar:
            task = bar.add_task("requests", total=table.num_rows)
            result = run_simulation(table, step, cfg, rng, progress=lambda done, total: bar.update(task, completed=done))
    if out is not None:
        write_table(result.records, out)
    if timeseries_out is not None:
        write_table(result.timeseries, timeseries_out)
    s = dict(result.summary)
    s.update(model=spec.name, gpu=g.name, tp=tp, kv_blocks_per_replica=blocks, step_model=type(step).__name__)
    s["max_model_len"] = engine.max_model_len
    s["rejected_over_max_model_len"] = _over_limit(table, engine.max_model_len)
    s["input_accounting"] = account_json(cleaned.report)
    s["deployment"] = f"P/D {pools[0]}:{pools[1]}" if pools else f"{replicas} replica(s)"
    if json_out:
        print_json(s)
        return
    t = Table(title=f"{spec.name} on {g.name} TP{tp}, {s['deployment']}, router {router}")
    t.add_column("metric")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    t.add_column("p99", justify="right")
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        t.add_row(key, *(f"{v:,.1f}" if v is not None else "-" for v in s[key].values()))
    console = Console()
    console.print(t)
    thr = s["throughput"]
    console.print(
        f"requests {s['requests']:,} (completed {s['completed']:,}, rejected {s['rejected']:,} of which "
        f"{s['rejected_over_max_model_len']:,} longer than max_model_len {s['max_model_len']}, unfinished {s['unfinished']:,}); "
        f"duration {s['duration_s']:,.1f} s; output {thr['output_tok_s'] or 0:,.0f} tok/s, {thr['req_s'] or 0:,.2f} req/s; "
        f"preemptions {s['preemptions']:,}; prefix hit ratio {s['prefix_hit_ratio']:.3f}; "
        f"wall {s['wall_s']:.2f} s ({s['requests_per_wall_s'] or 0:,.0f} req/wall-s)"
    )


def _over_limit(table: pa.Table, max_model_len: int | None) -> int:
    """Requests whose prompt + output exceed the engine's limit (rejected on arrival; SLO misses)."""
    if max_model_len is None:
        return 0
    total = table.column("isl").to_numpy() + table.column("osl").to_numpy()
    return int((total > max_model_len).sum())
