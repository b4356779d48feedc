"""The closed-loop sender: N clients, each sending its next request as soon as its last one has ended.

This is how a product with N concurrent users loads a server (vLLM bench's `--max-concurrency` with no rate),
and it is not a capacity measurement: a slow server slows its own clients, so overload shows as a lower
request rate instead of a growing queue (back-pressure hides it). Capacity is decided open loop
(`llmcap.live.openloop`); this describes concurrency. The trace gives the requests and their order; its
arrival times are not used.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import numpy as np

from llmcap.live.client import StreamResult
from llmcap.live.openloop import Schedule, Sent
from llmcap.live.wire import Connector

CAVEAT = (
    "closed loop: a slow server slows its clients (back-pressure hides overload), so this describes that many "
    "concurrent users, not capacity; capacity is measured open loop"
)


async def send_closed_loop(
    connector: Connector,
    schedule: Schedule,
    clients: int,
    t0: float,
    timeout_s: float,
    on_done: Callable[[], None] | None = None,
) -> Sent:
    """From `t0` (perf_counter seconds), `clients` clients take the schedule's requests in its time order, each
    sending the next one when its last one ended; every request stamps its own send time."""
    if clients < 1:
        raise ValueError("clients must be >= 1")
    results = [
        StreamResult(sent_s=0.0, isl=int(n), max_tokens=int(m))
        for n, m in zip(schedule.isl, schedule.max_tokens, strict=True)
    ]
    queue = iter(
        np.argsort(np.asarray(schedule.due_s, dtype=np.float64), kind="stable").tolist()
    )  # shared: one loop, no lock

    async def client() -> None:
        for k in queue:
            results[k].sent_s = time.perf_counter()
            await connector.exchange(schedule.requests[k], results[k], timeout_s)
            if on_done is not None:
                on_done()

    cpu0 = time.process_time()
    gc.freeze()
    try:
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        await asyncio.gather(*(client() for _ in range(min(clients, len(results)))))
    finally:
        gc.unfreeze()
    return Sent(results, time.process_time() - cpu0)
