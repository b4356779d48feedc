"""Typed models of `params.yaml` (the knobs; `dvc.yaml` owns the paths).

Each stage reads only its own section. Unknown keys are errors, so a typo in params.yaml fails loudly
instead of silently falling back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmcap.candidates import EnumerationSpec, workload_context_lengths
from llmcap.errors import InputFileError, LlmcapError
from llmcap.sizing.params import SizeParams

TraceFormat = Literal["auto", "mooncake", "azure", "burstgpt", "lengths", "csv", "jsonl", "parquet"]
TimeUnit = Literal["auto", "s", "ms", "us", "ns", "datetime"]
CANONICAL_MAPPABLE = ("arrival", "isl", "osl", "hash_ids", "model", "adapter", "tenant", "session", "deadline_s", "request_id")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArrivalSpec(_Strict):
    """An arrival process: used for length-only traces and for what-if synthesis."""

    process: Literal["poisson", "gamma"] = "poisson"
    rate_rps: float = Field(1.0, gt=0, description="mean arrival rate, requests per second")
    cv: float = Field(1.0, gt=0, description="inter-arrival coefficient of variation (gamma only; 1 = Poisson)")
    diurnal_amplitude: float = Field(0.0, ge=0, lt=1, description="relative sinusoidal rate swing, 0 = flat")
    diurnal_period_s: float = Field(86_400.0, gt=0)
    seed: int = 0


class TraceParams(_Strict):
    """How to read the input trace."""

    file: str = Field(description="trace file, relative to the raw-data directory dvc.yaml passes in")
    format: TraceFormat = "auto"
    time_unit: TimeUnit = Field("auto", description="unit of the arrival column for generic formats")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="generic formats: canonical name (arrival, isl, osl, hash_ids, model, ...) -> source column",
    )
    block_size: int | None = Field(None, gt=0, description="prefix block size for hash_ids (Mooncake: 512)")
    generate_arrivals: bool = Field(
        False, description="generic files without a clock column: draw arrivals from `arrivals` (never done unasked)"
    )
    arrivals: ArrivalSpec = ArrivalSpec()

    @field_validator("columns")
    @classmethod
    def _known_targets(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(CANONICAL_MAPPABLE))
        if unknown:
            raise ValueError(f"unknown canonical column(s) {unknown}; expected a subset of {list(CANONICAL_MAPPABLE)}")
        return value


class ExcludeRule(_Strict):
    """Quarantine rows whose `field` matches `pattern` (a regular expression, full match) as test traffic."""

    field: Literal["model", "adapter", "tenant", "session"]
    pattern: str


class CleanParams(_Strict):
    max_context_tokens: int = Field(262_144, gt=0, description="ISL+OSL above this is quarantined")
    window_start_s: float | None = Field(None, description="keep arrivals at or after this (s from first request)")
    window_end_s: float | None = Field(None, description="keep arrivals before this (s from first request)")
    exclude: list[ExcludeRule] = Field(default_factory=list)
    duplicates: Literal["by_id", "identical", "keep"] = Field(
        "by_id",
        description="by_id: drop a row identical in every field to an earlier one, request id included (a file "
        "without ids has no duplicates: on a coarse clock, equal rows are distinct requests); identical: also "
        "without an id (strict); keep: drop nothing",
    )


class CharacteriseParams(_Strict):
    rps_windows_s: list[float] = Field(default_factory=lambda: [1.0, 60.0, 300.0])
    percentiles: list[float] = Field(default_factory=lambda: [50.0, 90.0, 99.0])
    lru_cache_blocks: list[int] = Field(default_factory=lambda: [4_096, 16_384, 65_536])
    length_bucket_base: float = Field(2.0, gt=1, description="joint ISL/OSL buckets are powers of this")


class EnumerateParams(EnumerationSpec):
    """Stage `enumerate`: the model to plan for plus the candidate grid (`llmcap.candidates.EnumerationSpec`)."""

    model: str = "Llama-3.1-70B"
    """Catalog model name (data/catalog/models/) or a path to a config.json or its directory."""
    max_context_len: int | Literal["model", "workload"] = Field(default="workload")  # type: ignore[assignment]
    """Longest ISL + OSL a deployment must accept: tokens, "model" (max_position_embeddings) or
    "workload" (the trace's longest ISL + longest OSL, from the characterise stage's summary)."""

    @field_validator("max_context_len")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be >= 1 token, 'model' or 'workload'")
        return value

    def grid(self, workload: Mapping[str, Any] | None = None) -> EnumerationSpec:
        """The plain EnumerationSpec, with max_context_len resolved against the workload summary."""
        data = self.model_dump(exclude={"model"})
        if self.max_context_len == "model":
            data["max_context_len"] = None
        elif self.max_context_len == "workload":
            if workload is None:
                raise LlmcapError("enumerate.max_context_len is 'workload' but no workload summary was given")
            data["max_context_len"] = workload_context_lengths(workload)["max"]
        return EnumerationSpec.model_validate(data)


class ProfileParams(_Strict):
    """Stage `profile`: the environment the plan targets (its fingerprint) and how to (re-)profile it.

    The model is `enumerate.model`. A stored profile is reused only when its fingerprint equals the
    one these knobs describe; otherwise it is stale and the stage re-profiles `endpoint` (if set) or
    falls back to the roofline model, loudly.
    """

    endpoint: str | None = Field(None, description="OpenAI-compatible base URL to profile, e.g. http://127.0.0.1:8000")
    served_model: str | None = Field(None, description="model name the endpoint serves (default: enumerate.model)")
    engine: str = "vllm"
    engine_version: str | None = None
    engine_commit: str | None = None
    driver_version: str | None = None
    runtime_version: str | None = None
    gpu: str = Field("H100-SXM-80GB", description="catalog GPU name or alias")
    interconnect: str | None = None
    model_revision: str | None = None
    weight_quant: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = Field(4, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    block_size: int | None = Field(16, ge=1)
    max_num_seqs: int | None = Field(256, ge=1)
    max_num_batched_tokens: int | None = Field(8192, ge=1)
    enable_chunked_prefill: bool | None = True
    enable_prefix_caching: bool | None = True
    scheduler: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    isl: list[int] = Field(default_factory=lambda: [128, 512, 2048, 8192], description="profiled prompt lengths")
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16], description="profiled concurrency levels")
    osl: int = Field(128, ge=2)
    repeats: int = Field(3, ge=1)


class Params(_Strict):
    """The whole of params.yaml."""

    seed: int = 0
    trace: TraceParams
    clean: CleanParams = CleanParams()
    characterise: CharacteriseParams = CharacteriseParams()
    enumerate: EnumerateParams = EnumerateParams()
    profile: ProfileParams = ProfileParams()
    size: SizeParams = SizeParams()


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml; a bad key or value is one clear error naming the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise InputFileError(path, "params file not found") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputFileError(path, f"not valid YAML: {exc}", line=None if line is None else line + 1) from None
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise InputFileError(path, err["msg"], field=field) from None
