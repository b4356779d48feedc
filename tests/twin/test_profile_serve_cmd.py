"""`llmcap profile --serve-cmd`: it starts the engine (here a real `llmcap twin serve` process behind a known delay),
times process start → first healthy /health, records it in the profile manifest and stops the engine; a given
endpoint's model-ready time is recorded as not seen."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from tests.conftest import ROOT
from tests.twin._twin import twin_server

pytestmark = [pytest.mark.timeout(180)]
GRID = ["--isl", "16", "--concurrency", "1", "--repeats", "1", "--osl", "4", "--json"]
DELAY_S = 1.5  # the engine's start-up sleeps this long before it even loads: model-ready cannot be shorter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_cmd_times_start_to_healthy_and_records_it(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    twin = f"{shlex.quote(sys.executable)} -m llmcap twin serve -m Llama-3.1-8B -g h100 --host 127.0.0.1 --port {port}"
    cmd = f"sh -c {shlex.quote(f'sleep {DELAY_S}; cd {shlex.quote(str(ROOT))} && exec {twin}')}"
    t0 = time.perf_counter()
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "--endpoint",
            url,
            "--serve-cmd",
            cmd,
            "--ready-timeout",
            "90",
            "--out",
            str(tmp_path / "p"),
            *GRID,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - t0
    assert result.exit_code == 0, result.output
    ready = json.loads(result.stdout)["ready"]
    assert ready["started_by_profile"] is True and ready["health_polls"] >= 2  # the first polls found nothing listening
    assert (
        DELAY_S <= ready["model_ready_s"] < wall
    )  # the sleep, then the twin's own start; within the command's wall time
    assert "router_admitted" in ready["not_measured"] and "pod_running" in ready["not_measured"]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["ready"] == ready
    with pytest.raises(httpx.TransportError):  # the engine it started is stopped again
        httpx.get(f"{url}/health", timeout=2.0)


def test_a_given_endpoint_records_model_ready_as_not_seen(tmp_path: Path) -> None:
    with twin_server("-m", "Llama-3.1-8B", "-g", "h100") as (_, url):
        result = CliRunner().invoke(app, ["profile", "--endpoint", url, "--out", str(tmp_path / "p"), *GRID])
    assert result.exit_code == 0, result.output
    ready = json.loads(result.stdout)["ready"]
    assert ready["started_by_profile"] is False and ready["model_ready_s"] is None and "--serve-cmd" in ready["note"]


def test_an_engine_that_exits_early_is_an_error_naming_its_output(tmp_path: Path) -> None:
    cmd = f"{shlex.quote(sys.executable)} -c \"import sys; print('no GPU found'); sys.exit(3)\""
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "--endpoint",
            f"http://127.0.0.1:{_free_port()}",
            "--serve-cmd",
            cmd,
            "--out",
            str(tmp_path / "p"),
            *GRID,
        ],
    )
    assert result.exit_code == 2 and "exited (code 3)" in result.output and "no GPU found" in result.output
