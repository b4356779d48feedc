"""`llmcap simulate --trace FILE --model M --gpu G [--tp N] [--replicas R | --pd P:D] ...`: replay a trace
through the request-level serving simulator and print the summary (`--output-format table|json|csv`).

Step times come from the roofline (`llmcap.perf.build_step_model`, compiled for speed by the simulator),
or from a measured profile (`--profile DIR` from `llmcap profile`, for the configuration it was measured
on); KV blocks per replica come from the memory plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    err_console,
    given_options,
    output_format,
    print_csv,
    print_json,
    user_errors,
)
from llmcap.commands._deployment import (
    AdmissionOpt,
    FirstTokenFromOpt,
    GpuMemUtilOpt,
    HostBlocksOpt,
    HostGbpsOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    LinkGbpsOpt,
    LinkLatencyOpt,
    MaxBatchedOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    NumBlocksOpt,
    PdOpt,
    PrefixCachingOpt,
    ProfileOpt,
    QuantOpt,
    ReplicasOpt,
    RouterOpt,
    SchedulingOpt,
    TierOpt,
    TpOpt,
)
from llmcap.commands._goodput import SLO, GoodputOpt, ItlStatOpt, SloTargets, check_itl_stat, parse_goodput
from llmcap.commands._simulate_options import (
    MaxTimeOpt,
    PlanFileOpt,
    RateScaleOpt,
    RecordsOutOpt,
    ReferenceOpt,
    RequestRateOpt,
    ResolutionOpt,
    RouterSeedOpt,
    ScenarioOpt,
    SimEngineOpt,
    SimGpuOpt,
    SimModelOpt,
    SimTraceOpt,
    TimeseriesOutOpt,
)
from llmcap.commands._simulate_plan import simulate_plan
from llmcap.commands._simulate_print import print_simulation
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
    read_trace_input,
)
from llmcap.deployment import (
    ENGINE,
    PRESET_FIELDS,
    EngineOptions,
    check_choices,
    deployment_label,
    model_default,
    sim_config,
    step_model,
    with_preset,
)
from llmcap.engine_presets import EnginePreset, engine_preset
from llmcap.errors import LlmcapError
from llmcap.first_token import includes_handoff
from llmcap.perf.model import StepTimeModel
from llmcap.sim import SimConfig, SimResult
from llmcap.sim import simulate as run_simulation
from llmcap.sizing.measured import MeasuredProfile, load_profile
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import definitions, goodput, token_itl_check
from llmcap.trace import mean_rate, scale_rate, write_table
from llmcap.trace.clean import CleanReport
from llmcap.trace.synth import spread_ties

if TYPE_CHECKING:
    pass

PROGRESS_MIN_REQUESTS = 20_000  # shorter runs finish before a bar is worth drawing
RESOLUTION_S = model_default(SimConfig, "timeseries_resolution_s")  # the simulator's own defaults, never copies
REFERENCE_MODE = model_default(SimConfig, "reference")


# deployment options a plan (--plan) sets itself
PLAN_SETS = (
    "model",
    "gpu",
    "tp",
    "replicas",
    "router",
    "admission_policy",
    "scheduling_policy",
    "pd",
    "first_token_from",
    "link_gbps",
    "link_latency_ms",
    "request_rate",
    "rate_scale",
    "quant",
    "kv_dtype",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_blocks",
    "gpu_memory_utilization",
    "prefix_caching",
    "host_blocks",
    "host_gbps",
    "tier",
    "profile",
    "max_model_len",
    "goodput",
    "itl_stat",
)


@user_errors
def simulate(
    ctx: typer.Context,
    trace: SimTraceOpt,
    model: SimModelOpt = None,
    gpu: SimGpuOpt = None,
    plan: PlanFileOpt = None,
    scenario: ScenarioOpt = None,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    hash_block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    max_model_len: MaxModelLenOpt = None,
    tp: TpOpt = ENGINE.tp,
    replicas: ReplicasOpt = ENGINE.replicas,
    router: RouterOpt = ENGINE.router,
    admission_policy: AdmissionOpt = ENGINE.admission_policy,
    scheduling_policy: SchedulingOpt = ENGINE.scheduling_policy,
    engine_name: SimEngineOpt = None,
    pd: PdOpt = None,
    first_token_from: FirstTokenFromOpt = ENGINE.first_token_from,
    link_gbps: LinkGbpsOpt = ENGINE.link_gbps,
    link_latency_ms: LinkLatencyOpt = ENGINE.link_latency_ms,
    request_rate: RequestRateOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    num_blocks: NumBlocksOpt = None,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    prefix_caching: PrefixCachingOpt = ENGINE.prefix_caching,
    host_blocks: HostBlocksOpt = ENGINE.host_blocks,
    host_gbps: HostGbpsOpt = ENGINE.host_gbps,
    tier: TierOpt = None,
    profile: ProfileOpt = None,
    seed: RouterSeedOpt = 0,
    resolution: ResolutionOpt = RESOLUTION_S,
    max_time: MaxTimeOpt = None,
    reference: ReferenceOpt = REFERENCE_MODE,
    out: RecordsOutOpt = None,
    timeseries_out: TimeseriesOutOpt = None,
    goodput: GoodputOpt = None,
    itl_stat: ItlStatOpt = SLO.itl_stat,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """Simulate serving TRACE on REPLICAS x (MODEL on GPU, TP) and report TTFT / ITL / throughput."""
    reading = (fmt, time_unit, column, hash_block_size, generate_arrivals, arrival_rate, duplicates)
    if plan is not None:
        given = [f"--{n.replace('_', '-')}" for n in given_options(ctx, PLAN_SETS)]
        if given:
            raise LlmcapError(f"--plan sets the deployment, rate and SLO; drop {', '.join(given)}")
        seed_given = bool(given_options(ctx, ["seed"]))
        simulate_plan(
            plan, scenario, trace, reading, seed if seed_given else None, output_format(output_fmt, json_out), out
        )
        return
    if scenario is not None:
        raise LlmcapError("--scenario names one of a plan's scenarios: give --plan summary.json with it")
    if model is None or gpu is None:
        raise LlmcapError("give --model and --gpu (the deployment to simulate), or --plan summary.json (a sized plan)")
    opts = EngineOptions(
        tp=tp,
        replicas=replicas,
        router=router,
        admission_policy=admission_policy,
        scheduling_policy=scheduling_policy,
        pd=pd,
        first_token_from=first_token_from,
        link_gbps=link_gbps,
        link_latency_ms=link_latency_ms,
        quant=quant,
        kv_dtype=kv_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_blocks=num_blocks,
        gpu_memory_utilization=gpu_memory_utilization,
        prefix_caching=prefix_caching,
        host_blocks=host_blocks,
        host_gbps=host_gbps,
        tiers=tuple(tier or ()),
        max_model_len=max_model_len,
    )
    preset = engine_preset(engine_name, get_gpu(gpu)) if engine_name is not None else None
    if preset is not None:
        opts = with_preset(opts, preset, set(given_options(ctx, PRESET_FIELDS)))
    check_choices(opts)
    output = output_format(output_fmt, json_out)
    slo = _goodput_slo(goodput, itl_stat, includes_handoff(first_token_from))
    positive("--rate-scale", rate_scale)
    positive("--request-rate", request_rate)
    if request_rate is not None and rate_scale != 1.0:
        raise LlmcapError("--request-rate and --rate-scale both set the rate; give one")
    check_outputs([trace], [p for p in (out, timeseries_out) if p is not None])
    spec = load_model(model)
    g = get_gpu(gpu)
    measured = load_profile(profile) if profile is not None else None
    if measured is not None:
        measured.check_matches({"gpu": g.name, "tp": tp, "pp": 1, "ep": 1, "weight_quant": quant, "kv_dtype": kv_dtype})
    # the deployment (a model that does not fit its GPU included) fails before the trace is read
    cfg = sim_config(spec, g, opts, reference=reference, resolution=resolution, max_time=max_time)
    cleaned = read_trace_input(trace, *reading, announce=output == "table")
    # A clock coarser than the request rate logs distinct requests at one tick: spread them within it,
    # as the sizing search does, instead of sending every tick's requests at once.
    table = spread_ties(cleaned.trace, np.random.default_rng(seed))
    table = _at_rate(table, request_rate, rate_scale)
    step = measured.fit.model if measured is not None else step_model(model, gpu, tp, quant, kv_dtype)
    result = _run(table, step, cfg, np.random.default_rng(seed), output == "table")
    if out is not None:
        write_table(result.records, out)
    if timeseries_out is not None:
        write_table(result.timeseries, timeseries_out)
    s = _summary(
        result, spec.name, g.name, tp, cfg, type(step).__name__, measured, table, cleaned.report, (preset, opts)
    )
    if slo is not None:
        s["goodput"] = _goodput_summary(result, slo, pd is not None)
    if output == "json":
        print_json(s)
        return
    if output == "csv":
        print_csv([s])
        return
    steps = s["profile"]["describe"] if measured is not None else "the roofline for " + g.name
    print_simulation(s, f"{spec.name} on {g.name} TP{tp}, {s['deployment']}, router {router}", steps, preset)


def _summary(
    result: SimResult,
    model_name: str,
    gpu_name: str,
    tp: int,
    cfg: SimConfig,
    step_name: str,
    measured: MeasuredProfile | None,
    table: pa.Table,
    accounting: CleanReport,
    preset_and_options: tuple[EnginePreset | None, EngineOptions],
) -> dict[str, Any]:
    """The run's summary with what was simulated: the deployment, step times, input accounting, the preset's overrides."""
    preset, opts = preset_and_options
    engine = cfg.engine
    s = dict(result.summary)
    s.update(model=model_name, gpu=gpu_name, tp=tp, kv_blocks_per_replica=engine.num_blocks, step_model=step_name)
    if measured is not None:
        s["profile"] = {
            "path": str(measured.directory),
            "fingerprint_hash": measured.fingerprint_hash,
            "describe": measured.describe(),
        }
    s["max_model_len"] = engine.max_model_len
    s["rejected_over_max_model_len"] = _over_limit(table, engine.max_model_len)
    s["input_accounting"] = account_json(accounting)
    s["deployment"] = deployment_label(cfg)
    if preset is not None:
        s["engine_preset"] = preset.to_dict() | {
            "overridden": sorted(n for n in PRESET_FIELDS if getattr(opts, n) != getattr(preset, n))
        }
    return s


def _at_rate(table: pa.Table, request_rate: float | None, rate_scale: float) -> pa.Table:
    """The trace at the asked mean rate (--request-rate or --rate-scale), its burst shape kept."""
    if request_rate is not None:
        plausible_rate("--request-rate", request_rate)
        table = scale_rate(table, request_rate)
    elif rate_scale != 1.0:
        plausible_rate(
            f"--rate-scale {rate_scale:g} x the trace's {mean_rate(table):.3g} req/s", mean_rate(table) * rate_scale
        )
        table = scale_rate(table, mean_rate(table) * rate_scale)
    return table


def _run(table: pa.Table, step: StepTimeModel, cfg: SimConfig, rng: np.random.Generator, on_console: bool) -> SimResult:
    """The simulation, with a progress bar on the console when the run is long enough to want one."""
    if not on_console or table.num_rows < PROGRESS_MIN_REQUESTS:
        return run_simulation(table, step, cfg, rng)
    with Progress(
        "simulating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True
    ) as bar:
        task = bar.add_task("requests", total=table.num_rows)
        return run_simulation(table, step, cfg, rng, progress=lambda done, total: bar.update(task, completed=done))


def _goodput_slo(goodput: list[str] | None, itl_stat: str, ttft_includes_handoff: bool) -> SloParams | None:
    """The --goodput targets as SloParams (None without --goodput); every request of the run is judged."""
    targets = parse_goodput(goodput)
    if not targets:
        return None
    fields = SloTargets(
        ttft_ms=targets.get("ttft_ms"),
        itl_ms=targets.get("itl_ms"),
        tpot_ms=targets.get("tpot_ms"),
        e2e_ms=targets.get("e2e_ms"),
    )
    return SloParams(**fields, itl_stat=check_itl_stat(itl_stat), ttft_includes_handoff=ttft_includes_handoff)


def _goodput_summary(result: SimResult, slo: SloParams, disaggregated: bool) -> dict:
    """Requests meeting every per-request target over the whole arrival span (no warm-up excluded, as vllm bench
    counts), and the token-level ITL check when one is set."""
    g = goodput(result.records, slo)
    token = token_itl_check(result.itl_values, result.itl_weights, slo)
    verdict = (
        None
        if token is None
        else f"ITL token-level P{token.percentile:g} {token.observed_ms:.4g} ms vs {token.target_ms:g} ms: {'met' if token.ok else 'MISSED'}"
    )
    return {
        "slo_definitions": definitions(slo, disaggregated),
        "requests": g.requests,
        "good": g.qualified,
        "attainment": g.attainment,
        "goodput_rps": g.goodput_rps,
        "misses": g.misses,
        "token_itl": verdict,
    }


def _over_limit(table: pa.Table, max_model_len: int | None) -> int:
    """Requests whose prompt + output exceed the engine's limit (rejected on arrival; SLO misses)."""
    if max_model_len is None:
        return 0
    total = table.column("isl").to_numpy() + table.column("osl").to_numpy()
    return int((total > max_model_len).sum())
