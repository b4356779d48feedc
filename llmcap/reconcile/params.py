"""Knobs of reconciliation and metric diagnosis (pydantic, frozen, unknown keys rejected), ready to plug
into `llmcap.config.Params` as its `reconcile:` section."""

from __future__ import annotations

from itertools import pairwise

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    # strict: a YAML `true` is no 1 and "3" no 3; no knob means anything at .inf/.nan. Tuples from YAML lists.
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, strict=True, allow_inf_nan=False
    )


class DiagnoseParams(_Strict):
    """Thresholds of the metric-diagnosis rules (`llmcap.reconcile.diagnose`)."""

    window_s: float = Field(default=10.0, gt=0)
    """Width of the windows the series is cut into (seconds of its clock)."""
    min_windows: int = Field(default=2, ge=1)
    """Consecutive windows a reading must hold to be a finding (one window's blip is noise)."""
    waiting_min: float = Field(default=1.0, gt=0)
    """Mean requests waiting (all engines) from which a window counts as queueing."""
    kv_low: float = Field(default=0.7, gt=0, lt=1)
    """KV usage below this while requests wait: compute / queue bound."""
    kv_high: float = Field(default=0.9, gt=0, le=1)
    """KV usage at or above this while requests wait: memory / concurrency bound."""
    preemptions_per_s: float = Field(default=0.05, gt=0)
    """Preemption rate from which the operating point counts as too aggressive."""
    prefix_hit_drop: float = Field(default=0.2, gt=0, le=1)
    """Absolute drop of the prefix-cache hit rate (vs the baseline) that counts."""
    itl_rise: float = Field(default=0.25, gt=0)
    """Relative rise of the mean ITL (vs the baseline) that counts."""
    network_high: float = Field(default=0.8, gt=0, le=1)
    """KV-transfer link busy share from which the network counts as high."""

    @field_validator("kv_high")
    @classmethod
    def _above_low(cls, value: float, info) -> float:
        low = info.data.get("kv_low")
        if low is not None and value <= low:
            raise ValueError(f"must be above kv_low ({low})")
        return value


class ReconcileParams(_Strict):
    """Stage `reconcile` and `llmcap reconcile`: buckets, bootstrap and the decision rule."""

    isl_edges: tuple[int, ...] = Field(default=(0, 1024, 8192), strict=False, min_length=1)
    """Lower edges of the ISL ranges of the buckets (tokens, ascending, first 0; the last range is open)."""
    osl_edges: tuple[int, ...] = Field(default=(0,), strict=False, min_length=1)
    """Lower edges of the OSL ranges (same rules)."""
    percentiles: tuple[float, ...] = Field(default=(50.0, 90.0, 99.0), strict=False, min_length=1)
    """Percentiles at which e_TTFT and e_ITL are reported (the first one decides)."""
    tolerance: float = Field(default=0.10, gt=0, lt=1)
    """|e| up to this is within tolerance; correction factors that agree within it are one factor."""
    min_requests: int = Field(default=20, ge=2)
    """A bucket with fewer paired requests is reported as too small to judge."""
    bootstrap: int = Field(default=1000, ge=100)
    """Bootstrap resamples per bucket."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the intervals."""
    seed: int = Field(default=0, ge=0)
    diagnose: DiagnoseParams = DiagnoseParams()

    @field_validator("isl_edges", "osl_edges")
    @classmethod
    def _edges(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if value[0] != 0 or any(b <= a for a, b in pairwise(value)):
            raise ValueError(f"must start at 0 and ascend strictly (got {list(value)})")
        return value

    @field_validator("percentiles")
    @classmethod
    def _percentiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < p < 100 for p in value):
            raise ValueError(f"each must lie strictly between 0 and 100 (got {list(value)})")
        return value
