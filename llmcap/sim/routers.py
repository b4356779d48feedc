"""Routers: which replica of a pool gets a request. Ties always go to the lowest index.

- round_robin: in turn.
- least_outstanding_tokens: fewest tokens still to process (prompt left + output left), counting
  handoffs already on their way (P/D decode pool: `Replica.inbound`).
- power_of_two: two distinct replicas drawn from the run's seeded generator, the less loaded wins.
- prefix_aware: most prompt tokens already in the replica's prefix cache, minus a load penalty
  (score = hit tokens - penalty x outstanding tokens).
"""

from __future__ import annotations

import numpy as np

from llmcap.sim.engine import Replica, Req


class Router:
    def __init__(self, policy: str, pool: list[Replica], n_requests: int, rng: np.random.Generator | None, penalty: float) -> None:
        self.policy = policy
        self.pool = pool
        self.rr = 0
        self.penalty = penalty
        self.pairs: tuple[list[int], list[int]] | None = None
        if policy == "power_of_two" and len(pool) > 1:
            if rng is None:
                raise ValueError("power_of_two routing needs a numpy Generator")
            a = rng.integers(0, len(pool), size=n_requests)
            b = (a + 1 + rng.integers(0, len(pool) - 1, size=n_requests)) % len(pool)  # distinct from a
            self.pairs = (a.tolist(), b.tolist())

    def resized(self) -> None:
        """The pool list changed in place (an autoscaled pool)."""
        self.rr %= max(len(self.pool), 1)

    def load(self, j: int, t: float) -> int:
        r = self.pool[j]
        return r.outstanding_at(t) + r.inbound

    def choose(self, req: Req, t: float) -> int:
        n = len(self.pool)
        if n == 1:
            return 0
        policy = self.policy
        if policy == "round_robin":
            j = self.rr
            self.rr = (j + 1) % n
            return j
        if policy == "power_of_two" and self.pairs is not None:
            a, b = self.pairs[0][req.i], self.pairs[1][req.i]
            la, lb = self.load(a, t), self.load(b, t)
            return a if (la, a) <= (lb, b) else b
        if policy == "prefix_aware" and req.keys:  # (the cluster fetched the request's hashes for this)
            best, best_key = 0, None
            for j, r in enumerate(self.pool):
                r.sync(t)  # evictions up to t decide what is still cached
                load = self.load(j, t)
                key = (-(r.prefix_hit_tokens(req.keys, req.his, req.isl) - self.penalty * load), load, j)
                if best_key is None or key < best_key:
                    best, best_key = j, key
            return best
        loads = [self.load(j, t) for j in range(n)]
        return loads.index(min(loads))
