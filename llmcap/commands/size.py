"""`llmcap size`: the GPU count for a trace and its SLOs, with the evidence (step 4 outside the pipeline).

Reads and cleans the trace, enumerates candidates for the model on the given GPUs, searches each
shortlisted candidate's max feasible rate by simulation, sizes the cheapest deployment for the target
rate with headroom by risk, and writes the capacity table, Markdown/HTML report and summary.json (`--out`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmcap.candidates import (
    EnumerationSpec,
    ParallelGrid,
    SchedulerGrid,
    enumerate_with_presets,
    workload_context_lengths,
)
from llmcap.catalog import ModelSpec, get_gpu, load_model
from llmcap.catalog.quant import kv_dtype_bytes, weight_format
from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    dumps,
    err_console,
    given_options,
    out_console,
    output_format,
    print_csv,
    print_json,
    user_errors,
)
from llmcap.commands._deployment import AdmissionOpt, KvFromLogOpt, ProfileOpt, TierOpt
from llmcap.commands._fleet import PlannedModel, model_classes, size_fleet, with_cap_split
from llmcap.commands._goodput import (
    SIZE,
    SLO,
    GoodputOpt,
    ItlStatOpt,
    SloPercentileOpt,
    SloTargets,
    check_itl_stat,
    parse_goodput,
    parse_percentiles,
    steady_window,
)
from llmcap.commands._size_sources import budget_lines, stated_kv, step_model_summary
from llmcap.commands._trace_input import (
    ArrivalRateOpt,
    BlockSizeOpt,
    ColumnOpt,
    DuplicatesOpt,
    FormatOpt,
    GenerateArrivalsOpt,
    PrefixScopeOpt,
    TimeUnitOpt,
    account_json,
    plausible_rate,
    positive,
    read_trace_input,
)
from llmcap.config import Params, load_params
from llmcap.deployment import tier_spec
from llmcap.engine_presets import EnginePreset, presets_for
from llmcap.errors import InputFileError, LlmcapError
from llmcap.memory import MemoryParams
from llmcap.planning import StepTimes, mixed_traffic, plan_capacity
from llmcap.policy_names import admission_option
from llmcap.report.capacity import write_report
from llmcap.sizing.executor import make_executor
from llmcap.sizing.measured import MeasuredProfile, load_profile
from llmcap.sizing.nearmiss import NoFeasiblePlan
from llmcap.sizing.params import ComputeParams, DistributionTarget, SizeParams, SloParams
from llmcap.sizing.plan import no_feasible_candidate
from llmcap.sizing.search import SearchResult
from llmcap.sizing.slo import itl_name
from llmcap.sizing.units import candidate_key
from llmcap.vllm_serve import serve_commands

MEMORY = MemoryParams()
MIN_REQUESTS = 20  # warm-up and drain are excluded from every replay: fewer leave no steady window to judge
DEFAULT_TP = ",".join(map(str, ParallelGrid().tp))  # the catalog grid's TP degrees, as the option's default text


def _lengths_summary(isl: np.ndarray, osl: np.ndarray) -> dict:
    def stats(x: np.ndarray) -> dict:
        p = np.percentile(x, [50, 90, 99])
        return {
            "mean": float(x.mean()),
            "p50": float(p[0]),
            "p90": float(p[1]),
            "p99": float(p[2]),
            "max": float(x.max()),
        }

    return {"isl": stats(isl), "osl": stats(osl)}


def _slo_targets(ttft_ms: float | None, itl_ms: float | None, goodput: list[str] | None) -> SloTargets:
    """SloParams' target fields from --slo-ttft-p99 / --slo-itl-p99 and --goodput (unset targets are None)."""
    targets = parse_goodput(goodput)
    for name, field, value in (("--slo-ttft-p99", "ttft_ms", ttft_ms), ("--slo-itl-p99", "itl_ms", itl_ms)):
        if value is not None:
            if field in targets:
                raise LlmcapError(
                    f"{name} and --goodput {field.removesuffix('_ms')}:MS both set the same target; give one"
                )
            targets[field] = value
    if not targets:
        raise LlmcapError(
            "no SLO target: give --goodput KEY:MS (ttft, tpot, e2el, itl) or --slo-ttft-p99 / --slo-itl-p99"
        )
    return SloTargets(
        ttft_ms=targets.get("ttft_ms"),
        itl_ms=targets.get("itl_ms"),
        tpot_ms=targets.get("tpot_ms"),
        e2e_ms=targets.get("e2e_ms"),
    )


