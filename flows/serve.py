"""Serve the deployments `watch/watch` (re-plan on an upgrade) and `promote/replan` (scheduled re-plan).

    python -m flows.serve [--project DIR]     (make serve; needs the Prefect server: make server)

A Prefect runner in this process (`prefect.serve`): it creates both deployments with their schedules
from params.yaml `watch` (interval_s, replan_cron), runs each scheduled or manual run in a subprocess,
and lives until interrupted. Both flows pause for approval when they have a new plan (flows.promote).
Their runs log at INFO to the Prefect API (the UI's run logs, `/api/logs/filter`): `PREFECT_LOGGING_LEVEL`
above INFO (the Makefile exports WARNING to keep `make plan`'s console short) is lowered to INFO here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from flows.server import use_server
from stages.env import ROOT, apply_defaults


def deployments(root: Path) -> list:
    """The runner deployments, with their schedules from params.yaml."""
    from flows.promote import promote
    from flows.watch import watch
    from llmcap.config import load_params

    params = load_params(root / "params.yaml").watch
    out = [
        watch.to_deployment(
            name="watch",
            interval=params.interval_s,
            parameters={"root": str(root)},
            description="re-plan when an endpoint's environment changes (params watch.*)",
        )
    ]
    if params.replan_cron:
        out.append(
            promote.to_deployment(
                name="replan",
                cron=params.replan_cron,
                parameters={"root": str(root), "reason": "scheduled re-plan"},
                description="scheduled re-plan, promoted through an approval",
            )
        )
    return out


def log_at_info() -> None:
    """Flow runs started by this runner (its subprocesses inherit the environment) send their INFO lines, the
    approval hint among them, to the API; a level below INFO (DEBUG) is kept. Before Prefect is imported."""
    level = logging.getLevelName(os.environ.get("PREFECT_LOGGING_LEVEL", "INFO").upper())
    if not isinstance(level, int) or level > logging.INFO:
        os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    log_at_info()
    root = args.project.resolve()
    apply_defaults(root)
    url = use_server(root)
    from prefect import serve

    os.chdir(root)  # deployment entrypoints (flows/watch.py:watch) are paths relative to where the runner runs

    print(f"serving watch/watch and promote/replan on {url}", flush=True)
    serve(*deployments(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
