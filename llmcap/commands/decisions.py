"""`llmcap history | reproduce | diff | approve | correct`: past planning decisions (stored by `llmcap plan` / `make plan`).

The work needs DVC, MLflow, Prefect and git, which the domain library never imports: it lives in the
project's `ops/` and `flows/` packages, and these commands run it as `python -m ops.<command>` (or
`flows.approve`, `flows.correct`) subprocesses of the same interpreter in the project directory (as `llmcap plan` runs
`flows.replan`); output and exit code pass through.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmcap.commands._common import user_errors
from llmcap.errors import LlmcapError

Project = Annotated[Path, typer.Option("--project", "-p", help="project directory holding dvc.yaml and ops/")]
Json = Annotated[bool, typer.Option("--json", help="print JSON instead of a table / Markdown")]


def _run(project: Path, module: str, args: list[str]) -> None:
    project = project.resolve()
    if not (project / "dvc.yaml").exists() or not (project / "ops").is_dir():
        raise LlmcapError(f"{project}: not an llmcap project (needs dvc.yaml and ops/); run from the repository root")
    module = module if "." in module else f"ops.{module}"
    raise typer.Exit(subprocess.call([sys.executable, "-m", module, "--project", str(project), *args], cwd=project))


@user_errors
def history(
    project: Project = Path("."),
    json: Json = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="newest N decisions only (0: all)")] = 0,
) -> None:
    """Past decisions, newest first: date, commit, target rate, chosen config, GPUs, cost, approved by."""
    _run(project, "history", ["--limit", str(limit)] + (["--json"] if json else []))


@user_errors
def reproduce(
    rev: Annotated[str, typer.Argument(help="the commit whose dvc.lock records the decision (sha, branch, tag)")],
    project: Project = Path("."),
    pull: Annotated[
        bool, typer.Option("--pull", help="fetch REV's outputs from the DVC remote instead of recomputing")
    ] = False,
    keep: Annotated[bool, typer.Option("--keep", help="keep the temporary worktree")] = False,
    json: Json = False,
) -> None:
    """Re-run REV's pipeline in a clean worktree with its locked environment; exit 0 if every output is byte-identical."""
    _run(
        project,
        "reproduce",
        [rev] + (["--pull"] if pull else []) + (["--keep"] if keep else []) + (["--json"] if json else []),
    )


@user_errors
def diff(
    a: Annotated[str, typer.Argument(help="a commit, an MLflow replan run id or a plan directory")],
    b: Annotated[str, typer.Argument(help="the same for the other side")],
    project: Project = Path("."),
    json: Json = False,
) -> None:
    """What changed in the decision between A and B (GPUs, configuration, cost, headroom, max rates) and which inputs explain it."""
    sides = [str(Path(s).resolve()) if Path(s).is_dir() else s for s in (a, b)]  # the subprocess runs in the project
    _run(project, "diff", sides + (["--json"] if json else []))


@user_errors
def approve(
    run: Annotated[
        str | None, typer.Argument(help="the paused `promote` or `rollout` flow run id (none: list the runs waiting)")
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="optional: must name your git identity (the approver is who runs this)")
    ] = None,
    reject: Annotated[
        bool, typer.Option("--reject", help="reject: the old plan stays in force / the rollout rolls back")
    ] = False,
    comment: Annotated[str, typer.Option("--comment", "--reason", help="why (recorded)")] = "",
    project: Project = Path("."),
) -> None:
    """Approve (or --reject) a re-plan waiting in the Prefect flow `promote`, or a rollout's next step in `rollout`."""
    args = ([run] if run else ["--list"]) + (["--by", by] if by else []) + (["--reject"] if reject else [])
    _run(project, "flows.approve", args + (["--comment", comment] if comment else []))


@user_errors
def correct(
    project: Project = Path("."),
    alias: Annotated[
        str,
        typer.Option(
            "--alias", help="the alias the new versions get (params.yaml profile.corrections_alias picks one)"
        ),
    ] = "champion",
) -> None:
    """Write the last plan's step-time corrections back: a new version per configuration (file + MLflow registry)."""
    _run(project, "flows.correct", ["--alias", alias])
