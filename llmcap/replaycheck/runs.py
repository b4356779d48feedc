"""The replay runs: each seed's share of a window of the trace (`llmcap.replaycheck.share`) at each scale of the
load the check brackets, measured against an endpoint (open loop, `llmcap.live.trace_replay`) and predicted by
the simulator, as request records.

Both record tables have the shared request schema (`llmcap.sim.records.REQUEST_SCHEMA`) plus `run` (the
scale, e.g. "0.8x") and `excerpt_seed`; times are on the run's clock (its first arrival is 0).
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
from llmcap.replaycheck.share import Share
from llmcap.sim import SimConfig, simulate
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.sizing.simeval import excerpt

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
    rate_rps: float  # the unit's mean rate over the run's window
    requests: pa.Table  # the run's requests, first arrival at 0
    prompt_seed: int  # token ids of its prompts: unique per run, so no run hits the prefix cache an earlier run filled
    traffic: str  # how the requests were drawn from the trace (`plan_runs`)


@dataclass(frozen=True)
class Measured:
    run: Run
    records: pa.Table  # RECORD_SCHEMA, simulated-clock seconds
    lateness_ms: dict[str, float]  # wall-clock send lateness p50 / p99 / max
    valid: bool  # every send within the lateness bound
    wall_s: float


def _from_zero(table: pa.Table) -> pa.Table:
    arrival = table.column("arrival_s").to_numpy()
    return table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arrival - arrival[0]))


def plan_runs(
    trace: pa.Table,
    share: Share,
    load: float,
    scales: list[float],
    seeds: list[int],
    requests: int,
) -> list[Run]:
    """Each seed's run at each scale x `load` (a multiple of the planning rate): the unit's share of one window of
    the trace (`Share`), the window holding about `requests` of them and the same window at
    every scale. One server serves every run in turn or each run has its own: each run's prompts get their own
    token ids (equal hash blocks still share tokens within the run), so its cache starts as cold as the
    simulator's."""
    window = share.window(requests)
    runs: list[Run] = []
    for seed in seeds:
        part = excerpt(share.on_clock(trace, seed), window, seed)
        for scale in scales:
            taken, span, how = share.take(part, scale * load, seed)
            rate = taken.num_rows / span
            traffic = f"{how} of {part.num_rows:,} trace requests at {scale * load:.3g}x the planning rate"
            runs.append(
                Run(run_label(scale), scale, seed, rate, _from_zero(taken), prompt_seed=len(runs), traffic=traffic)
            )
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


@dataclass(frozen=True)
class Client:
    """How runs are sent: `dilation` wall seconds per simulated second of a time-dilated twin (1: real time);
    `timeout_s` and `max_drain_s` in simulated seconds."""

    dilation: float
    block_tokens: int | None
    vocab_size: int
    timeout_s: float
    max_drain_s: float
    max_lateness_ms: float
    api_key: str | None = None


async def _measure(run: Run, endpoint: str, model: str, client: Client) -> Measured:
    t = run.requests
    c = client
    result = await replay_async(
        endpoint,
        model,
        t.column("arrival_s").to_numpy(),
        t.column("isl").to_numpy(),
        t.column("osl").to_numpy(),
        request_id=t.column("request_id").to_numpy(),
        rate_scale=1.0 / c.dilation,
        hash_ids=_run_hashes(t, run.prompt_seed),
        block_tokens=c.block_tokens,
        vocab_size=c.vocab_size,
        seed=run.prompt_seed,
        timeout_s=c.timeout_s * c.dilation,
        api_key=c.api_key,
        max_drain_s=c.max_drain_s * c.dilation,
    )
    records = result.requests
    for name in TIME_COLUMNS:  # wall seconds -> simulated seconds
        i = records.schema.get_field_index(name)
        records = records.set_column(i, name, pc.divide(records.column(name).cast(pa.float64()), c.dilation))
    late = result.lateness_s * 1e3
    lateness = {"p50": float(np.percentile(late, 50)), "p99": float(np.percentile(late, 99)), "max": float(late.max())}
    return Measured(run, _tagged(records, run), lateness, lateness["max"] <= c.max_lateness_ms, result.wall_s)


def measure(runs: list[Run], endpoints: list[str], model: str, client: Client) -> list[Measured]:
    """Replay `runs` open loop, every request a row whatever happened to it: all at once in one event loop when
    each run has an endpoint of its own (`endpoints[i]` serves `runs[i]`: one twin per run), else one after
    another against the one endpoint."""
    if len(set(endpoints)) == len(runs) == len(endpoints):

        async def together() -> list[Measured]:
            return list(
                await asyncio.gather(*(_measure(r, e, model, client) for r, e in zip(runs, endpoints, strict=True)))
            )

        return asyncio.run(together())
    (endpoint,) = set(endpoints)
    return [asyncio.run(_measure(r, endpoint, model, client)) for r in runs]
