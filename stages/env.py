"""The environment the stack needs: one list, `defaults(work)`, that every entry point applies.

`make` exports it (the Makefile reads it from this file: `python3 stages/env.py WORK`), every stage and
flow fills in what is unset (`apply_defaults`), the tests point it at a temporary directory, and
`llmcap reproduce` at its own state. So a run started by hand writes its state into the project's
`.work/` directory instead of $HOME or CWD.

The stores where decisions are kept (`stores`: the DVC remote and the MLflow tracking URI) come from one
setting a clone picks up: params.yaml `stores:` (committed), overridden by the environment variables
LLMCAP_DVC_REMOTE and MLFLOW_TRACKING_URI; empty, the checkout's own (`.dvc/config`'s default remote,
`.work/mlflow.db`). `apply_defaults` sets MLFLOW_TRACKING_URI from it, so every stage, flow and `ops`
command opens the same store. This file imports nothing outside the standard library at import time: the
Makefile runs it before the virtual environment exists (it exports `defaults` less the MLflow store,
which needs params.yaml and so is left to `apply_defaults`).
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


DVC_REMOTE_ENV = "LLMCAP_DVC_REMOTE"
STORES_REMOTE = "team"  # the DVC remote's name when `stores.dvc_remote` (or LLMCAP_DVC_REMOTE) names one


def stores(root: Path = ROOT, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The stores of the project at `root`: {"dvc_remote", "mlflow_tracking_uri"} and where each came from
    ({"…_from": "environment" | "params.yaml" | "default"}). dvc_remote "" means `.dvc/config`'s default remote;
    a relative path is taken from `root` (a URL with a scheme is kept as it is)."""
    import yaml  # only here: the module is imported by the Makefile's system python too

    env = os.environ if environ is None else environ
    params = root / "params.yaml"
    section = ((yaml.safe_load(params.read_text()) or {}).get("stores") or {}) if params.is_file() else {}
    out: dict[str, str] = {}
    for key, var, default in (
        ("dvc_remote", DVC_REMOTE_ENV, ""),
        ("mlflow_tracking_uri", "MLFLOW_TRACKING_URI", defaults(root / ".work")["MLFLOW_TRACKING_URI"]),
    ):
        value, source = env.get(var) or "", "environment"
        if not value:
            value, source = str(section.get(key) or ""), "params.yaml"
        if not value:
            value, source = default, "default"
        out[key], out[f"{key}_from"] = value, source
    remote = out["dvc_remote"]
    if remote and "://" not in remote and not Path(remote).is_absolute():
        out["dvc_remote"] = str((root / remote).resolve())
    return out


def apply_defaults(root: Path = ROOT) -> None:
    work = root / ".work"
    store = stores(root)[
        "mlflow_tracking_uri"
    ]  # before the defaults fill the environment: its own value, else params.yaml
    for key, value in {**defaults(work), "MLFLOW_TRACKING_URI": store}.items():
        os.environ.setdefault(key, value)
    work.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":  # for the Makefile: KEY=VALUE words (the MLflow store: apply_defaults, from params.yaml)
    print(" ".join(f"{k}={v}" for k, v in defaults(Path(sys.argv[1])).items() if k != "MLFLOW_TRACKING_URI"))
