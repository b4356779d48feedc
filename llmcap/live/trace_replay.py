"""Open-loop replay: send a trace's requests at their arrival times, whatever the server's state.

Open loop is what measures capacity (docs/domain.md): the arrival clock never waits for the server,
so overload shows up as queueing and tails instead of being hidden by back-pressure. The schedule
(`t0 + arrival_s / rate_scale`) is kept by `llmcap.live.openloop` with the lean client of
`llmcap.live.wire`; when one process cannot keep it, `llmcap.live.shards` deals it out to several.
`lateness_s` reports how late every send actually was: a run whose sends were late measured the
client, and `llmcap replay` flags it INVALID.

Prompts are token ids of exactly `isl` tokens and outputs exactly `osl` tokens (ignore_eos). When
the trace has `hash_ids` (prefix-block hashes) and `block_tokens` is given, equal hashes become
equal token blocks, so the server's prefix cache sees the trace's prefix reuse; otherwise every
prompt is unique. `api="chat"` posts /v1/chat/completions instead: a chat message is text, so each
token id becomes a common one-token word and the ISL is approximate (the row keeps the server's
`usage.prompt_tokens` when it reports it).

The output is a table with exactly `llmcap.sim.records.REQUEST_SCHEMA`. What a client cannot
observe is null: admitted_s, queue_s, prefill_s, transfer_s, visible_wait_s and the replica
columns; cached_tokens, host_cached_tokens and preemptions are 0 (non-null in the schema; the
engine's /metrics carries their totals). Plus every token gap of every request (`itls`).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from llmcap.live.client import StreamResult
from llmcap.live.closedloop import send_closed_loop
from llmcap.live.openloop import Schedule, Sent, send_on_schedule
from llmcap.live.prompts import APIS, prompts, request_body
from llmcap.live.shards import send_sharded
from llmcap.live.wire import Connector, Endpoint
from llmcap.sim.records import REQUEST_SCHEMA

LEAD_S = 0.05  # from the last preparation to the first send (one process)
# Sends one process keeps within a few ms of schedule on a 2-core box shared with the server under
# test (benchmarks/loadgen.py measures it); `processes=None` gives a schedule one process per this many
# req/s at its busiest second.
RATE_PER_PROCESS = 800.0


@dataclass(frozen=True)
class ReplayResult:
    requests: pa.Table  # REQUEST_SCHEMA, one row per trace request, in trace order
    itls: np.ndarray  # every inter-token gap of every request (seconds)
    lateness_s: np.ndarray  # actual send time - scheduled arrival, per request
    wall_s: float
    processes: int = 1  # load generator processes that sent the schedule
    client_cpu_s: float = 0.0  # their CPU time over the run, summed: the generator's own cost
    clients: int | None = None  # closed loop: that many clients (`llmcap.live.closedloop`); None: open loop


def peak_rate(arrival_s: np.ndarray, window_s: float = 1.0) -> float:
    """The most sends in any `window_s` of the schedule, per second."""
    t = np.sort(np.asarray(arrival_s, dtype=np.float64))
    if t.size == 0:
        return 0.0
    ends = np.searchsorted(t, t + window_s, side="left")
    return float((ends - np.arange(t.size)).max()) / window_s


def processes_for(arrival_s: np.ndarray) -> int:
    """Processes for a schedule: one per RATE_PER_PROCESS of its peak rate, at most one per usable core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, math.ceil(peak_rate(arrival_s) / RATE_PER_PROCESS)))


def request_row(rid: int, arrival: float, sent: float, r: StreamResult, t0: float) -> tuple[dict, np.ndarray]:
    """One REQUEST_SCHEMA row for a request as the client saw it (times from t0), and its token gaps."""
    gaps = r.itls()
    itl = np.percentile(gaps, [50, 99]) if gaps.size else None  # one call: numpy's overhead is per call
    first = None if r.first_token_s is None else r.first_token_s - t0
    finish = None if r.finish_s is None else r.finish_s - t0
    osl = r.tokens
    status = r.status if r.status != "ok" else ("ok" if osl >= r.max_tokens else "unfinished")
    if status == "rejected":
        first = finish = None
    row = {
        "request_id": rid,
        "arrival_s": sent - t0,
        "admitted_s": None,
        "first_token_s": first,
        "finish_s": finish,
        "isl": r.prompt_tokens or r.isl,
        "osl": osl,
        "cached_tokens": 0,
        "host_cached_tokens": 0,
        "preemptions": 0,
        "prefill_replica": None,
        "decode_replica": None,
        "queue_s": None,
        "prefill_s": None,
        "transfer_s": None,
        "visible_wait_s": None,
        "decode_s": None if first is None or finish is None else finish - first,
        "ttft_s": None if first is None else first - (sent - t0),
        "tpot_s": (finish - first) / (osl - 1) if first is not None and finish is not None and osl > 1 else None,
        "e2e_s": None if finish is None else finish - (sent - t0),
        "itl_p50_s": float(itl[0]) if itl is not None else None,
        "itl_p99_s": float(itl[1]) if itl is not None else None,
        "itl_max_s": float(gaps.max()) if gaps.size else None,
        "status": status,
    }
    return row, gaps


