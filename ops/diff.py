"""`llmcap diff A B`: what changed in the decision between two plans, and which inputs explain it.

    python -m ops.diff A B [--project DIR] [--json]

A and B are each a commit (its dvc.lock; outputs read with DVC from the cache or the remote), an
MLflow replan run id (its dvc.lock and decision/ artifacts) or a plan directory (a checkout holding
dvc.lock and the outputs). Decision: chosen configuration, GPUs, instances, cost, headroom items, pools
and every candidate's max feasible rate (capacity table). Inputs: params per key (as DVC recorded
them per stage), dependencies whose content changed (code, data, uv.lock), stage commands, the trace
(raw file and canonical table), the step model (source, version, fingerprint fields) and each pool's
provenance (GPU, parallelism, formats, the step model that sized it, engine/driver/runtime versions and
model revision: summary.json's `pool_provenance`). Markdown, or JSON with --json.
"""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcap.perf.corrections import describe as describe_corrections
from ops.common import (
    CAPACITY_SUMMARY,
    STEP_MODEL,
    OpsError,
    input_changes,
    lock_outs,
    parse_lock,
    resolve_commit,
    run_main,
)
from ops.decision import step_model_version

CAPACITY_TABLE = "data/processed/capacity.parquet"
SCALARS = (
    "chosen",
    "mode",
    "pd_ratio",
    "target_rps",
    "max_rps_per_unit",
    "gpus_per_unit",
    "base_instances",
    "instances",
    "gpus",
    "usd_per_hour",
    "step_model_source",
    "candidates_feasible",
    "candidates_simulated",
)


@dataclass
class Side:
    spec: str
    kind: str
    commit: str | None = None
    run_id: str | None = None
    lock: dict = field(default_factory=dict)
    summary: dict | None = None
    step_model: dict | None = None
    capacity: list[dict] | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "commit": self.commit, "run_id": self.run_id, "notes": self.notes}


def _json(data: bytes | None) -> dict | None:
    return None if data is None else json.loads(data)


def _table(data: bytes | None) -> list[dict] | None:
    if data is None:
        return None
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data), columns=["candidate", "mode", "max_rps"]).to_pylist()


def _dvc_read(root: Path, commit: str, path: str, side: Side) -> bytes | None:
    import dvc.api

    try:
        return dvc.api.read(path, repo=str(root), rev=commit, mode="rb")
    except Exception as exc:  # noqa: BLE001 - not in the cache nor the remote, or not an output at that commit
        side.notes.append(
            f"{path}: not retrievable at {commit[:10]} ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        )
        return None


def load_side(root: Path, spec: str) -> Side:
    from ops.common import show

    directory = Path(spec)
    if directory.is_dir() and (directory / "dvc.lock").is_file():
        side = Side(spec, "directory")
        read = lambda rel: (directory / rel).read_bytes() if (directory / rel).is_file() else None  # noqa: E731
        side.lock = parse_lock(read("dvc.lock"))
        side.summary, side.step_model, side.capacity = (
            _json(read(CAPACITY_SUMMARY)),
            _json(read(STEP_MODEL)),
            _table(read(CAPACITY_TABLE)),
        )
        return side
    commit = resolve_commit(root, spec)
    if commit is not None:
        side = Side(spec, "commit", commit=commit)
        lock = show(root, commit, "dvc.lock")
        if lock is None:
            raise OpsError(f"{spec} ({commit[:10]}) has no dvc.lock: nothing was planned there")
        side.lock = parse_lock(lock)
        side.summary = _json(_dvc_read(root, commit, CAPACITY_SUMMARY, side))
        side.step_model = _json(_dvc_read(root, commit, STEP_MODEL, side))
        side.capacity = _table(_dvc_read(root, commit, CAPACITY_TABLE, side))
        return side
    return load_run(spec)


def load_run(run_id: str) -> Side:
    import mlflow

    try:
        run = mlflow.MlflowClient().get_run(run_id)
    except Exception:  # noqa: BLE001 - MLflow raises its own not-found error
        raise OpsError(f"{run_id!r}: not a plan directory (with dvc.lock), a commit or an MLflow run id") from None
    side = Side(run_id, "run", commit=run.data.tags.get("git.commit"), run_id=run_id)

    def artifact(path: str) -> bytes | None:
        try:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)
        except Exception:  # noqa: BLE001
            side.notes.append(f"run {run_id[:8]} has no artifact {path}")
            return None
        return Path(local).read_bytes()

    lock = artifact("dvc.lock")
    if lock is None:
        raise OpsError(f"MLflow run {run_id} has no dvc.lock artifact: not a replan run")
    side.lock = parse_lock(lock)
    side.summary, side.step_model = (
        _json(artifact("decision/summary.json")),
        _json(artifact("decision/step_model.json")),
    )
    side.notes.append("max feasible rates: the capacity table is not among a run's decision artifacts")
    return side


