"""MLflow logging shared by every stage: params, metrics, artifacts and provenance tags.

Tags on every stage run:
- `git.commit`, `git.dirty`: the code the run came from (reproduce a decision from its commit;
  dirty = tracked files other than dvc.lock differ from the commit);
- `dvc.stage`, `dvc.stage_hash`: sha256 over what DVC decides on (the stage's cmd, the content of its
  deps and the values of its params) — equal hashes mean DVC would consider the stage unchanged;
- `input.sha256` per input file: content hash of the trace the numbers came from.
When the Prefect flow `replan` runs the pipeline it passes its MLflow run id in
`LLMCAP_MLFLOW_PARENT_RUN_ID`, and stage runs nest under it.

The experiment `llmcap` is created once with its artifacts beside a local (sqlite) store — `.work/mlartifacts`
under `make` — and tagged as a model-development experiment, so the MLflow 3 UI opens it in the runs view
(an untagged experiment is guessed to be GenAI from its contents).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stages import timing
from stages.provenance import git_state, path_sha256, stage_hash

EXPERIMENT = "llmcap"
PARENT_ENV = "LLMCAP_MLFLOW_PARENT_RUN_ID"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def artifact_location(tracking_uri: str) -> str | None:
    """`mlartifacts/` beside a sqlite store's file; None (the server's default) for any other store."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()


def use_experiment() -> str:
    """Select the experiment `llmcap` (created on first use, module docstring); returns its id."""
    import mlflow

    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        location = artifact_location(mlflow.get_tracking_uri())
        experiment_id = client.create_experiment(EXPERIMENT, artifact_location=location, tags=EXPERIMENT_KIND)
    else:
        experiment_id = exp.experiment_id
        for key, value in EXPERIMENT_KIND.items():
            if exp.tags.get(key) != value:  # a store made before the tag existed
                client.set_experiment_tag(experiment_id, key, value)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def decision_name(summary: dict[str, Any]) -> str:
    """A run name saying what was decided, e.g. "36 GPUs: 7xP TP4 H100 + 2xD TP4 H200" (P/D) or "8 GPUs: 4x TP2 H100";
    "NO PLAN PASSES (closest: …)" when no shape passed its scenarios."""
    role = {"prefill": "P", "decode": "D"}
    parts = []
    for pool, q in summary["pool_plans"].items():
        key = q["configuration"]  # "GPU/weights/kv-dtype/tpNppNepN/..."
        tp = re.search(r"/tp(\d+)", key)
        parts.append(
            f"{q['instances']}x{role.get(pool, '')} TP{tp.group(1) if tp else '?'} {key.split('/')[0].split('-')[0]}"
        )
    name = f"{summary['gpus']} GPUs: {' + '.join(parts)}"
    return f"NO PLAN PASSES (closest: {name})" if summary.get("verdict") == "fails" else name


def log_dataset(mlflow: Any, path: Path, sha256: str, name: str, context: str) -> None:
    """`path` as an MLflow dataset input of the active run (metadata only: the data stays in DVC), digest = its hash."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # MLflow registers its local-file source twice ("" and "file" schemes): same class
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        source = resolve_dataset_source(path.resolve().as_uri())
    dataset = MetaDataset(source, name=name, digest=sha256[:32])  # the store's digest column holds 36 characters
    mlflow.log_input(dataset, context=context, tags={"hash": sha256})


def flatten(prefix: str, obj: Any) -> dict[str, float]:
    """Numeric leaves of a nested dict as MLflow metric names (`isl.p99`, `rps_windows.60s.max`)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else str(k), v))
    elif isinstance(obj, bool) or isinstance(obj, (int, float)) and obj == obj:
        out[prefix] = float(obj)
    return out


@contextlib.contextmanager
def stage_run(root: Path, stage: str, params: dict, inputs: dict[str, Path]) -> Iterator[Any]:
    """An MLflow run for one stage execution, tagged with provenance; yields the mlflow module (opening and closing it: MLflow time)."""
    began = timing.now()
    import mlflow

    use_experiment()
    tags = {
        **git_state(root),
        "llmcap.kind": "stage",
        "dvc.stage": stage,
        "dvc.stage_hash": stage_hash(root, stage),
        **{f"input.{name}.sha256": path_sha256(p) for name, p in inputs.items()},
        **{f"input.{name}.path": str(p) for name, p in inputs.items()},
    }
    parent = os.environ.get(PARENT_ENV)
    with mlflow.start_run(run_name=stage, parent_run_id=parent or None, nested=bool(parent), tags=tags) as run:
        mlflow.log_params(
            {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in flatten_params(params).items()}
        )
        timing.add_since("mlflow", began)
        yield mlflow
        print(f"[{stage}] MLflow run {run.info.run_id} ({os.environ.get('MLFLOW_TRACKING_URI', 'default store')})")
        began = timing.now()
    timing.add_since("mlflow", began)  # the run's end


def flatten_params(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            out.update(flatten_params(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = obj
    return out
