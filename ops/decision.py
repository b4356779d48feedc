"""What a plan's MLflow run records about its decision (the flow `replan` calls `record`).

Tags: `dvc.lock.sha256` (finds the commit that records the decision), `uv.lock.sha256`,
`params.sha256`, `trace.file` / `trace.sha256` (the raw trace planned for), `trace.canonical.md5`,
`step_model.source` / `.version` / `.fingerprint_hash` / `.corrections` and `step_model.fingerprint.<field>` (the
profile's target), `plan.<pool>.<field>` (what each pool of the chosen plan is and what sized it), and
`approval` (`none` until flows.promote records a decision). Artifacts under `decision/`: the capacity summary, the
step model and `outputs.json` (md5 of every output file, per file inside directory outputs — what
`reproduce` compares a re-run with).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from llmcap.perf.corrections import describe as describe_corrections
from ops.common import CAPACITY_SUMMARY, STEP_MODEL, dir_manifest, lock_outs, md5_file, parse_lock, sha256


def step_model_version(step_model: dict) -> str:
    """Content hash of the step-time model itself (source + fitted/roofline parameters + the corrections
    applied), 16 hex digits."""
    core = {"source": step_model.get("source"), "step_model": step_model.get("step_model")}
    if step_model.get("corrections"):  # (absent from plans made before corrections were written back: same hash)
        core["corrections"] = step_model["corrections"]
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _text(value: Any) -> str:
    """A tag's value: "unknown" for a value nobody stated (never the string "None")."""
    if value is None:
        return "unknown"
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def step_model_tags(step_model: dict) -> dict[str, str]:
    """The profile stage's step model: `step_model.fingerprint.*` is the profile's target (params.yaml `profile`),
    not necessarily a configuration of the chosen plan: `pool_tags` say what sized each pool."""
    tags = {
        "step_model.source": _text(step_model.get("source")),
        "step_model.version": step_model_version(step_model),
        "step_model.fingerprint_hash": _text(step_model.get("fingerprint_hash")),
        "step_model.corrections": describe_corrections(step_model.get("corrections") or []),
    }
    for key, value in sorted((step_model.get("fingerprint") or {}).items()):
        tags[f"step_model.fingerprint.{key}"] = _text(value)
    return tags


def pool_tags(summary: dict) -> dict[str, str]:
    """`plan.<pool>.<field>`: each pool's GPU, parallelism, weights, KV dtype, the step model that sized it and the
    environment (engine, driver, runtime versions) from the capacity summary's `pool_provenance`."""
    return {
        f"plan.{pool}.{field}": _text(value)
        for pool, row in (summary.get("pool_provenance") or {}).items()
        for field, value in row.items()
    }


def outputs_manifest(root: Path, lock: dict) -> dict[str, str]:
    """md5 of every file of every output in the lock, directory outputs file by file (`dir/file`)."""
    out = {}
    for path in lock_outs(lock):
        p = root / path
        if p.is_dir():
            out.update({f"{path}/{rel}": md5 for rel, md5 in dir_manifest(p).items()})
        elif p.is_file():
            out[path] = md5_file(p)
    return out


def record(root: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(tags, {artifact name: JSON content}) for the replan run of the plan now in the workspace."""
    lock_bytes = (root / "dvc.lock").read_bytes()
    lock = parse_lock(lock_bytes)
    params = yaml.safe_load((root / "params.yaml").read_text())
    trace_file = params["trace"]["file"]
    raw = root / "data" / "raw" / trace_file
    step_model = json.loads((root / STEP_MODEL).read_text())
    tags = {
        "dvc.lock.sha256": sha256(lock_bytes),
        "uv.lock.sha256": sha256((root / "uv.lock").read_bytes()),
        "params.sha256": sha256((root / "params.yaml").read_bytes()),
        "trace.file": trace_file,
        "trace.sha256": sha256(raw.read_bytes()) if raw.is_file() else "missing",
        "trace.canonical.md5": str(lock_outs(lock).get("data/interim/trace.parquet", {}).get("md5")),
        **step_model_tags(step_model),
        "approval": "none",
    }
    summary = json.loads((root / CAPACITY_SUMMARY).read_text())
    tags |= pool_tags(summary)
    artifacts = {
        "summary.json": summary,
        "step_model.json": step_model,
        "outputs.json": outputs_manifest(root, lock),
    }
    return tags, artifacts