async def replay_async(
    base_url: str,
    model: str,
    arrival_s: np.ndarray,
    isl: np.ndarray,
    osl: np.ndarray,
    *,
    request_id: np.ndarray | None = None,
    rate_scale: float = 1.0,
    hash_ids: list | None = None,
    block_tokens: int | None = None,
    vocab_size: int = 1000,
    seed: int = 0,
    timeout_s: float = 600.0,
    api_key: str | None = None,
    on_done: Callable[[], None] | None = None,
    processes: int | None = None,
    api: str = "completions",
    max_drain_s: float | None = None,
    clients: int | None = None,
) -> ReplayResult:
    """`on_done` is called as each request ends (a progress bar's tick); `processes`: how many send the
    schedule (None: `processes_for` decides); `api`: "completions" or "chat" (`llmcap.live.prompts`);
    `max_drain_s`: requests still streaming this long after the last send are cut (`unfinished`);
    `clients`: closed loop instead, that many clients in one process (`llmcap.live.closedloop`)."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be > 0")
    if processes is not None and processes < 1:
        raise ValueError("processes must be >= 1")
    arrival = (np.asarray(arrival_s, dtype=np.float64) - float(np.min(arrival_s))) / rate_scale
    isl, osl = np.asarray(isl, dtype=np.int64), np.asarray(osl, dtype=np.int64)
    rid = np.arange(arrival.size) if request_id is None else np.asarray(request_id, dtype=np.int64)
    endpoint = Endpoint.from_url(base_url, api_key)
    path = APIS[api] if api in APIS else request_body(api, model, [], 1).decode()  # request_body names the bad api
    requests = [
        endpoint.request(path, request_body(api, model, p, int(m)), int(i))
        for p, m, i in zip(
            prompts(isl, hash_ids, block_tokens, vocab_size, seed), osl.tolist(), rid.tolist(), strict=True
        )
    ]
    schedule = Schedule(arrival, requests, isl, osl)
    if clients is not None:
        connector = Connector(endpoint)
        await connector.resolve()
        t0 = time.perf_counter() + LEAD_S
        sent = await send_closed_loop(connector, schedule, clients, t0, timeout_s, on_done)
        sent_at = np.array([r.sent_s for r in sent.results], dtype=np.float64)
        # no schedule to be late for: each request's own send is its arrival
        return replace(_result(sent, sent_at - t0, rid, t0, time.perf_counter() - t0, 1), clients=clients)
    n = processes or processes_for(arrival)
    if n == 1:
        connector = Connector(endpoint)
        await connector.resolve()
        t0 = time.perf_counter() + LEAD_S
        sent = await send_on_schedule(connector, schedule, t0, timeout_s, on_done, max_drain_s)
    else:
        t0, sent = await _sharded(endpoint, schedule, n, timeout_s, on_done, max_drain_s)
    wall = time.perf_counter() - t0
    return _result(sent, arrival, rid, t0, wall, n)


async def _sharded(
    endpoint: Endpoint,
    schedule: Schedule,
    n: int,
    timeout_s: float,
    on_done: Callable[[], None] | None,
    max_drain_s: float | None,
) -> tuple[float, Sent]:
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def ticks(count: int) -> None:  # called in the collecting thread: hand the ticks to this loop
        if on_done is not None:
            for _ in range(count):
                loop.call_soon_threadsafe(on_done)

    try:
        t0, sent, _ = await loop.run_in_executor(
            None, send_sharded, endpoint, schedule, n, timeout_s, stop, ticks, max_drain_s
        )
    finally:
        stop.set()  # cancelled: the thread terminates the processes
    return t0, sent


def _result(sent: Sent, arrival: np.ndarray, rid: np.ndarray, t0: float, wall: float, processes: int) -> ReplayResult:
    rows, gaps = [], []
    sent_at = np.array([r.sent_s for r in sent.results], dtype=np.float64)
    for i, r in enumerate(sent.results):
        row, g = request_row(int(rid[i]), float(arrival[i]), float(sent_at[i]), r, t0)
        rows.append(row)
        gaps.append(g)
    table = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)
    return ReplayResult(
        table, np.concatenate(gaps) if gaps else np.empty(0), sent_at - t0 - arrival, wall, processes, sent.cpu_s
    )


def replay(base_url: str, model: str, trace: pa.Table, rate_scale: float = 1.0, **kw) -> ReplayResult:
    """Replay a canonical trace table (arrival_s, isl, osl; request_id and hash_ids if present)."""
    names = trace.column_names
    return asyncio.run(
        replay_async(
            base_url,
            model,
            trace.column("arrival_s").to_numpy(),
            trace.column("isl").to_numpy(),
            trace.column("osl").to_numpy(),
            request_id=trace.column("request_id").to_numpy() if "request_id" in names else None,
            rate_scale=rate_scale,
            hash_ids=trace.column("hash_ids").to_pylist() if "hash_ids" in names else None,
            **kw,
        )
    )
