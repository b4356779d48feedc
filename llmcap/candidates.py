"""Step 2: enumerate deployment candidates and say which ones can even fit, and why not.

The grid is GPU type x weight format x KV dtype x (TP, PP, EP, DP) x serving mode x scheduler knobs.
Serving mode "aggregated" gives one row per configuration (role "both"); "disaggregated" gives rows for
the prefill role and for the decode role separately, each with its own scheduler knobs, so a later stage
can pair any feasible prefill row with any feasible decode row.

Every row is kept, feasible or not; an infeasible row carries every reason that applies (codes in
`reason_codes`, sentences in `reasons`). Row order is the nested order of the spec's lists, so the same
spec always gives the same table.

Given a context-length distribution (e.g. `workload_context_lengths` of the characterise stage's
summary), each row also says how many sequences of each length the instance holds at once
(`max_seqs_<label>` columns: KV-wise, capped by max_num_seqs x DP).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from llmcap.catalog.gpus import GIB, GpuCatalog, GpuSpec, load_gpu_catalog
from llmcap.catalog.models import ModelSpec
from llmcap.catalog.quant import kv_dtype_bytes, weight_format
from llmcap.engine_presets import EnginePreset
from llmcap.errors import LlmcapError
from llmcap.memory import MemoryParams, plan_memory
from llmcap.parallelism import Parallelism, parallelism_issues

Mode = Literal["aggregated", "disaggregated"]


class _Grid(BaseModel):
    # strict: a YAML `true` is no 1 and "4" no 4 (ints still pass for floats); no .inf/.nan knob means anything
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, strict=True, allow_inf_nan=False
    )


Positive = Annotated[int, Field(ge=1)]


class SchedulerGrid(_Grid):
    """Scheduler knobs for one role (vLLM names)."""

    max_num_seqs: list[Positive] = Field(default=[256], min_length=1)
    max_num_batched_tokens: list[Positive] = Field(default=[8192], min_length=1)
    block_sizes: list[Positive] = Field(default=[16], min_length=1)


class ParallelGrid(_Grid):
    tp: list[Positive] = Field(default=[1, 2, 4, 8], min_length=1)
    pp: list[Positive] = Field(default=[1], min_length=1)
    ep: list[Positive] = Field(default=[1], min_length=1)
    dp: list[Positive] = Field(default=[1], min_length=1)


class EnumerationSpec(_Grid):
    """The candidate grid (readable from params.yaml). Every list is enumerated in the order given."""

    gpus: list[str] = Field(default=["H100-SXM-80GB"], min_length=1)
    """Catalog GPU names or aliases (unknown ones fail in `enumerate_candidates`, and at params load)."""
    weight_quants: list[str] = Field(default=["bf16"], min_length=1)
    kv_dtypes: list[str] = Field(default=["bf16"], min_length=1)
    parallel: ParallelGrid = ParallelGrid()
    modes: list[Mode] = Field(default=["aggregated", "disaggregated"], min_length=1)
    aggregated: SchedulerGrid = SchedulerGrid()
    prefill: SchedulerGrid = SchedulerGrid(max_num_seqs=[32], max_num_batched_tokens=[16384])
    decode: SchedulerGrid = SchedulerGrid(max_num_seqs=[256], max_num_batched_tokens=[2048])
    max_context_len: int | None = Field(default=None, gt=0)
    """Longest ISL + OSL a request may have; None = the model's max_position_embeddings."""
    allow_multi_node: bool = False
    """Allow one instance (TP x PP x DP GPUs) to span more than one node."""
    memory: MemoryParams = MemoryParams()
    usd_per_gpu_hour: dict[str, Annotated[float, Field(ge=0)]] = {}
    """$/GPU-hour overrides by GPU name or alias; GPUs not listed use the catalog default."""


@dataclass(frozen=True)
class EnumerationResult:
    table: pd.DataFrame
    summary: dict[str, Any]


_COLUMNS: dict[str, str] = {
    "row": "int64",
    "mode": "string",
    "role": "string",
    "gpu": "string",
    "weight_quant": "string",
    "kv_dtype": "string",
    "tp": "int64",
    "pp": "int64",
    "ep": "int64",
    "dp": "int64",
    "gpus_per_instance": "int64",
    "nodes_per_instance": "int64",
    "max_num_seqs": "int64",
    "max_num_batched_tokens": "int64",
    "block_size": "int64",
    "max_context_len": "int64",
    "max_loras": "int64",
    "weights_bytes_per_rank": "Int64",
    "runtime_bytes_per_rank": "Int64",
    "kv_budget_bytes_per_rank": "Int64",
    "kv_bytes_per_token_per_rank": "Float64",
    "kv_tokens_per_rank": "Int64",
    "kv_tokens_per_instance": "Int64",
    "max_seqs_at_max_context": "Int64",
    "usd_per_instance_hour": "float64",
    "feasible": "bool",
    "reason_codes": "string",
    "reasons": "string",
}


