"""Has the serving environment been upgraded since the plan? (the Prefect flow `watch` asks this)

An endpoint's environment is read from what it answers: `GET /version` (the engine version),
`GET /v1/models` (the served models), `GET /metrics` (vLLM's `vllm:cache_config_info` labels:
block size, prefix caching), plus a fingerprint file the operator provides for what no endpoint
says (driver, runtime, engine commit). The plan's environment is the fingerprint its step model was
built for (`data/processed/step_model.json`). A field observed with another value is an upgrade;
a field nobody observes is not compared (unknown is not a change).

The trace is watched too (`trace_changes`): a new file under the name params.yaml gives, or new bytes
under the old name, is a reason to re-plan like an upgrade.

`mark_stale` writes the observed values into params.yaml's `profile` section: the stored profile's
fingerprint no longer matches, so the `profile` stage re-profiles (with `profile.endpoint`) or falls
back to the roofline model, and DVC re-runs what depends on it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmcap.credentials import redact_url
from ops.common import CLEAN_REPORT, RAW_DIR, STEP_MODEL, OpsError

# Fingerprint fields an observation may carry, all of them params.yaml `profile.<field>` knobs.
WATCHED = (
    "engine_version",
    "engine_commit",
    "driver_version",
    "runtime_version",
    "interconnect",
    "model_revision",
    "block_size",
    "enable_prefix_caching",
)
_CACHE_INFO = "vllm:cache_config_info"


def observe_endpoint(base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """What one endpoint says about its environment; an unreachable endpoint is an error (a watch that
    cannot see must not report 'no upgrade')."""
    base = base_url.rstrip("/")
    out: dict[str, Any] = {}
    with httpx.Client(timeout=timeout_s) as client:
        try:
            version = client.get(f"{base}/version")
        except httpx.HTTPError as exc:
            raise OpsError(f"watch: {redact_url(base)}/version: {exc}") from None
        if version.status_code == 200:
            out["engine_version"] = str(version.json().get("version"))
        models = _get_json(client, f"{base}/v1/models")
        if models:
            out["served_models"] = sorted(str(m.get("id")) for m in models.get("data") or [])
        metrics = client.get(f"{base}/metrics")
        if metrics.status_code == 200:
            out.update(cache_config(metrics.text))
    return out


def _get_json(client: httpx.Client, url: str) -> dict | None:
    r = client.get(url)
    try:
        return r.json() if r.status_code == 200 else None
    except ValueError:
        return None


def cache_config(metrics_text: str) -> dict[str, Any]:
    """block_size and enable_prefix_caching from vLLM's `vllm:cache_config_info` gauge (Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == _CACHE_INFO:
            for sample in family.samples:
                labels = sample.labels
                out: dict[str, Any] = {}
                if labels.get("block_size", "").isdigit():
                    out["block_size"] = int(labels["block_size"])
                if labels.get("enable_prefix_caching") in ("True", "False", "true", "false"):
                    out["enable_prefix_caching"] = labels["enable_prefix_caching"].lower() == "true"
                return out
    return {}


def read_fingerprint_file(path: Path) -> dict[str, Any]:
    """The operator's fingerprint file: a JSON/YAML mapping of watched fields (others are an error)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OpsError(f"{path}: watch.fingerprint_file not found") from None
    except yaml.YAMLError as exc:
        raise OpsError(f"{path}: not JSON/YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise OpsError(f"{path}: expected a mapping of fingerprint fields, got {type(data).__name__}")
    unknown = sorted(set(data) - set(WATCHED))
    if unknown:
        raise OpsError(f"{path}: field {unknown[0]!r} is not a watched fingerprint field ({', '.join(WATCHED)})")
    return {k: None if v is None else v for k, v in data.items()}


def planned_fingerprint(root: Path) -> dict[str, Any]:
    """The environment the current plan was made for: the step model's target fingerprint."""
    path = root / STEP_MODEL
    if not path.is_file():
        raise OpsError(f"{path}: no plan yet (run `make plan` first); nothing to compare an upgrade with")
    return dict(json.loads(path.read_text(encoding="utf-8"))["fingerprint"])