def decision_fields(summary: dict) -> dict[str, Any]:
    out = {k: summary.get(k) for k in SCALARS}
    for name, pool in (summary.get("pool_plans") or {}).items():  # per pool: its count and each risk's instances
        for key in ("per_instance_rps", "base_instances", "instances", "gpus"):
            out[f"pool.{name}.{key}"] = pool.get(key)
        for risk, item in (pool.get("headroom") or {}).items():
            out[f"pool.{name}.headroom.{risk}.instances"] = item.get("instances")
    pools = summary.get("pools")
    if pools:
        out["pools.cheaper"] = pools.get("cheaper")
        for kind in ("shared", "split"):
            for pool in pools.get(kind) or []:
                for key in ("gpus", "usd_per_hour", "rate_rps"):
                    out[f"pools.{kind}[{pool['name']}].{key}"] = pool.get(key)
    return out


def pool_provenance(summary: dict) -> dict[str, Any]:
    """Each pool's provenance field as `pool.field` (what sized the pool: GPU, formats, step model, versions)."""
    return {
        f"{pool}.{k}": v for pool, fields in (summary.get("pool_provenance") or {}).items() for k, v in fields.items()
    }


def _changed(a: dict, b: dict) -> list[dict]:
    return [{"field": k, "a": a.get(k), "b": b.get(k)} for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def diff(a: Side, b: Side) -> dict:
    """What changed between two decisions, and the inputs that explain it."""
    decision: dict[str, Any] = {"changed": [], "max_rps": []}
    if a.summary and b.summary:
        decision["changed"] = _changed(decision_fields(a.summary), decision_fields(b.summary))
    else:
        decision["note"] = "the capacity summary of one side is not available (see notes)"
    if a.capacity is not None and b.capacity is not None:
        ra = {(r["candidate"], r["mode"]): r["max_rps"] for r in a.capacity}
        rb = {(r["candidate"], r["mode"]): r["max_rps"] for r in b.capacity}
        decision["max_rps"] = [
            {"candidate": c, "mode": m, "a": ra.get((c, m)), "b": rb.get((c, m))}
            for c, m in dict.fromkeys([*ra, *rb])
            if ra.get((c, m)) != rb.get((c, m))
        ]
    changes = input_changes(a.lock, b.lock)
    by_kind: dict[str, list] = {"code": [], "data": [], "environment": []}
    for d in changes["deps"]:
        by_kind[d["kind"]].append(d)
    outs_a, outs_b = lock_outs(a.lock), lock_outs(b.lock)
    trace = {
        k: {"a": outs_a.get(p, {}).get("md5"), "b": outs_b.get(p, {}).get("md5")}
        for k, p in (("canonical", "data/interim/trace.parquet"),)
    }
    trace["file"] = {"a": _param(a.lock, "trace.file"), "b": _param(b.lock, "trace.file")}
    step: dict[str, Any] = {}
    if a.step_model and b.step_model:
        fa, fb = a.step_model.get("fingerprint") or {}, b.step_model.get("fingerprint") or {}
        step = {
            "source": {"a": a.step_model.get("source"), "b": b.step_model.get("source")},
            "version": {"a": step_model_version(a.step_model), "b": step_model_version(b.step_model)},
            "fingerprint": _changed(fa, fb),
            "corrections": {
                "a": describe_corrections(a.step_model.get("corrections") or []),
                "b": describe_corrections(b.step_model.get("corrections") or []),
            },
        }
    provenance = _changed(pool_provenance(a.summary), pool_provenance(b.summary)) if a.summary and b.summary else []
    inputs = {
        "params": changes["params"],
        **by_kind,
        "cmds": changes["cmds"],
        "trace": trace,
        "step_model": step,
        "provenance": provenance,
    }
    return {
        "a": a.describe(),
        "b": b.describe(),
        "decision": decision,
        "inputs": inputs,
        "explanation": explain(inputs),
    }


def _param(lock: dict, key: str) -> Any:
    from ops.common import lock_params

    for values in lock_params(lock).values():
        if key in values:
            return values[key]
    return None


def explain(inputs: dict) -> list[str]:
    """The inputs that differ, most specific first, as sentences."""
    out = [f"param `{p['key']}`: {p['a']!r} → {p['b']!r} (stages: {', '.join(p['stages'])})" for p in inputs["params"]]
    t = inputs["trace"]
    if t["file"]["a"] != t["file"]["b"]:
        out.append(f"trace file: {t['file']['a']} → {t['file']['b']}")
    elif t["canonical"]["a"] != t["canonical"]["b"]:
        out.append(f"canonical trace changed: md5 {t['canonical']['a']} → {t['canonical']['b']}")
    for kind in ("data", "code", "environment"):
        for d in inputs[kind]:
            out.append(f"{kind} `{d['path']}` changed (stages: {', '.join(d['stages'])})")
    for c in inputs["cmds"]:
        out.append(f"command of stage {c['stage']} changed")
    s = inputs["step_model"]
    if s and s["source"]["a"] != s["source"]["b"]:
        out.append(f"step model source: {s['source']['a']} → {s['source']['b']}")
    corrections = (s or {}).get("corrections")
    if corrections and corrections["a"] != corrections["b"]:
        out.append(f"step-time corrections written back: {corrections['a']} → {corrections['b']}")
    if s and s["version"]["a"] != s["version"]["b"]:
        out.append(f"step model version: {s['version']['a']} → {s['version']['b']}")
    out += [f"step-model fingerprint `{f['field']}`: {f['a']!r} → {f['b']!r}" for f in (s or {}).get("fingerprint", [])]
    out += [f"pool provenance `{p['field']}`: {p['a']!r} → {p['b']!r}" for p in inputs.get("provenance", [])]
    return out or ["no recorded input differs"]


def markdown(result: dict) -> str:
    a, b = result["a"], result["b"]
    label = lambda s: f"{s['spec']} ({s['kind']}{', ' + s['commit'][:10] if s['commit'] else ''})"  # noqa: E731
    lines = [f"# llmcap diff: A = {label(a)}, B = {label(b)}", "", "## Decision", ""]
    d = result["decision"]
    if d["changed"]:
        lines += ["| field | A | B |", "|---|---|---|"] + [
            f"| {c['field']} | {_fmt(c['a'])} | {_fmt(c['b'])} |" for c in d["changed"]
        ]
    else:
        lines.append(d.get("note", "unchanged"))
    if d["max_rps"]:
        lines += ["", "Max feasible rate (req/s per unit):", "", "| candidate | mode | A | B |", "|---|---|---|---|"]
        lines += [f"| {r['candidate']} | {r['mode']} | {_fmt(r['a'])} | {_fmt(r['b'])} |" for r in d["max_rps"]]
    lines += ["", "## Inputs that explain it", ""] + [f"- {e}" for e in result["explanation"]]
    notes = a["notes"] + b["notes"]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "—" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.diff", description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from stages.env import apply_defaults

    root = args.project.resolve()
    apply_defaults(root)
    result = diff(load_side(root, args.a), load_side(root, args.b))
    print(
        json.dumps(result, indent=1, default=str) if args.json else markdown(result), end="" if not args.json else "\n"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
