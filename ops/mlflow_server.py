"""The team's MLflow tracking server (`make store`, `make store-stop`): one history of decisions for every clone.

    python -m ops.mlflow_server start [--dir DIR] [--host 127.0.0.1] [--port 5000]
    python -m ops.mlflow_server stop | status

`mlflow server` with a SQL backend (the sqlite file DIR/mlflow.db) and the artifacts it serves kept under
DIR/mlartifacts (`--artifacts-destination`: clients upload and download through the server), one worker
(the default four starve a small machine), in a process group of its own. `.work/mlflow-server/server.json`
holds its PID, URL and store directory; `stop` ends that PID's group. DIR (default $LLMCAP_STORE_DIR, else
`.work/store`) is the shared location: put it where the server's machine keeps it safe, with DIR/dvc-remote
beside it as the DVC remote where planners' machines reach it. Clones use both through params.yaml (README,
"Team stores"):

    stores:
      dvc_remote: DIR/dvc-remote
      mlflow_tracking_uri: http://HOST:PORT
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ops.background import BackgroundServer
from stages.env import ROOT


def home(root: Path) -> Path:
    return root / ".work" / "mlflow-server"


def _server(root: Path) -> BackgroundServer:
    return BackgroundServer("mlflow server", home(root))


def command(store: Path, host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlflow.db'}",
        "--artifacts-destination",
        str(store / "mlartifacts"),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def start(
    root: Path = ROOT, store: Path | None = None, port: int = 5000, host: str = "127.0.0.1", timeout_s: float = 180.0
) -> dict:
    """Start `mlflow server` in the background and wait for /health; returns {pid, url, store, log, seconds}."""
    server = _server(root)
    record = server.running()
    if record:
        return {**record, "seconds": 0.0, "already_running": True}
    store = (store or Path(os.environ.get("LLMCAP_STORE_DIR") or root / ".work" / "store")).resolve()
    (store / "mlartifacts").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the server is the store, not a client of one
    return server.launch(command(store, host, port), f"http://{host}:{port}", env, store, timeout_s, store=str(store))


def stop(root: Path = ROOT, timeout_s: float = 20.0) -> bool:
    """Stop the server this project started (its process group, by the recorded PID: the worker goes with it)."""
    return _server(root).stop(timeout_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.mlflow_server", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the shared store directory (default $LLMCAP_STORE_DIR, else .work/store)",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("LLMCAP_MLFLOW_PORT", "5000")))
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    root = args.project.resolve()
    if args.action == "start":
        r = start(root, args.dir, args.port, args.host)
        print(
            f"mlflow server {'already running' if r.get('already_running') else 'started'} (pid {r['pid']}) at {r['url']} "
            f"in {r['seconds']} s; store {r['store']}; log {r['log']}"
        )
        print(
            f"params.yaml, for every clone:\n  stores:\n    dvc_remote: {Path(r['store']) / 'dvc-remote'}\n"
            f"    mlflow_tracking_uri: {r['url']}"
        )
    elif args.action == "stop":
        print("stopped" if stop(root) else "not running")
    else:
        record = _server(root).running()
        print(f"running (pid {record['pid']}) at {record['url']}, store {record['store']}" if record else "not running")
        return 0 if record else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