def _listed(values: list[str], option: str) -> list[str]:
    """An option given as comma lists and/or repeated (`--tp 1,2 --tp 4`), in order, without repeats."""
    items = [v.strip() for text in values for v in text.split(",")]
    if not items or not all(items):
        raise LlmcapError(f"{option} {','.join(values)!r}: an empty item; give comma-separated values")
    return list(dict.fromkeys(items))


def _tp_degrees(values: list[str]) -> list[int]:
    items = _listed(values, "--tp")
    if not all(v.isdigit() and int(v) >= 1 for v in items):
        raise LlmcapError(f"--tp {','.join(values)!r}: TP degrees are positive integers")
    return [int(v) for v in items]


def _catalog_grid(
    gpu: list[str], weight_quant: list[str], kv_dtype: list[str], tp: list[str]
) -> tuple[list[str], list[str], list[str], list[int]]:
    """The --gpu/--weight-quant/--kv-dtype/--tp lists, each name checked against the catalog before any file is read
    (a typo fails in a second, not after the trace)."""
    gpus, quants, kv_dtypes = (
        _listed(gpu, "--gpu"),
        _listed(weight_quant, "--weight-quant"),
        _listed(kv_dtype, "--kv-dtype"),
    )
    tps = _tp_degrees(tp)
    for name in gpus:
        get_gpu(name)
    for q in quants:
        weight_format(q)
    for k in kv_dtypes:
        kv_dtype_bytes(k)
    return gpus, quants, kv_dtypes, tps


# the options --params replaces (its `size` section holds them), by the function's parameter names
SIZE_KNOBS = (
    "slo_ttft_p99",
    "slo_itl_p99",
    "goodput",
    "slo_percentile",
    "slo_availability",
    "itl_stat",
    "ttft_handoff",
    "target_rps",
    "ttft_per_1k_isl",
    "attainment",
    "shortlist",
    "excerpt",
    "workers",
    "dask_address",
    "admission_policy",
    "max_usd_per_hour",
    "tier",
)


def _from_params(ctx: typer.Context, path: Path) -> Params:
    """The params file, after checking no option it replaces was given too (the file would silently win)."""
    given = [f"--{n.replace('_', '-')}" for n in given_options(ctx, SIZE_KNOBS)]
    if given:
        raise LlmcapError(
            f"--params {path} sets every sizing knob from its `size` section; drop {', '.join(given)} or --params"
        )
    return load_params(path)


def _size_params(
    ttft_ms: float | None,
    itl_ms: float | None,
    goodput: list[str] | None,
    itl_stat: str,
    ttft_handoff: bool,
    target_rps: float | None,
    ttft_per_1k_isl: float,
    attainment: float,
    pd: bool,
    shortlist: int,
    excerpt: int,
    workers: int,
    dask_address: str | None,
    pools_split_isl: int | None,
    admission_policy: str,
    max_usd_per_hour: float | None = None,
    distribution: tuple[DistributionTarget, ...] = (),
    availability: float | None = None,
) -> SizeParams:
    """SizeParams from the command line's options."""
    targets = _slo_targets(ttft_ms, itl_ms, goodput)
    admission_option(admission_policy)
    itl = check_itl_stat(itl_stat)
    positive("--target-rps", target_rps)
    if target_rps is not None:
        plausible_rate("--target-rps", target_rps)
    return SizeParams(
        slo=SloParams(
            **targets,
            ttft_ms_per_1k_isl=ttft_per_1k_isl,
            itl_stat=itl,
            ttft_includes_handoff=ttft_handoff,
            attainment_target=attainment,
            distribution=distribution,
            availability=availability,
            **steady_window(),
        ),
        search=SIZE.search,
        target_rps=target_rps,
        shortlist=shortlist,
        pd_prefill_shortlist=SIZE.pd_prefill_shortlist if pd else 0,
        excerpt_requests=excerpt,
        compute=ComputeParams(workers=workers, dask_address=dask_address),
        pools_split_isl=pools_split_isl,
        admission_policy=admission_policy,
        max_usd_per_hour=max_usd_per_hour,
    )


