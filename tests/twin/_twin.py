"""A twin in this test's event loop or a `llmcap twin serve` process (127.0.0.1, any free port; stopped
when the block ends), and the deployment the twin tests simulate."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from typing import Any

from llmcap.catalog import get_gpu, load_model
from llmcap.deployment import EngineOptions, sim_config, step_model
from llmcap.perf.model import StepTimeModel
from llmcap.sim import SimConfig
from llmcap.twin import Twin, TwinSpec
from tests.conftest import ROOT

SERVED = "twin-under-test"
FAST = ("Llama-3.1-8B", "H100-SXM-80GB", 1)  # decode steps of ~7 ms: fault tests finish in seconds


@cache
def deployment(model: str, gpu: str, tp: int, max_num_seqs: int = 256) -> tuple[SimConfig, StepTimeModel]:
    """What `llmcap twin serve` / `llmcap simulate` build for these options."""
    cfg = sim_config(load_model(model), get_gpu(gpu), EngineOptions(tp=tp, max_num_seqs=max_num_seqs))
    return cfg, step_model(model, gpu, tp, "bf16", "bf16")


def spec(**knobs: Any) -> TwinSpec:
    cfg, step = deployment(*FAST)
    return TwinSpec(
        config=cfg,
        step_model=step,
        served_model_name=SERVED,
        info={"model": FAST[0], "gpu": FAST[1]},
        max_model_len=cfg.engine.max_model_len,
        **knobs,
    )


@asynccontextmanager
async def running_twin(**knobs: Any) -> AsyncIterator[Twin]:
    twin = Twin(spec(**knobs))
    await twin.start("127.0.0.1", 0)
    try:
        yield twin
    finally:
        await twin.stop()


@contextmanager
def twin_server(*args: str, startup_s: float = 60.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """`llmcap twin serve --port 0 ARGS` as its own process: (the process, its URL) once it prints the URL;
    stopped by its PID at the end (SIGTERM, then SIGKILL)."""
    cmd = [sys.executable, "-m", "llmcap", "twin", "serve", "--host", "127.0.0.1", "--port", "0", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], startup_s)
        line = proc.stdout.readline() if ready else ""
        assert "http://127.0.0.1:" in line and "not a measurement" in line, (
            f"the twin did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        )
        yield proc, line.strip().rsplit(" ", 1)[-1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
