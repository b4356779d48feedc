"""Open-loop replay: send a trace's requests at their arrival times, whatever the server's state.

Open loop is what measures capacity (DESIGN.md §1): the arrival clock never waits for the server,
so overload shows up as queueing and tails instead of being hidden by back-pressure. Each request
is its own asyncio task started at `t0 + arrival_s / rate_scale`; the HTTP pool is large enough
that no request ever queues in the client (`lateness` reports how late sends actually were).

Prompts are token ids of exactly `isl` tokens and outputs exactly `osl` tokens (ignore_eos). When
the trace has `hash_ids` (prefix-block hashes) and `block_tokens` is given, equal hashes become
equal token blocks, so the server's prefix cache sees the trace's prefix reuse; otherwise every
prompt is unique.

The output is a table with exactly `llmcap.sim.records.REQUEST_SCHEMA`. What a client cannot
observe is null: admitted_s, queue_s, prefill_s, transfer_s, visible_wait_s and the replica
columns; cached_tokens, host_cached_tokens and preemptions are 0 (non-null in the schema; the
engine's /metrics carries their totals). Plus every token gap of every request (`itls`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from llmcap.live.client import FIRST_ORDINARY_ID, StreamResult, endpoint_client, stream_completion, token_prompt
from llmcap.sim.records import REQUEST_SCHEMA


@dataclass(frozen=True)
class ReplayResult:
    requests: pa.Table  # REQUEST_SCHEMA, one row per trace request, in trace order
    itls: np.ndarray  # every inter-token gap of every request (seconds)
    lateness_s: np.ndarray  # actual send time - scheduled arrival, per request
    wall_s: float


def _prompts(isl: np.ndarray, hash_ids: list | None, block_tokens: int | None, vocab_size: int, seed: int) -> list[list[int]]:
    out = []
    for i, n in enumerate(isl):
        unique = token_prompt(int(n), vocab_size, seed * 1_000_003 + i + 1)
        if hash_ids is None or block_tokens is None or not hash_ids[i]:
            out.append(unique)
            continue
        shared: list[int] = []
        for h in hash_ids[i]:  # a block hash always maps to the same tokens
            shared += token_prompt(block_tokens, vocab_size, (int(h) * 7919 + 17) % (2**63))
        prompt = (shared + unique)[: int(n)]
        # the tail past the shared blocks stays request-specific (unique tokens after them)
        out.append(prompt if len(prompt) == int(n) else prompt + [FIRST_ORDINARY_ID] * (int(n) - len(prompt)))
    return out


def _row(rid: int, arrival: float, sent: float, r: StreamResult, t0: float) -> tuple[dict, np.ndarray]:
    gaps = r.itls()
    first = None if r.first_token_s is None else r.first_token_s - t0
    finish = None if r.finish_s is None else r.finish_s - t0
    osl = r.tokens
    status = r.status if r.status != "ok" else ("ok" if osl >= r.max_tokens else "unfinished")
    if status == "rejected":
        first = finish = None
    row = {
        "request_id": rid, "arrival_s": sent - t0, "admitted_s": None, "first_token_s": first, "finish_s": finish,
        "isl": r.prompt_tokens or r.isl, "osl": osl, "cached_tokens": 0, "host_cached_tokens": 0, "preemptions": 0,
        "prefill_replica": None, "decode_replica": None, "queue_s": None, "prefill_s": None, "transfer_s": None,
        "visible_wait_s": None,
        "decode_s": None if first is None or finish is None else finish - first,
        "ttft_s": None if first is None else first - (sent - t0),
        "tpot_s": (finish - first) / (osl - 1) if first is not None and finish is not None and osl > 1 else None,
        "e2e_s": None if finish is None else finish - (sent - t0),
        "itl_p50_s": float(np.percentile(gaps, 50)) if gaps.size else None,
        "itl_p99_s": float(np.percentile(gaps, 99)) if gaps.size else None,
        "itl_max_s": float(gaps.max()) if gaps.size else None,
        "status": status,
    }
    return row, gaps


async def replay_async(
    base_url: str, model: str, arrival_s: np.ndarray, isl: np.ndarray, osl: np.ndarray, *,
    request_id: np.ndarray | None = None, rate_scale: float = 1.0, hash_ids: list | None = None,
    block_tokens: int | None = None, vocab_size: int = 1000, seed: int = 0, timeout_s: float = 600.0,
    api_key: str | None = None, on_done: Callable[[], None] | None = None,
) -> ReplayResult:
    """`on_done` is called as each request ends (a progress bar's tick)."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be > 0")
    arrival = (np.asarray(arrival_s, dtype=np.float64) - float(np.min(arrival_s))) / rate_scale
    isl, osl = np.asarray(isl, dtype=np.int64), np.asarray(osl, dtype=np.int64)
    rid = np.arange(arrival.size) if request_id is None else np.asarray(request_id, dtype=np.int64)
    prompts = _prompts(isl, hash_ids, block_tokens, vocab_size, seed)
    sent = np.zeros(arrival.size)

    base_url, client = endpoint_client(base_url, api_key, max_connections=max(64, 2 * arrival.size))
    async with client:
        t0 = time.perf_counter() + 0.05  # a moment to start all tasks before the first arrival

        async def one(i: int) -> StreamResult:
            await asyncio.sleep(max(0.0, t0 + arrival[i] - time.perf_counter()))
            sent[i] = time.perf_counter()
            result = await stream_completion(client, base_url, model, prompts[i], int(osl[i]), timeout_s)
            if on_done is not None:
                on_done()
            return result

        results = await asyncio.gather(*(one(i) for i in range(arrival.size)))
    wall = time.perf_counter() - t0
    rows, gaps = [], []
    for i, r in enumerate(results):
        r.sent_s = sent[i]  # the request left at its send time; StreamResult stamped the task's start
        row, g = _row(int(rid[i]), float(arrival[i]), float(sent[i]), r, t0)
        rows.append(row)
        gaps.append(g)
    table = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)
    return ReplayResult(table, np.concatenate(gaps) if gaps else np.empty(0), sent - t0 - arrival, wall)


def replay(base_url: str, model: str, trace: pa.Table, rate_scale: float = 1.0, **kw) -> ReplayResult:
    """Replay a canonical trace table (arrival_s, isl, osl; request_id and hash_ids if present)."""
    names = trace.column_names
    return asyncio.run(replay_async(
        base_url, model, trace.column("arrival_s").to_numpy(), trace.column("isl").to_numpy(),
        trace.column("osl").to_numpy(),
        request_id=trace.column("request_id").to_numpy() if "request_id" in names else None,
        rate_scale=rate_scale, hash_ids=trace.column("hash_ids").to_pylist() if "hash_ids" in names else None, **kw,
    ))
