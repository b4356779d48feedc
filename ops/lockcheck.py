"""Does the committed dvc.lock record what the code, params and data at hand would give? (CI: tests/test_dvc_lock.py)

    python -m ops.lockcheck [--rev REV] [--json]        (REV's files exported as a clean clone has them; default HEAD)
    python -m ops.lockcheck --worktree --root DIR       (the files in DIR as they are: deps and lock checks only)

Three checks, each one DVC's own answer or a fact of the lock and git history, none re-running a stage:
- deps: `dvc status` (DVC's hashes of every dep file and directory, the params values, the commands) finds
  nothing changed but outputs. Outputs are left out: a clean clone has none (not in cache, deleted), and a
  dep produced by another stage (the canonical trace, the step model) is checked by the next point instead.
- lock: each such produced dep's md5 in its consumer's entry equals the md5 its producer recorded (a dep
  inside an output directory is left out: the directory's file list is in the DVC cache, not in the lock).
- history: a stage that writes the commit of its own code into its outputs (`provenance.code_commit`: the
  capacity report names the last commit changing the sizing code) was recorded after that commit, so the
  commit's re-run names the same commit and gives the same bytes. Its lock entry must come from a later
  commit than the last one changing its deps (commit the code, then re-plan, then commit dvc.lock).
Exit 0: the lock matches; 1: what is stale, one line each; 2: not a DVC project.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ops.common import OpsError, git, parse_lock, resolve_commit, run_main, show

ROOT = Path(__file__).resolve().parent.parent
# `provenance.code_commit(ROOT, "size")` in a stage's module: that stage's outputs name its code's commit
_EMBEDS_COMMIT = re.compile(r"""code_commit\(\s*ROOT\s*,\s*["'](\w+)["']\s*\)""")


def _produced(path: str, outs: dict[str, str]) -> str | None:
    """The output `path` is, or lies inside (a directory output), else None."""
    return next((o for o in outs if path == o or path.startswith(o.rstrip("/") + "/")), None)


def _outs(lock: dict) -> dict[str, str]:
    return {o["path"]: o.get("md5", "") for spec in lock["stages"].values() for o in spec.get("outs", [])}


def stale_deps(root: Path) -> list[str]:
    """What `dvc status` finds changed besides outputs, and produced deps whose md5 disagrees across the lock."""
    from dvc.repo import Repo

    lock = parse_lock((root / "dvc.lock").read_bytes())
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    outs = _outs(lock)
    problems = [f"{name}: not in dvc.lock (never run)" for name in stages if name not in lock["stages"]]
    with Repo(str(root)) as repo:
        status: dict[str, list[Any]] = repo.status()
    for stage, changes in status.items():
        name = stage.split(":")[-1]
        for change in changes:
            if isinstance(change, str):  # "changed command", "always changed"
                problems.append(f"{name}: {change}")
                continue
            for path, what in (change.get("changed deps") or {}).items():
                if isinstance(what, dict):  # params.yaml: {key: modified|new|deleted}
                    problems += [
                        f"{name}: param {key} {how} (params.yaml differs from the lock)" for key, how in what.items()
                    ]
                elif _produced(path, outs) is None:
                    problems.append(f"{name}: dep {path} {what}")
    for name, spec in lock["stages"].items():
        for dep in spec.get("deps", []):
            producer = _produced(dep["path"], outs)
            if producer is not None and producer == dep["path"] and dep.get("md5") != outs[producer]:
                problems.append(
                    f"{name}: dep {dep['path']} md5 {dep.get('md5')} but its stage recorded {outs[producer]}"
                )
    return problems


def _entry(lock_bytes: bytes | None, stage: str) -> Any:
    return None if lock_bytes is None else (yaml.safe_load(lock_bytes) or {}).get("stages", {}).get(stage)


def recorded_after_code(root: Path, rev: str, tree: Path) -> list[str]:
    """For every stage whose outputs name its code's commit: its entry in `rev`'s dvc.lock was recorded after
    that commit. `tree`: `rev`'s files (its dvc.yaml and stages/)."""
    if git(root, "rev-parse", "--is-shallow-repository", check=False) != "false":
        print(
            "ops.lockcheck: a shallow clone: the code-commit order is not checked (fetch the history: git fetch --unshallow)",
            file=sys.stderr,
        )
        return []
    stages = yaml.safe_load((tree / "dvc.yaml").read_text())["stages"]
    embedding = sorted(
        {m for f in (tree / "stages").glob("*.py") for m in _EMBEDS_COMMIT.findall(f.read_text())} & set(stages)
    )
    problems = []
    for stage in embedding:
        code = git(root, "log", "-1", "--format=%H", rev, "--", *stages[stage].get("deps", []))
        current = _entry(show(root, rev, "dvc.lock"), stage)
        introduced = None
        for commit in git(root, "log", "--format=%H", rev, "--", "dvc.lock").split():
            if _entry(show(root, commit, "dvc.lock"), stage) != current:
                break
            introduced = commit
        if not code or introduced is None:
            continue
        if introduced == code or not _is_ancestor(root, code, introduced):
            problems.append(
                f"{stage}: dvc.lock's entry was recorded at {introduced[:12]}, not after {code[:12]} (the last change to its "
                f"code): its outputs name an older commit than a re-run of {rev} would; commit the code first, then re-run "
                f"{stage} (make plan, or dvc repro --force {stage}) and commit dvc.lock"
            )
    return problems


def export(root: Path, rev: str, dest: Path) -> Path:
    """`rev`'s files (as a clean clone checks them out: no outputs) in `dest`, a git repository of its own for DVC."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def _is_ancestor(root: Path, a: str, b: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=root, capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.lockcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the git repository (default: this checkout)")
    ap.add_argument("--rev", default="HEAD", help="the commit whose dvc.lock is checked (default HEAD)")
    ap.add_argument(
        "--worktree",
        action="store_true",
        help="check the files in --root as they are (deps and lock only), not a commit",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    from stages.env import apply_defaults

    apply_defaults(ROOT)  # DVC's site cache under this checkout's .work/ unless the environment says otherwise
    if args.worktree:
        if not (root / "dvc.yaml").is_file() or not (root / "dvc.lock").is_file():
            raise OpsError(f"{root}: no dvc.yaml and dvc.lock")
        problems = stale_deps(root)
    else:
        if resolve_commit(root, args.rev) is None or show(root, args.rev, "dvc.lock") is None:
            raise OpsError(f"{args.rev}: not a commit with a dvc.lock in {root}")
        with tempfile.TemporaryDirectory(prefix="lockcheck-") as tmp:
            tree = export(root, args.rev, Path(tmp))
            problems = stale_deps(tree) + recorded_after_code(root, args.rev, tree)
    if args.json:
        print(json.dumps({"stale": problems}, indent=1))
    else:
        print(
            "\n".join(problems)
            if problems
            else f"dvc.lock {'in ' + str(root) if args.worktree else 'at ' + args.rev} matches its code, params and data"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    run_main(main)
