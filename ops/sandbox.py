"""A throw-away copy of this checkout, as a fresh clone would have it plus what is not yet committed: every
tracked and new file (nothing git ignores), its own git history of one commit, and its own Prefect,
MLflow, DVC and matplotlib state under its `.work/` (`sandbox_env`). The pipeline tests and `make bench`
run the plan in one, so the checkout's own outputs and lock are never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sandbox_env(dest: Path) -> dict[str, str]:
    """The environment that keeps a sandbox's state inside it (and runs this interpreter's `python`)."""
    work = dest / ".work"
    return {
        **{k: v for k, v in os.environ.items() if k != "LLMCAP_DVC_REMOTE"},  # a team's remote is not the sandbox's
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(work / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "DVC_SITE_CACHE_DIR": str(work / "dvc-site-cache"),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
    }


def copy_checkout(dest: Path, native: bool = False) -> None:
    """Copy the checkout's tracked and new files to `dest`. `native`: also the compiled simulator core when it
    was built from exactly these sources (`make setup`; llmcap._native checks the record and else runs the sources)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    own_stores(dest / "params.yaml")
    if native and (ROOT / "llmcap" / "native.json").is_file():
        for so in (ROOT / "llmcap").rglob("*.so"):
            (dest / so.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)  # llmcap/_compiled/ is not tracked
            shutil.copy2(so, dest / so.relative_to(ROOT))
        shutil.copy2(ROOT / "llmcap" / "native.json", dest / "llmcap" / "native.json")


def own_stores(params: Path) -> None:
    """Empty a team's `stores:` in the copy's params.yaml: a sandbox's plans go to its own `.work/`, never to the shared stores."""
    import yaml

    data = yaml.safe_load(params.read_text()) if params.is_file() else None
    if isinstance(data, dict) and any((data.get("stores") or {}).values()):
        data["stores"] = dict.fromkeys(data["stores"], "")
        params.write_text(yaml.safe_dump(data, sort_keys=False))


def commit_all(dest: Path, env: dict[str, str], message: str) -> None:
    """`git init` (when new), add everything and commit in the sandbox."""
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", message]):
        subprocess.run(cmd, cwd=dest, env=env, capture_output=True, check=True)
