"""The open-loop sender: each request leaves at its scheduled time, whatever the server is doing.

One loop walks the schedule in time order, sleeps until the next send is due and starts it as a task;
it never waits for a response, so a stalled or overloaded server cannot delay a send (no coordinated
omission). Each request stamps its own send time when its task starts, so a busy client shows up as
send lateness (actual − scheduled) instead of silently shifting the load. Creating one sleeping task
per request up front instead cost the old replay its schedule: thousands of timers and tasks woke in
one loop iteration.

The objects alive before the run (prompts, modules) are frozen out of the collector's scans while it
lasts, so a full collection cannot stall the loop for tens of milliseconds mid-schedule.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmcap.live.client import StreamResult
from llmcap.live.wire import Connector


@dataclass
class Schedule:
    """What one process sends: request `k` goes out `due_s[k]` seconds after the shared zero."""

    due_s: np.ndarray
    requests: list[bytes]  # each request as it goes on the wire (`Endpoint.request`)
    isl: np.ndarray
    max_tokens: np.ndarray


@dataclass
class Sent:
    results: list[StreamResult]  # in schedule order; `sent_s` is when each request actually left
    cpu_s: float  # this process's CPU time over the run: the generator's own cost


async def send_on_schedule(
    connector: Connector,
    schedule: Schedule,
    t0: float,
    timeout_s: float,
    on_done: Callable[[], None] | None = None,
    max_drain_s: float | None = None,
) -> Sent:
    """Send every request at `t0 + due_s` (perf_counter seconds) and wait for all to end, or for
    `max_drain_s` after the last send: requests still streaming then are cut, `unfinished` ("run
    deadline") — the per-read timeout alone would let a server that trickles hold the run forever."""
    loop = asyncio.get_running_loop()
    due = t0 + np.asarray(schedule.due_s, dtype=np.float64)
    results = [
        StreamResult(sent_s=0.0, isl=int(n), max_tokens=int(m))
        for n, m in zip(schedule.isl, schedule.max_tokens, strict=True)
    ]

    async def one(k: int) -> None:
        results[k].sent_s = time.perf_counter()
        await connector.exchange(schedule.requests[k], results[k], timeout_s)
        if on_done is not None:
            on_done()

    tasks: dict[asyncio.Task[None], int] = {}
    cpu0 = time.process_time()
    gc.freeze()
    try:
        for k in np.argsort(due, kind="stable").tolist():
            wait = due[k] - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks[loop.create_task(one(k))] = k
        _, cut = await asyncio.wait(tasks, timeout=max_drain_s) if tasks else (set(), set())
        for t in cut:
            t.cancel()
        await asyncio.gather(*cut, return_exceptions=True)
        for t in cut:
            results[tasks[t]].status, results[tasks[t]].error = "unfinished", "run deadline"
        for t in tasks:
            if t not in cut and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]  # a bug, not a server fault: never swallowed
    finally:
        for t in tasks:
            t.cancel()  # only the unfinished ones (cancelled from outside): they drop their connections
        gc.unfreeze()
    return Sent(results, time.process_time() - cpu0)
