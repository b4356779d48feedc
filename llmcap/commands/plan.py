"""`llmcap plan`: run the closed loop (the Prefect flow `replan`) in the current project directory.

The flow lives in the project's `flows/` package, outside the domain library (which never imports
Prefect), so the CLI starts it as a subprocess of the same interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmcap.commands._common import user_errors
from llmcap.errors import LlmcapError


@user_errors
def plan(
    project: Annotated[
        Path, typer.Option("--project", "-p", help="project directory holding dvc.yaml and params.yaml")
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="re-run every stage even when DVC says it is up to date")
    ] = False,
) -> None:
    """Run the planning loop (DVC pipeline under the Prefect flow `replan`) and print where results are."""
    project = project.resolve()
    if not (project / "dvc.yaml").exists() or not (project / "flows").is_dir():
        raise LlmcapError(f"{project}: not an llmcap project (needs dvc.yaml and flows/); run from the repository root")
    cmd = [sys.executable, "-m", "flows.replan"] + (["--force"] if force else [])
    raise typer.Exit(subprocess.call(cmd, cwd=project))