def _unique(xs: list[Any]) -> list[Any]:
    return list(dict.fromkeys(xs))


def _roles(spec: EnumerationSpec) -> list[tuple[str, str, SchedulerGrid]]:
    out: list[tuple[str, str, SchedulerGrid]] = []
    for mode in _unique(spec.modes):
        if mode == "aggregated":
            out.append((mode, "both", spec.aggregated))
        else:
            out += [(mode, "prefill", spec.prefill), (mode, "decode", spec.decode)]
    return out


_LABEL = re.compile(r"^[a-z0-9_]+$")


def workload_context_lengths(workload: Mapping[str, Any]) -> dict[str, int]:
    """Context lengths (ISL + OSL, tokens) of a workload summary (`llmcap.trace.characterise`).

    `mean` is exact (E[ISL + OSL] = E[ISL] + E[OSL]); `pNN` adds the ISL and OSL percentiles of the same
    rank (exact when long prompts go with long answers); `max` is the longest ISL plus the longest OSL,
    an upper bound of the longest request. Rounded up to whole tokens.
    """
    try:
        isl, osl = workload["isl"], workload["osl"]
        keys = [k for k in isl if k == "mean" or re.fullmatch(r"p\d+(\.\d+)?", k)] + ["max"]
        out = {k.replace(".", "_"): math.ceil(float(isl[k]) + float(osl[k])) for k in keys}
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmcapError(f"workload summary has no usable ISL/OSL statistics ({exc!r})") from None
    return out


def enumerate_candidates(
    model: ModelSpec,
    spec: EnumerationSpec | None = None,
    context_lengths: Mapping[str, int] | None = None,
    gpu_catalog: GpuCatalog | None = None,
) -> EnumerationResult:
    """All candidates of `spec` for `model`, each feasible or not with explicit reasons, plus a summary.

    `context_lengths` (label -> ISL + OSL tokens) adds a `max_seqs_<label>` column per entry;
    `gpu_catalog` defaults to llmcap/catalog/data/gpus.yaml.
    """
    spec = spec or EnumerationSpec()
    contexts = dict(context_lengths or {})
    for label, n in contexts.items():
        if not _LABEL.match(label) or int(n) < 1:
            raise LlmcapError(f"context length {label!r}={n}: labels are [a-z0-9_]+ and lengths >= 1 token")
    catalog = gpu_catalog or load_gpu_catalog()
    gpus: list[GpuSpec] = [catalog.get(n) for n in _unique(spec.gpus)]
    prices = {catalog.get(k).name: v for k, v in spec.usd_per_gpu_hour.items()}
    for q in spec.weight_quants:
        weight_format(q)  # unknown names fail here, once, with one clear message
    for k in spec.kv_dtypes:
        kv_dtype_bytes(k)
    max_ctx = spec.max_context_len or model.max_position_embeddings
    if max_ctx is None:
        raise LlmcapError(f"{model.name} has no max_position_embeddings: set max_context_len in the spec")

    rows: list[dict[str, Any]] = []
    for mode, role, knobs in _roles(spec):
        for gpu in gpus:
            price = prices.get(gpu.name, gpu.usd_per_gpu_hour)
            for quant in _unique(spec.weight_quants):
                for kv in _unique(spec.kv_dtypes):
                    for tp in _unique(spec.parallel.tp):
                        for pp in _unique(spec.parallel.pp):
                            for ep in _unique(spec.parallel.ep):
                                for dp in _unique(spec.parallel.dp):
                                    par = Parallelism(tp=tp, pp=pp, ep=ep, dp=dp)
                                    for seqs in _unique(knobs.max_num_seqs):
                                        for batched in _unique(knobs.max_num_batched_tokens):
                                            for bs in _unique(knobs.block_sizes):
                                                rows.append(
                                                    _row(
                                                        model,
                                                        spec,
                                                        gpu,
                                                        price,
                                                        mode,
                                                        role,
                                                        quant,
                                                        kv,
                                                        par,
                                                        seqs,
                                                        batched,
                                                        bs,
                                                        max_ctx,
                                                        contexts,
                                                    )
                                                )
    for i, r in enumerate(rows):
        r["row"] = i
    columns = dict(_COLUMNS)
    at = list(columns).index("max_seqs_at_max_context") + 1
    names = list(columns)
    names[at:at] = [f"max_seqs_{label}" for label in contexts]
    columns = {n: columns.get(n, "Int64") for n in names}
    table = pd.DataFrame(rows, columns=names).astype(columns)
    summary = _summary(model, table)
    summary["max_context_len"] = max_ctx
    summary["context_lengths"] = {k: int(v) for k, v in contexts.items()}
    return EnumerationResult(table, summary)


