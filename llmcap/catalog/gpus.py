"""GPU catalog: `llmcap/catalog/data/gpus.yaml` validated by pydantic, served as frozen dataclasses.

Units are explicit in the YAML (see its header). Inside llmcap everything is SI: bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmcap.errors import InputFileError, LlmcapError

MIB = 2**20
GIB = 2**30

# Dtypes a GPU may list peak throughput for.
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8", "int4")


CATALOG_ENV = "LLMCAP_CATALOG_DIR"


def default_catalog_dir() -> Path:
    """The catalog shipped inside the package (`llmcap/catalog/data`: gpus.yaml, models/), so an installed
    wheel has it too; `LLMCAP_CATALOG_DIR` points every command at another one (commands and stages that
    take a catalog path override both)."""
    override = os.environ.get(CATALOG_ENV)
    return Path(override) if override else Path(__file__).resolve().parent / "data"


def _norm(name: str) -> str:
    """Lookup key: case-insensitive, ignoring spaces, dashes, underscores and dots."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


# ---------------------------------------------------------------- YAML schema (the edge)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Memory(_Strict):
    hbm_mib_reported: int = Field(gt=0)
    hbm_gb_datasheet: float = Field(gt=0)
    bandwidth_gb_s: float = Field(gt=0)
    source: str = Field(min_length=1)
    note: str = ""


class _Compute(_Strict):
    dense_tflops: dict[str, float]
    source: str = Field(min_length=1)
    note: str = ""

    @field_validator("dense_tflops")
    @classmethod
    def _known_dtypes(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(COMPUTE_DTYPES))
        if unknown:
            raise ValueError(f"unknown dtype(s) {unknown}; allowed: {list(COMPUTE_DTYPES)}")
        if any(x <= 0 for x in v.values()):
            raise ValueError("peak TFLOPS must be > 0")
        return v


class _Interconnect(_Strict):
    scale_up: str | None
    scale_up_gb_s: float | None = Field(default=None, gt=0)
    gpus_per_node: int = Field(gt=0)
    nic_gbit_s: float = Field(gt=0)
    source: str = Field(min_length=1)
    note: str = ""


class _Cost(_Strict):
    usd_per_gpu_hour: float = Field(ge=0)
    source: str = Field(min_length=1)
    note: str = ""


class _GpuEntry(_Strict):
    name: str = Field(min_length=1)
    vendor: str
    aliases: list[str] = []
    memory: _Memory
    compute: _Compute
    interconnect: _Interconnect
    cost: _Cost


class _GpuFile(_Strict):
    gpus: list[_GpuEntry] = Field(min_length=1)


# ---------------------------------------------------------------- domain objects


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type, in SI units. `hbm_bytes` is the driver-reported total that gpu_memory_utilization scales."""

    name: str
    vendor: str
    hbm_bytes: int
    hbm_gb_datasheet: float
    hbm_bandwidth_bytes_s: float
    dense_flops: dict[str, float]  # dtype -> FLOP/s, dense
    scale_up: str | None
    scale_up_bytes_s: float | None  # aggregate bidirectional, as marketed
    gpus_per_node: int
    nic_bytes_s: float  # per GPU, one direction
    usd_per_gpu_hour: float
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for `dtype`; LlmcapError when the GPU has no tensor-core path for it."""
        try:
            return self.dense_flops[dtype]
        except KeyError:
            raise LlmcapError(
                f"GPU {self.name} lists no {dtype} throughput (has: {', '.join(sorted(self.dense_flops))})"
            ) from None


@dataclass(frozen=True)
class GpuCatalog:
    gpus: tuple[GpuSpec, ...]

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.gpus]

    def get(self, name: str) -> GpuSpec:
        """Case-insensitive lookup by name or alias ('h100', 'H100-SXM', 'h100_sxm5' all work)."""
        key = _norm(name)
        for gpu in self.gpus:
            if key == _norm(gpu.name) or key in {_norm(a) for a in gpu.aliases}:
                return gpu
        raise LlmcapError(f"unknown GPU '{name}'; known GPUs: {', '.join(self.names)}")


def _to_spec(e: _GpuEntry) -> GpuSpec:
    ic = e.interconnect
    return GpuSpec(
        name=e.name,
        vendor=e.vendor,
        hbm_bytes=e.memory.hbm_mib_reported * MIB,
        hbm_gb_datasheet=e.memory.hbm_gb_datasheet,
        hbm_bandwidth_bytes_s=e.memory.bandwidth_gb_s * 1e9,
        dense_flops={k: v * 1e12 for k, v in e.compute.dense_tflops.items()},
        scale_up=ic.scale_up,
        scale_up_bytes_s=None if ic.scale_up_gb_s is None else ic.scale_up_gb_s * 1e9,
        gpus_per_node=ic.gpus_per_node,
        nic_bytes_s=ic.nic_gbit_s * 1e9 / 8,
        usd_per_gpu_hour=e.cost.usd_per_gpu_hour,
        aliases=tuple(e.aliases),
        sources={
            "memory": e.memory.source,
            "compute": e.compute.source,
            "interconnect": ic.source,
            "cost": e.cost.source,
        },
    )


def load_gpu_catalog(path: str | Path | None = None) -> GpuCatalog:
    """Parse and validate a GPU catalog YAML (default: llmcap/catalog/data/gpus.yaml)."""
    p = Path(path) if path is not None else default_catalog_dir() / "gpus.yaml"
    return _load_cached(str(p.resolve()))


@lru_cache(maxsize=8)
def _load_cached(path: str) -> GpuCatalog:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(p, "GPU catalog file not found") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputFileError(p, f"not valid YAML: {getattr(exc, 'problem', exc)}", line=line) from None
    try:
        parsed = _GpuFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise InputFileError(p, err["msg"], field=loc) from None
    specs = tuple(_to_spec(e) for e in parsed.gpus)
    keys: dict[str, str] = {}
    for s in specs:
        for k in (s.name, *s.aliases):
            nk = _norm(k)
            if nk in keys and keys[nk] != s.name:
                raise InputFileError(p, f"name/alias '{k}' used by both {keys[nk]} and {s.name}", field="aliases")
            keys[nk] = s.name
    return GpuCatalog(specs)


def get_gpu(name: str, catalog_path: str | Path | None = None) -> GpuSpec:
    """Look up a GPU by name or alias in the default (or given) catalog."""
    return load_gpu_catalog(catalog_path).get(name)
