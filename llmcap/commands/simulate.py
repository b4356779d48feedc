"""`llmcap simulate --trace FILE --model M --gpu G [--tp N] [--replicas R | --pd P:D] ...`: replay a trace
through the request-level serving simulator and print the summary (`--output-format table|json|csv`).

Step times come from the roofline (`llmcap.perf.build_step_model`, compiled for speed by the simulator),
or from a measured profile (`--profile DIR` from `llmcap profile`, for the configuration it was measured
on); KV blocks per replica come from the memory plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import pyarrow as pa
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    err_console,
    given_options,
    out_console,
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
from llmcap.engine_presets import engine_preset
from llmcap.errors import InputFileError, LlmcapError
from llmcap.exit_codes import SLO_MISSED
from llmcap.first_token import includes_handoff
from llmcap.sim import SimConfig, SimResult
from llmcap.sim import simulate as run_simulation
from llmcap.sizing.measured import load_profile
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import definitions, goodput, token_itl_check
from llmcap.trace import mean_rate, scale_rate, write_table
from llmcap.trace.synth import spread_ties

if TYPE_CHECKING:
    from llmcap.sizing.planned import PlannedDeployment

PROGRESS_MIN_REQUESTS = 20_000  # shorter runs finish before a bar is worth drawing


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
    trace: Annotated[
        Path, typer.Option("--trace", "-t", help="trace file: canonical Parquet or any format `llmcap trace` reads")
    ],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="catalog model name or path to config.json")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", "-g", help="GPU name or alias (e.g. h100)")] = None,
    plan: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            help="replay a sized plan instead (summary.json of `llmcap size --out` or the size "
            "stage): its deployment, step times, planning rate, seed and SLO; exit 6 (SLO MISSED) when it misses",
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario",
            help="with --plan: serve only what one of its scenarios leaves, e.g. "
            "'node loss: prefill' (default: every planned instance)",
        ),
    ] = None,
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
    engine_name: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="vllm | sglang | trtllm: that engine's own defaults on --gpu for "
            "the admission policy, chunk, max batch and KV block; an option given explicitly wins",
        ),
    ] = None,
    pd: PdOpt = None,
    first_token_from: FirstTokenFromOpt = ENGINE.first_token_from,
    link_gbps: LinkGbpsOpt = ENGINE.link_gbps,
    link_latency_ms: LinkLatencyOpt = ENGINE.link_latency_ms,
    request_rate: Annotated[
        float | None,
        typer.Option("--request-rate", help="simulate at this mean rate, req/s (the trace's burst shape kept)"),
    ] = None,
    rate_scale: Annotated[
        float, typer.Option(help="or: multiply the trace's mean arrival rate by this (gaps shrink by it)")
    ] = 1.0,
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
    seed: Annotated[int, typer.Option(help="seed of the power-of-two router")] = 0,
    resolution: Annotated[float, typer.Option(min=1e-6, help="time-series resolution, s")] = model_default(
        SimConfig, "timeseries_resolution_s"
    ),
    max_time: Annotated[float | None, typer.Option(min=0.0, help="stop the simulated clock here, s")] = None,
    reference: Annotated[bool, typer.Option("--reference", help="step-by-step reference mode (slow)")] = model_default(
        SimConfig, "reference"
    ),
    out: Annotated[Path | None, typer.Option("--out", help="write per-request records (Parquet)")] = None,
    timeseries_out: Annotated[
        Path | None, typer.Option("--timeseries-out", help="write per-replica time series (Parquet)")
    ] = None,
    goodput: GoodputOpt = None,
    itl_stat: ItlStatOpt = SLO.itl_stat,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """Simulate serving TRACE on REPLICAS x (MODEL on GPU, TP) and report TTFT / ITL / throughput."""
    if plan is not None:
        given = [f"--{n.replace('_', '-')}" for n in given_options(ctx, PLAN_SETS)]
        if given:
            raise LlmcapError(f"--plan sets the deployment, rate and SLO; drop {', '.join(given)}")
        seed_given = bool(given_options(ctx, ["seed"]))
        _simulate_plan(
            plan,
            scenario,
            trace,
            (fmt, time_unit, column, hash_block_size, generate_arrivals, arrival_rate, duplicates),
            seed if seed_given else None,
            output_format(output_fmt, json_out),
            out,
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
    engine = cfg.engine
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
    )
    # A clock coarser than the request rate logs distinct requests at one tick: spread them within it,
    # as the sizing search does, instead of sending every tick's requests at once.
    table = spread_ties(cleaned.trace, np.random.default_rng(seed))
    if request_rate is not None:
        plausible_rate("--request-rate", request_rate)
        table = scale_rate(table, request_rate)
    elif rate_scale != 1.0:
        plausible_rate(
            f"--rate-scale {rate_scale:g} x the trace's {mean_rate(table):.3g} req/s", mean_rate(table) * rate_scale
        )
        table = scale_rate(table, mean_rate(table) * rate_scale)
    step = measured.fit.model if measured is not None else step_model(model, gpu, tp, quant, kv_dtype)
    rng = np.random.default_rng(seed)
    if output != "table" or table.num_rows < PROGRESS_MIN_REQUESTS:
        result = run_simulation(table, step, cfg, rng)
    else:
        with Progress(
            "simulating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True
        ) as bar:
            task = bar.add_task("requests", total=table.num_rows)
            result = run_simulation(
                table, step, cfg, rng, progress=lambda done, total: bar.update(task, completed=done)
            )
    if out is not None:
        write_table(result.records, out)
    if timeseries_out is not None:
        write_table(result.timeseries, timeseries_out)
    s = dict(result.summary)
    s.update(
        model=spec.name, gpu=g.name, tp=tp, kv_blocks_per_replica=engine.num_blocks, step_model=type(step).__name__
    )
    if measured is not None:
        s["profile"] = {
            "path": str(measured.directory),
            "fingerprint_hash": measured.fingerprint_hash,
            "describe": measured.describe(),
        }
    s["max_model_len"] = engine.max_model_len
    s["rejected_over_max_model_len"] = _over_limit(table, engine.max_model_len)
    s["input_accounting"] = account_json(cleaned.report)
    s["deployment"] = deployment_label(cfg)
    if preset is not None:
        s["engine_preset"] = preset.to_dict() | {
            "overridden": sorted(n for n in PRESET_FIELDS if getattr(opts, n) != getattr(preset, n))
        }
    if slo is not None:
        s["goodput"] = _goodput_summary(result, slo, pd is not None)
    if output == "json":
        print_json(s)
        return
    if output == "csv":
        print_csv([s])
        return
    t = Table(title=f"{spec.name} on {g.name} TP{tp}, {s['deployment']}, router {router}")
    t.add_column("metric")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    t.add_column("p99", justify="right")
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        t.add_row(key, *(f"{v:,.1f}" if v is not None else "-" for v in s[key].values()))
    console = out_console()
    console.print(t)
    console.print(f"step times: {s['profile']['describe'] if measured is not None else 'the roofline for ' + g.name}")
    if preset is not None:
        console.print(
            f"engine preset: {preset.line()}"
            + (
                f" (given instead: {', '.join(s['engine_preset']['overridden'])})"
                if s["engine_preset"]["overridden"]
                else ""
            ),
            highlight=False,
        )
    thr = s["throughput"]
    console.print(
        f"requests {s['requests']:,} (completed {s['completed']:,}, rejected {s['rejected']:,} of which "
        f"{s['rejected_over_max_model_len']:,} longer than max_model_len {s['max_model_len']}, unfinished {s['unfinished']:,}); "
        f"duration {s['duration_s']:,.1f} s; output {thr['output_tok_s'] or 0:,.0f} tok/s, {thr['req_s'] or 0:,.2f} req/s; "
        f"preemptions {s['preemptions']:,}; prefix hit ratio {s['prefix_hit_ratio']:.3f}; "
        f"wall {s['wall_s']:.2f} s ({s['requests_per_wall_s'] or 0:,.0f} req/wall-s)"
    )
    for t in s.get("prefix_tiers", ()):
        console.print(
            f"tier {t['tier']}: {t['hit_tokens']:,} prompt tokens loaded ({t['hit_ratio']:.1%} of all), load {t['load_s']:,.2f} s, "
            f"{t['lookups']:,} lookups {t['lookup_s']:,.2f} s; saved prefill ≈ {t['saved_prefill_s']:,.2f} s, "
            f"net {t['net_gain_s']:+,.2f} s",
            highlight=False,
        )
    if slo is not None:
        g = s["goodput"]
        console.print(
            f"goodput: {g['good']:,} of {g['requests']:,} requests meet every target (attainment {g['attainment']:.4f}), "
            f"{g['goodput_rps']:,.3g} req/s over the arrival span" + (f"; {g['token_itl']}" if g["token_itl"] else "")
        )
        for name, definition in g["slo_definitions"].items():
            console.print(f"  SLO {name}: {definition}")


def _simulate_plan(
    path: Path, scenario: str | None, trace: Path, reading: tuple, seed: int | None, output: str, out: Path | None
) -> None:
    """The plan's deployment (or what `scenario` leaves of it) on the whole trace at its planning rate, judged by its SLO."""
    import json

    from llmcap.sizing.planned import PlannedDeployment

    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        record = summary["deployment"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputFileError(path, f"not a sized plan's summary.json ({type(exc).__name__}: {exc})") from None
    planned = PlannedDeployment.from_dict(record, str(path))
    if scenario == "availability":  # judged over time on several deployments: not one run's records
        _plan_availability(planned, summary, path, trace, reading, seed, output, out)
        return
    name = scenario or "traffic"
    counts = planned.scenario_counts(name) if scenario is not None else planned.counts
    if out is not None:
        check_outputs([trace], [out])
    cleaned = read_trace_input(trace, *reading, announce=output == "table")
    result = planned.replay(cleaned.trace, counts, seed)
    if out is not None:
        write_table(result.records, out)
    verdict = planned.judge(result, cleaned.trace)
    s = dict(result.summary) | {
        "plan": str(path),
        "chosen": summary.get("chosen"),
        "scenario": name,
        "counts": counts,
        "planning_rps": planned.planning_rps,
        "seed": planned.seed if seed is None else seed,
        "deployment": deployment_label(planned.config_at(counts)),
        "plan_check": {
            "attainment": verdict.attainment,
            "target": verdict.target,
            "run_miss": verdict.run_miss,
            "passes": verdict.passes,
        },
        "input_accounting": account_json(cleaned.report),
    }
    # the plan's availability target, judged with the plan itself (a scenario names one deployment only)
    check = planned.judge_availability(cleaned.trace, seed) if scenario is None and planned.availability else None
    if check is not None:
        s["availability_check"] = {
            "availability": check.share,
            "target": check.target,
            "states": check.detail,
            "passes": check.passes,
        }
    if output == "json":
        print_json(s)
    elif output == "csv":
        print_csv([s])
    else:
        out_console().print(
            f"plan {s['chosen']}, scenario {name!r} ({', '.join(f'{k} {v}' for k, v in counts.items())}) on "
            f"{s['requests']:,} requests at {planned.planning_rps:.4g} req/s: {verdict.line()}",
            highlight=False,
            soft_wrap=True,
        )
        if check is not None:
            out_console().print(
                f"plan {s['chosen']}, scenario 'availability': {check.line()}", highlight=False, soft_wrap=True
            )
    if not verdict.passes or (
        check is not None and not check.passes
    ):  # a check of the plan: a miss is the exit code every command gives it
        raise typer.Exit(SLO_MISSED)


def _plan_availability(
    planned: PlannedDeployment,
    summary: dict,
    path: Path,
    trace: Path,
    reading: tuple,
    seed: int | None,
    output: str,
    out: Path | None,
) -> None:
    """`--scenario availability`: the plan's availability target alone (each state's whole-trace run, weighted by its time)."""
    if out is not None:
        raise LlmcapError(
            "--scenario availability replays several deployments: --out (one run's records) does not apply"
        )
    cleaned = read_trace_input(trace, *reading, announce=output == "table")
    check = planned.judge_availability(cleaned.trace, seed)
    s = {
        "plan": str(path),
        "chosen": summary.get("chosen"),
        "scenario": "availability",
        "planning_rps": planned.planning_rps,
        "seed": planned.seed if seed is None else seed,
        "availability_check": {
            "availability": check.share,
            "target": check.target,
            "states": check.detail,
            "passes": check.passes,
        },
        "input_accounting": account_json(cleaned.report),
    }
    if output == "json":
        print_json(s)
    elif output == "csv":
        print_csv([s])
    else:
        out_console().print(
            f"plan {s['chosen']}, scenario 'availability' at {planned.planning_rps:.4g} req/s: {check.line()}",
            highlight=False,
            soft_wrap=True,
        )
    if not check.passes:
        raise typer.Exit(SLO_MISSED)


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
