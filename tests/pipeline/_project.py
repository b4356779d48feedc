"""A throw-away copy of the repository for end-to-end pipeline tests: its own git history, light sizing
params (same code path, fewer simulations) and its own Prefect/MLflow/DVC state under its `.work/`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT


def sh(cmd: list[str], cwd: Path, env: dict, timeout: int = 600, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def project_env(dest: Path) -> dict:
    work = dest / ".work"
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(work / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "DVC_SITE_CACHE_DIR": str(work / "dvc-site-cache"),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost",
    }


def make_project(dest: Path, native: bool = False) -> tuple[Path, dict]:
    """Copy the repository's tracked and new files (nothing ignored) to `dest`, lighten the sizing search and
    commit it all in a fresh git repository. `native`: also copy the compiled simulator core when it was
    built from exactly these sources (`make setup`; llmcap._native checks the record and else runs the sources)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    if native and (ROOT / "llmcap" / "native.json").is_file():
        for so in (ROOT / "llmcap").rglob("*.so"):
            (dest / so.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)  # llmcap/_compiled/ is not tracked
            shutil.copy2(so, dest / so.relative_to(ROOT))
        shutil.copy2(ROOT / "llmcap" / "native.json", dest / "llmcap" / "native.json")
    # A lighter sizing search than the shipped default (same code path): these tests run the pipeline several times.
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["size"].update(excerpt_requests=400, shortlist=1, pd_prefill_shortlist=0, pools_split_isl=None, final_shortlist=1,
                          model_error_range=False)  # fmt: skip
    params["size"]["search"]["seeds"] = [0]
    params["size"]["count_seeds"] = [1]
    # the replay check against the twin: a few seconds per run (12 requests; the light search picks a slow
    # instance, ~0.04 req/s, whose 12 requests span ~5 simulated minutes: played 50x faster than real time)
    params["replay"].update(excerpt_requests=12, twin_dilation=0.02)
    params["autoscale"].update(period_s=1800, duration_s=1800, t_ready_s=120, min_residency_s=120, floor_fractions=[1])
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = project_env(dest)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "fresh clone"]):
        sh(cmd, dest, env)
    return dest, env
