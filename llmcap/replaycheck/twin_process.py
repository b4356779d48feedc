"""The unit's digital twin as a child process: `llmcap twin serve` on a free loopback port, stopped by its PID."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from llmcap.errors import LlmcapError

SERVED_MODEL = "llmcap-twin"
_URL = re.compile(r" at (http://\S+)\s*$")


@contextmanager
def serving_twin(args: list[str], dilation: float, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the base URL of `llmcap twin serve ARGS --port 0 --dilation D`; the process is ended (SIGTERM, then
    SIGKILL) by its PID when the block ends, whatever happened inside it."""
    cmd = [
        sys.executable,
        "-m",
        "llmcap",
        "twin",
        "serve",
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--dilation",
        f"{dilation:g}",
        "--served-model-name",
        SERVED_MODEL,
    ]
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally below); a file, not a pipe: a chatty twin never blocks on a full pipe
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        first: list[str] = []
        reader = threading.Thread(
            target=lambda: first.append(proc.stdout.readline() if proc.stdout else ""), daemon=True
        )
        reader.start()
        reader.join(start_timeout_s)
        match = _URL.search(first[0]) if first else None
        if match is None:
            proc.kill()
            proc.wait()
            log.seek(0)
            err = log.read().strip().splitlines()
            raise LlmcapError(
                f"the digital twin did not start ({' '.join(cmd[3:])}): {err[-1] if err else 'no output'}"
            )
        yield match.group(1)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout:
            proc.stdout.close()
        log.close()
