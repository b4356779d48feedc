"""What a run is made of, as hashes: files and folders, the git state, the code commit that last changed a stage, and the
stage as DVC decides on it (its cmd, the content of its deps and the values of its params)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def path_sha256(path: Path) -> str:
    """Content hash of a file, or of a directory's files (relative names + contents, sorted)."""
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    files = (p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for f in sorted(files):
        digest.update(str(f.relative_to(path)).encode() + b"\0" + file_sha256(f).encode())
    return digest.hexdigest()


def git_state(root: Path) -> dict[str, str]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or "unknown"
    # dvc.lock is rewritten by the pipeline itself after each stage: it is state, not a code change.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)dvc.lock")
    return {"git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def code_commit(root: Path, stage: str) -> tuple[str, str] | None:
    """(sha, ISO commit date) of the last commit that changed one of `stage`'s git-tracked deps in dvc.yaml;
    None outside git. Not HEAD: recording a plan (committing dvc.lock) or an unrelated edit must not change
    what the stage writes, or `llmcap reproduce` would find different bytes."""
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage].get("deps", [])
    out = subprocess.run(
        ["git", "log", "-1", "--format=%H %cI", "--", *deps], cwd=root, capture_output=True, text=True, check=False
    )
    fields = out.stdout.split()
    return (fields[0], fields[1]) if out.returncode == 0 and len(fields) == 2 else None


def _dotted(params: dict, key: str) -> Any:
    value: Any = params
    for part in key.split("."):
        value = value[part]
    return value


def stage_hash(root: Path, stage: str) -> str:
    """sha256 over the stage's cmd, its deps' content and its params' values, as declared in dvc.yaml."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]
    params = yaml.safe_load((root / "params.yaml").read_text())
    keys: list[str] = []
    for entry in spec.get("params", []):
        if isinstance(entry, str):
            keys.append(entry)
        else:  # {params_file: [keys]}
            keys.extend(k for v in entry.values() for k in v)
    payload = {
        "cmd": spec["cmd"],
        "deps": {d: path_sha256(root / d) for d in spec.get("deps", [])},
        "params": {k: _dotted(params, k) for k in keys},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
