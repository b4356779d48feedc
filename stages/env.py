"""Defaults for the environment variables the stack needs, for runs outside `make`.

`make` exports the same variables (see Makefile); these only fill in what is unset, so a stage or
flow started by hand writes its state into the project's `.work/` directory instead of $HOME or CWD.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def apply_defaults(root: Path = ROOT) -> None:
    work = root / ".work"
    defaults = {
        "PREFECT_HOME": str(work / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(work / "dvc-site-cache"),
        "MPLCONFIGDIR": str(work / "matplotlib"),
        "MPLBACKEND": "Agg",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    work.mkdir(parents=True, exist_ok=True)
