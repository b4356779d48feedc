"""Step 4 as one call, the same for `llmcap size` and the pipeline's size stage: size the deployments
(`llmcap.sizing.plan`), compare request-class pools when asked (`size.pools_split_isl`), say what timed the
steps, and assemble the report and the summary. Given the same trace, candidates, params and step times,
both give the same table, report and decision."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pyarrow as pa

from llmcap.catalog import ModelSpec
from llmcap.engine_presets import EnginePreset
from llmcap.errors import InputFileError, LlmcapError
from llmcap.perf import CalibratedFit
from llmcap.policy_names import reserves_output
from llmcap.report.capacity import CapacityReport, Provenance, Sources, capacity_report
from llmcap.sizing.executor import Executor
from llmcap.sizing.kvbudget import EngineKV, apply_engine_kv, from_fingerprint, kv_budget_summary
from llmcap.sizing.measured import MeasuredModels, measured_models, with_corrections
from llmcap.sizing.outcome import SizingOutcome
from llmcap.sizing.params import SizeParams
from llmcap.sizing.plan import class_pools, size_deployments
from llmcap.sizing.pools import PoolComparison
from llmcap.sizing.summary import CapacitySummary, PoolSizes, RequestClassPools, SizingSummary
from llmcap.trace.stats import label_mix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepTimes:
    """What times the candidates' steps: the profile stage's `source` ("roofline…" or "profile…"), the
    profile's description (`fingerprint`, written-back `corrections`, as in step_model.json) and the
    calibrated step models of the candidates it matches (the roofline times every other one)."""

    source: str = "roofline"
    info: Mapping[str, Any] = field(default_factory=dict)
    measured: MeasuredModels = field(default_factory=dict)
    engine_kv: tuple[EngineKV, ...] = ()  # KV capacities engines stated (`llmcap.sizing.kvbudget`)

    @classmethod
    def read(cls, path: Path) -> StepTimes:
        """The step times the profile stage's step_model.json describes, with the corrections reconciliation
        wrote back applied to their configurations."""
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            source = info["source"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise InputFileError(path, f"not a readable step_model.json ({type(exc).__name__}: {exc})") from None
        measured: MeasuredModels = {}
        if source.startswith("profile") and info.get("step_model"):  # a measured, matching profile
            measured = measured_models(CalibratedFit.from_dict(info["step_model"]), info["fingerprint"])
        if info.get("corrections"):  # resolved by the profile stage
            measured = with_corrections(measured, info["corrections"], info["model"])
        engine_kv: tuple[EngineKV, ...] = ()
        if source.startswith("profile") and info.get("kv_capacity_tokens"):  # what the profiled engine stated
            where = info.get("measured_profile") or info.get("stored_profile") or "the profile"
            fp = str(info.get("fingerprint_hash") or "")[:12]
            engine_kv = (
                from_fingerprint(
                    info["kv_capacity_tokens"], info["fingerprint"], f"profile {where} (fingerprint {fp})"
                ),
            )
        return cls(source, info, measured, engine_kv)


@dataclass(frozen=True)
class CapacityDecision:
    table: pa.Table
    report: CapacityReport
    summary: CapacitySummary


def plan_capacity(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    step_times: StepTimes = StepTimes(),
    executor: Executor | None = None,
    workload_id: str = "workload",
    progress: Callable[[str], None] | None = None,
    on_phase: Callable[[int, int, str], None] | None = None,
    provenance: Provenance | None = None,
    engine_presets: Mapping[str, EnginePreset] | None = None,
) -> CapacityDecision:
    """The capacity decision for `trace` at `params` over `candidates` (see `size_deployments`); `engine_presets`:
    the engine defaults the candidates were enumerated with, by GPU (the notes and the summary name them)."""
    candidates, kv_notes = apply_engine_kv(candidates, step_times.engine_kv, params.kv_budget)
    out = size_deployments(
        trace,
        candidates,
        model,
        params,
        executor,
        workload_id=workload_id,
        progress=progress,
        measured=step_times.measured,
        on_phase=on_phase,
    )
    say = progress or log.info
    notes, pools = _request_class_pools(trace, candidates, model, params, out, step_times, executor, say)
    calibrations = roofline_calibrations(set(out.table.column("gpu").to_pylist()))
    slots = int(candidates["max_loras"].max()) if "max_loras" in candidates.columns and len(candidates) else 0
    presets = [f"engine preset on {gpu}: {p.line()}" for gpu, p in (engine_presets or {}).items()]
    mixed = [
        *presets,
        *kv_notes,
        *mixed_traffic(trace, model.name, slots),
        reservation_note(trace, params.admission_policy),
    ]
    notes = (step_times_note(step_times, calibrations), *mixed, *notes)
    fields: dict[str, Any] = dict(out.summary) | ({"pools": pools} if pools is not None else {})
    fields["notes"] = [
        *out.summary["notes"],
        *mixed,
    ]  # the summary says them too, as the size stage and `llmcap size` write it
    fields["kv_budget"] = kv_budget_summary(candidates)
    if engine_presets:
        fields["engine_preset"] = {gpu: p.to_dict() for gpu, p in engine_presets.items()}
    fields |= {
        "step_model_source": step_times.source,
        "step_model_corrections": list(step_times.info.get("corrections") or []),
        "roofline_calibrations": calibrations,
        "pool_provenance": pool_provenance(step_times, out.summary["pool_plans"], calibrations),
    }
    summary = cast(CapacitySummary, fields)
    report = capacity_report(
        out, params.slo, notes=notes, provenance=provenance, sources=report_sources(step_times, summary, calibrations)
    )
    return CapacityDecision(out.table, report, summary)


def _request_class_pools(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    out: SizingOutcome,
    step_times: StepTimes,
    executor: Executor | None,
    say: Callable[[str], None],
) -> tuple[tuple[str, ...], RequestClassPools | None]:
    """(notes, summary) of the shared plan `out` against one plan per request class, where `params` asks for the split
    (`class_pools`); none asked: ((), None)."""
    if params.pools_split_isl is None and params.pools_split_cap is None:
        return (), None
    where = (
        f"ISL {params.pools_split_isl:,}"
        if params.pools_split_isl is not None
        else f"max_tokens {params.pools_split_cap:g}× the median OSL"
    )
    say(f"request-class pools: sizing each side of {where} separately")
    try:
        compared = class_pools(
            trace,
            candidates,
            model,
            params,
            out,
            params.pools_split_isl,
            executor,
            step_times.measured,
            params.pools_split_cap,
        )
    except LlmcapError as exc:  # a class no candidate can serve alone: the shared pool wins by default
        reason = f"request-class pools at {where}: split not possible — {exc}"
        return (reason,), {"cheaper": "shared", "reason": reason}
    return (f"request-class pools: {compared.summary()}",), _pools_summary(compared)


def _pools_summary(compared: PoolComparison) -> RequestClassPools:
    def sizes(pools) -> list[PoolSizes]:
        return [{"name": p.name, "rate_rps": p.rate_rps, "gpus": p.gpus, "usd_per_hour": p.usd_per_hour} for p in pools]

    return {
        "cheaper": compared.cheaper,
        "saving_usd_per_hour": compared.saving_usd_per_hour,
        "shared": sizes(compared.shared),
        "split": sizes(compared.split),
    }


def report_sources(
    step_times: StepTimes, summary: SizingSummary, calibrations: Mapping[str, Mapping[str, str]]
) -> Sources:
    """What timed the plan's steps and priced its GPUs, for the report's header and its warnings: the one place
    they are decided, so `llmcap size --out` and the size stage warn alike. `calibrations`: by GPU, as
    `roofline_calibrations` gives them (summary.json's `roofline_calibrations`)."""
    from llmcap.catalog import get_gpu

    configs = [q["configuration"] for q in summary["pool_plans"].values()]  # "GPU/weights/kv-dtype/tpNppNepN/..."
    gpus = {g.name: g for g in (get_gpu(key.split("/")[0]) for key in configs)}
    source, detail = _step_source(step_times, configs)
    return Sources(
        step_model=source,
        step_model_detail=detail,
        prices=tuple((g.name, g.usd_per_gpu_hour, g.sources.get("cost", "catalog")) for _, g in sorted(gpus.items())),
        calibrations=tuple(
            (gpu, c["file"], c["sha256"], _kept_defaults(c)) for gpu, c in sorted(calibrations.items()) if gpu in gpus
        ),
        uncalibrated=tuple(sorted(set(gpus) - set(calibrations))),
        pools=tuple(
            (pool, describe_provenance(row))
            for pool, row in pool_provenance(step_times, summary["pool_plans"], calibrations).items()
        ),
    )


ENVIRONMENT = ("engine", "engine_version", "engine_commit", "driver_version", "runtime_version", "model_revision")
_CONFIGURATION = re.compile(
    r"^(?P<gpu>[^/]+)/(?P<weights>[^/]+)/kv-(?P<kv_dtype>[^/]+)/tp(?P<tp>\d+)pp(?P<pp>\d+)ep(?P<ep>\d+)(/|$)"
)


def pool_provenance(
    step_times: StepTimes, pool_plans: Mapping[str, Mapping[str, Any]], calibrations: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """Per pool of the chosen plan, as text fields: its GPU, parallelism, weights and KV dtype, the step model that
    sized it (`profile-measured` with the profile's fingerprint hash where the measured profile is of this very
    configuration, else `roofline` with the GPU's calibration), the written-back corrections applied to it, and
    the serving environment (engine, its version and commit, driver, runtime, model revision): measured by the
    profile, or for a roofline pool the one params.yaml `profile` says the plan is for. Unknown: "unknown"."""
    from llmcap.perf.corrections import describe
    from llmcap.sizing.measured import config_key, fingerprint_key

    info = step_times.info
    fingerprint = info.get("fingerprint") or {}
    profiled = fingerprint_key(fingerprint) if step_times.source.startswith("profile") else None
    corrections = {config_key(e["configuration"]): e for e in info.get("corrections") or []}
    out: dict[str, dict[str, str]] = {}
    for pool, plan in pool_plans.items():
        row = {"configuration": str(plan["configuration"])}
        m = _CONFIGURATION.match(row["configuration"])
        key = None
        if m is not None:
            row |= {k: m.group(k) for k in ("gpu", "tp", "pp", "ep", "weights", "kv_dtype")}
            key = config_key(
                {
                    "gpu": m["gpu"],
                    "tp": m["tp"],
                    "pp": m["pp"],
                    "ep": m["ep"],
                    "weight_quant": m["weights"],
                    "kv_dtype": m["kv_dtype"],
                }
            )
        if key is not None and key == profiled:
            row |= {
                "step_model": "profile-measured",
                "profile_fingerprint_hash": str(info.get("fingerprint_hash") or "unknown"),
                "environment": "measured by the profile",
            }
        else:
            calibration = calibrations.get(row.get("gpu", ""))
            row |= {
                "step_model": "roofline",
                "roofline_calibration": f"{calibration['file']} sha256 {calibration['sha256'][:12]}"
                if calibration
                else "documented default efficiencies",
                "environment": "planned for (params.yaml profile), not measured",
            }
        if key in corrections:
            row["corrections"] = describe([corrections[key]])
        row |= {f: "unknown" if fingerprint.get(f) is None else str(fingerprint[f]) for f in ENVIRONMENT}
        out[pool] = row
    return out


def describe_provenance(row: Mapping[str, str]) -> str:
    """One line of a pool's provenance, for the report."""
    config = (
        f"{row['gpu']} TP{row['tp']} PP{row['pp']} EP{row['ep']}, weights {row['weights']}, KV {row['kv_dtype']}"
        if "gpu" in row
        else row["configuration"]
    )
    if row["step_model"] == "profile-measured":
        model = f"measured profile (fingerprint {row['profile_fingerprint_hash'][:12]})"
    else:
        model = f"roofline, not measured ({row['roofline_calibration']})"
    model += f", corrected {row['corrections']}" if row.get("corrections") else ""
    env = (
        f"{row['engine']} {row['engine_version']} (commit {row['engine_commit']}), driver {row['driver_version']}, runtime {row['runtime_version']}, "
        f"model revision {row['model_revision']}"
    )
    return f"{config} — step times: {model}; environment {row['environment']}: {env}"


def mixed_traffic(table: pa.Table, model: str, lora_slots: int = 0) -> list[str]:
    """What sizing one model's pools for the whole trace leaves out, when the trace mixes models or adapters (`lora_slots`:
    the adapters the candidates hold resident, 0 = none)."""
    mix = label_mix(table)
    shares = lambda name: ", ".join(f"{k} {v:.0%}" for k, v in mix[name].items())  # noqa: E731
    out = []
    if len(mix.get("model", {})) > 1:
        out.append(
            f"the trace mixes {len(mix['model'])} models ({shares('model')}); this plan is {model}'s pools for all of their "
            "traffic, but different models share no weights or KV: give llmcap size --model LABEL=MODEL for each "
            "label, a pool per model"
        )
    if len(mix.get("adapter", {})) > 1 and lora_slots:
        out.append(
            f"{len(mix['adapter'])} adapters ({shares('adapter')}) share {model}'s pools: {lora_slots} LoRA slots on every rank "
            f"(their memory taken from the KV cache) and at most {lora_slots} adapters per batch are planned; their prefix "
            "caches are kept apart"
        )
    elif len(mix.get("adapter", {})) > 1:
        out.append(
            f"{len(mix['adapter'])} adapters ({shares('adapter')}) share {model}'s pools: their slots' memory and the limit of "
            "max_loras adapters per batch are planned only with --max-loras (enumerate.memory.lora_slots); without it the pools "
            "are planned as if the base model served every request (their prefix caches are kept apart)"
        )
    if mix.get("feature"):
        out.append(
            f"request features ({shares('feature')}) are planned at {model}'s plain step times: structured output, logprobs, "
            "beam search, speculative decoding and multimodal encoders change a step's cost, which no step model here "
            "prices per feature; `llmcap trace clean --exclude feature=REGEX` leaves a feature out to size the rest apart"
        )
    return out


def reservation_note(trace: pa.Table, policy: str) -> str:
    """What the plan assumed each request's scheduler knew of its output: its max_tokens where the trace states
    one, else the output itself, which no engine knows in advance (only admission that reserves ahead cares)."""
    caps = trace.column("max_tokens")
    n, stated = len(caps), len(caps) - caps.null_count
    if not reserves_output(policy):
        return (
            f"output lengths: admission {policy} reserves nothing ahead; max_tokens ({stated:,} of {n:,} requests state one) "
            "only bounds max_model_len"
        )
    if stated == n:
        return f"output lengths: admission {policy} reserves each request's max_tokens (every request states one), not the output to come"
    real = "real output length, which no engine knows in advance (optimistic)"
    if stated == 0:
        return f"output lengths: the trace states no max_tokens, so admission {policy} was simulated reserving each request's {real}"
    return f"output lengths: admission {policy} reserves max_tokens for the {stated:,} of {n:,} requests stating one, and for the rest their {real}"


def _kept_defaults(calibration: Mapping[str, str]) -> str:
    """The knob groups a calibration leaves at the defaults (they predicted the GPU's independent timings worse); "" if none."""
    kept = calibration.get("not_applied", "none")
    return "" if kept == "none" else kept


def _step_source(step_times: StepTimes, configs: list[str]) -> tuple[str, str]:
    """(source, detail) of the plan's step times: measured only where the profile covers every pool's configuration."""
    from llmcap.sizing.measured import fingerprint_key

    info, source = step_times.info, step_times.source
    if not info:  # `llmcap size` without --profile / --step-model
        return source, "no measured profile given"
    if not source.startswith("profile"):
        stored = info.get("stored_profile")
        why = (
            "none stored"
            if info.get("stored_fingerprint_hash") is None
            else f"stale: {', '.join(info.get('stale_fields') or [])}"
        )
        return source, f"no matching measured profile ({f'{stored}: ' if stored else ''}{why})"
    key = fingerprint_key(info.get("fingerprint") or {})
    profiled = (
        "an unmatched configuration" if key is None else f"{key[0]}/{key[4]}/kv-{key[5]}/tp{key[1]}pp{key[2]}ep{key[3]}"
    )
    if key is not None and all(c.startswith(profiled + "/") for c in configs):
        return source, f"profiled {profiled}"
    return f"roofline for the chosen configuration (profile stage: {source})", f"the profile covers {profiled} only"


def roofline_calibrations(gpus: set[str]) -> dict[str, dict[str, str]]:
    """The shipped roofline calibrations (llmcap.perf.calibration) of these GPUs: file and sha256 by GPU."""
    from llmcap.perf.calibration import shipped_calibrations

    return {c.gpu: c.describe() for c in shipped_calibrations() if c.gpu in gpus}


def step_times_note(step_times: StepTimes, calibrations: dict[str, dict[str, str]]) -> str:
    """What times the candidates: the roofline (with the GPUs' fitted efficiencies where shipped), the
    calibrated profile where it matches, and the written-back corrections with their versions."""
    from llmcap.perf.corrections import describe
    from llmcap.sizing.measured import config_key, describe_key, fingerprint_key

    info, source = step_times.info, step_times.source
    corrected = {config_key(e["configuration"]) for e in info.get("corrections") or []}
    profiled = fingerprint_key(info["fingerprint"]) if source.startswith("profile") else None
    fitted = ", ".join(f"{g} ({c['file']}, sha256 {c['sha256'][:12]})" for g, c in calibrations.items()) or "none"
    uses = (
        f"roofline per candidate (efficiencies fitted to timed operations for: {fitted}; other GPUs: documented defaults)"
        + "".join(
            f", {'the calibrated profile' if k == profiled else 'the roofline'}{' corrected' if k in corrected else ''} for {describe_key(k)}"
            for k in step_times.measured
        )
    )
    return f"step times: {uses} (profile stage source: {source}; written-back corrections: {describe(info.get('corrections') or [])})"
