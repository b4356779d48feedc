"""`llmcap profile` tells by its exit code whether the profile holds every run (llmcap.exit_codes): against a
real `llmcap twin serve` process with injected errors, and against a port nothing listens on."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmcap import exit_codes
from llmcap.cli import app
from tests.twin._twin import twin_server

pytestmark = [pytest.mark.timeout(120)]
runner = CliRunner()
GRID = ["--isl", "16,32", "--concurrency", "1,2", "--repeats", "2", "--osl", "8", "--json"]


def _profile(url: str, out: Path, *extra: str):
    return runner.invoke(app, ["profile", "--endpoint", url, "--out", str(out), *GRID, *extra])


def test_failed_runs_fail_the_profile_unless_allowed(tmp_path: Path) -> None:
    with twin_server("-m", "Llama-3.1-8B", "-g", "h100", "--error-rate", "0.2", "--seed", "3") as (_, url):
        strict = _profile(url, tmp_path / "strict")
        lenient = _profile(url, tmp_path / "lenient", "--max-failed", "1")
    assert strict.exit_code == exit_codes.FAILED, strict.output
    s = json.loads(strict.stdout)
    assert 0 < s["failed_runs"] < 8 and s["valid"] is False and s["outcome"] == "FAILED"
    assert f"{s['failed_runs']} of 8 runs rejected or unfinished" in s["outcome_reason"]
    assert (tmp_path / "strict" / "fit.json").is_file()  # written from the runs that completed
    assert lenient.exit_code == 0, lenient.output
    assert json.loads(lenient.stdout)["valid"] is True


def test_every_run_failing_is_failed_and_writes_nothing(tmp_path: Path) -> None:
    with twin_server("-m", "Llama-3.1-8B", "-g", "h100", "--error-rate", "1") as (_, url):
        result = _profile(url, tmp_path / "p")
    assert result.exit_code == exit_codes.FAILED, result.output
    assert result.stderr.startswith(f"error: every request to {url} failed") and not (tmp_path / "p").exists()


def test_a_closed_port_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        named = _profile(url, tmp_path / "a", "--model", "m")  # the runs themselves find nothing listening
        unnamed = _profile(url, tmp_path / "b")  # the model lookup finds nothing listening
    for result in (named, unnamed):
        assert result.exit_code == exit_codes.UNREACHABLE, result.output
        assert "ConnectError" in result.stderr and "Traceback" not in result.stderr
