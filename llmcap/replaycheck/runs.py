"""The replay runs: each seed's excerpt of the trace at each scale of the predicted rate, measured against an
endpoint (open loop, `llmcap.live.trace_replay`) and predicted by the simulator, as request records.

Both record tables have the shared request schema (`llmcap.sim.records.REQUEST_SCHEMA`) plus `run` (the
scale, e.g. "0.8x") and `excerpt_seed`; times are on the excerpt's clock (its first arrival is 0).
A time-dilated twin (`dilation` wall seconds per simulated second) is replayed `1/dilation` times faster and its
measured times are divided by `dilation`, so they read in the simulated seconds the prediction uses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.live.trace_replay import replay_async
from llmcap.perf.model import StepTimeModel
from llmcap.sim import SimConfig, simulate
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.sizing.simeval import excerpt
from llmcap.trace.synth import scale_rate, spread_ties

RUN_COLUMNS = [pa.field("run", pa.string(), nullable=False), pa.field("excerpt_seed", pa.int64(), nullable=False)]
RECORD_SCHEMA = pa.schema([*REQUEST_SCHEMA, *RUN_COLUMNS])
TIME_COLUMNS = [f.name for f in REQUEST_SCHEMA if f.name.endswith("_s") and pa.types.is_floating(f.type)]


def run_label(scale: float) -> str:
    return f"{scale:g}x"


@dataclass(frozen=True)
class Run:
    label: str  # "0.8x"
    scale: float
    seed: int
    rate_rps: float
    requests: pa.Table  # the excerpt with arrivals at `rate_rps`, first arrival at 0
    prompt_seed: int  # token ids of its prompts: unique per run, so no run hits the prefix cache an earlier run filled


@dataclass(frozen=True)
class Measured:
    run: Run
    records: pa.Table  # RECORD_SCHEMA, simulated-clock seconds
    lateness_ms: dict[str, float]  # wall-clock send lateness p50 / p99 / max
    valid: bool  # every send within the lateness bound
    wall_s: float


def plan_runs(trace: pa.Table, rate_rps: float, scales: list[float], seeds: list[int], requests: int) -> list[Run]:
    """Each seed's excerpt (the same requests at every scale), its tied timestamps spread as the size stage does.
    One server serves every run in turn: each run's prompts get their own token ids (equal hash blocks still share
    tokens within the run), so its cache starts as cold as the simulator's."""
    runs: list[Run] = []
    for seed in seeds:
        part = spread_ties(excerpt(trace, requests, seed), np.random.default_rng(seed))
        for scale in scales:
            scaled = scale_rate(part, rate_rps * scale)
            arrival = scaled.column("arrival_s").to_numpy()
            scaled = scaled.set_column(
                scaled.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arrival - arrival[0])
            )
            runs.append(Run(run_label(scale), scale, seed, rate_rps * scale, scaled, prompt_seed=len(runs)))
    return runs


def _tagged(records: pa.Table, run: Run) -> pa.Table:
    n = records.num_rows
    records = records.select(REQUEST_SCHEMA.names).cast(REQUEST_SCHEMA)
    return records.append_column(RUN_COLUMNS[0], pa.array([run.label] * n, pa.string())).append_column(
        RUN_COLUMNS[1], pa.array(np.full(n, run.seed, dtype=np.int64))
    )


def predict(run: Run, config: SimConfig, step: StepTimeModel, decode_step: StepTimeModel | None) -> pa.Table:
    """The simulator's records of `run` (seeded by the excerpt's seed, as the size stage seeds its runs)."""
    result = simulate(run.requests, step, config, rng=np.random.default_rng(run.seed), decode_model=decode_step)
    return _tagged(result.records, run)


HASH_NAMESPACE = 1 << 40  # per-run offset of prefix hash ids (trace hash ids are far smaller)


def _run_hashes(requests: pa.Table, prompt_seed: int) -> list | None:
    """The run's prefix hash ids moved to its own namespace: equal within the run, disjoint from other runs'
    (a hash block always maps to the same tokens, whatever the prompt seed)."""
    if "hash_ids" not in requests.column_names:
        return None
    offset = prompt_seed * HASH_NAMESPACE
    return [None if h is None else [x + offset for x in h] for h in requests.column("hash_ids").to_pylist()]


def measure(
    run: Run,
    endpoint: str,
    model: str,
    *,
    dilation: float,
    block_tokens: int | None,
    vocab_size: int,
    timeout_s: float,
    max_drain_s: float,
    max_lateness_ms: float,
    api_key: str | None,
) -> Measured:
    """Replay `run` open loop against `endpoint`; every request is a row, whatever happened to it."""
    t = run.requests
    result = asyncio.run(
        replay_async(
            endpoint,
            model,
            t.column("arrival_s").to_numpy(),
            t.column("isl").to_numpy(),
            t.column("osl").to_numpy(),
            request_id=t.column("request_id").to_numpy(),
            rate_scale=1.0 / dilation,
            hash_ids=_run_hashes(t, run.prompt_seed),
            block_tokens=block_tokens,
            vocab_size=vocab_size,
            seed=run.prompt_seed,
            timeout_s=timeout_s * dilation,
            api_key=api_key,
            max_drain_s=max_drain_s * dilation,
        )
    )
    records = result.requests
    for name in TIME_COLUMNS:  # wall seconds -> simulated seconds
        i = records.schema.get_field_index(name)
        records = records.set_column(i, name, pc.divide(records.column(name).cast(pa.float64()), dilation))
    late = result.lateness_s * 1e3
    lateness = {"p50": float(np.percentile(late, 50)), "p99": float(np.percentile(late, 99)), "max": float(late.max())}
    return Measured(run, _tagged(records, run), lateness, lateness["max"] <= max_lateness_ms, result.wall_s)
