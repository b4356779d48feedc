"""What `llmcap profile` can measure of a worker's ready time (`llmcap.sizing.params.ReadyPhases`).

An engine it starts itself (`--serve-cmd`): process start → first healthy /health (HTTP 200) is the *model-ready*
time: the start-up phases after the pod runs (weights, engine init, compile/graphs), on this machine, with its
caches as they are. Schedule and image pull happen before the process exists, and router admission after the engine
is healthy, at the gateway: neither is seen from here, and the record says so. An endpoint it is given was
started by someone else: its model-ready time is not known, and the record says that too.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import httpx

from llmcap.credentials import redact_url
from llmcap.errors import LlmcapError

NOT_SEEN = {
    "pod_running": "not measured: scheduling and the image pull happen before the process exists (read them from the cluster's events)",
    "router_admitted": "not measured: admission happens at the gateway, after the engine is healthy (read it from the gateway's endpoint list)",
}


@dataclass(frozen=True)
class ReadyRecord:
    """The profile manifest's `ready` entry."""

    started_by_profile: bool
    model_ready_s: float | None  # process start → first healthy /health
    health_polls: int
    note: str

    def to_dict(self) -> dict:
        return asdict(self) | {"not_measured": NOT_SEEN}


def given_endpoint() -> ReadyRecord:
    return ReadyRecord(
        False,
        None,
        0,
        "the endpoint was already running (not started by llmcap profile): process start → first healthy "
        "/health is not seen; `llmcap profile --serve-cmd` starts the engine and times it",
    )


def wait_healthy(
    base_url: str, proc: subprocess.Popen, started: float, timeout_s: float, poll_s: float = 0.1
) -> ReadyRecord:
    """Poll `base_url`/health until it answers 200; the time from `started` (perf_counter at the process start)."""
    polls, shown = 0, redact_url(base_url)
    with httpx.Client(timeout=max(poll_s, 1.0)) as client:
        while True:
            polls += 1
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    ready = time.perf_counter() - started
                    return ReadyRecord(
                        True, ready, polls, f"process start → first healthy /health, polled every {poll_s:g} s"
                    )
            except httpx.TransportError:
                pass  # not listening yet
            if proc.poll() is not None:
                raise LlmcapError(f"the engine exited (code {proc.returncode}) before {shown}/health answered")
            if time.perf_counter() - started > timeout_s:
                raise LlmcapError(f"{shown}/health did not answer 200 within {timeout_s:g} s of the engine's start")
            time.sleep(poll_s)


@contextmanager
def started_engine(
    command: str, base_url: str, timeout_s: float = 1800.0, poll_s: float = 0.1
) -> Iterator[ReadyRecord]:
    """Start `command` (its own session: an engine spawns workers), wait until `base_url` is healthy, yield the record;
    the engine's process group is stopped when the block ends (SIGTERM, then SIGKILL), whatever happened inside it."""
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally below); a file, not a pipe: a chatty engine never blocks on a full pipe
    started = time.perf_counter()
    proc = subprocess.Popen(shlex.split(command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            record = wait_healthy(base_url, proc, started, timeout_s, poll_s)
        except LlmcapError as exc:
            log.seek(0)
            tail = log.read().strip().splitlines()[-3:]
            raise LlmcapError(f"{exc}{': ' + ' | '.join(tail) if tail else ''}") from None
        yield record
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)  # the group this process leads (start_new_session): its workers too
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