def _presets(engine: str | None, gpus: list[str] | None, candidates_file: Path | None) -> dict[str, EnginePreset]:
    """Each GPU's preset of `engine` (none without --engine)."""
    if engine is None:
        return {}
    if gpus is None:
        raise LlmcapError(
            f"--engine sets the candidates' scheduler knobs; --candidates {candidates_file} already fixes them: give one"
        )
    return presets_for(engine, [get_gpu(g) for g in gpus])


def read_candidates(path: Path) -> pd.DataFrame:
    """An enumerated candidates table (the enumerate stage's candidates.parquet)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path).to_pandas()
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputFileError(path, f"not a readable candidates parquet ({exc})") from None
    if "feasible" not in table.columns:
        raise InputFileError(
            path, "not a candidates table: no `feasible` column (write one with the enumerate stage)", field="feasible"
        )
    return table


def _near_miss_report(none: NoFeasiblePlan, output: str, out: Path | None) -> None:
    """Nothing met the SLOs: how close each candidate came, on stdout (and near_misses.json under --out)."""
    rows = [m.to_dict() for m in none.near_misses]
    report = {"feasible": False, "error": none.headline, "near_misses": rows}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "near_misses.json").write_text(dumps(report, indent=2) + "\n", encoding="utf-8")
    if output == "json":
        print_json(report)
    elif output == "csv":
        print_csv(rows)
    else:
        t = Table(title="no candidate meets the SLOs: the nearest misses (closest first)")
        itl = itl_name("token_p99").replace("ITL (", "ITL ms (")  # the statistic the report's near-miss table names
        for col in ("candidate", "rate req/s", "met every SLO", "binds", "TTFT p99 ms", itl):
            t.add_column(col, overflow="fold")
        for m in none.near_misses:
            ms = lambda v: "–" if v is None else f"{v:,.1f}"  # noqa: E731
            t.add_row(
                m.candidate,
                "idle (unsimulated)" if m.binding == "idle" else f"{m.rate_rps:.4g}",
                f"{m.attainment:.1%} (target {m.attainment_target:.1%})",
                m.binding,
                ms(m.ttft_p99_ms),
                ms(m.itl_p99_ms),
            )
        out_console().print(t)
        for m in none.near_misses[:3]:
            print(f"  {m.line()}")
    print(f"error: {report['error']}", file=sys.stderr)


def _ruled_out_report(candidates: pd.DataFrame, output: str) -> None:
    """Step 2 ruled out every candidate: each one with its reasons, on stdout (the error line follows on stderr)."""
    rows = [
        {
            "candidate": candidate_key(r),
            "mode": r["mode"],
            "role": r["role"],
            "reason_codes": r["reason_codes"],
            "reasons": r["reasons"],
        }
        for _, r in candidates.iterrows()
    ]
    if output == "json":
        print_json({"feasible": False, "error": no_feasible_candidate(candidates), "ruled_out": rows})
    elif output == "csv":
        print_csv(rows)
    else:
        t = Table(title=f"every candidate was ruled out before simulation ({len(rows)}): why")
        for col in ("candidate", "mode", "role", "reasons"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r["candidate"], r["mode"], r["role"], r["reasons"])
        out_console().print(t)


@user_errors
def size(
    ctx: typer.Context,
    trace: Annotated[
        Path, typer.Option("--trace", "-t", help="Request trace (any format `llmcap trace inspect` reads).")
    ],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="Catalog model name or a path to config.json / its directory (with --params: "
            "enumerate.model by default). A trace of several models: LABEL=MODEL for each of its `model` labels, a pool per model "
            "and the fleet's total.",
        ),
    ] = None,
    class_by: Annotated[
        str | None,
        typer.Option(
            "--class-by",
            help="tenant | feature: one model's traffic as a pool per value of that label, the fleet and the one-pool view.",
        ),
    ] = None,
    slo_ttft_p99: Annotated[
        float | None,
        typer.Option(
            "--slo-ttft-p99",
            min=0.001,
            help="TTFT target (ms) that 99% (--attainment) of requests must meet (= --goodput ttft:MS).",
        ),
    ] = None,
    slo_itl_p99: Annotated[
        float | None,
        typer.Option(
            "--slo-itl-p99",
            min=0.001,
            help="Inter-token latency target (ms), judged by --itl-stat (= --goodput itl:MS).",
        ),
    ] = None,
    goodput: GoodputOpt = None,
    slo_percentile: SloPercentileOpt = None,
    itl_stat: ItlStatOpt = SLO.itl_stat,
    ttft_handoff: Annotated[
        bool,
        typer.Option(
            "--ttft-includes-handoff/--ttft-at-prefill",
            help="P/D: TTFT ends at the first token the user sees (after the KV handoff), or when prefill computes it.",
        ),
    ] = SLO.ttft_includes_handoff,
    target_rps: Annotated[
        float | None,
        typer.Option("--target-rps", "--request-rate", help="Planning rate (req/s); default: the trace's mean rate."),
    ] = SIZE.target_rps,
    ttft_per_1k_isl: Annotated[
        float, typer.Option("--slo-ttft-per-1k-isl", min=0, help="Extra TTFT allowance (ms) per 1,000 prompt tokens.")
    ] = SLO.ttft_ms_per_1k_isl,
    attainment: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="Share of requests that must meet every SLO.")
    ] = SLO.attainment_target,
    slo_availability: Annotated[
        float | None,
        typer.Option(
            "--slo-availability",
            min=0.01,
            max=0.999999,
            help="Share of requests within the "
            "SLOs over the long run, with nodes failing and being repaired (params: headroom.node_mtbf_h, node_repair_h).",
        ),
    ] = SLO.availability,
    gpu: Annotated[
        list[str], typer.Option("--gpu", "-g", help="GPUs to consider: a comma list or the option repeated.")
    ] = ["H100-SXM-80GB,H200-SXM-141GB"],
    weight_quant: Annotated[list[str], typer.Option(help="Weight formats to consider (comma list or repeated).")] = [
        "bf16,fp8"
    ],
    tp: Annotated[list[str], typer.Option(help="TP degrees to consider (comma list or repeated).")] = [DEFAULT_TP],
    kv_dtype: Annotated[list[str], typer.Option(help="KV cache dtypes to consider (comma list or repeated).")] = [
        "bf16,fp8"
    ],
    profile: ProfileOpt = None,
    kv_from_log: KvFromLogOpt = None,
    admission_policy: AdmissionOpt = SIZE.admission_policy,
    tier: TierOpt = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="vllm | sglang | trtllm: size for that engine's own defaults on each GPU "
            "(admission policy, chunk, max batch, KV block; sources in the output); an "
            "explicit --admission-policy still wins"
        ),
    ] = None,
    step_model: Annotated[
        Path | None,
        typer.Option(
            help="The profile stage's step_model.json (its profile and written-back corrections) instead of --profile."
        ),
    ] = None,
    params_file: Annotated[
        Path | None,
        typer.Option(
            "--params",
            help="Take every sizing knob (SLOs, search, headroom, pools) from this params.yaml's `size` section, as the pipeline does.",
        ),
    ] = None,
    candidates_file: Annotated[
        Path | None,
        typer.Option(
            "--candidates",
            help="Size these enumerated candidates (the enumerate stage's parquet) instead of the --gpu/--tp/... grid.",
        ),
    ] = None,
    pools_split_isl: Annotated[
        int | None,
        typer.Option(
            min=1, help="Also compare one shared pool with a pool per request class (prompts ≤ N tokens vs longer)."
        ),
    ] = SIZE.pools_split_isl,
    pools_split_cap: Annotated[
        float | None,
        typer.Option(
            min=1.0001, help="Or a pool for requests whose max_tokens exceeds this × the median output vs the rest."
        ),
    ] = SIZE.pools_split_cap,
    pd: Annotated[
        bool, typer.Option("--pd/--no-pd", help="Also size disaggregated prefill/decode deployments.")
    ] = SIZE.pd_prefill_shortlist > 0,
    max_usd_per_hour: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help="Cost limit ($/h): no plan above it; when none below it passes every scenario, exit 1 with the closest miss.",
        ),
    ] = SIZE.max_usd_per_hour,
    shortlist: Annotated[int, typer.Option(min=1, help="Aggregated candidates to simulate.")] = SIZE.shortlist,
    excerpt: Annotated[
        int, typer.Option(min=10, help="Requests replayed per search evaluation.")
    ] = SIZE.excerpt_requests,
    workers: Annotated[int, typer.Option(min=1, help="Local worker processes for the search.")] = SIZE.compute.workers,
    dask_address: Annotated[
        str | None, typer.Option(help="Run the search on this Dask scheduler instead.")
    ] = SIZE.compute.dask_address,
    max_loras: Annotated[
        int,
        typer.Option(
            min=0,
            help="LoRA adapters resident at once (vLLM --max-loras): their buffers on every "
            "rank leave less KV; 0 = no LoRA.",
        ),
    ] = MEMORY.lora_slots,
    max_lora_rank: Annotated[
        int, typer.Option(min=1, help="The largest adapter rank (vLLM --max-lora-rank).")
    ] = MEMORY.lora_rank,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Longest prompt + output a deployment accepts (default: the trace's longest, "
            "within the model's max_position_embeddings); longer requests are rejected: SLO misses.",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write capacity.parquet/.md/.html and summary.json here.")] = None,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    hash_block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    scope: PrefixScopeOpt = None,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """Size a deployment for a trace under its SLOs (TTFT, ITL, TPOT, E2E): candidates, simulated max rates, GPU count, cost."""
    output = output_format(output_fmt, json_out)
    if profile is not None and step_model is not None:
        raise LlmcapError("--profile and --step-model both name the step times; give one")
    pipeline = _from_params(ctx, params_file) if params_file is not None else None
    models = model or ([pipeline.enumerate.model] if pipeline is not None else [])
    if not models:
        raise LlmcapError("no model: give --model (or --params with enumerate.model)")
    classes = model_classes(models)
    prof = load_profile(profile) if profile is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise LlmcapError(f"{out}: is a file; --out names a directory for capacity.parquet/.md/.html")
    if pipeline is not None:
        params = (
            pipeline.size
            if pools_split_isl is None
            else pipeline.size.model_copy(update={"pools_split_isl": pools_split_isl})
        )
    else:
        params = _size_params(
            slo_ttft_p99,
            slo_itl_p99,
            goodput,
            itl_stat,
            ttft_handoff,
            target_rps,
            ttft_per_1k_isl,
            attainment,
            pd,
            shortlist,
            excerpt,
            workers,
            dask_address,
            pools_split_isl,
            admission_policy,
            max_usd_per_hour,
            parse_percentiles(slo_percentile),
            slo_availability,
        )
    params = with_cap_split(params, pools_split_isl, pools_split_cap)
    if tier:
        params = params.model_copy(update={"prefix_tiers": [tier_spec(t) for t in tier]})
    grid_lists = None if candidates_file is not None else _catalog_grid(gpu, weight_quant, kv_dtype, tp)
    presets = _presets(engine, grid_lists[0] if grid_lists is not None else None, candidates_file)
    if presets and not given_options(ctx, ["admission_policy"]):
        params = params.model_copy(update={"admission_policy": next(iter(presets.values())).admission_policy})
    specs = {
        label: load_model(name) for label, name in classes.items()
    }  # an unknown model fails now, not after the trace is read
    cleaned = read_trace_input(
        trace,
        fmt,
        time_unit,
        column,
        hash_block_size,
        generate_arrivals,
        arrival_rate,
        duplicates,
        announce=output == "table",
        scope=scope,
    )
    table = cleaned.trace
    if table.num_rows < MIN_REQUESTS:
        raise LlmcapError(
            f"{trace}: {table.num_rows} usable requests are too few to size on (at least {MIN_REQUESTS}: rates are judged on a steady window)"
        )
    plan_one = partial(
        _plan_one,
        params=params,
        grid_lists=grid_lists,
        presets=presets,
        candidates_file=candidates_file,
        prof=prof,
        kv_log=kv_from_log,
        step_model=step_model,
        max_model_len=max_model_len,
        output=output,
        workload_id=trace.name,
        disaggregated=pd,
        memory=MEMORY.model_copy(update={"lora_slots": max_loras, "lora_rank": max_lora_rank}),
    )
    if None not in specs or class_by is not None:  # LABEL=MODEL or --class-by: a pool per class, then the fleet
        size_fleet(trace, table, specs, plan_one, params, output, out, (max_loras, max_lora_rank), class_by or "model")
        return
    spec, model_arg = specs[None], classes[None]
    for line in mixed_traffic(table, spec.name):  # said before the minutes of sizing; the plan's notes say it too
        err_console.print(f"warning: {trace}: {line}", style="yellow", highlight=False, markup=False, soft_wrap=True)
    try:
        one = plan_one(spec, table)
    except NoFeasiblePlan as none:
        _near_miss_report(none, output, out)
        raise typer.Exit(1) from None
    outcome, candidates, context = one.outcome, one.candidates, one.context
    paths = write_report(outcome.report, out) if out is not None else {}
    if out is not None:  # the summary beside the report, as the pipeline's size stage writes it
        paths["summary"] = out / "summary.json"
    serve = serve_commands(
        outcome.summary, candidates, model_arg, one.gpu_memory_utilization, (max_loras, max_lora_rank)
    )
    step_line = step_model_summary(prof, one.step_times.measured, step_model)
    s = outcome.summary
    summary = dict(s) | {
        "vllm_serve": [c.to_dict() for c in serve],
        "step_model": step_line,
        "report": {k: str(v) for k, v in paths.items()},
        "max_model_len": context,
        "rejected_over_max_model_len": one.over,
        "input_accounting": account_json(cleaned.report),
    }
    if out is not None:
        paths["summary"].write_text(dumps(summary, indent=2) + "\n", encoding="utf-8")
    fails = s["verdict"] == "fails"
    if output == "json":
        print_json(summary)
    elif output == "csv":
        print_csv(chosen_rows(outcome.table.to_pylist(), s["chosen"], s["mode"]))
    else:
        for gpu_name, p in presets.items():
            out_console().print(f"engine preset on {gpu_name}: {p.line()}", highlight=False)
        _print_plan(outcome, spec.name, step_line, serve, model_arg, one.over, context)
    for path in paths.values():
        print(f"  wrote {path}", file=sys.stderr)
    if fails:
        nearest = next((f["line"] for f in s["finalists"] or [] if f["candidate"] == s["chosen"]), s["chosen"])
        print(f"error: {NO_PLAN_PASSES}; nearest: {nearest}", file=sys.stderr)
        raise typer.Exit(1)


def _plan_one(
    spec: ModelSpec,
    table: pa.Table,
    *,
    params: SizeParams,
    grid_lists: tuple | None,
    presets: dict[str, EnginePreset],
    candidates_file: Path | None,
    prof: MeasuredProfile | None,
    kv_log: Path | None,
    step_model: Path | None,
    max_model_len: int | None,
    output: str,
    workload_id: str,
    disaggregated: bool,
    memory: MemoryParams,
) -> PlannedModel:
    """One model's capacity decision for `table`: its candidates enumerated (or read), step times, the sizing with a progress bar."""
    isl, osl = table.column("isl").to_numpy(), table.column("osl").to_numpy()
    workload = _lengths_summary(isl, osl)
    # what the engine checks against max_model_len: prompt + max_tokens where a request states one (vLLM)
    reach = np.fmax(osl, table.column("max_tokens").to_numpy(zero_copy_only=False).astype(np.float64)).astype(np.int64)
    context = max_model_len or min(
        workload_context_lengths(_lengths_summary(isl, reach))["max"], spec.max_position_embeddings or 2**62
    )
    gpu_memory_utilization = MemoryParams().gpu_memory_utilization
    if candidates_file is not None:
        candidates = read_candidates(candidates_file)
    else:
        assert grid_lists is not None
        gpus, quants, kv_dtypes, tps = grid_lists
        grid = EnumerationSpec(
            gpus=gpus,
            weight_quants=quants,
            kv_dtypes=kv_dtypes,
            parallel=ParallelGrid(tp=tps),
            modes=["aggregated", "disaggregated"] if disaggregated else ["aggregated"],
            aggregated=SchedulerGrid(max_num_batched_tokens=[512, 1024, 2048, 8192]),
            max_context_len=context,
            memory=memory,
        )
        candidates = enumerate_with_presets(spec, grid, workload_context_lengths(workload), presets).table
        gpu_memory_utilization = grid.memory.gpu_memory_utilization
    if not candidates["feasible"].any():
        _ruled_out_report(candidates, output)
        raise LlmcapError(no_feasible_candidate(candidates))
    if step_model is not None:
        step_times = StepTimes.read(step_model)
    else:
        measured = prof.models_for(candidates[candidates["feasible"]]) if prof is not None else {}
        step_times = (
            StepTimes("roofline") if prof is None else StepTimes("profile", {"fingerprint": prof.fingerprint}, measured)
        )
    step_times = replace(step_times, engine_kv=stated_kv(prof, kv_log, candidates, step_times.engine_kv))
    console = Console(stderr=True, quiet=output != "table")
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with make_executor(params.compute) as executor, Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("sizing", total=None)
        phase = lambda done, total, name: bar.update(task, completed=done, total=total, description=name)  # noqa: E731
        step = lambda message: bar.update(task, description=message)  # noqa: E731
        outcome = plan_capacity(
            table,
            candidates,
            spec,
            params,
            step_times,
            executor,
            workload_id=workload_id,
            progress=step,
            on_phase=phase,
            engine_presets=presets,
        )
    return PlannedModel(
        outcome, candidates, context, int((isl + reach > context).sum()), gpu_memory_utilization, step_times
    )


