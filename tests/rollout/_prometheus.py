"""A real Prometheus server (Debian's package, scripts/install_prometheus.sh) on a free loopback port,
scraping the given targets, with its data in a temporary directory; stopped by its PID."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import yaml


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def prometheus(workdir: Path, jobs: dict[str, str], scrape_interval: str = "250ms") -> AsyncIterator[str]:
    """jobs: job name -> base URL (host:port is scraped at /metrics). Yields the server's URL. Async: the
    targets it waits for may be served by this very event loop."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: make test installs it (scripts/install_prometheus.sh)"
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [url.split("//", 1)[1]]}]} for job, url in jobs.items()
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=1) as client:
            while True:
                try:  # ready, and every target scraped once (the scrape manager applies targets every 5 s)
                    r = await client.get(f"{url}/api/v1/targets")
                    active = r.json()["data"]["activeTargets"] if r.status_code == 200 else []
                    if {t["labels"]["job"] for t in active if t["health"] == "up"} == set(jobs):
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, (workdir / "prometheus.log").read_text()[
                    -2000:
                ]
                await asyncio.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
