"""`make bench` (simulator part): requests and simulated seconds per wall-second, and peak memory.

- Mooncake conversation trace (data/raw/mooncake, 12,031 rows; 12,030 after cleaning) on 4 and 8
  replicas of Llama-3.1-8B / H100 TP1, KV blocks from the memory plan, least-outstanding-tokens routing;
  with the catalog-derived LinearStepModel stand-in (timed inline with plain floats) and with the
  roofline model (`build_step_model`; the StepTimer compiles it to `CompiledRoofline` tables, same
  step times to ~1e-15). The roofline rows also give their wall time relative to the linear one.
  Each row runs twice: with the Python sources (a child with LLMCAP_SIM_PURE=1) and with the
  mypyc-compiled core `make setup` builds (`x source`: wall time relative to the sources).
- 1,000,000 synthetic requests (jointly resampled from Mooncake, written once to .work/bench/, Poisson
  at 2 x the source rate (8 replicas: twice the 4-replica load)) on 8 replicas with the compiled core,
  simulated in a child process so its peak RSS is the simulation's (synthesis peaks on its own).
Each wall time is the best of 3 runs (the 1M run: one).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks._timing import best_of
from llmcap.catalog import get_gpu, load_model
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.memory import plan_memory
from llmcap.parallelism import Parallelism
from llmcap.perf import build_step_model
from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.standin import analytic_step_model
from llmcap.sim.workload import SIM_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
CONVERSATION = ROOT / "data/raw/mooncake/conversation_trace.jsonl"
MODEL, GPU = "Llama-3.1-8B", "h100"
SYNTH_N = 1_000_000
SYNTH_FILE = ROOT / ".work" / "bench" / "mooncake_synth_1m.parquet"


def _config(replicas: int) -> SimConfig:
    spec, g = load_model(MODEL), get_gpu(GPU)
    blocks = plan_memory(spec, g, Parallelism(tp=1)).kv_blocks_per_rank
    engine = EngineConfig(num_blocks=blocks, kv_bytes_per_token=spec.kv_bytes_per_token(kv_dtype_bytes("bf16")))
    return SimConfig(engine=engine, replicas=replicas)


def _conversation():
    from llmcap.trace import ingest

    return ingest(CONVERSATION).trace


def synthetic_trace() -> None:
    """Run in a child (synthesis has its own memory peak): write the 1M-request trace once."""
    from llmcap.config import ArrivalSpec
    from llmcap.trace import mean_rate, synthesize, write_table

    source = _conversation()
    trace = synthesize(source, SYNTH_N, ArrivalSpec(rate_rps=2 * mean_rate(source), seed=0), np.random.default_rng(0))
    write_table(trace, SYNTH_FILE)


def synthetic_child() -> None:
    """Run in a child: load the 1M trace, simulate, print one JSON line with the figures."""
    from llmcap.sim import CORE
    from llmcap.trace import load_trace

    trace = load_trace(SYNTH_FILE, columns=SIM_COLUMNS)
    start = time.perf_counter()
    r = simulate(trace, analytic_step_model(MODEL, GPU), _config(8), rng=np.random.default_rng(0))
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "wall_s": wall,
                "sim_s": r.summary["duration_s"],
                "completed": r.summary["completed"],
                "peak_bytes": peak,
                "core": CORE,
            }
        )
    )


def mooncake_rows() -> list[dict]:
    """Every (step model, replicas) row on the Mooncake conversation trace with this process's core."""
    from llmcap.sim import CORE

    trace = _conversation()
    models = {"linear stand-in": analytic_step_model(MODEL, GPU), "roofline": build_step_model(MODEL, GPU)}
    rows = []
    for name, model in models.items():
        for replicas in (4, 8):
            cfg = _config(replicas)
            wall, r = best_of(lambda m=model, c=cfg: simulate(trace, m, c, rng=np.random.default_rng(0)))
            s = r.summary
            rows.append(
                {
                    "core": CORE,
                    "model": name,
                    "replicas": replicas,
                    "wall_s": wall,
                    "requests": trace.num_rows,
                    "sim_s": s["duration_s"],
                    "completed": s["completed"],
                    "ttft_p99_ms": s["ttft_ms"]["p99"],
                }
            )
    return rows


def _child(flag: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim", flag],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env={**os.environ, **env},
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    # the sources first, in a child (LLMCAP_SIM_PURE=1), then this process's (compiled) core
    rows = json.loads(_child("--mooncake", LLMCAP_SIM_PURE="1")) + mooncake_rows()
    print(f"simulator: Mooncake conversation ({rows[0]['requests']:,} requests), {MODEL} on {GPU} TP1")
    print(
        f"{'core':<7} {'step model':<16} {'replicas':>8} {'wall s':>8} {'req/wall-s':>11} {'sim-s/wall-s':>13} {'completed':>10}"
        f" {'ttft p99 ms':>12} {'x linear':>9} {'x source':>9}"
    )
    wall = {(r["core"], r["model"], r["replicas"]): r["wall_s"] for r in rows}
    for r in rows:
        lin = wall[(r["core"], "linear stand-in", r["replicas"])]
        src = wall[("source", r["model"], r["replicas"])]
        print(
            f"{r['core']:<7} {r['model']:<16} {r['replicas']:>8} {r['wall_s']:>8.3f} {r['requests'] / r['wall_s']:>11,.0f}"
            f" {r['sim_s'] / r['wall_s']:>13,.0f} {r['completed']:>10,} {r['ttft_p99_ms']:>12,.0f} {r['wall_s'] / lin:>9.2f}"
            f" {r['wall_s'] / src:>9.2f}"
        )
    if not SYNTH_FILE.exists():
        subprocess.run([sys.executable, "-m", "benchmarks.sim", "--make-synthetic"], cwd=ROOT, check=True)
    f = json.loads(_child("--synthetic"))
    print(
        f"simulator: {SYNTH_N:,} synthetic requests, 8 replicas, linear stand-in, {f['core']} core: {f['wall_s']:.1f} s wall, "
        f"{SYNTH_N / f['wall_s']:,.0f} req/wall-s, {f['sim_s'] / f['wall_s']:,.0f} sim-s/wall-s, "
        f"peak RSS {f['peak_bytes'] / 2**30:.2f} GiB = {f['peak_bytes'] / 1e9:.2f} GB (whole child process: imports, "
        f"trace loaded from Parquet ({', '.join(SIM_COLUMNS)}), simulation and its outputs)"
    )


if __name__ == "__main__":
    if "--make-synthetic" in sys.argv:
        synthetic_trace()
    elif "--synthetic" in sys.argv:
        synthetic_child()
    elif "--mooncake" in sys.argv:
        print(json.dumps(mooncake_rows()))
    else:
        main()
