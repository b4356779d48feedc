"""`llmcap reproduce REV`: re-run a past decision and check its outputs byte for byte.

    python -m ops.reproduce REV [--project DIR] [--pull] [--json] [--keep]

In a clean git worktree at REV (`git worktree add --detach`, removed afterwards unless --keep), with
REV's locked environment (the current interpreter when REV's uv.lock is the project's, else a venv per
uv.lock hash made once with `uv sync --frozen` under $LLMCAP_VENV_CACHE or ~/.cache/llmcap/venvs),
`dvc repro --force` re-runs every stage (state in a temporary directory: the project's MLflow history
is left alone). Then every output's md5 is compared with REV's dvc.lock and, where the MLflow run of
REV's decision exists (its dvc.lock.sha256 tag), with its `decision/outputs.json`. --pull fetches REV's
outputs from the project's DVC remote instead of recomputing (outputs with `cache: false` are not stored).

Outputs dvc.yaml marks `meta: {measured: true}` (the replay stage's measured records and report: wall-clock
timing of an endpoint or the digital twin) are listed as "measured, not expected identical", not compared.

Exit 0: byte-identical (measured outputs aside); 1: a list of what differs (path, expected md5, got md5) and which stage
inputs (commands, params, deps) differ between REV's dvc.lock and the re-run's; 2: a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from ops.common import (
    OpsError,
    dir_manifest,
    git,
    input_changes,
    lock_outs,
    md5_file,
    out_md5,
    parse_lock,
    resolve_commit,
    run_main,
    sha256,
    show,
)


def venv_for(root: Path, worktree: Path, uv_lock: bytes) -> tuple[Path, str]:
    """The python of REV's locked environment (one venv per uv.lock hash, cached) and how it was found."""
    digest = sha256(uv_lock)[:16]
    current = root / "uv.lock"
    if current.is_file() and sha256(current.read_bytes())[:16] == digest:
        return Path(
            sys.executable
        ), f"this interpreter's environment ({sys.prefix}): REV's uv.lock {digest} is the project's"
    cache = Path(
        os.environ.get("LLMCAP_VENV_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmcap" / "venvs"
    )
    venv = cache / digest
    python, marker = venv / "bin" / "python", venv / ".llmcap-synced"
    if marker.is_file() and python.exists():
        return python, f"cached venv {venv} (uv.lock {digest})"
    uv = os.environ.get("UV") or shutil.which("uv") or str(root / ".tools" / "bin" / "uv")
    if not Path(uv).exists() and not shutil.which(uv):
        raise OpsError(
            f"REV's uv.lock ({digest}) differs from the project's and no `uv` to build its venv (run `make setup`)"
        )
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    print(f"[reproduce] building REV's environment: uv sync --frozen into {venv}", file=sys.stderr)
    proc = subprocess.run([uv, "sync", "--frozen", "--no-install-project", "--python", version], cwd=worktree, env=env)
    if proc.returncode != 0:
        raise OpsError(f"uv sync --frozen for REV's uv.lock failed (exit {proc.returncode}); see above")
    marker.write_text(digest + "\n")
    return python, f"new venv {venv} (uv sync --frozen, uv.lock {digest})"


def native_core(root: Path, worktree: Path) -> str:
    """Copy the project's compiled simulator core into the worktree when it was built from REV's exact
    sources (llmcap._native checks the record again); else REV's Python sources run (same bytes, slower)."""
    record = root / "llmcap" / "native.json"
    if not record.is_file():
        return "Python sources (the project has no compiled core)"
    modules = json.loads(record.read_text()).get("modules", {})
    for name, digest in modules.items():
        src = worktree / "llmcap" / (name.replace(".", "/") + ".py")
        if not src.is_file() or sha256(src.read_bytes()) != digest:
            return f"Python sources (REV's {name} differs from the compiled one)"
    # REV's loader finds the extensions in llmcap/_compiled/ or, before that directory existed, beside the sources
    into = (
        worktree / "llmcap" / ("_compiled" if "_compiled" in (worktree / "llmcap" / "_native.py").read_text() else "")
    )
    for name in modules:
        rel = Path(*name.split("."))
        (into / rel.parent).mkdir(parents=True, exist_ok=True)
        for so in (root / "llmcap" / "_compiled" / rel.parent).glob(f"{rel.name}*.so"):
            if so.name.split(".")[0] in (rel.name, rel.name + "__mypyc"):
                shutil.copy2(so, into / rel.parent / so.name)
    shutil.copy2(record, worktree / "llmcap" / "native.json")
    return "compiled core (copied: built from REV's exact sources)"


def isolated_env(state: Path, python: Path) -> dict[str, str]:
    from stages.env import defaults

    return {
        **os.environ,
        **defaults(state),
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONHASHSEED": "0",
    }


def use_project_remote(root: Path, worktree: Path) -> str:
    """Point the worktree's default remote at the project's (the stores setting, else .dvc/config's default: a relative
    local remote would resolve inside the worktree, and REV's own params.yaml may predate the setting)."""
    from ops.store import configure_dvc, default_remote

    remote = default_remote(root)
    if remote is None:
        raise OpsError("--pull: the project has no DVC remote (params.yaml stores.dvc_remote or .dvc/config)")
    local = root / ".dvc" / "config.local"
    if local.is_file():  # credentials and options of this machine
        shutil.copy2(local, worktree / ".dvc" / "config.local")
    configure_dvc(worktree, remote)
    return remote["url"]


def expected_files(
    root: Path, worktree: Path, path: str, md5: str, manifest: dict[str, str] | None
) -> dict[str, str] | None:
    """Per-file md5s a directory output should have: its `.dir` object in a DVC cache or local remote, else the MLflow manifest."""
    if manifest is not None and any(k.startswith(path + "/") for k in manifest):
        return {k[len(path) + 1 :]: v for k, v in manifest.items() if k.startswith(path + "/")}
    value = md5.removesuffix(".dir")
    for base in (root / ".dvc" / "cache", worktree / ".dvc" / "cache"):
        obj = base / "files" / "md5" / value[:2] / (value[2:] + ".dir")
        if obj.is_file():
            return {e["relpath"]: e["md5"] for e in json.loads(obj.read_text())}
    return None


def mlflow_run(lock_bytes: bytes) -> dict | None:
    """The newest finished replan run whose dvc.lock is REV's, with its outputs manifest."""
    from ops.history import replan_runs

    digest = sha256(lock_bytes)
    for run in replan_runs():
        if run.data.tags.get("dvc.lock.sha256") == digest:
            import mlflow

            try:
                manifest = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/decision/outputs.json")
            except Exception:  # noqa: BLE001 - a run from before outputs.json was recorded
                manifest = None
            return {"run_id": run.info.run_id, "manifest": manifest}
    return None


MEASURED = "measured, not expected identical"
SKIPPED = ("identical", "not stored (cache: false)", MEASURED)


def out_flags(dvc_yaml: dict) -> tuple[set[str], set[str]]:
    """Outputs with `cache: false`, and outputs marked `meta: {measured: true}` (timing of a live endpoint or the
    digital twin: a re-run measures again and is not expected to give the same bytes)."""
    uncached, measured = set(), set()
    for stage in dvc_yaml.get("stages", {}).values():
        for o in stage.get("outs", []):
            if isinstance(o, dict):
                path, spec = next(iter(o.items()))
                if spec.get("cache") is False:
                    uncached.add(path)
                if (spec.get("meta") or {}).get("measured") is True:
                    measured.add(path)
    return uncached, measured


def compare(root: Path, worktree: Path, lock: dict, dvc_yaml: dict, run: dict | None, pulled: bool) -> list[dict]:
    manifest = run["manifest"] if run else None
    uncached, measured = out_flags(dvc_yaml)
    rows = []
    for path, entry in lock_outs(lock).items():
        target = worktree / path
        expected, got = entry.get("md5"), out_md5(target)
        row = {"path": path, "stage": entry["stage"], "expected": expected, "got": got, "files": []}
        if pulled and path in uncached:
            row["status"] = "not stored (cache: false)"
            rows.append(row)
            continue
        if path in measured and not pulled:  # wall-clock timing: a re-run measures again, other bytes
            row["status"] = MEASURED if got is not None else "missing"
            rows.append(row)
            continue
        row["status"] = "identical" if got == expected else ("missing" if got is None else "differs")
        if target.is_dir() and expected and expected.endswith(".dir"):
            want = expected_files(root, worktree, path, expected, manifest)
            have = dir_manifest(target)
            if want is None and row["status"] != "identical":
                row["files"].append({"path": f"{path}/*", "expected": "unknown (no .dir manifest cached)", "got": None})
            for rel in sorted(set(want or {}) | (set(have) if want is not None else set())):
                if (want or {}).get(rel) != have.get(rel):
                    row["files"].append(
                        {"path": f"{path}/{rel}", "expected": (want or {}).get(rel), "got": have.get(rel)}
                    )
        rows.append(row)
    return rows


def compare_mlflow(worktree: Path, run: dict | None, rows: list[dict]) -> dict:
    if run is None:
        return {
            "run_id": None,
            "compared": 0,
            "differences": [],
            "note": "no finished replan run with REV's dvc.lock in this MLflow store",
        }
    if run["manifest"] is None:
        return {
            "run_id": run["run_id"],
            "compared": 0,
            "differences": [],
            "note": "the run has no decision/outputs.json",
        }
    skip = {r["path"] for r in rows if r["status"].startswith("not stored") or r["status"] == MEASURED}
    diffs = []
    compared = 0
    for rel, md5 in sorted(run["manifest"].items()):
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        compared += 1
        f = worktree / rel
        got = md5_file(f) if f.is_file() else None
        if got != md5:
            diffs.append({"path": rel, "expected": md5, "got": got})
    return {"run_id": run["run_id"], "compared": compared, "differences": diffs}


def reproduce(root: Path, rev: str, pull: bool, keep: bool) -> dict:
    commit = resolve_commit(root, rev)
    if commit is None:
        raise OpsError(f"{rev!r}: not a commit of {root}")
    lock_bytes = show(root, commit, "dvc.lock")
    if lock_bytes is None:
        raise OpsError(f"{rev} ({commit[:10]}) has no dvc.lock: nothing was planned there")
    lock = parse_lock(lock_bytes)
    dvc_yaml = yaml.safe_load(show(root, commit, "dvc.yaml") or b"{}") or {}
    tmp = Path(tempfile.mkdtemp(prefix="llmcap-reproduce-"))
    worktree = tmp / "tree"
    git(root, "worktree", "add", "--detach", str(worktree), commit)
    try:
        result: dict = {
            "rev": rev,
            "commit": commit,
            "mode": "pull" if pull else "recompute",
            "worktree": str(worktree) if keep else None,
        }
        if pull:
            result["remote"] = use_project_remote(root, worktree)
            proc = subprocess.run(
                [sys.executable, "-m", "dvc", "pull"],
                cwd=worktree,
                env=isolated_env(tmp / "state", Path(sys.executable)),
                stdout=sys.stderr,
                stderr=sys.stderr,
            )
            result["environment"] = {"dvc pull exit": proc.returncode}
            rerun_lock = None
        else:
            python, how = venv_for(root, worktree, show(root, commit, "uv.lock") or b"")
            result["environment"] = {"python": how, "simulator": native_core(root, worktree)}
            print(f"[reproduce] {commit[:10]}: dvc repro --force in {worktree} ({how})", file=sys.stderr)
            proc = subprocess.run(
                [str(python), "-m", "dvc", "repro", "--force"],
                cwd=worktree,
                env=isolated_env(tmp / "state", python),
                stdout=sys.stderr,
                stderr=sys.stderr,
            )
            result["environment"]["dvc repro exit"] = proc.returncode
            rerun = worktree / "dvc.lock"
            rerun_lock = parse_lock(rerun.read_bytes()) if rerun.is_file() else None
        run = mlflow_run(lock_bytes)
        rows = compare(root, worktree, lock, dvc_yaml, run, pull)
        result["outputs"] = rows
        result["mlflow"] = compare_mlflow(worktree, run, rows)
        result["inputs_changed"] = input_changes(lock, rerun_lock) if rerun_lock else None
        result["identical"] = (
            proc.returncode == 0 and all(r["status"] in SKIPPED for r in rows) and not result["mlflow"]["differences"]
        )
        return result
    finally:
        if not keep:
            git(root, "worktree", "remove", "--force", str(worktree), check=False)
            git(root, "worktree", "prune", check=False)
            shutil.rmtree(tmp, ignore_errors=True)


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    table = Table(title=f"reproduce {result['rev']} ({result['commit'][:10]}, {result['mode']})")
    for col in (
        "output",
        "stage",
        "dvc.lock md5",
        "re-run md5" if result["mode"] == "recompute" else "pulled md5",
        "status",
    ):
        table.add_column(col)
    for r in result["outputs"]:
        table.add_row(r["path"], r["stage"], r["expected"] or "", r["got"] or "-", r["status"])
        for f in r["files"]:
            table.add_row(f"  {f['path']}", "", f["expected"] or "-", f["got"] or "-", "differs")
    console.print(table)
    for key, value in result["environment"].items():
        console.print(f"{key}: {value}")
    m = result["mlflow"]
    if m["run_id"]:
        console.print(
            f"MLflow run {m['run_id']}: {m['compared']} output files compared with decision/outputs.json, "
            f"{len(m['differences'])} differ" + ("" if "note" not in m else f" ({m['note']})")
        )
        for d in m["differences"]:
            console.print(f"  {d['path']}: run {d['expected']}, now {d['got']}")
    else:
        console.print(f"MLflow: {m['note']}")
    changed = result["inputs_changed"]
    if changed and any(changed.values()):
        console.print("inputs that differ between REV's dvc.lock and the re-run's:")
        for c in changed["cmds"]:
            console.print(f"  cmd of {c['stage']}: {c['a']!r} -> {c['b']!r}")
        for p in changed["params"]:
            console.print(f"  param {p['key']} ({', '.join(p['stages'])}): {p['a']!r} -> {p['b']!r}")
        for d in changed["deps"]:
            console.print(f"  {d['kind']} {d['path']} ({', '.join(d['stages'])}): {d['a']} -> {d['b']}")
    elif changed is not None and not result["identical"]:
        console.print("no stage input differs from REV's dvc.lock: the difference is nondeterminism or the environment")
    measured = [r["path"] for r in result["outputs"] if r["status"] == MEASURED]
    aside = f" (measured outputs aside, not expected identical: {', '.join(measured)})" if measured else ""
    console.print(f"[bold green]byte-identical[/]{aside}" if result["identical"] else "[bold red]DIFFERS[/]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit (sha, branch, tag) whose dvc.lock records the decision")
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument(
        "--pull", action="store_true", help="fetch REV's outputs from the DVC remote instead of recomputing"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the worktree (its path is printed)")
    args = ap.parse_args(argv)
    from stages.env import apply_defaults

    root = args.project.resolve()
    apply_defaults(root)
    result = reproduce(root, args.rev, args.pull, args.keep)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        render(result)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    run_main(main)
