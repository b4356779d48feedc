"""Step-time corrections written back by reconciliation, versioned per configuration.

One file per configuration (GPU, TP, PP, EP, weight quant, KV dtype) — the fingerprint a step model is
measured and timed on — named after the registered step model it mirrors (`registered_model_name`). Each
version holds the *cumulative* corrections (a re-plan's replay is predicted with the previous version,
so what reconciliation finds then is relative to it: the new factors compound on the old), the ones it
added, and where they came from. Aliases (e.g. `champion`) name the version a plan uses; the profile
stage resolves them. The files are committed with the project (they are what makes a past plan
reproducible); the MLflow model registry holds the same versions with their runs and the plans that
used them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmcap.errors import InputFileError
from llmcap.perf.model import StepTimeModel
from llmcap.perf.scaled import ScaledStepModel

CONFIGURATION_FIELDS = ("gpu", "tp", "pp", "ep", "weight_quant", "kv_dtype")


class StepCorrection(BaseModel):
    """Step times × factor: every step (min_context 0) or steps whose prefill reaches past min_context tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    factor: float = Field(gt=0, allow_inf_nan=False)
    min_context: int = Field(default=0, ge=0)
    buckets: tuple[str, ...] = ()
    reasoning: str = ""


class CorrectionVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    corrections: tuple[StepCorrection, ...]  # cumulative: what a plan using this version applies
    added: tuple[StepCorrection, ...]  # what this version's reconciliation found
    reconcile_sha256: str
    measured_on: str  # "digital twin" or the endpoint reconciled against
    git_commit: str | None = None
    mlflow_run_id: str | None = None
    mlflow_version: str | None = None  # the registry's number (a fresh store numbers afresh)


class CorrectionHistory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    registered_model: str
    configuration: dict[str, Any]  # CONFIGURATION_FIELDS
    versions: list[CorrectionVersion] = []
    aliases: dict[str, int] = {}

    def resolve(self, alias: str) -> CorrectionVersion | None:
        """The version `alias` names, or None when the alias is not set."""
        number = self.aliases.get(alias)
        return None if number is None else self.versions[number - 1]

    def add(
        self, found: list[StepCorrection], reconcile_sha256: str, measured_on: str, alias: str, git_commit: str | None
    ) -> CorrectionVersion:
        """A new version: the alias's current corrections plus `found`; the alias then names it."""
        base = self.resolve(alias)
        version = CorrectionVersion(
            version=len(self.versions) + 1,
            corrections=(*(base.corrections if base else ()), *found),
            added=tuple(found),
            reconcile_sha256=reconcile_sha256,
            measured_on=measured_on,
            git_commit=git_commit,
        )
        self.versions.append(version)
        self.aliases[alias] = version.version
        return version

    def record_registry(self, version: int, run_id: str, registry_version: str) -> None:
        self.versions[version - 1] = self.versions[version - 1].model_copy(
            update={"mlflow_run_id": run_id, "mlflow_version": registry_version}
        )


def registered_model_name(configuration: dict[str, Any]) -> str:
    """`llmcap-step-model-H100-SXM-80GB-tp2pp1ep1-fp8-kv-fp8`: readable, one per configuration."""
    c = configuration
    name = f"llmcap-step-model-{c['gpu']}-tp{c['tp']}pp{c['pp']}ep{c['ep']}-{c['weight_quant']}-kv-{c['kv_dtype']}"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def history_for(directory: Path, configuration: dict[str, Any]) -> CorrectionHistory:
    """The configuration's history from `directory`, or an empty one."""
    name = registered_model_name(configuration)
    path = directory / f"{name}.json"
    if path.exists():
        return read_history(path)
    return CorrectionHistory(registered_model=name, configuration={f: configuration[f] for f in CONFIGURATION_FIELDS})


def read_history(path: Path) -> CorrectionHistory:
    try:
        return CorrectionHistory.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError) as exc:
        raise InputFileError(path, f"not a readable corrections file ({str(exc).splitlines()[0]})") from None


def read_histories(directory: Path) -> list[CorrectionHistory]:
    return [read_history(p) for p in sorted(directory.glob("*.json"))] if directory.is_dir() else []


def write_history(directory: Path, history: CorrectionHistory) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{history.registered_model}.json"
    path.write_text(json.dumps(history.model_dump(mode="json"), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def apply_corrections(
    model: StepTimeModel, corrections: tuple[StepCorrection, ...] | list[StepCorrection]
) -> StepTimeModel:
    """`model` with every correction applied, global ones first (a factor per ISL range acts on top)."""
    for c in sorted(corrections, key=lambda c: c.min_context):
        model = ScaledStepModel(model, c.factor, c.min_context)
    return model


def resolve_all(directory: Path | None, alias: str | None) -> list[dict[str, Any]]:
    """What a plan applies: for every configuration with corrections in `directory`, the version `alias`
    names (none when alias is None or names no version there), as step_model.json records it."""
    if alias is None or directory is None:
        return []
    out = []
    for history in read_histories(directory):
        v = history.resolve(alias)
        if v is not None:
            out.append(
                {
                    "registered_model": history.registered_model,
                    "alias": alias,
                    "version": v.version,
                    "mlflow_version": v.mlflow_version,
                    "configuration": history.configuration,
                    "measured_on": v.measured_on,
                    "corrections": [c.model_dump(mode="json") for c in v.corrections],
                }
            )
    return out


def describe_factors(corrections: list[dict[str, Any]]) -> str:
    """`x1.21, x2 past 8192`: the factors of corrections as dumped (`StepCorrection.model_dump`)."""
    return ", ".join(
        f"x{c['factor']:.3g}" + (f" past {c['min_context']}" if c["min_context"] else "") for c in corrections
    )


def describe(applied: list[dict[str, Any]]) -> str:
    """`llmcap-step-model-…@champion=v2 (x1.21)`, for logs and tags; "none" when nothing applies."""
    return (
        "; ".join(
            f"{e['registered_model']}@{e['alias']}=v{e['version']} ({describe_factors(e['corrections'])})"
            for e in applied
        )
        or "none"
    )
