"""One source for every default (issue 37): a command's option that is also a params or simulator field
defaults to that field's default, read from the typer app itself, and P/D TTFT has one definition.

params.yaml may choose other values than the models' defaults; the commands and the models must agree.
Every option of the commands below is placed in one table: MATCHED (defaults to a model's field), DIFFERS
(a model has a field of that name and meaning but the command's default is its own, with the reason), or
OWN (no model field to agree with). A new option therefore fails `test_every_option_is_placed` until someone
says which it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from llmcap.candidates import EnumerationSpec, ParallelGrid
from llmcap.cli import load_command
from llmcap.config import ProfileParams, ReplayParams
from llmcap.deployment import EngineOptions
from llmcap.first_token import TTFT_INCLUDES_HANDOFF, first_token_from
from llmcap.live.profiler import ProfileSpec
from llmcap.memory import MemoryParams
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig
from llmcap.sizing.params import AutoscaleParams, ComputeParams, SizeParams, SloParams
from llmcap.twin import TwinSpec

Convert = Callable[[Any], Any]  # the model's default in the option's form (units, a comma list)
Spec = tuple[type, str] | tuple[type, str, Convert]


def _giga(v: float) -> float:
    return v / 1e9


def _milli(v: float) -> float:
    return v * 1e3


def _comma_list(v: list | tuple) -> str:
    return ",".join(f"{x:g}" for x in v)  # as one would type it: 0.5, 1, 4096


def _one_comma_list(v: list) -> list[str]:
    return [",".join(str(x) for x in v)]  # size's list options: one comma-separated value, repeatable


def model_default(owner: type, name: str) -> Any:
    """The default of field `name` of a pydantic model or a dataclass."""
    if issubclass(owner, BaseModel):
        return owner.model_fields[name].get_default(call_default_factory=True)
    (field,) = [f for f in dataclasses.fields(owner) if f.name == name]
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def expected(spec: Spec) -> Any:
    owner, name, *convert = spec
    value = model_default(owner, name)
    return convert[0](value) if convert else value


# the deployment's engine and pools (`llmcap.commands._deployment`): the simulator's own defaults, in the options' units
ENGINE: dict[str, Spec] = {
    "tp": (EngineOptions, "tp"),
    "quant": (EngineOptions, "quant"),
    "kv_dtype": (EngineOptions, "kv_dtype"),
    "replicas": (SimConfig, "replicas"),
    "router": (SimConfig, "router"),
    "admission_policy": (EngineConfig, "admission_policy"),
    "scheduling_policy": (EngineConfig, "scheduling_policy"),
    "first_token_from": (PDConfig, "first_token_from"),
    "link_gbps": (LinkConfig, "bandwidth_bytes_s", _giga),
    "link_latency_ms": (LinkConfig, "latency_s", _milli),
    "max_num_seqs": (EngineConfig, "max_num_seqs"),
    "max_num_batched_tokens": (EngineConfig, "max_num_batched_tokens"),
    "block_size": (EngineConfig, "block_size"),
    "prefix_caching": (EngineConfig, "enable_prefix_caching"),
    "host_blocks": (EngineConfig, "host_blocks"),
    "host_gbps": (EngineConfig, "host_bandwidth_bytes_s", _giga),
    "gpu_memory_utilization": (MemoryParams, "gpu_memory_utilization"),
}
ONE_INSTANCE = (
    "tp",
    "quant",
    "kv_dtype",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "gpu_memory_utilization",
)
TWIN: dict[str, Spec] = {
    name: (TwinSpec, name)
    for name in (
        "dilation",
        "slowdown",
        "error_rate",
        "crash_after",
        "stall_s",
        "stall_at",
        "long_prompt_slowdown",
        "long_prompt_tokens",
        "seed",
        "engine_version",
    )
} | {"max_in_flight": (TwinSpec, "slots")}

MATCHED: dict[str, dict[str, Spec]] = {
    "simulate": ENGINE
    | {
        "itl_stat": (SloParams, "itl_stat"),
        "resolution": (SimConfig, "timeseries_resolution_s"),
        "reference": (SimConfig, "reference"),
        "max_time": (
            SimConfig,
            "max_time_s",
            lambda v: None if v == math.inf else v,
        ),  # None: no limit (sim_config passes inf)
    },
    "size": {
        "itl_stat": (SloParams, "itl_stat"),
        "ttft_handoff": (SloParams, "ttft_includes_handoff"),
        "ttft_per_1k_isl": (SloParams, "ttft_ms_per_1k_isl"),
        "attainment": (SloParams, "attainment_target"),
        "slo_availability": (SloParams, "availability"),
        "max_loras": (MemoryParams, "lora_slots"),
        "max_lora_rank": (MemoryParams, "lora_rank"),
        "target_rps": (SizeParams, "target_rps"),
        "admission_policy": (SizeParams, "admission_policy"),
        "pools_split_isl": (SizeParams, "pools_split_isl"),
        "pools_split_cap": (SizeParams, "pools_split_cap"),
        "max_usd_per_hour": (SizeParams, "max_usd_per_hour"),
        "shortlist": (SizeParams, "shortlist"),
        "excerpt": (SizeParams, "excerpt_requests"),
        "pd": (SizeParams, "pd_prefill_shortlist", lambda n: n > 0),  # P/D is sized when prefill rows are shortlisted
        "workers": (ComputeParams, "workers"),
        "dask_address": (ComputeParams, "dask_address"),
        "tp": (ParallelGrid, "tp", _one_comma_list),
    },
    "replay": {
        "attainment": (SloParams, "attainment_target"),
        "max_lateness_ms": (ReplayParams, "max_lateness_ms"),
        "vocab_size": (ReplayParams, "vocab_size"),
    },
    "autoscale": {name: ENGINE[name] for name in ONE_INSTANCE}
    | {
        "attainment": (SloParams, "attainment_target"),
        "amplitude": (AutoscaleParams, "amplitude"),
        "t_ready": (AutoscaleParams, "t_ready_s"),
        "interval": (AutoscaleParams, "interval_s"),
        "min_residency": (AutoscaleParams, "min_residency_s"),
        "scale_down_window": (AutoscaleParams, "scale_down_window_s"),
        "waiting_target": (AutoscaleParams, "waiting_per_replica"),
        "utilization": (AutoscaleParams, "utilization"),
        "forecast_error": (AutoscaleParams, "forecast_error"),
        "forecast": (AutoscaleParams, "forecast"),
        "max_total_gpus": (AutoscaleParams, "max_total_gpus"),
    },
    "twin serve": {k: v for k, v in ENGINE.items() if k not in ("admission_policy", "scheduling_policy")} | TWIN,
    "profile": {
        "concurrency": (ProfileParams, "concurrency", _comma_list),
        "osl": (ProfileParams, "osl"),
        "repeats": (ProfileParams, "repeats"),
        "vocab_size": (ProfileSpec, "vocab_size"),
    },
    "rollout predict": {name: ENGINE[name] for name in ONE_INSTANCE},
}

_NO_TARGET = "no default target: None means the target is not set (the command asks for it, or judges no SLO)"
DIFFERS: dict[str, dict[str, tuple[Spec, str]]] = {
    "size": {
        "slo_ttft_p99": ((SloParams, "ttft_ms"), _NO_TARGET),
        "slo_itl_p99": ((SloParams, "itl_ms"), _NO_TARGET),
        "gpu": (
            (EnumerationSpec, "gpus", _one_comma_list),
            "the command compares H100 and H200 by default; the grid model's default is one GPU",
        ),
        "weight_quant": (
            (EnumerationSpec, "weight_quants", _one_comma_list),
            "the command compares bf16 and fp8 weights by default",
        ),
        "kv_dtype": (
            (EnumerationSpec, "kv_dtypes", _one_comma_list),
            "the command compares bf16 and fp8 KV by default",
        ),
    },
    "replay": {
        "slo_ttft_ms": ((SloParams, "ttft_ms"), _NO_TARGET),
        "slo_itl_ms": ((SloParams, "itl_ms"), _NO_TARGET),
        "timeout": (
            (ReplayParams, "timeout_s"),
            "the stage's is in simulated seconds (scaled by the twin's dilation); the command's in wall seconds, any engine",
        ),
        "max_drain": (
            (ReplayParams, "max_drain_s"),
            "the command cuts nothing by default (None: only --timeout bounds a stream)",
        ),
    },
    "autoscale": {
        "slo_itl_p99": ((SloParams, "itl_ms"), _NO_TARGET),
        "period": (
            (AutoscaleParams, "period_s"),
            "the what-if simulates a real day; the stage a 4-hour cycle (a short simulation)",
        ),
        "duration": ((AutoscaleParams, "duration_s"), "as --period"),
        "floor_fractions": (
            (AutoscaleParams, "floor_fractions", _comma_list),
            "the what-if also tries 0.75 of the floor",
        ),
    },
    "profile": {
        "isl": ((ProfileParams, "isl", _comma_list), "the command's quick grid leaves out 8192-token prompts"),
        "tp": (
            (ProfileParams, "tp"),
            "the stage's fields describe the environment it plans for (4 GPUs); the command, one server",
        ),
        "device": ((ProfileParams, "gpu"), "None: the fingerprint leaves the device unstated; the stage names its own"),
        "weight_quant": ((ProfileParams, "weight_quant"), "None: unstated in the fingerprint"),
        "kv_dtype": ((ProfileParams, "kv_dtype"), "None: unstated (read from /metrics if there)"),
        "max_num_batched_tokens": ((ProfileParams, "max_num_batched_tokens"), "None: the engine's chunk is unknown"),
    },
}

_TRACE_INPUT = {
    "trace",
    "fmt",
    "time_unit",
    "column",
    "hash_block_size",
    "generate_arrivals",
    "arrival_rate",
    "duplicates",
}
_OUTPUT = {"output_fmt", "json_out"}
OWN: dict[str, set[str]] = {
    "simulate": _TRACE_INPUT
    | _OUTPUT
    | {
        "model",
        "gpu",
        "engine_name",
        "plan",
        "scenario",
        "max_model_len",
        "pd",
        "request_rate",
        "rate_scale",
        "num_blocks",
        "profile",
        "seed",
        "out",
        "timeseries_out",
        "goodput",
        "tier",
    },
    "size": _TRACE_INPUT
    | _OUTPUT
    | {
        "model",
        "goodput",
        "slo_percentile",
        "engine",
        "profile",
        "step_model",
        "params_file",
        "candidates_file",
        "max_model_len",
        "out",
        "scope",
        "class_by",
        "kv_from_log",
        "tier",
    },  # scope None: CleanParams' own prefix_scope
    "replay": _TRACE_INPUT
    | {
        "endpoint",
        "model",
        "request_rate",
        "rate_scale",
        "max_concurrency",
        "max_requests",
        "max_failed",
        "block_tokens",
        "seed",
        "api",
        "processes",
        "out",
        "api_key_env",
        "json_out",
    },
    "autoscale": _OUTPUT
    | {
        "trace",
        "model",
        "gpu",
        "slo_ttft_p99",
        "instance_rps",
        "mean_rps",
        "kv_usage_target",
        "seed",
        "ready_phases",
    },  # NAME=S overrides over ReadyPhases' defaults ("" = them all)
    "twin serve": {
        "model",
        "gpu",
        "pd",
        "num_blocks",
        "max_model_len",
        "decode_gpu",
        "decode_tp",
        "decode_max_num_seqs",
        "decode_max_num_batched_tokens",
        "decode_num_blocks",
        "host",
        "port",
        "served_model_name",
    },
    "profile": {
        "endpoint",
        "model",
        "out",
        "max_failed",
        "json_out",
        "api_key_env",
        "serve_cmd",
        "ready_timeout",
        "cache_hit",
        "block_size",
    },
    "rollout predict": {
        "trace",
        "model",
        "gpu",
        "out",
        "request_rate",
        "steps",
        "profile",
        "client_latency_ms",
        "seed",
    },
}


TYPER_ADDS = {
    "install_completion",
    "show_completion",
}  # typer's own options on a single command (llmcap.cli.load_command)


def option_defaults(command: str) -> dict[str, Any]:
    """{parameter name: default} of `command` ("twin serve": a group's sub-command), as the typer app registers it."""
    name, _, sub = command.partition(" ")
    cmd = load_command(name)
    if sub:
        cmd = cmd.commands[sub]
    params = [p for p in cmd.params if p.name is not None and p.name not in TYPER_ADDS]
    return {p.name: list(p.default) if isinstance(p.default, tuple) else p.default for p in params}


@pytest.mark.parametrize("command", sorted(MATCHED))
def test_every_option_defaults_to_its_models_default(command: str) -> None:
    defaults = option_defaults(command)
    wrong = {
        name: (defaults[name], expected(spec))
        for name, spec in MATCHED[command].items()
        if defaults[name] != expected(spec)
    }
    assert wrong == {}, f"{command}: option default != model default: {wrong}"


@pytest.mark.parametrize("command", sorted(DIFFERS))
def test_the_options_that_differ_still_differ(command: str) -> None:
    # one made equal belongs in MATCHED, with its default taken from the model
    defaults = option_defaults(command)
    same = [name for name, (spec, _) in DIFFERS[command].items() if defaults[name] == expected(spec)]
    assert same == [], f"{command}: {same} now equal their model's default: move them to MATCHED"


@pytest.mark.parametrize("command", sorted(MATCHED))
def test_every_option_is_placed(command: str) -> None:
    tables = [set(MATCHED[command]), set(DIFFERS.get(command, {})), OWN[command]]
    params = set(option_defaults(command))
    assert set.union(*tables) == params, (
        f"{command}: unplaced {sorted(params - set.union(*tables))}, gone {sorted(set.union(*tables) - params)}"
    )
    assert sum(len(t) for t in tables) == len(set.union(*tables)), f"{command}: an option is in two tables"


def test_pd_ttft_has_one_definition_the_first_token_the_user_sees() -> None:
    assert TTFT_INCLUDES_HANDOFF is True  # after the P→D KV handoff: what the user sees
    assert (
        SloParams().ttft_includes_handoff is TTFT_INCLUDES_HANDOFF
        and SizeParams().slo.ttft_includes_handoff is TTFT_INCLUDES_HANDOFF
    )
    assert model_default(PDConfig, "first_token_from") == first_token_from(TTFT_INCLUDES_HANDOFF) == "decode"
    for command in ("simulate", "twin serve"):
        assert option_defaults(command)["first_token_from"] == "decode", command
    assert option_defaults("size")["ttft_handoff"] is True


def test_the_twin_serves_what_engine_options_leave_out() -> None:
    # a replay unit passes `twin serve` only the options that differ from EngineOptions' defaults (PlanUnit.twin_args)
    twin = option_defaults("twin serve")
    shared = [f.name for f in dataclasses.fields(EngineOptions) if f.name in twin]
    assert {"first_token_from", "link_gbps", "max_num_seqs", "decode_tp"} <= set(shared)
    assert {n: twin[n] for n in shared} == {n: model_default(EngineOptions, n) for n in shared}