def _row(
    model: ModelSpec,
    spec: EnumerationSpec,
    gpu: GpuSpec,
    price: float,
    mode: str,
    role: str,
    quant: str,
    kv: str,
    par: Parallelism,
    seqs: int,
    batched: int,
    bs: int,
    max_ctx: int,
    contexts: Mapping[str, int],
) -> dict[str, Any]:
    nodes = -(-par.gpus // gpu.gpus_per_node)
    reasons = _config_reasons(model, spec, gpu, par, nodes, seqs, batched, bs, max_ctx)
    row: dict[str, Any] = {
        "mode": mode,
        "role": role,
        "gpu": gpu.name,
        "weight_quant": weight_format(quant).name,
        "kv_dtype": kv,
        "tp": par.tp,
        "pp": par.pp,
        "ep": par.ep,
        "dp": par.dp,
        "gpus_per_instance": par.gpus,
        "nodes_per_instance": nodes,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "block_size": bs,
        "max_context_len": max_ctx,
        "max_loras": spec.memory.lora_slots,  # adapters resident (their slots are in the memory plan) and per batch
        "usd_per_instance_hour": price * par.gpus,
    }
    sharding_ok = not any(code in _SHARDING_CODES for code, _ in reasons) and bs >= 1 and batched >= 1 and seqs >= 1
    if sharding_ok:  # the memory plan needs a valid sharding and scheduler knobs
        columns, memory_reasons = _memory_fit(model, spec, gpu, par, quant, kv, seqs, batched, bs, max_ctx, contexts)
        row.update(columns)
        reasons += memory_reasons
    row["feasible"] = not reasons
    row["reason_codes"] = ",".join(_unique([c for c, _ in reasons]))
    row["reasons"] = "; ".join(m for _, m in reasons)
    return row


def _config_reasons(
    model: ModelSpec,
    spec: EnumerationSpec,
    gpu: GpuSpec,
    par: Parallelism,
    nodes: int,
    seqs: int,
    batched: int,
    bs: int,
    max_ctx: int,
) -> list[tuple[str, str]]:
    """Why the configuration itself cannot run, before any memory is counted: scheduler knobs, sharding, nodes,
    context length."""
    reasons: list[tuple[str, str]] = []
    if min(seqs, batched, bs) < 1:
        reasons.append(
            ("bad_scheduler_knobs", f"scheduler knobs must be >= 1 (seqs={seqs}, batched={batched}, block={bs})")
        )
    elif batched < seqs:
        reasons.append(("batched_tokens_below_num_seqs", f"max_num_batched_tokens={batched} < max_num_seqs={seqs}"))
    reasons += parallelism_issues(model, par)
    if nodes > 1 and not spec.allow_multi_node:
        reasons.append(
            ("instance_exceeds_node", f"{par.gpus} GPUs per instance > {gpu.gpus_per_node} per {gpu.name} node")
        )
    if model.max_position_embeddings is not None and max_ctx > model.max_position_embeddings:
        reasons.append(
            ("max_context_exceeds_model", f"max context {max_ctx} > model limit {model.max_position_embeddings}")
        )
    return reasons


def _memory_fit(
    model: ModelSpec,
    spec: EnumerationSpec,
    gpu: GpuSpec,
    par: Parallelism,
    quant: str,
    kv: str,
    seqs: int,
    batched: int,
    bs: int,
    max_ctx: int,
    contexts: Mapping[str, int],
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The memory plan's columns of a row (the `max_seqs_<label>` ones first), and why its memory does not fit."""
    params = spec.memory.model_copy(update={"max_num_seqs": seqs, "max_num_batched_tokens": batched})
    plan = plan_memory(model, gpu, par, quant, kv, bs, params)
    usable = int(gpu.hbm_bytes * params.gpu_memory_utilization)
    fit = plan.max_concurrent_sequences([max_ctx, *contexts.values()])
    fit_seqs = int(fit[0])
    columns: dict[str, Any] = {
        f"max_seqs_{label}": min(int(n_fit), seqs * par.dp) for label, n_fit in zip(contexts, fit[1:], strict=True)
    }
    columns.update(
        weights_bytes_per_rank=plan.weights_bytes_per_rank,
        runtime_bytes_per_rank=plan.breakdown.runtime_bytes,
        kv_budget_bytes_per_rank=plan.kv_budget_bytes_per_rank,
        kv_bytes_per_token_per_rank=plan.kv_bytes_per_token_per_rank,
        kv_tokens_per_rank=plan.kv_tokens_per_rank,
        kv_tokens_per_instance=plan.kv_tokens_per_instance,
        max_seqs_at_max_context=min(fit_seqs, seqs * par.dp),
    )
    reasons: list[tuple[str, str]] = []
    if plan.weights_bytes_per_rank > usable:
        reasons.append(
            (
                "weights_do_not_fit",
                f"weights {plan.weights_bytes_per_rank / GIB:.1f} GiB/rank > usable "
                f"{usable / GIB:.1f} GiB (HBM x {params.gpu_memory_utilization:g})",
            )
        )
    elif plan.kv_budget_bytes_per_rank <= 0:
        reasons.append(
            (
                "no_kv_budget",
                f"weights + runtime + margin leave no KV cache ({plan.kv_budget_bytes_per_rank / GIB:.2f} GiB/rank)",
            )
        )
    elif fit_seqs < 1:
        reasons.append(
            (
                "kv_below_one_max_context_request",
                f"KV holds {plan.kv_tokens_per_rank} tokens/rank < one max-context request ({max_ctx} tokens)",
            )
        )
    return columns, reasons


_SHARDING_CODES = {
    "bad_parallelism",
    "heads_not_divisible_by_tp",
    "kv_heads_incompatible_with_tp",
    "mlp_not_divisible_by_tp",
    "pp_exceeds_layers",
    "ep_without_moe",
    "ep_incompatible",
    "experts_not_divisible_by_ep",
}


def _summary(model: ModelSpec, t: pd.DataFrame) -> dict[str, Any]:
    by_reason: dict[str, int] = {}
    for codes in t.loc[~t["feasible"], "reason_codes"]:
        for c in str(codes).split(","):
            by_reason[c] = by_reason.get(c, 0) + 1
    feasible = t[t["feasible"]]
    best: dict[str, dict[str, Any]] = {}
    for (mode, role), g in feasible.groupby(["mode", "role"], sort=False):
        top = g.sort_values(["kv_tokens_per_instance", "row"], ascending=[False, True]).iloc[0]
        best[f"{mode}/{role}"] = {
            "row": int(top["row"]),
            "gpu": str(top["gpu"]),
            "parallelism": f"TP{top['tp']} PP{top['pp']} EP{top['ep']} DP{top['dp']}",
            "kv_tokens_per_instance": int(top["kv_tokens_per_instance"]),
        }
    return {
        "model": model.name,
        "rows": int(len(t)),
        "feasible": int(t["feasible"].sum()),
        "infeasible": int((~t["feasible"]).sum()),
        "infeasible_by_reason": dict(sorted(by_reason.items())),
        "most_kv_per_role": best,
    }


def enumerate_with_presets(
    model: ModelSpec,
    spec: EnumerationSpec,
    context_lengths: Mapping[str, int],
    presets: Mapping[str, EnginePreset],
    gpu_catalog: GpuCatalog | None = None,
) -> EnumerationResult:
    """The grid's candidates; with engine presets (by GPU name), each GPU's with that engine's own scheduler knobs
    in every role instead of the grid's (the summary names them)."""
    if not presets:
        return enumerate_candidates(model, spec, context_lengths, gpu_catalog)
    parts = []
    for name, p in presets.items():
        knobs = SchedulerGrid(
            max_num_seqs=[p.max_num_seqs], max_num_batched_tokens=[p.max_num_batched_tokens], block_sizes=[p.block_size]
        )
        one = spec.model_copy(update={"gpus": [name], "aggregated": knobs, "prefill": knobs, "decode": knobs})
        parts.append(enumerate_candidates(model, one, context_lengths, gpu_catalog))
    table = pd.concat([r.table for r in parts], ignore_index=True)
    table["row"] = range(len(table))  # one numbering across the GPUs
    summary = _summary(model, table) | {k: parts[0].summary[k] for k in ("max_context_len", "context_lengths")}
    return EnumerationResult(table, summary | {"engine_preset": {name: p.to_dict() for name, p in presets.items()}})
