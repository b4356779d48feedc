"""The chosen plan's replay unit: one aggregated instance, or one prefill and one decode instance, and the
max feasible rate the plan predicts for it.

The unit is described as `llmcap twin serve` options (`EngineOptions`), and its prediction is built from
those same options by the same function the twin uses (`llmcap.deployment.sim_config`), so the
twin and the prediction cannot drift apart. The engine knobs come from the candidate rows the size stage
sized: KV blocks as the plan's `deployment` record has them (else the row's `kv_tokens_per_instance`), `max_model_len`
from its `max_context_len`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pandas as pd
import pyarrow as pa

from llmcap.catalog import get_gpu, load_model
from llmcap.deployment import EngineOptions, decode_step_model, sim_config, step_model
from llmcap.errors import LlmcapError
from llmcap.first_token import first_token_from
from llmcap.perf.model import StepTimeModel
from llmcap.replaycheck.share import Share
from llmcap.sim import SimConfig
from llmcap.sizing.measured import ConfigKey, MeasuredModels
from llmcap.sizing.planned import PlannedDeployment, sized_blocks
from llmcap.sizing.units import candidate_key, candidate_row
from llmcap.trace.synth import mean_rate

_PD_KEY = re.compile(r"^P\[(?P<prefill>.+)\]\+D\[(?P<decode>.+)\]$")


@dataclass(frozen=True)
class PlanUnit:
    chosen: str  # the plan's chosen key (summary.json `chosen`)
    mode: str  # "aggregated" | "disaggregated"
    model: str  # catalog model name
    gpu: str  # the (prefill) instance's GPU
    options: EngineOptions
    rate_rps: float  # the plan's max feasible rate of this unit
    rate_basis: str  # where that rate comes from
    corrected: MeasuredModels = field(default_factory=dict)  # the plan's corrected step models by configuration
    planning_rps: float | None = None  # the plan's planning rate (None: the trace's own mean rate)
    deployment: PlannedDeployment | None = None  # the plan's deployment record, where summary.json has one
    pool_instances: int | None = None  # instances in the pool the unit's (prefill) instance comes from

    def share(self, trace: pa.Table) -> Share:
        """How the unit's requests are drawn from the trace: as the plan's router sends one instance of its pool,
        by simulating the recorded deployment; a round-robin split over planning rate / G instances where the
        record is missing or its steps cannot be rebuilt from it."""
        planning = self.planning_rps if self.planning_rps is not None else mean_rate(trace)
        pool = "instances" if self.mode == "aggregated" else "prefill"
        if self.deployment is not None and self.pool_instances:
            with contextlib.suppress(LlmcapError):  # a measured or corrected plan's steps are not in the record
                self.deployment.step_times()
                return Share(planning, float(self.pool_instances), self.deployment, pool)
        return Share(planning, planning / self.rate_rps)

    def configuration_keys(self) -> tuple[ConfigKey, ConfigKey]:
        """(prefill or only instance, decode instance) configuration keys."""
        o = self.options
        prefill = (get_gpu(self.gpu).name, o.tp, 1, 1, o.quant, o.kv_dtype)
        return prefill, (get_gpu(o.decode_gpu or self.gpu).name, o.decode_tp or o.tp, 1, 1, o.quant, o.kv_dtype)

    def simulation(self) -> tuple[SimConfig, StepTimeModel, StepTimeModel | None]:
        """The unit's simulator config, step model and (P/D on another GPU or TP) decode step model: the
        roofline the twin serves, or the plan's corrected model of that configuration."""
        cfg = sim_config(load_model(self.model), get_gpu(self.gpu), self.options)
        o = self.options
        prefill, decode = self.configuration_keys()
        step = self.corrected.get(prefill) or step_model(self.model, self.gpu, o.tp, o.quant, o.kv_dtype)
        decode_step = decode_step_model(self.model, self.gpu, o)
        if decode_step is not None and decode in self.corrected:
            decode_step = self.corrected[decode]
        return cfg, step, decode_step

    def twin_args(self) -> list[str]:
        """`llmcap twin serve` options serving exactly this unit."""
        args = ["--model", self.model, "--gpu", self.gpu]
        defaults = EngineOptions()
        for f in fields(EngineOptions):
            value = getattr(self.options, f.name)
            if value is None or value == getattr(defaults, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                args += [flag, str(value)]
        return args

    def describe(self) -> str:
        o = self.options
        if self.mode == "aggregated":
            return f"one instance of {self.chosen}"
        return f"one prefill ({self.gpu} TP{o.tp}) + one decode ({o.decode_gpu or self.gpu} TP{o.decode_tp or o.tp}) instance of {self.chosen}"


def _engine_knobs(row: Mapping[str, Any]) -> dict[str, Any]:
    if int(row["pp"]) != 1 or int(row["ep"]) != 1 or int(row["dp"]) != 1:
        raise LlmcapError(f"{candidate_key(row)}: the twin and the replay unit serve TP only (pp, ep and dp must be 1)")
    block = int(row["block_size"])
    return {
        "tp": int(row["tp"]),
        "max_num_seqs": int(row["max_num_seqs"]),
        "max_num_batched_tokens": int(row["max_num_batched_tokens"]),
        "num_blocks": int(row["kv_tokens_per_instance"]) // block,
    }


def unit_from_plan(
    summary: Mapping[str, Any],
    candidates: pd.DataFrame,
    model: str,
    pd_link_latency_s: float,
    ttft_includes_handoff: bool,
) -> PlanUnit:
    """The replay unit of the size stage's `summary` (summary.json) over its `candidates` table; P/D TTFT ends
    where the size stage's SLO says (`slo.ttft_includes_handoff`: the decode instance's first token).

    Aggregated: one instance, with the plan's per-instance rate. Disaggregated: one prefill and one decode
    instance (P/D 1:1), with the smaller of the two pools' per-instance rates — a 1:1 pair serves no more. The
    plan's planning rate and deployment record come along: the check draws the unit's traffic from them
    (`PlanUnit.share`)."""
    chosen, mode, pools = str(summary["chosen"]), str(summary["mode"]), summary["pool_plans"]
    unit = (
        _aggregated_unit(summary, candidates, chosen, model, pools)
        if mode == "aggregated"
        else _pd_unit(summary, candidates, chosen, model, pools, pd_link_latency_s, ttft_includes_handoff)
    )
    return replace(
        unit,
        planning_rps=None if summary.get("planning_rps") is None else float(summary["planning_rps"]),
        deployment=_deployment(summary),
        pool_instances=_instances(pools["instances" if mode == "aggregated" else "prefill"]),
    )


def _deployment(summary: Mapping[str, Any]) -> PlannedDeployment | None:
    """The plan's deployment record; None where there is none or it is not whole (the unit's traffic is then a
    round-robin share, which its runs say)."""
    with contextlib.suppress(LlmcapError):
        return PlannedDeployment.from_dict(summary["deployment"]) if "deployment" in summary else None
    return None


def _instances(pool: Mapping[str, Any]) -> int | None:
    return int(pool["instances"]) if "instances" in pool else None


def _pd_unit(
    summary: Mapping[str, Any],
    candidates: pd.DataFrame,
    chosen: str,
    model: str,
    pools: Mapping[str, Any],
    pd_link_latency_s: float,
    ttft_includes_handoff: bool,
) -> PlanUnit:
    mode = str(summary["mode"])
    match = _PD_KEY.match(chosen)
    if mode != "disaggregated" or match is None:
        raise LlmcapError(
            f"summary.json: chosen {chosen!r} in mode {mode!r} is neither an aggregated key nor P[...]+D[...]"
        )
    prefill, decode = (
        candidate_row(candidates, match["prefill"], ("prefill",)),
        candidate_row(candidates, match["decode"], ("decode",)),
    )
    options = _pd_options(summary, chosen, prefill, decode, pd_link_latency_s, ttft_includes_handoff)
    g_p, g_d = float(pools["prefill"]["per_instance_rps"]), float(pools["decode"]["per_instance_rps"])
    return PlanUnit(
        chosen,
        mode,
        model,
        str(prefill["gpu"]),
        options,
        min(g_p, g_d),
        f"min(prefill {g_p:.4g}, decode {g_d:.4g}) req/s per instance: the pools' max feasible rates",
    )


def _aggregated_unit(
    summary: Mapping[str, Any],
    candidates: pd.DataFrame,
    chosen: str,
    model: str,
    pools: Mapping[str, Any],
) -> PlanUnit:
    """One instance of the chosen candidate, with the KV blocks the plan sized, at the plan's per-instance rate."""
    row = candidate_row(candidates, chosen, ("both",))
    knobs = _engine_knobs(row)
    knobs["num_blocks"] = sized_blocks(summary)[0] or knobs["num_blocks"]
    options = EngineOptions(
        **knobs,
        quant=str(row["weight_quant"]),
        kv_dtype=str(row["kv_dtype"]),
        block_size=int(row["block_size"]),
        max_model_len=int(row["max_context_len"]),
    )
    (pool,) = pools.values()
    return PlanUnit(
        chosen,
        "aggregated",
        model,
        str(row["gpu"]),
        options,
        float(pool["per_instance_rps"]),
        "the plan's max feasible rate of one instance",
    )


def _pd_options(
    summary: Mapping[str, Any],
    chosen: str,
    prefill: Mapping[str, Any],
    decode: Mapping[str, Any],
    pd_link_latency_s: float,
    ttft_includes_handoff: bool,
) -> EngineOptions:
    """The `twin serve` options of one prefill and one decode instance of these candidate rows, linked as the
    size stage links them; the twin needs both in one weight format, KV dtype and block size."""
    if (prefill["weight_quant"], prefill["kv_dtype"], prefill["block_size"]) != (
        decode["weight_quant"],
        decode["kv_dtype"],
        decode["block_size"],
    ):
        raise LlmcapError(
            f"{chosen}: prefill and decode differ in weight format, KV dtype or block size; the twin needs them equal"
        )
    p, d = _engine_knobs(prefill), _engine_knobs(decode)
    front, back = sized_blocks(summary)
    p["num_blocks"], d["num_blocks"] = front or p["num_blocks"], back or d["num_blocks"]
    gpu = get_gpu(str(prefill["gpu"]))
    return EngineOptions(
        **p,
        pd="1:1",
        quant=str(prefill["weight_quant"]),
        kv_dtype=str(prefill["kv_dtype"]),
        block_size=int(prefill["block_size"]),
        max_model_len=int(prefill["max_context_len"]),
        # the size stage's link: the prefill instance's NICs, its latency
        link_gbps=gpu.nic_bytes_s * int(prefill["gpus_per_instance"]) / 1e9,
        link_latency_ms=pd_link_latency_s * 1e3,
        first_token_from=first_token_from(ttft_includes_handoff),
        decode_gpu=str(decode["gpu"]),
        decode_tp=d["tp"],
        decode_max_num_seqs=d["max_num_seqs"],
        decode_max_num_batched_tokens=d["max_num_batched_tokens"],
        decode_num_blocks=d["num_blocks"],
    )
