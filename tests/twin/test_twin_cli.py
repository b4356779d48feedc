"""`llmcap twin serve`: user errors are one line and exit 2; a simulated crash ends the process with
exit 3 (started as a real process on 127.0.0.1, stopped by PID if the test fails first)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import httpx
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "no-such-model", "-g", "h100"], "no-such-model"),
        (["-m", "Llama-3.1-8B", "-g", "h100", "--pd", "0:2"], "--pd must be P:D"),
        (["-m", "Llama-3.1-8B", "-g", "h100", "--router", "random"], "--router must be one of"),
        (["-m", "Llama-3.1-70B", "-g", "h100", "--tp", "1"], "does not fit"),
    ],
)
def test_user_errors_are_one_line(args, message):
    result = CliRunner().invoke(app, ["twin", "serve", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_crash_ends_the_process_with_exit_3():
    cmd = [
        sys.executable,
        "-m",
        "llmcap",
        "twin",
        "serve",
        "-m",
        "Llama-3.1-8B",
        "-g",
        "h100",
        "--pd",
        "1:1",
        "--port",
        "0",
        "--crash-after",
        "1",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        line = proc.stdout.readline() if ready else ""
        assert "simulated, not a measurement" in line and "P/D 1:1" in line, line
        url = line.strip().rsplit(" ", 1)[-1]
        body = {"prompt": list(range(100)), "max_tokens": 4, "stream": True}
        first = httpx.post(f"{url}/v1/completions", json=body, timeout=10.0)
        assert first.status_code == 200 and first.text.endswith("data: [DONE]\n\n")
        with pytest.raises(httpx.TransportError):  # the second request kills it: its connection is cut
            httpx.post(f"{url}/v1/completions", json=body, timeout=10.0)
        assert proc.wait(15) == 3
        assert "simulated crash" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
