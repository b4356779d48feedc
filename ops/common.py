"""Git, dvc.lock and hashing helpers shared by `ops` (no DVC or MLflow import here)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CAPACITY_SUMMARY = "data/reports/capacity/summary.json"  # dvc.yaml: the size stage's report dir
STEP_MODEL = "data/processed/step_model.json"
CLEAN_REPORT = "data/reports/clean/clean_report.json"  # dvc.yaml: the clean stage's report dir
RAW_DIR = "data/raw"  # dvc.yaml: the clean stage's --raw-dir


class OpsError(Exception):
    """A user error: printed as one line, exit code 2."""


def git(root: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise OpsError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def git_bytes(root: Path, *args: str) -> bytes | None:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def resolve_commit(root: Path, rev: str) -> str | None:
    """The full commit id of `rev` (a sha, branch, tag, HEAD~1 ...), or None when git does not know it."""
    return git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False) or None


def show(root: Path, commit: str, path: str) -> bytes | None:
    """A tracked file's content at `commit`, or None when the commit has no such file."""
    return git_bytes(root, "show", f"{commit}:{path}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def md5_file(path: Path) -> str:
    """DVC 3's `hash: md5` of a file: the plain md5 of its bytes."""
    digest = hashlib.md5()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dir_manifest(path: Path) -> dict[str, str]:
    """md5 of every file under a directory output, by posix path relative to it (DVC's `.dir` entries)."""
    return {f.relative_to(path).as_posix(): md5_file(f) for f in sorted(path.rglob("*")) if f.is_file()}


def dir_md5(manifest: dict[str, str]) -> str:
    """DVC's hash of a directory: md5 of its sorted JSON manifest, suffixed `.dir` (dvc_data Tree.digest)."""
    entries = [{"md5": md5, "relpath": rel} for rel, md5 in sorted(manifest.items())]
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def out_md5(path: Path) -> str | None:
    """The md5 DVC records for an output path (file or directory), None when it is missing."""
    if path.is_file():
        return md5_file(path)
    if path.is_dir():
        return dir_md5(dir_manifest(path))
    return None


def parse_lock(text: bytes | str) -> dict:
    lock = yaml.safe_load(text) or {}
    if not isinstance(lock, dict) or "stages" not in lock:
        raise OpsError("not a dvc.lock (no `stages`)")
    return lock


def lock_outs(lock: dict) -> dict[str, dict]:
    """Every output of a dvc.lock: path -> {stage, md5, ...} in stage order."""
    out = {}
    for stage, spec in lock["stages"].items():
        for entry in spec.get("outs", []):
            out[entry["path"]] = {**entry, "stage": stage}
    return out


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested params as dotted keys (`size.headroom.node_failures`); lists are leaves."""
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def lock_params(lock: dict) -> dict[str, dict[str, Any]]:
    """Param values DVC recorded per stage: stage -> {dotted key: value}."""
    out = {}
    for stage, spec in lock["stages"].items():
        values: dict[str, Any] = {}
        for file_params in (spec.get("params") or {}).values():
            values.update(flatten(file_params))
        out[stage] = values
    return out


def lock_deps(lock: dict) -> dict[str, dict[str, str]]:
    """Dependency hashes per stage: stage -> {path: md5}."""
    return {
        stage: {d["path"]: d.get("md5", "") for d in spec.get("deps", [])} for stage, spec in lock["stages"].items()
    }


def input_changes(a: dict, b: dict) -> dict[str, list[dict]]:
    """What DVC decides on that differs between two dvc.locks: commands, params (per key) and deps (per path).
    Deps that a stage of either lock produces (a file in an output directory too) are left out: they are
    consequences of the inputs listed, not inputs (a re-measured replay, the size stage's summary read by replay)."""
    pa, pb, da, db = lock_params(a), lock_params(b), lock_deps(a), lock_deps(b)
    produced = set(lock_outs(a)) | set(lock_outs(b))
    params: dict[str, dict] = {}
    deps: dict[str, dict] = {}
    cmds = []
    for stage in list(dict.fromkeys([*a["stages"], *b["stages"]])):
        sa, sb = a["stages"].get(stage, {}), b["stages"].get(stage, {})
        if sa.get("cmd") != sb.get("cmd"):
            cmds.append({"stage": stage, "a": sa.get("cmd"), "b": sb.get("cmd")})
        for key in sorted(set(pa.get(stage, {})) | set(pb.get(stage, {}))):
            va, vb = pa.get(stage, {}).get(key, "<absent>"), pb.get(stage, {}).get(key, "<absent>")
            if va != vb:
                params.setdefault(key, {"key": key, "a": va, "b": vb, "stages": []})["stages"].append(stage)
        for path in sorted(p for p in set(da.get(stage, {})) | set(db.get(stage, {})) if not _produced(p, produced)):
            ma, mb = da.get(stage, {}).get(path), db.get(stage, {}).get(path)
            if ma != mb:
                deps.setdefault(path, {"path": path, "kind": dep_kind(path), "a": ma, "b": mb, "stages": []})[
                    "stages"
                ].append(stage)
    return {"params": list(params.values()), "deps": list(deps.values()), "cmds": cmds}


def _produced(path: str, outs: set[str]) -> bool:
    return any(path == o or path.startswith(o.rstrip("/") + "/") for o in outs)


def dep_kind(path: str) -> str:
    if path == "uv.lock":
        return "environment"
    if path.startswith("data/"):
        return "data"
    return "code"


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> None:
    """Run a command's main and exit with its code; an OpsError is one line on stderr and exit code 2.

    The exit skips interpreter teardown (os._exit after flushing): with DVC's git/fsspec threads and
    pyarrow loaded, teardown has intermittently aborted ("terminate called without an active
    exception", exit 134) after the command had finished and printed its result."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        code = main(argv)
    except OpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
