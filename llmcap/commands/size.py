"""`llmcap size`: the GPU count for a trace and its SLOs, with the evidence (step 4 outside the pipeline).

Reads and cleans the trace, enumerates candidates for the model on the given GPUs, searches each
shortlisted candidate's max feasible rate by simulation, sizes the cheapest deployment for the target
rate with headroom by risk, and writes the capacity table, Markdown/HTML report and summary.json (`--out`).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from llmcap.candidates import (
    EnumerationSpec,
    ParallelGrid,
    SchedulerGrid,
    enumerate_with_presets,
    workload_context_lengths,
)
from llmcap.catalog import ModelSpec, load_model
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
    parse_percentiles,
)
from llmcap.commands._size_inputs import (
    catalog_grid,
    engine_presets_for,
    lengths_summary,
    params_from_file,
    read_candidates,
    size_params_from_options,
)
from llmcap.commands._size_options import (
    AlsoPdOpt,
    AttainmentOpt,
    CandidatesFileOpt,
    ClassByOpt,
    DaskAddressOpt,
    EngineOpt,
    ExcerptOpt,
    GpuGridOpt,
    KvDtypeGridOpt,
    MaxLoraRankOpt,
    MaxLorasOpt,
    MaxUsdPerHourOpt,
    ModelsOpt,
    ParamsFileOpt,
    PoolsSplitCapOpt,
    PoolsSplitIslOpt,
    ReportDirOpt,
    ShortlistOpt,
    SizeMaxModelLenOpt,
    SizeTraceOpt,
    SloAvailabilityOpt,
    SloItlP99Opt,
    SloTtftP99Opt,
    StepModelOpt,
    TargetRpsOpt,
    TpGridOpt,
    TtftHandoffOpt,
    TtftPer1kIslOpt,
    WeightQuantGridOpt,
    WorkersOpt,
)
from llmcap.commands._size_print import NO_PLAN_PASSES, chosen_rows, print_near_miss, print_plan, print_ruled_out
from llmcap.commands._size_sources import stated_kv, step_model_summary
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
    read_trace_input,
)
from llmcap.deployment import tier_spec
from llmcap.engine_presets import EnginePreset
from llmcap.errors import LlmcapError
from llmcap.memory import MemoryParams
from llmcap.planning import StepTimes, mixed_traffic, plan_capacity
from llmcap.report.capacity import write_report
from llmcap.sizing.executor import make_executor
from llmcap.sizing.measured import MeasuredProfile, load_profile
from llmcap.sizing.nearmiss import NoFeasiblePlan
from llmcap.sizing.params import SizeParams
from llmcap.sizing.plan import no_feasible_candidate
from llmcap.trace.clean import CleanReport, CleanResult
from llmcap.vllm_serve import serve_commands

MEMORY = MemoryParams()
MIN_REQUESTS = 20  # warm-up and drain are excluded from every replay: fewer leave no steady window to judge
DEFAULT_TP = ",".join(map(str, ParallelGrid().tp))  # the catalog grid's TP degrees, as the option's default text


@user_errors
def size(
    ctx: typer.Context,
    trace: SizeTraceOpt,
    model: ModelsOpt = None,
    class_by: ClassByOpt = None,
    slo_ttft_p99: SloTtftP99Opt = None,
    slo_itl_p99: SloItlP99Opt = None,
    goodput: GoodputOpt = None,
    slo_percentile: SloPercentileOpt = None,
    itl_stat: ItlStatOpt = SLO.itl_stat,
    ttft_handoff: TtftHandoffOpt = SLO.ttft_includes_handoff,
    target_rps: TargetRpsOpt = SIZE.target_rps,
    ttft_per_1k_isl: TtftPer1kIslOpt = SLO.ttft_ms_per_1k_isl,
    attainment: AttainmentOpt = SLO.attainment_target,
    slo_availability: SloAvailabilityOpt = SLO.availability,
    gpu: GpuGridOpt = ["H100-SXM-80GB,H200-SXM-141GB"],
    weight_quant: WeightQuantGridOpt = ["bf16,fp8"],
    tp: TpGridOpt = [DEFAULT_TP],
    kv_dtype: KvDtypeGridOpt = ["bf16,fp8"],
    profile: ProfileOpt = None,
    kv_from_log: KvFromLogOpt = None,
    admission_policy: AdmissionOpt = SIZE.admission_policy,
    tier: TierOpt = None,
    engine: EngineOpt = None,
    step_model: StepModelOpt = None,
    params_file: ParamsFileOpt = None,
    candidates_file: CandidatesFileOpt = None,
    pools_split_isl: PoolsSplitIslOpt = SIZE.pools_split_isl,
    pools_split_cap: PoolsSplitCapOpt = SIZE.pools_split_cap,
    pd: AlsoPdOpt = SIZE.pd_prefill_shortlist > 0,
    max_usd_per_hour: MaxUsdPerHourOpt = SIZE.max_usd_per_hour,
    shortlist: ShortlistOpt = SIZE.shortlist,
    excerpt: ExcerptOpt = SIZE.excerpt_requests,
    workers: WorkersOpt = SIZE.compute.workers,
    dask_address: DaskAddressOpt = SIZE.compute.dask_address,
    max_loras: MaxLorasOpt = MEMORY.lora_slots,
    max_lora_rank: MaxLoraRankOpt = MEMORY.lora_rank,
    max_model_len: SizeMaxModelLenOpt = None,
    out: ReportDirOpt = None,
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
    pipeline = params_from_file(ctx, params_file) if params_file is not None else None
    models = model or ([pipeline.enumerate.model] if pipeline is not None else [])
    if not models:
        raise LlmcapError("no model: give --model (or --params with enumerate.model)")
    classes = model_classes(models)
    prof = load_profile(profile) if profile is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise LlmcapError(f"{out}: is a file; --out names a directory for capacity.parquet/.md/.html")
    if pipeline is not None:
        split = pools_split_isl if pools_split_isl is not None else pipeline.size.pools_split_isl
        params = pipeline.size.model_copy(update={"pools_split_isl": split})
    else:
        params = size_params_from_options(
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
    grid_lists = None if candidates_file is not None else catalog_grid(gpu, weight_quant, kv_dtype, tp)
    presets = engine_presets_for(engine, grid_lists[0] if grid_lists is not None else None, candidates_file)
    if presets and not given_options(ctx, ["admission_policy"]):
        params = params.model_copy(update={"admission_policy": next(iter(presets.values())).admission_policy})
    specs = {
        label: load_model(name) for label, name in classes.items()
    }  # an unknown model fails before the trace is read
    cleaned = _read_sizing_trace(
        trace, (fmt, time_unit, column, hash_block_size, generate_arrivals, arrival_rate, duplicates), output, scope
    )
    table = cleaned.trace
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
        print_near_miss(none, output, out)
        raise typer.Exit(1) from None
    _publish_one(
        one, cleaned.report, presets, prof, step_model, model_arg, spec.name, out, output, (max_loras, max_lora_rank)
    )


def _read_sizing_trace(trace: Path, reading: tuple, output: str, scope: str | None) -> CleanResult:
    """The cleaned trace, refused when too few requests are left to judge a rate on a steady window."""
    cleaned = read_trace_input(trace, *reading, announce=output == "table", scope=scope)
    if cleaned.trace.num_rows < MIN_REQUESTS:
        raise LlmcapError(
            f"{trace}: {cleaned.trace.num_rows} usable requests are too few to size on (at least {MIN_REQUESTS}: rates are judged on a steady window)"
        )
    return cleaned


def _publish_one(
    one: PlannedModel,
    accounting: CleanReport,
    presets: dict[str, EnginePreset],
    prof: MeasuredProfile | None,
    step_model: Path | None,
    model_arg: str,
    model_name: str,
    out: Path | None,
    output: str,
    loras: tuple[int, int],
) -> None:
    """One model's plan written (report, summary.json) and printed; exit 1 when no plan passes."""
    outcome, candidates, context = one.outcome, one.candidates, one.context
    paths = write_report(outcome.report, out) if out is not None else {}
    if out is not None:  # the summary beside the report, as the pipeline's size stage writes it
        paths["summary"] = out / "summary.json"
    serve = serve_commands(outcome.summary, candidates, model_arg, one.gpu_memory_utilization, loras)
    step_line = step_model_summary(prof, one.step_times.measured, step_model)
    s = outcome.summary
    summary = dict(s) | {
        "vllm_serve": [c.to_dict() for c in serve],
        "step_model": step_line,
        "report": {k: str(v) for k, v in paths.items()},
        "max_model_len": context,
        "rejected_over_max_model_len": one.over,
        "input_accounting": account_json(accounting),
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
        print_plan(outcome, model_name, step_line, serve, model_arg, one.over, context)
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
    workload = lengths_summary(isl, osl)
    # what the engine checks against max_model_len: prompt + max_tokens where a request states one (vLLM)
    reach = np.fmax(osl, table.column("max_tokens").to_numpy(zero_copy_only=False).astype(np.float64)).astype(np.int64)
    context = max_model_len or min(
        workload_context_lengths(lengths_summary(isl, reach))["max"], spec.max_position_embeddings or 2**62
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
        print_ruled_out(candidates, output)
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
