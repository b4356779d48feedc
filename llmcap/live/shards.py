"""Sending one schedule from several processes, when one interpreter cannot keep it.

The schedule is dealt out round robin in time order (send k goes to process k mod n), so each process
sends 1/n of the rate with the same shape. Every process runs its own event loop with
`llmcap.live.openloop.send_on_schedule` against the same zero `t0`: perf_counter is CLOCK_MONOTONIC,
system-wide on Linux, so the parent picks t0 once all are ready and their lateness is comparable.

Each process is a fresh interpreter running `_worker(FD)` talking over a socket pair (no inherited
loop, threads or locks, and unlike multiprocessing's spawn it never re-imports the caller's main
script); it reports progress every 0.2 s and is terminated by PID when the replay ends or is
cancelled. A process that dies is an error, never a silent gap in the records.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import cast

import numpy as np

from llmcap.errors import LlmcapError
from llmcap.live.client import StreamResult
from llmcap.live.openloop import Schedule, Sent, send_on_schedule
from llmcap.live.wire import Connector, Endpoint

LEAD_S = 0.1  # from "all ready" to the first send: time to hand every process its zero
START_TIMEOUT_S = 120.0  # a spawned process imports numpy and llmcap: seconds on a busy box
PROGRESS_S = 0.2
_WORKER = "import sys; from llmcap.live.shards import _worker; _worker(int(sys.argv[1]))"


def deal(schedule: Schedule, n: int) -> list[tuple[np.ndarray, Schedule]]:
    """n (positions in `schedule`, sub-schedule) pairs, round robin in send order."""
    order = np.argsort(schedule.due_s, kind="stable")
    out = []
    for j in range(n):
        pos = order[j::n]
        out.append(
            (
                pos,
                Schedule(
                    schedule.due_s[pos],
                    [schedule.requests[k] for k in pos.tolist()],
                    schedule.isl[pos],
                    schedule.max_tokens[pos],
                ),
            )
        )
    return out


def _worker(fd: int) -> None:
    conn = Connection(fd)
    endpoint, schedule, timeout_s, max_drain_s = conn.recv()
    asyncio.run(_work(conn, endpoint, schedule, timeout_s, max_drain_s))


async def _work(
    conn: Connection, endpoint: Endpoint, schedule: Schedule, timeout_s: float, max_drain_s: float | None
) -> None:
    connector = Connector(endpoint)
    await connector.resolve()
    conn.send("ready")
    t0 = conn.recv()
    finished = reported = 0

    def tick() -> None:
        nonlocal finished
        finished += 1

    async def report() -> None:
        nonlocal reported
        while True:
            await asyncio.sleep(PROGRESS_S)
            if finished > reported:
                conn.send(("progress", finished - reported))
                reported = finished

    reporter = asyncio.get_running_loop().create_task(report())
    sent = await send_on_schedule(connector, schedule, t0, timeout_s, tick, max_drain_s)
    reporter.cancel()
    conn.send(("progress", finished - reported))
    conn.send(("done", sent))


def send_sharded(
    endpoint: Endpoint,
    schedule: Schedule,
    n: int,
    timeout_s: float,
    stop: threading.Event,
    on_done: Callable[[int], None] | None = None,
    max_drain_s: float | None = None,
) -> tuple[float, Sent, list[float]]:
    """Blocking (run it in a thread). (t0, every result in `schedule` order with the CPU seconds of all
    processes summed, each process's CPU seconds). `stop` set: terminate the processes and raise."""
    parts = deal(schedule, n)
    conns: list[Connection] = []
    procs: list[subprocess.Popen] = []
    try:
        for _, part in parts:
            here, there = socket.socketpair()
            procs.append(
                subprocess.Popen([sys.executable, "-c", _WORKER, str(there.fileno())], pass_fds=[there.fileno()])
            )
            there.close()
            conns.append(Connection(here.detach()))
            conns[-1].send((endpoint, part, timeout_s, max_drain_s))
        for c in conns:
            _expect(c, stop, START_TIMEOUT_S)
        t0 = time.perf_counter() + LEAD_S
        for c in conns:
            c.send(t0)
        done: dict[int, Sent] = {}
        while len(done) < n:
            if stop.is_set():
                raise LlmcapError("the replay was cancelled")
            for c in cast(
                list[Connection], wait([c for i, c in enumerate(conns) if i not in done], timeout=PROGRESS_S)
            ):  # wait returns some of the objects it is given
                i = conns.index(c)
                msg = _recv(c, i)
                if msg[0] == "progress" and on_done is not None:
                    on_done(msg[1])
                elif msg[0] == "done":
                    done[i] = msg[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for c in conns:
            c.close()
    results: list[StreamResult | None] = [None] * len(schedule.requests)
    for i, (pos, _) in enumerate(parts):
        for k, r in zip(pos.tolist(), done[i].results, strict=True):
            results[k] = r
    cpu = [done[i].cpu_s for i in range(n)]
    return t0, Sent(results, sum(cpu)), cpu  # type: ignore[arg-type]


def _recv(c: Connection, i: int) -> tuple:
    try:
        return c.recv()
    except EOFError:
        raise LlmcapError(f"load generator process {i} died mid-run: its requests have no records") from None


def _expect(c: Connection, stop: threading.Event, timeout_s: float) -> None:
    end = time.perf_counter() + timeout_s
    while not c.poll(0.1):
        if stop.is_set() or time.perf_counter() > end:
            raise LlmcapError("a load generator process did not start in time")
    if _recv(c, -1) != "ready":
        raise LlmcapError("a load generator process did not start")
