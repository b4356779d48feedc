"""`make bench`: wall time of the full step-4 search on the default trace and candidate set.

Uses the pipeline's own inputs (run `make plan` first): data/interim/trace.parquet and
data/processed/candidates.parquet, with params.yaml's `size` section, on this machine's cores
(`size.compute.workers` local processes, or in-process with 1).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.parquet as pq

from llmcap.catalog import load_model
from llmcap.config import load_params
from llmcap.sizing.executor import make_executor
from llmcap.sizing.plan import size_deployments
from llmcap.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    trace_path, cand_path = ROOT / "data/interim/trace.parquet", ROOT / "data/processed/candidates.parquet"
    if not (trace_path.exists() and cand_path.exists()):
        print("size search: skipped — run `make plan` first (needs the pipeline's trace and candidates)")
        return
    params = load_params(ROOT / "params.yaml")
    trace, candidates = load_trace(trace_path), pq.read_table(cand_path).to_pandas()
    model = load_model(params.enumerate.model)
    for workers in sorted({1, min(2, os.cpu_count() or 1)}):
        compute = params.size.compute.model_copy(update={"workers": workers})
        size = params.size.model_copy(update={"compute": compute})
        t0 = time.perf_counter()
        with make_executor(size.compute) as ex:
            out = size_deployments(trace, candidates, model, size, ex)
        wall = time.perf_counter() - t0
        s = out.summary
        print(
            f"size search ({trace.num_rows:,} requests, {s['candidates_feasible']} feasible candidates, "
            f"{s['candidates_simulated']} simulated, {workers} worker(s)): {wall:.1f} s → {s['chosen']} ({s['mode']}), {s['gpus']} GPUs"
        )
