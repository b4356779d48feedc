"""The project's Prefect server: where schedules run and approvals are given (`make plan` does not need it).

    python -m flows.server start [--port 4200]   # background, on loopback; waits until it answers
    python -m flows.server stop                  # by its PID
    python -m flows.server status

`prefect server start` runs with its own PREFECT_HOME (`.work/prefect-server/`: its SQLite database
is not the ephemeral one `make plan` uses) in a new process group; `.work/prefect-server/server.json`
holds its PID and API URL, which `flows.serve` and `llmcap approve` use when PREFECT_API_URL is unset.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ops.background import BackgroundServer, alive
from stages.env import ROOT


def home(root: Path) -> Path:
    return root / ".work" / "prefect-server"


def _server(root: Path) -> BackgroundServer:
    return BackgroundServer("prefect server", home(root))


def _record(root: Path) -> dict | None:
    return _server(root).record()


def start(root: Path = ROOT, port: int = 4200, host: str = "127.0.0.1", timeout_s: float = 180.0) -> dict:
    """Start `prefect server start` in the background and wait for /api/health; returns {pid, url, log, seconds}."""
    server = _server(root)
    record = server.running()
    if record:
        return {**record, "seconds": 0.0, "already_running": True}
    env = {
        k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"
    }  # the server must not try to be a client of itself
    env.update(PREFECT_HOME=str(server.home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    return server.launch(argv, f"http://{host}:{port}/api", env, root, timeout_s)


def stop(root: Path = ROOT, timeout_s: float = 20.0) -> bool:
    """Stop the server this project started (its process group, by the recorded PID: uvicorn and services go with it)."""
    return _server(root).stop(timeout_s)


def adopt_server(root: Path = ROOT) -> str | None:
    """Point this process's Prefect client at the project's server when one runs and PREFECT_API_URL is
    unset (call before importing prefect: its settings are read then); returns the URL in use, if any."""
    url = os.environ.get("PREFECT_API_URL")
    record = None if url else _record(root)
    if record and alive(record["pid"]):
        url = os.environ["PREFECT_API_URL"] = record["url"]
    return url


def use_server(root: Path = ROOT) -> str:
    """Point this process's Prefect client at the project's server (before importing prefect); returns the URL."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        record = _record(root)
        if not record or not alive(record["pid"]):
            print("error: no Prefect server: start it with `make server` (or set PREFECT_API_URL)", file=sys.stderr)
            raise SystemExit(2)
        url = os.environ["PREFECT_API_URL"] = record["url"]
    return url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.server", description="Start or stop the project's Prefect server.")
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--port", type=int, default=int(os.environ.get("LLMCAP_PREFECT_PORT", "4200")))
    ap.add_argument("--project", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    root = args.project.resolve()
    if args.action == "start":
        r = start(root, args.port)
        print(
            f"prefect server {'already running' if r.get('already_running') else 'started'} (pid {r['pid']}) "
            f"at {r['url']} in {r['seconds']} s; UI {r['url'].removesuffix('/api')}; log {r['log']}"
        )
        print(f"export PREFECT_API_URL={r['url']}")
    elif args.action == "stop":
        print("stopped" if stop(root) else "not running")
    else:
        record = _server(root).running()
        print(f"running (pid {record['pid']}) at {record['url']}" if record else "not running")
        return 0 if record else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
