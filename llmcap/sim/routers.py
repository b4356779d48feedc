"""Routers: which replica of a pool gets a request. Ties always go to the lowest index.

- round_robin: in turn.
- least_outstanding_tokens: fewest tokens still to process (prompt left + output left), counting
  handoffs already on their way (P/D decode pool: `Replica.inbound`).
- power_of_two: two distinct replicas drawn from the run's seeded generator (by arrival number), the less
  loaded wins.
- prefix_aware: most prompt tokens already in the replica's prefix cache, minus a load penalty
  (score = hit tokens - penalty x outstanding tokens).

A policy is one small class over a `ReplicaView` (what a router may read of the pool at the request's
time; it cannot change a replica), made from a `RouterSetup` and registered once by name
(`register_router`). A new policy is a class and one `register_router` call, in a file of its own;
the simulator, the twin and the configuration then know its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from llmcap.policy_names import BUILT_IN_ROUTERS, ROUTER_NAMES, known_router
from llmcap.sim.engine import Replica, Req


class ReplicaView:
    """A pool's replicas as a router sees them at time `t`: how loaded each is, and how much of a prompt
    each has cached. (Reading the cache first brings its lazily applied evictions up to t.)"""

    def __init__(self, pool: list[Replica]) -> None:
        self._pool = pool
        self.t = 0.0
        self.arrival = (
            0  # the request's arrival number (0, 1, ...: rejected requests counted): what per-request draws go by
        )

    def size(self) -> int:
        return len(self._pool)

    def load(self, j: int) -> int:
        """Tokens replica j still has to process, handoffs on their way to it included."""
        r = self._pool[j]
        return r.outstanding_at(self.t) + r.inbound

    def loads(self) -> list[int]:
        return [self.load(j) for j in range(len(self._pool))]

    def prefix_hit_tokens(self, j: int, req: Req) -> int:
        """Prompt tokens of `req` in replica j's prefix cache (the request's keys must be set)."""
        if req.keys is None:
            return 0
        r = self._pool[j]
        r.sync(self.t)
        return r.prefix_hit_tokens(req.keys, req.block_ends, req.isl)


@dataclass(frozen=True)
class RouterSetup:
    """What a policy is made from: the pool's size, the run's request count and generator, the config's
    prefix load penalty."""

    pool_size: int
    n_requests: int
    rng: np.random.Generator | None
    prefix_load_penalty: float


class RoutingPolicy(Protocol):
    needs_prefix_keys: bool  # the cluster fills `Req.keys`/`Req.block_ends` only for a policy that reads them

    def choose(self, view: ReplicaView, req: Req) -> int: ...

    def resized(self, pool_size: int) -> None: ...


def least_loaded(view: ReplicaView) -> int:
    loads = view.loads()
    return loads.index(min(loads))


class RoundRobin:
    needs_prefix_keys = False

    def __init__(self, setup: RouterSetup) -> None:
        self.next = 0

    def choose(self, view: ReplicaView, req: Req) -> int:
        j = self.next
        self.next = (j + 1) % view.size()
        return j

    def resized(self, pool_size: int) -> None:
        self.next %= max(pool_size, 1)


class LeastOutstandingTokens:
    needs_prefix_keys = False

    def __init__(self, setup: RouterSetup) -> None:
        pass

    def choose(self, view: ReplicaView, req: Req) -> int:
        return least_loaded(view)

    def resized(self, pool_size: int) -> None:
        pass


class PowerOfTwo:
    """Pairs for the run's `n_requests` arrivals drawn at once, by arrival number (a stream that goes on,
    as the twin's does, draws the next as many when they run out). A fixed pool: the config refuses it
    with autoscaling."""

    needs_prefix_keys = False

    def __init__(self, setup: RouterSetup) -> None:
        self.n = setup.pool_size
        self.batch = max(setup.n_requests, 1)
        self.rng = setup.rng
        self.base = 0  # arrival number of the first pair drawn last
        self.a: list[int] = []
        self.b: list[int] = []
        if self.n > 1:
            if setup.rng is None:
                raise ValueError("power_of_two routing needs a numpy Generator")
            self._draw()

    def _draw(self) -> None:
        rng, n, m = self.rng, self.n, self.batch
        assert rng is not None
        self.base += len(self.a)
        a = rng.integers(0, n, size=m)
        b = (a + 1 + rng.integers(0, n - 1, size=m)) % n  # distinct from a
        self.a, self.b = a.tolist(), b.tolist()

    def choose(self, view: ReplicaView, req: Req) -> int:
        if self.n <= 1:
            return least_loaded(view)
        while view.arrival - self.base >= len(self.a):
            self._draw()
        k = view.arrival - self.base
        a, b = self.a[k], self.b[k]
        la, lb = view.load(a), view.load(b)
        return a if (la, a) <= (lb, b) else b

    def resized(self, pool_size: int) -> None:
        pass


class PrefixAware:
    needs_prefix_keys = True

    def __init__(self, setup: RouterSetup) -> None:
        self.penalty = setup.prefix_load_penalty

    def choose(self, view: ReplicaView, req: Req) -> int:
        if not req.keys:  # no prefix hashes for this request (or prefix caching off)
            return least_loaded(view)
        best, best_key = 0, None
        for j in range(view.size()):
            hit = view.prefix_hit_tokens(j, req)
            load = view.load(j)
            key = (-(hit - self.penalty * load), load, j)
            if best_key is None or key < best_key:
                best, best_key = j, key
        return best

    def resized(self, pool_size: int) -> None:
        pass


ROUTERS: dict[str, Callable[[RouterSetup], RoutingPolicy]] = {}


def register_router(name: str, policy: Callable[[RouterSetup], RoutingPolicy]) -> None:
    """Make `policy` (a class taking a RouterSetup) available as `router: name` everywhere."""
    if name in ROUTERS and ROUTERS[name] is not policy:
        raise ValueError(f"router {name!r} is already registered")
    ROUTERS[name] = policy
    ROUTER_NAMES.add(name)


def unregister_router(name: str) -> None:
    """Forget a registered (not built-in) router."""
    if name in BUILT_IN_ROUTERS:
        raise ValueError(f"router {name!r} is built in")
    ROUTERS.pop(name, None)
    ROUTER_NAMES.drop(name)


BUILT_IN_POLICIES: dict[str, Callable[[RouterSetup], RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_outstanding_tokens": LeastOutstandingTokens,
    "power_of_two": PowerOfTwo,
    "prefix_aware": PrefixAware,
}
assert tuple(BUILT_IN_POLICIES) == BUILT_IN_ROUTERS  # one policy class per built-in name (llmcap.policy_names)
for _name, _policy in BUILT_IN_POLICIES.items():
    register_router(_name, _policy)


class Router:
    """A pool's routing: the named policy over a read-only view of the pool."""

    def __init__(
        self, policy: str, pool: list[Replica], n_requests: int, rng: np.random.Generator | None, penalty: float
    ) -> None:
        make = ROUTERS[known_router(policy)]
        self.name = policy
        self.view = ReplicaView(pool)
        self.policy = make(RouterSetup(len(pool), n_requests, rng, penalty))
        self.needs_prefix_keys = bool(self.policy.needs_prefix_keys)

    def resized(self) -> None:
        """The pool list changed in place (an autoscaled pool)."""
        self.policy.resized(self.view.size())

    def choose(self, req: Req, t: float, arrival: int) -> int:
        """Where `req` goes at t; `arrival`: its arrival number (`ReplicaView.arrival`)."""
        if self.view.size() == 1:
            return 0
        self.view.t = t
        self.view.arrival = arrival
        return self.policy.choose(self.view, req)


def handoff_router(front: str, pool: list[Replica], n_requests: int) -> Router:
    """The decode pool's router of a P/D deployment: in turn behind a round-robin front, else least loaded
    (prefill-side policies such as prefix affinity mean nothing to a decode pool)."""
    return Router("round_robin" if front == "round_robin" else "least_outstanding_tokens", pool, n_requests, None, 0.0)