def upgrade_changes(planned: dict[str, Any], observations: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every watched field some source observed with a value other than the plan's: [{field, planned, observed, source}].

    Two sources disagreeing on a field (two endpoints on different versions) is an error: which one
    would the plan be for?"""
    seen: dict[str, tuple[Any, str]] = {}
    for source, observed in observations.items():
        for field in WATCHED:
            if observed.get(field) is None:
                continue
            if field in seen and seen[field][0] != observed[field]:
                raise OpsError(
                    f"watch: {field} differs between {seen[field][1]} ({seen[field][0]!r}) and {source} ({observed[field]!r})"
                )
            seen[field] = (observed[field], source)
    return [
        {"field": f, "planned": planned.get(f), "observed": v, "source": s}
        for f, (v, s) in seen.items()
        if planned.get(f) != v
    ]


def trace_changes(root: Path) -> list[dict[str, Any]]:
    """A new trace to plan for: the raw file params.yaml names now against the one the plan was cleaned from
    (its name and sha256 in the clean stage's report), as [{field, planned, observed, source}] like an upgrade's.
    A renamed file with the same bytes is no change; a plan cleaned before hashes were recorded compares names."""
    from llmcap.config import load_params

    report_path = root / CLEAN_REPORT
    if not report_path.is_file():
        raise OpsError(f"{report_path}: no plan yet (run `make plan` first); nothing to compare a trace with")
    planned = json.loads(report_path.read_text(encoding="utf-8"))
    name = load_params(root / "params.yaml").trace.file
    path = root / RAW_DIR / name
    if not path.is_file():
        raise OpsError(f"{path}: the trace params.yaml names (trace.file) is not there")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    was = planned.get("source_sha256")
    if (digest == was) if was else (Path(name).name == planned["source_file"]):
        return []
    show = lambda file, sha: f"{file} (sha256 {sha[:12]})" if sha else file  # noqa: E731
    return [
        {
            "field": "trace",
            "planned": show(planned["source_file"], was),
            "observed": show(name, digest),
            "source": RAW_DIR,
        }
    ]


def changes_key(changes: list[dict[str, Any]]) -> str:
    """A stable id of an upgrade (which fields to which values): a rejected upgrade is not asked about again."""
    core = sorted((c["field"], json.dumps(c["observed"])) for c in changes)
    return hashlib.sha256(json.dumps(core).encode()).hexdigest()[:16]


def describe(changes: list[dict[str, Any]]) -> str:
    return "; ".join(f"{c['field']} {c['planned']!r} -> {c['observed']!r} ({c['source']})" for c in changes)


def mark_stale(params_path: Path, changes: list[dict[str, Any]]) -> None:
    """Set `profile.<field>` to the observed values in params.yaml, keeping its comments and layout."""
    lines = params_path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "profile:"), None)
    if start is None:
        raise OpsError(f"{params_path}: no top-level `profile:` section to record the upgrade in")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"\S", lines[i])), len(lines))
    for c in changes:
        pattern = re.compile(rf"^(\s+{re.escape(c['field'])}:)[ \t]*([^#\n]*?)([ \t]+#.*)?(\r?\n)?$")
        value = yaml.safe_dump(c["observed"], default_flow_style=True).removesuffix("\n...\n").strip()
        for i in range(start + 1, end):
            m = pattern.match(lines[i])
            if m:
                lines[i] = f"{m.group(1)} {value}{m.group(3) or ''}{m.group(4) or ''}"
                break
        else:  # not written yet: add it as the section's first key
            indent = re.match(
                r"\s*",
                next((ln for ln in lines[start + 1 : end] if ln.strip() and not ln.lstrip().startswith("#")), "  x"),
            ).group(0)
            lines.insert(start + 1, f"{indent}{c['field']}: {value}\n")
            end += 1
    params_path.write_text("".join(lines), encoding="utf-8")
