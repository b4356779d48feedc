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
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from stages.env import ROOT

_children: dict[int, subprocess.Popen] = {}  # servers this process started: waited for when stopped


def home(root: Path) -> Path:
    return root / ".work" / "prefect-server"


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


def start(root: Path = ROOT, port: int = 4200, host: str = "127.0.0.1", timeout_s: float = 180.0) -> dict:
    """Start `prefect server start` in the background and wait for /api/health; returns {pid, url, log, seconds}."""
    record = _record(root)
    if record and _alive(record["pid"]) and healthy(record["url"]):
        return {**record, "seconds": 0.0, "already_running": True}
    h = home(root)
    h.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}/api"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the server must not try to be a client of itself
    env.update(PREFECT_HOME=str(h), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    log = h / "server.log"
    began = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)  # fmt: skip
    _children[proc.pid] = proc
    record = {"pid": proc.pid, "url": url, "log": str(log)}
    (h / "server.json").write_text(json.dumps(record) + "\n")
    while not healthy(url):
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log}")
        if time.monotonic() - began > timeout_s:
            stop(root)
            raise TimeoutError(f"prefect server did not answer {url}/health within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    return {**record, "seconds": round(time.monotonic() - began, 1)}


def stop(root: Path = ROOT, timeout_s: float = 20.0) -> bool:
    """Stop the server this project started (its process group, by the recorded PID)."""
    record = _record(root)
    if not record or not _alive(record["pid"]):
        (home(root) / "server.json").unlink(missing_ok=True)
        return False
    pid = record["pid"]
    os.killpg(pid, signal.SIGTERM)  # its own session (start_new_session): uvicorn and services go with it
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


def adopt_server(root: Path = ROOT) -> str | None:
    """Point this process's Prefect client at the project's server when one runs and PREFECT_API_URL is
    unset (call before importing prefect: its settings are read then); returns the URL in use, if any."""
    url = os.environ.get("PREFECT_API_URL")
    record = None if url else _record(root)
    if record and _alive(record["pid"]):
        url = os.environ["PREFECT_API_URL"] = record["url"]
    return url


def use_server(root: Path = ROOT) -> str:
    """Point this process's Prefect client at the project's server (before importing prefect); returns the URL."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        record = _record(root)
        if not record or not _alive(record["pid"]):
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
        print(f"prefect server {'already running' if r.get('already_running') else 'started'} (pid {r['pid']}) "
              f"at {r['url']} in {r['seconds']} s; UI {r['url'].removesuffix('/api')}; log {r['log']}")
        print(f"export PREFECT_API_URL={r['url']}")
    elif args.action == "stop":
        print("stopped" if stop(root) else "not running")
    else:
        record = _record(root)
        up = bool(record and _alive(record["pid"]) and healthy(record["url"]))
        print(f"running (pid {record['pid']}) at {record['url']}" if up and record else "not running")
        return 0 if up else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
