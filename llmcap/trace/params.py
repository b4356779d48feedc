"""The trace's knobs (params.yaml sections `trace`, `clean`, `characterise`): typed, strict, with the
trace package that reads them, so the bottom layer imports nothing above it. `llmcap.config` assembles
them with every other section's into `Params`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TraceFormat = Literal[
    "auto", "mooncake", "azure", "burstgpt", "lengths", "vllm-bench", "guidellm", "csv", "jsonl", "parquet"
]
TimeUnit = Literal["auto", "s", "ms", "us", "ns", "datetime"]
CANONICAL_MAPPABLE = (
    "arrival",
    "isl",
    "osl",
    "max_tokens",
    "priority",
    "hash_ids",
    "model",
    "adapter",
    "tenant",
    "session",
    "feature",
    "deadline_s",
    "request_id",
)


class StrictParams(BaseModel):
    """Base of every params section: `seed: true` or `tp: "4"` is a mistake to report, not to coerce; no .inf /
    .nan knob is meaningful; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(ge=1)]
Percentile = Annotated[float, Field(gt=0, lt=100)]  # 0 and 100 are min and max, reported anyway


class ArrivalSpec(StrictParams):
    """An arrival process: used for length-only traces and for what-if synthesis."""

    process: Literal["poisson", "gamma", "mmpp"] = "poisson"
    rate_rps: float = Field(1.0, gt=0, description="mean arrival rate, requests per second")
    cv: float = Field(1.0, gt=0, description="inter-arrival coefficient of variation (gamma only; 1 = Poisson)")
    burst_factor: float = Field(10_000.0, gt=1, description="mmpp: arrival rate in a burst ÷ the rate between bursts")
    burst_share: float = Field(0.04, gt=0, lt=1, description="mmpp: long-run share of time spent in bursts")
    burst_s: float = Field(3.0, gt=0, description="mmpp: mean burst length, seconds (exponential)")
    diurnal_amplitude: float = Field(0.0, ge=0, lt=1, description="relative sinusoidal rate swing, 0 = flat")
    diurnal_period_s: float = Field(86_400.0, gt=0)
    seed: int = Field(0, ge=0)


class TraceParams(StrictParams):
    """How to read the input trace."""

    file: str = Field(min_length=1, description="trace file, relative to the raw-data directory dvc.yaml passes in")
    format: TraceFormat = "auto"
    time_unit: TimeUnit = Field("auto", description="unit of the arrival column for generic formats")
    columns: dict[str, Annotated[str, Field(min_length=1)]] = Field(
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


class ExcludeRule(StrictParams):
    """Quarantine rows whose `field` matches `pattern` (a regular expression, full match) as test traffic."""

    field: Literal["model", "adapter", "tenant", "session", "feature"]
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value


ScopeLabel = Literal["model", "adapter", "tenant"]


class CleanParams(StrictParams):
    max_context_tokens: int = Field(262_144, gt=0, description="ISL+OSL above this is quarantined")
    window_start_s: float | None = Field(
        None, ge=0, description="keep arrivals at or after this (s from first request)"
    )
    window_end_s: float | None = Field(None, gt=0, description="keep arrivals before this (s from first request)")
    exclude: list[ExcludeRule] = Field(default_factory=list)
    duplicates: Literal["by_id", "identical", "keep"] = Field(
        "by_id",
        description="by_id: drop a row identical in every field to an earlier one, request id included (a file "
        "without ids has no duplicates: on a coarse clock, equal rows are distinct requests); identical: also "
        "without an id (strict); keep: drop nothing",
    )

    prefix_scope: list[ScopeLabel] = Field(
        default_factory=lambda: list[ScopeLabel](["model", "adapter"]),
        description="labels whose values never share prefix KV: equal hash blocks of different models or adapters (different "
        "weights) are distinct; add tenant where tenants are isolated; [] = the trace's hashes as given",
    )

    @model_validator(mode="after")
    def _window_not_empty(self) -> CleanParams:
        if (
            self.window_start_s is not None
            and self.window_end_s is not None
            and self.window_end_s <= self.window_start_s
        ):
            raise ValueError(
                f"window_end_s ({self.window_end_s:g}) must be after window_start_s ({self.window_start_s:g})"
            )
        return self


class CharacteriseParams(StrictParams):
    rps_windows_s: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [1.0, 60.0, 300.0], min_length=1)
    percentiles: list[Percentile] = Field(default_factory=lambda: [50.0, 90.0, 99.0], min_length=1)
    lru_cache_blocks: list[PositiveInt] = Field(default_factory=lambda: [4_096, 16_384, 65_536])
    length_bucket_base: float = Field(2.0, gt=1, description="joint ISL/OSL buckets are powers of this")