def chosen_rows(rows: list[dict[str, Any]], chosen: str, mode: str) -> list[dict[str, Any]]:
    """The capacity table's rows with `chosen` first: true on the plan's row alone (a role row may share its key)."""
    return [{"chosen": r["candidate"] == chosen and r["mode"] == mode} | r for r in rows]


#: Why a row carries no rate, by search status (`llmcap.sizing.search`).
_NO_RATE = {
    "below_floor": "stopped",
    "infeasible": "no rate meets the SLOs",
    "max_evaluations": "no feasible rate found",
}


def max_rps_cell(row: Mapping[str, Any], curves: Mapping[str, SearchResult]) -> str:
    """The max RPS/unit cell: the rate, or `—` and why there is none (a 0 would read as a measured rate)."""
    if row["max_rps"] > 0:
        return f"{row['max_rps']:.3g}"
    status = row["search_status"]
    why = _NO_RATE.get(status, f"no rate ({status.replace('_', ' ')})")
    curve = curves.get(row["candidate"] if row["mode"] == "aggregated" else f"{row['mode']}: {row['candidate']}")
    if status == "below_floor" and curve is not None and curve.upper_rate is not None:
        why += f": fails at {curve.upper_rate:.3g} req/s, needed to beat the best"
    elif status == "below_floor":
        why += ": cannot beat the best"
    return f"— {why}"


