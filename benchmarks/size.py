"""`make bench`: wall time of the full step-4 search, with the time of each of its phases.

Three traces, each over the pipeline's default candidate grid (data/processed/candidates.parquet) with
params.yaml's `size` section, on this machine's cores (`size.compute.workers` local processes, or in-process
with 1; run `make plan` first):
- the pipeline's own trace (data/interim/trace.parquet), on 1 and on 2 workers;
- a bursty trace nobody tuned the sizer on: 9,000 requests with the Azure conversation lengths on
  Markov-modulated arrivals at 2.6 req/s (1-second peaks about 25x the mean), on 2 workers;
- with LLMCAP_BENCH_SCALE=1 only (it takes minutes): one hour at 100 req/s (360,000 requests resampled from the
  pipeline's trace onto Poisson arrivals), on 2 workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.catalog import ModelSpec, load_model
from llmcap.config import load_params
from llmcap.sizing.executor import make_executor
from llmcap.sizing.params import SizeParams
from llmcap.sizing.plan import PHASES, size_deployments
from llmcap.trace import ingest, load_trace
from llmcap.trace.params import ArrivalSpec
from llmcap.trace.synth import synthesize

ROOT = Path(__file__).resolve().parent.parent
AZURE_CONV = ROOT / "data/raw/azure2023/AzureLLMInferenceTrace_conv.csv"
BURSTY = ArrivalSpec(process="mmpp", rate_rps=2.6, burst_share=0.02, burst_s=2.0, seed=0)


def _phase_timer() -> tuple[Callable[[int, int, str], None], dict[str, float]]:
    """An `on_phase` callback for `size_deployments` and the seconds it records per phase name."""
    times: dict[str, float] = {}
    began = [time.perf_counter()]

    def on_phase(done: int, total: int, name: str) -> None:
        now = time.perf_counter()
        if done > 0:
            times[PHASES[done - 1]] = now - began[0]
        began[0] = now

    return on_phase, times


def _timed(
    label: str, trace: pa.Table, candidates: pd.DataFrame, model: ModelSpec, size: SizeParams, workers: int
) -> None:
    size = size.model_copy(update={"compute": size.compute.model_copy(update={"workers": workers})})
    on_phase, phases = _phase_timer()
    t0 = time.perf_counter()
    with make_executor(size.compute) as ex:
        out = size_deployments(trace, candidates, model, size, ex, on_phase=on_phase)
    wall = time.perf_counter() - t0
    s = out.summary
    print(
        f"size search, {label} ({trace.num_rows:,} requests, {s['candidates_feasible']} feasible candidates, "
        f"{s['candidates_simulated']} simulated, {workers} worker(s)): {wall:.1f} s → {s['chosen']} ({s['mode']}), {s['gpus']} GPUs"
    )
    print("    " + " · ".join(f"{name.split(' (')[0]} {t:.1f} s" for name, t in phases.items()))
    for note in s["notes"]:  # a long trace: the span the checks replayed, and how the plan held on all of it
        if note.startswith("the whole-deployment checks"):
            print(f"    {note}")


def main() -> None:
    trace_path, cand_path = ROOT / "data/interim/trace.parquet", ROOT / "data/processed/candidates.parquet"
    if not (trace_path.exists() and cand_path.exists()):
        print("size search: skipped — run `make plan` first (needs the pipeline's trace and candidates)")
        return
    params = load_params(ROOT / "params.yaml")
    size, model = params.size, load_model(params.enumerate.model)
    trace, candidates = load_trace(trace_path), pq.read_table(cand_path).to_pandas()
    two = min(2, os.cpu_count() or 1)
    for workers in sorted({1, two}):
        _timed("the pipeline's trace", trace, candidates, model, size, workers)
    bursty = synthesize(ingest(AZURE_CONV).trace, 9000, BURSTY, np.random.default_rng(0))
    _timed("bursty MMPP, Azure conversation lengths", bursty, candidates, model, size, two)
    if os.environ.get("LLMCAP_BENCH_SCALE") == "1":
        hour = synthesize(
            trace, 360_000, ArrivalSpec(process="poisson", rate_rps=100.0, seed=0), np.random.default_rng(0)
        )
        _timed("one hour at 100 req/s", hour, candidates, model, size, two)
