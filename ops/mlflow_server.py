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
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from stages.env import ROOT

_children: dict[int, subprocess.Popen] = {}  # servers this process started: reaped when stopped


def home(root: Path) -> Path:
    return root / ".work" / "mlflow-server"


def _record(root: Path) -> dict | None:
    path = home(root) / "server.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def command(store: Path, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
            "--artifacts-destination", str(store / "mlartifacts"), "--host", host, "--port", str(port), "--workers", "1"]  # fmt: skip


def start(root: Path = ROOT, store: Path | None = None, port: int = 5000, host: str = "127.0.0.1", timeout_s: float = 180.0) -> dict:
    """Start `mlflow server` in the background and wait for /health; returns {pid, url, store, log, seconds}."""
    record = _record(root)
    if record and _alive(record["pid"]) and healthy(record["url"]):
        return {**record, "seconds": 0.0, "already_running": True}
    store = (store or Path(os.environ.get("LLMCAP_STORE_DIR") or root / ".work" / "store")).resolve()
    (store / "mlartifacts").mkdir(parents=True, exist_ok=True)
    h = home(root)
    h.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the server is the store, not a client of one
    log = h / "server.log"
    began = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(command(store, host, port), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=store,
                                start_new_session=True)  # fmt: skip
    _children[proc.pid] = proc
    record = {"pid": proc.pid, "url": url, "store": str(store), "log": str(log)}
    (h / "server.json").write_text(json.dumps(record) + "\n")
    while not healthy(url):
        if proc.poll() is not None:
            (h / "server.json").unlink(missing_ok=True)
            raise RuntimeError(f"mlflow server exited with {proc.returncode}; see {log}")
        if time.monotonic() - began > timeout_s:
            stop(root)
            raise TimeoutError(f"mlflow server did not answer {url}/health within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    return {**record, "seconds": round(time.monotonic() - began, 1)}


def stop(root: Path = ROOT, timeout_s: float = 20.0) -> bool:
    """Stop the server this project started (its process group, by the recorded PID)."""
    record = _record(root)
    if not record or not _alive(record["pid"]):
        (home(root) / "server.json").unlink(missing_ok=True)
        return False
    pid = record["pid"]
    os.killpg(pid, signal.SIGTERM)  # its own session: the worker goes with it
    proc = _children.pop(pid, None)
    running = (lambda: proc.poll() is None) if proc else (lambda: _alive(pid))  # poll() also reaps our own child
    deadline = time.monotonic() + timeout_s
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    if running():
        os.killpg(pid, signal.SIGKILL)
        if proc:
            proc.wait()
    (home(root) / "server.json").unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.mlflow_server", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--dir", type=Path, default=None, help="the shared store directory (default $LLMCAP_STORE_DIR, else .work/store)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("LLMCAP_MLFLOW_PORT", "5000")))
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    root = args.project.resolve()
    if args.action == "start":
        r = start(root, args.dir, args.port, args.host)
        print(f"mlflow server {'already running' if r.get('already_running') else 'started'} (pid {r['pid']}) at {r['url']} "
              f"in {r['seconds']} s; store {r['store']}; log {r['log']}")
        print(f"params.yaml, for every clone:\n  stores:\n    dvc_remote: {Path(r['store']) / 'dvc-remote'}\n"
              f"    mlflow_tracking_uri: {r['url']}")
    elif args.action == "stop":
        print("stopped" if stop(root) else "not running")
    else:
        record = _record(root)
        up = bool(record and _alive(record["pid"]) and healthy(record["url"]))
        print(f"running (pid {record['pid']}) at {record['url']}, store {record['store']}" if up and record else "not running")
        return 0 if up else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
