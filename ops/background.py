"""A server the project starts in the background: its own process group, a record of its PID and URL, a
health check, and a stop by that PID's group. The Prefect server (`flows.server`) and the team's MLflow
server (`ops.mlflow_server`) are both one of these."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

_children: dict[int, subprocess.Popen] = {}  # servers this process started: reaped when stopped


def alive(pid: int) -> bool:
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


@dataclass(frozen=True)
class BackgroundServer:
    """One kind of server, kept under `home` (server.json: its PID, URL and what `launch` adds; server.log)."""

    name: str  # for messages, e.g. "prefect server"
    home: Path

    @property
    def record_file(self) -> Path:
        return self.home / "server.json"

    def record(self) -> dict | None:
        return json.loads(self.record_file.read_text()) if self.record_file.is_file() else None

    def running(self) -> dict | None:
        """The record of a server that is up and answers its health check, else None."""
        record = self.record()
        return record if record and alive(record["pid"]) and healthy(record["url"]) else None

    def launch(self, argv: list[str], url: str, env: dict[str, str], cwd: Path, timeout_s: float, **extra: str) -> dict:
        """Start `argv` in a new session, record it, and wait until `url`/health answers; {pid, url, log, seconds, **extra}."""
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / "server.log"
        began = time.monotonic()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        _children[proc.pid] = proc
        record = {"pid": proc.pid, "url": url, **extra, "log": str(log)}
        self.record_file.write_text(json.dumps(record) + "\n")
        while not healthy(url):
            if proc.poll() is not None:
                self.record_file.unlink(missing_ok=True)
                raise RuntimeError(f"{self.name} exited with {proc.returncode}; see {log}")
            if time.monotonic() - began > timeout_s:
                self.stop()
                raise TimeoutError(f"{self.name} did not answer {url}/health within {timeout_s:.0f} s; see {log}")
            time.sleep(0.5)
        return {**record, "seconds": round(time.monotonic() - began, 1)}

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the recorded server: SIGTERM to its process group (its workers go with it), SIGKILL after `timeout_s`."""
        record = self.record()
        if not record or not alive(record["pid"]):
            self.record_file.unlink(missing_ok=True)
            return False
        pid = record["pid"]
        os.killpg(pid, signal.SIGTERM)
        proc = _children.pop(pid, None)
        running = (lambda: proc.poll() is None) if proc else (lambda: alive(pid))  # poll() also reaps our own child
        deadline = time.monotonic() + timeout_s
        while running() and time.monotonic() < deadline:
            time.sleep(0.2)
        if running():
            os.killpg(pid, signal.SIGKILL)
            if proc:
                proc.wait()
        self.record_file.unlink(missing_ok=True)
        return True
