"""A new router is one class and one `register_router` call: the configuration accepts its name and the
simulator routes through it, over the same read-only view of the pool the built-in policies use."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from llmcap.sim import SimConfig, register_router, router_names, simulate, unregister_router
from llmcap.sim.routers import ReplicaView, RouterSetup
from tests.sim._workloads import MODEL, random_config, random_trace


class FirstReplica:
    """Everything to replica 0."""

    needs_prefix_keys = False

    def __init__(self, setup: RouterSetup) -> None:
        pass

    def choose(self, view: ReplicaView, req) -> int:
        return 0

    def resized(self, pool_size: int) -> None:
        pass


class FewestTokensAgain:
    """least_outstanding_tokens written again from the view alone (ties to the lowest index)."""

    needs_prefix_keys = False

    def __init__(self, setup: RouterSetup) -> None:
        pass

    def choose(self, view: ReplicaView, req) -> int:
        return min(range(view.size()), key=lambda j: (view.load(j), j))

    def resized(self, pool_size: int) -> None:
        pass


@pytest.fixture
def toy_routers():
    register_router("first_replica", FirstReplica)
    register_router("fewest_tokens_again", FewestTokensAgain)
    yield
    unregister_router("first_replica")
    unregister_router("fewest_tokens_again")


def _run(seed: int, router: str):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, 50)
    cfg = random_config(rng, seed).model_copy(update={"router": router, "replicas": 3, "pd": None})
    return simulate(trace, MODEL, SimConfig.model_validate(cfg.model_dump()), rng=np.random.default_rng(seed))


def test_a_registered_router_is_configured_by_name_and_routes(toy_routers) -> None:
    assert {"first_replica", "fewest_tokens_again"} <= set(router_names())
    records = _run(3, "first_replica").records
    assert set(records.column("prefill_replica").to_pylist()) == {0}
    spread = _run(3, "least_outstanding_tokens").records
    assert len(set(spread.column("prefill_replica").to_pylist())) > 1  # the built-in one does use the pool


@pytest.mark.parametrize("seed", range(8))
def test_a_policy_rewritten_over_the_view_routes_like_the_built_in_one(toy_routers, seed: int) -> None:
    assert (
        _run(seed, "fewest_tokens_again").records_parquet() == _run(seed, "least_outstanding_tokens").records_parquet()
    )


def test_an_unknown_router_is_refused_with_the_registered_names() -> None:
    cfg = random_config(np.random.default_rng(0), 0)
    with pytest.raises(pydantic.ValidationError, match="unknown router 'nearest'.*round_robin"):
        SimConfig.model_validate(cfg.model_dump() | {"router": "nearest"})
    with pytest.raises(ValueError, match="already registered"):
        register_router("round_robin", FirstReplica)
    with pytest.raises(ValueError, match="built in"):
        unregister_router("round_robin")
