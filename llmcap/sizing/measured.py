"""Measured step models: a profile's calibrated fit, keyed by the configuration it was measured on.

A candidate whose (GPU, TP, PP, EP, weight quant, KV dtype) equals the profile's fingerprint is timed by
the fit instead of the roofline. The pipeline (stage `size`, from the profile stage's step_model.json) and
the command line (`llmcap size|simulate --profile DIR`, from `llmcap profile`'s directory) both key it
here, so they give the same answer for the same profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcap.catalog import get_gpu
from llmcap.errors import InputFileError, LlmcapError
from llmcap.perf import CalibratedFit, build_step_model, read_profile
from llmcap.perf.corrections import StepCorrection, apply_corrections
from llmcap.perf.model import StepTimeModel

if TYPE_CHECKING:  # pandas costs a second to import; `simulate --profile` needs none of it
    import pandas as pd

ConfigKey = tuple[str, int, int, int, str, str]
MeasuredModels = Mapping[ConfigKey, StepTimeModel]
"""Calibrated step models by (GPU name, tp, pp, ep, weight quant, KV dtype): a measured profile whose
fingerprint matches a candidate replaces the roofline for that candidate."""

KEY_FIELDS = ("device_sku", "tp", "pp", "ep", "quantization", "kv_dtype")  # the fingerprint's names
ROW_COLUMNS = ("gpu", "tp", "pp", "ep", "weight_quant", "kv_dtype")  # the candidate table's
OPTIONS = {
    "gpu": "--gpu",
    "tp": "--tp",
    "weight_quant": "--weight-quant",
    "kv_dtype": "--kv-dtype",
}  # to narrow a search


def config_key(row: Mapping[str, Any]) -> ConfigKey:
    """A candidate row's key."""
    return (
        str(row["gpu"]),
        int(row["tp"]),
        int(row["pp"]),
        int(row["ep"]),
        str(row["weight_quant"]),
        str(row["kv_dtype"]),
    )


def stated(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate-row values a fingerprint states (row column → value; unstated fields left out), the
    device named as the catalog names it (`llmcap profile --device h100` → H100-SXM-80GB)."""
    out = {}
    for column, name in zip(ROW_COLUMNS, KEY_FIELDS, strict=True):
        value = fingerprint.get(name)
        if value is not None:
            out[column] = _catalog_gpu(str(value)) if column == "gpu" else value
    return out


def fingerprint_key(fingerprint: Mapping[str, Any]) -> ConfigKey | None:
    """The key a fingerprint was measured on; None when it leaves a field of the key unstated (no candidate matches it)."""
    values = stated(fingerprint)
    return config_key(values) if len(values) == len(ROW_COLUMNS) else None


def _catalog_gpu(sku: str) -> str:
    return get_gpu(sku).name if _in_catalog(sku) else sku  # not a catalog GPU (e.g. cpu:...): no candidate has it


def describe_key(key: ConfigKey) -> str:
    gpu, tp, pp, ep, quant, kv = key
    return f"{gpu} TP{tp} PP{pp} EP{ep}, weights {quant}, KV {kv}"


def measured_models(fit: CalibratedFit, fingerprint: Mapping[str, Any]) -> MeasuredModels:
    """{key: the fit's step model}, or {} when the fingerprint cannot be matched to a candidate."""
    key = fingerprint_key(fingerprint)
    return {} if key is None else {key: fit.model}


def with_corrections(measured: MeasuredModels, applied: list[Mapping[str, Any]], model: str | Path) -> MeasuredModels:
    """`measured` with the written-back corrections (`llmcap.perf.corrections`; the profile stage's
    step_model.json `corrections` entries: configuration + cumulative corrections) applied to their
    configuration's step model — the measured one, else the roofline of that configuration."""
    out = dict(measured)
    for entry in applied:
        key = config_key(entry["configuration"])
        base = out.get(key) or build_step_model(
            model, key[0], tp=key[1], pp=key[2], ep=key[3], weight_quant=key[4], kv_dtype=key[5]
        )
        out[key] = apply_corrections(base, [StepCorrection.model_validate(c) for c in entry["corrections"]])
    return out


@dataclass(frozen=True)
class MeasuredProfile:
    """A profile directory written by `llmcap profile`, as the command line uses it."""

    directory: Path
    fit: CalibratedFit
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    kv_capacity_tokens: int | None = None  # the KV capacity the profiled engine stated (manifest; None: not known)

    def describe(self) -> str:
        said = stated(self.fingerprint)
        where = ", ".join(f"{c} {said[c]}" if c in said else f"{c} unstated" for c in ROW_COLUMNS)
        engine = " ".join(str(v) for v in (self.fingerprint.get("engine"), self.fingerprint.get("engine_version")) if v)
        return f"profile {self.directory} ({engine}: {where}; fingerprint {self.fingerprint_hash[:12]})"

    def models_for(self, rows: pd.DataFrame) -> MeasuredModels:
        """The fit for every row of `rows` (candidates) that the fingerprint matches. A field the profile
        leaves unstated matches only where the rows hold one value for it: a fit measured with unknown
        weights must not time both the bf16 and the fp8 candidates."""
        said = stated(self.fingerprint)
        for column in ROW_COLUMNS:
            values = sorted(map(str, rows[column].unique()))
            if column not in said and len(values) > 1:
                raise LlmcapError(
                    f"{self.describe()} does not state its {column}; this search considers {', '.join(values)}: "
                    f"give {OPTIONS.get(column, column)} to say which the profile measured"
                )
        match = rows
        for column, value in said.items():
            match = match[match[column].astype(str) == str(value)]
        if match.empty:
            raise LlmcapError(
                f"{self.describe()} matches no feasible candidate of this search: include its configuration "
                "(--gpu, --tp, --weight-quant, --kv-dtype) or leave --profile out"
            )
        return {config_key(r): self.fit.model for r in match.to_dict("records")}

    def check_matches(self, requested: Mapping[str, Any]) -> None:
        """One clear error when a field the profile states differs from `requested` (row column → value). A
        device outside the catalog (a CPU engine) is not compared: the GPU then only sets the KV memory plan."""
        said = stated(self.fingerprint)
        off = [
            f"{OPTIONS.get(c, c)} {requested[c]} (profile: {said[c]})"
            for c in requested
            if c in said and str(said[c]) != str(requested[c]) and not (c == "gpu" and not _in_catalog(str(said[c])))
        ]
        if off:
            raise LlmcapError(
                f"{self.describe()} was measured on another configuration than asked for: {'; '.join(off)}"
            )


def _in_catalog(sku: str) -> bool:
    try:
        get_gpu(sku)
    except LlmcapError:
        return False
    return True


def load_profile(directory: Path) -> MeasuredProfile:
    """`directory`'s fit and fingerprint; one clear error when it is not a profile or holds no fit."""
    prof = read_profile(directory)
    if prof.fit is None:
        raise InputFileError(
            directory / "fit.json", "this profile holds no step-model fit (re-run `llmcap profile`, which writes one)"
        )
    cap = prof.manifest.get("kv_capacity_tokens")
    return MeasuredProfile(
        directory,
        prof.fit,
        prof.fingerprint.model_dump(mode="json"),
        prof.fingerprint_hash,
        None if cap is None else int(cap),
    )
