"""The waiting queue of one replica, by scheduling policy (vLLM v1's `create_request_queue`,
vllm/v1/core/sched/request_queue.py; `--scheduling-policy`):

- `fcfs`: arrival order; a preempted request goes back to the front; the newest running request is the
  one preempted when blocks run out.
- `priority`: a request's `priority` first (lower first, vLLM's convention), then arrival; a preempted
  request is re-queued by that order; the preemption victim is the running request last in it
  (vLLM: `max(self.running, key=lambda r: (r.priority, r.arrival_time))`).

The scheduler (`engine.Replica`) only peeks, pops, adds and puts back; it never reaches into the queue.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush

from llmcap.policy_names import known_queue
from llmcap.sim.request import Req


class RequestQueue:
    """Waiting requests in scheduling order. This base is FCFS."""

    def __init__(self) -> None:
        self.fifo: deque[Req] = deque()

    def add(self, req: Req) -> None:
        """A request arrived (or its KV landed, P/D)."""
        self.fifo.append(req)

    def peek(self) -> Req:
        return self.fifo[0]

    def pop(self) -> Req:
        return self.fifo.popleft()

    def put_back(self, req: Req) -> None:
        """A preempted request: first in line again."""
        self.fifo.appendleft(req)

    def put_back_all(self, reqs: list[Req]) -> None:
        """Requests taken off the head and skipped this step (LoRA limit), in the order they were taken."""
        self.fifo.extendleft(reversed(reqs))

    def size(self) -> int:
        return len(self.fifo)

    def requests(self) -> list[Req]:
        return list(self.fifo)

    def victim(self, running: dict[int, Req]) -> Req:
        """The running request to preempt when blocks run out: the newest (`running` is in admission order)."""
        return running[next(reversed(running))]


class PriorityQueue(RequestQueue):
    """Lower `priority` first, then arrival (the trace's order, `Req.i`)."""

    def __init__(self) -> None:
        super().__init__()
        self.heap: list[tuple[int, int, Req]] = []

    def add(self, req: Req) -> None:
        heappush(self.heap, (req.priority, req.i, req))

    def peek(self) -> Req:
        return self.heap[0][2]

    def pop(self) -> Req:
        return heappop(self.heap)[2]

    def put_back(self, req: Req) -> None:
        self.add(req)

    def put_back_all(self, reqs: list[Req]) -> None:
        for req in reqs:
            self.add(req)

    def size(self) -> int:
        return len(self.heap)

    def requests(self) -> list[Req]:
        return [entry[2] for entry in sorted(self.heap, key=lambda e: (e[0], e[1]))]

    def victim(self, running: dict[int, Req]) -> Req:
        best: Req | None = None
        for req in running.values():  # the last in queue order; of equals, the newest admitted
            if best is None or (req.priority, req.i) >= (best.priority, best.i):
                best = req
        assert best is not None
        return best


def create_request_queue(policy: str) -> RequestQueue:
    """The waiting queue of a scheduling policy (`EngineConfig.scheduling_policy`)."""
    return PriorityQueue() if known_queue(policy) == "priority" else RequestQueue()