NO_PLAN_PASSES = (
    "no plan passes every scenario within its cost limit (size.max_cost_factor / max_usd_per_hour): "
    "the counts shown are the closest miss, not an answer"
)


def _print_plan(outcome, model_name: str, step_line: dict, serve, model: str, over: int, context: int) -> None:
    """The console answer: the table, the chosen plan (or the closest miss) with its evidence, the serve lines."""
    s = outcome.summary
    t = Table(title=f"{model_name}: capacity for {s['target_rps']:.3g} req/s")
    t.add_column("candidate", overflow="fold")  # a narrow terminal folds the name; it never cuts it to `…`
    for col in ("mode", "P:D", "max RPS/unit", "goodput/GPU", "GPUs", "$/h", "search", "scenarios"):
        t.add_column(col)
    for r in outcome.table.to_pylist():
        t.add_row(
            r["candidate"],
            r["mode"],
            r["pd_ratio"] or "–",
            max_rps_cell(r, outcome.report.curves),
            "–" if r["goodput_per_gpu"] is None else f"{r['goodput_per_gpu']:.3g}",
            "–" if r["gpus"] is None else str(r["gpus"]),
            "–" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:,.0f}",
            r["search_status"],
            r["scenarios"] or "–",
        )
    out_console().print(t)
    if s["verdict"] == "fails":
        out_console().print(
            f"[bold red]NO PLAN PASSES[/]: closest miss {s['chosen']} ({s['mode']}): {s['gpus']} GPUs, ${s['usd_per_hour']:,.0f}/h "
            "still fails a scenario — not an answer",
            highlight=False,
        )
    else:
        print(f"chosen: {s['chosen']} ({s['mode']}): {s['gpus']} GPUs, ${s['usd_per_hour']:,.0f}/h")
    for name, definition in s["slo_definitions"].items():
        print(f"  SLO {name}: {definition}")
    if over:
        print(
            f"  {over:,} requests are longer than max_model_len {context:,}: rejected as the engine would, counted as SLO misses"
        )
    for pool, q in s["pool_plans"].items():
        print(
            f"  {pool}: {q['instances']} × {q['gpus_per_instance']} GPU (base {q['base_instances']}, G = {q['per_instance_rps']:.3g} req/s per instance)"
        )
        for risk, h in q["headroom"].items():
            print(f"    +{h['instances']} {risk} (+{h['rps']:.3g} req/s): {h['reasoning']}")
    for f in s["finalists"] or []:
        print(f"  settled on the whole trace: {f['line']}")
    for line in s["scenarios"] or []:
        print(f"  scenario {line}")
    for line in s["minimality"] or []:
        print(f"  one fewer: {line}")
    for line in (s["count_range"] or {}).get("lines", []):
        print(f"  range: {line}")
    print(f"  {s['ledger']['line']}")
    for line in budget_lines(s):
        print(f"  {line}")
    print(f"  step times: {step_line['line']}")
    if serve and not Path(model).exists():
        print(f"  serve: {model} is llmcap's catalog name; give vllm serve your checkpoint's path or Hugging Face id")
    for c in serve:
        print(f"  serve ({c.pool}: {c.instances} × {c.gpus_per_instance} GPU): {c.shell}")
        for note in c.notes:
            print(f"    note: {note}")
