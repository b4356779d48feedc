"""The environment the stack needs: one list, `defaults(work)`, that every entry point applies.

`make` exports it (the Makefile reads it from this file: `python3 stages/env.py WORK`), every stage and
flow fills in what is unset (`apply_defaults`), the tests point it at a temporary directory, and
`llmcap reproduce` at its own state. So a run started by hand writes its state into the project's
`.work/` directory instead of $HOME or CWD. This file imports nothing outside the standard library: the
Makefile runs it before the virtual environment exists.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def defaults(work: Path) -> dict[str, str]:
    """Where Prefect, MLflow, DVC and matplotlib keep their state (under `work`), and their telemetry off."""
    return {
        "PREFECT_HOME": str(work / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # the ephemeral server can take over 20 s to start on a busy machine
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(work / "dvc-site-cache"),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "MPLBACKEND": "Agg",
    }


def apply_defaults(root: Path = ROOT) -> None:
    work = root / ".work"
    for key, value in defaults(work).items():
        os.environ.setdefault(key, value)
    work.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":  # for the Makefile: KEY=VALUE words
    print(" ".join(f"{k}={v}" for k, v in defaults(Path(sys.argv[1])).items()))
