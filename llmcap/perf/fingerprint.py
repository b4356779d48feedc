"""The environment fingerprint a measured profile is keyed by.

A profile is only valid for the exact environment it was measured in: an engine upgrade, a new
driver, another quantization or scheduler knob changes step times. Every field that can change
them is here; `fingerprint_hash` is a stable sha256 of the canonical JSON (sorted keys, no
whitespace), so the same environment always hashes the same across processes and machines.
`is_stale(stored, current)` lists the fields that differ — an empty list means the stored
profile may be reused.

Unknown values are None (not "", not guessed): None == None is a match, None vs a value is a
difference, so a profile measured without knowing the driver is stale once the driver is known.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Scalar = str | int | float | bool | None


class EnvironmentFingerprint(BaseModel):
    """Everything a step time depends on besides the batch itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # engine
    engine: str = Field(description="engine name, e.g. vllm, sglang, trtllm")
    engine_version: str | None = Field(None, description="as the server reports it (GET /version)")
    engine_commit: str | None = None
    # driver / runtime
    driver_version: str | None = Field(None, description="GPU driver (CUDA/ROCm) or None on CPU")
    runtime_version: str | None = Field(None, description="e.g. torch 2.9.0+cpu, CUDA 12.8")
    # hardware
    device_sku: str | None = Field(None, description="catalog GPU name, or 'cpu:<model name>'")
    device_count: int = Field(1, ge=1, description="devices per engine instance")
    interconnect: str | None = Field(None, description="e.g. nvlink4, pcie5, none")
    # model
    model_id: str = Field(description="model name or path the server loaded")
    model_revision: str | None = Field(None, description="commit/hash of the weights or config")
    quantization: str | None = Field(None, description="weight format: bf16, fp8, int4-awq, ...")
    kv_dtype: str | None = None
    # parallelism
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    # KV cache and scheduler knobs
    block_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    scheduler: dict[str, Scalar] = Field(default_factory=dict, description="any other knob that changes step times")

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def tags(self, prefix: str = "fingerprint.") -> dict[str, str]:
        """Flat string tags (MLflow, report headers): every field, scheduler knobs as scheduler.<k>."""
        out = {f"{prefix}hash": fingerprint_hash(self)}
        for key, value in _flat(self).items():
            out[f"{prefix}{key}"] = "" if value is None else str(value)
        return out


def fingerprint_hash(fp: EnvironmentFingerprint) -> str:
    """sha256 hex of the canonical JSON: stable across runs, processes and field order."""
    return hashlib.sha256(fp.canonical_json().encode()).hexdigest()


@dataclass(frozen=True)
class FieldChange:
    field: str  # dotted for scheduler knobs: scheduler.<knob>
    stored: Any
    current: Any

    def __str__(self) -> str:
        return f"{self.field}: {self.stored!r} -> {self.current!r}"


def _flat(fp: EnvironmentFingerprint) -> dict[str, Scalar]:
    data = fp.model_dump(mode="json")
    knobs = data.pop("scheduler")
    return {**data, **{f"scheduler.{k}": v for k, v in knobs.items()}}


def is_stale(stored: EnvironmentFingerprint, current: EnvironmentFingerprint) -> list[FieldChange]:
    """The fields where `stored` differs from `current` (empty: the profile is still valid)."""
    a, b = _flat(stored), _flat(current)
    keys = list(a) + sorted(k for k in b if k not in a)  # declaration order, then new scheduler knobs
    return [FieldChange(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]
