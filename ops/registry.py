"""The MLflow model registry of corrected step models: one registered model per configuration
(`llmcap.perf.corrections.registered_model_name`), one version per written-back correction, each tagged
with its configuration (the fingerprint it times), the corrections, the reconciliation it came from, and
the plans that used it (`plan.<run id>` tags, set by the flow `replan`). The committed correction files
are the source a plan applies (they reproduce without this store); the registry links the runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmcap.perf.corrections import CorrectionHistory


def register(history: CorrectionHistory, version: int, files: list[Path], tags: dict[str, str]) -> tuple[str, str]:
    """Log `files` in an MLflow run and register them as a new version of the history's model, the
    alias(es) of the history pointing at it: (run id, registry version)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    v = history.versions[version - 1]
    name = history.registered_model
    config_tags = {f"configuration.{k}": str(val) for k, val in history.configuration.items()}
    with mlflow.start_run(
        run_name=f"correct: {name} v{version}", tags={"llmcap.kind": "correct", **tags, **config_tags}
    ) as run:
        for f in files:
            mlflow.log_artifact(str(f), artifact_path="step_model")
        mlflow.log_metrics({f"correction.{c.min_context}": c.factor for c in v.added})
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name,
            tags=config_tags,
            description=f"llmcap step-time corrections for {name.removeprefix('llmcap-step-model-')}",
        )
    version_tags = {
        **config_tags,
        **tags,
        "llmcap.version": str(version),
        "reconcile.sha256": v.reconcile_sha256,
        "measured_on": v.measured_on,
        "corrections": json.dumps([c.model_dump(mode="json") for c in v.corrections], sort_keys=True),
    }
    mv = client.create_model_version(
        name,
        source=f"{run.info.artifact_uri}/step_model",
        run_id=run.info.run_id,
        tags=version_tags,
        description="; ".join(c.reasoning for c in v.added),
    )
    for alias, number in history.aliases.items():
        if number == version:
            client.set_registered_model_alias(name, alias, mv.version)
    return run.info.run_id, str(mv.version)


def link_plan(applied: list[dict[str, Any]], plan_run_id: str, plan_name: str) -> list[str]:
    """Tag each applied version with the plan that used it; returns what could not be linked (a version
    registered in another MLflow store: the committed files still say what the plan applied)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client, missing = mlflow.MlflowClient(), []
    for entry in applied:
        name, number = entry["registered_model"], entry.get("mlflow_version")
        try:
            if number is None:
                raise MlflowException("no registry version recorded")
            client.set_model_version_tag(name, number, f"plan.{plan_run_id}", plan_name)
        except MlflowException:
            missing.append(f"{name} v{entry['version']}")
    return missing
