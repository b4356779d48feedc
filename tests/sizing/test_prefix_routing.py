"""Prefix reuse in the sizing: LRU hits at an instance's KV size for the bounds, and prefix-aware routing searched
on the chosen plan where the trace has prefix hashes."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.sizing.headroom import planning_traffic
from llmcap.sizing.params import SearchParams, SizeParams, SloParams
from llmcap.sizing.plan import size_deployments
from llmcap.sizing.sizer import Sizer
from llmcap.sizing.units import Lengths
from llmcap.trace import ingest
from tests.conftest import TRACES

MODEL = load_model("Llama-3.1-8B")
PARAMS = SizeParams(
    slo=SloParams(
        ttft_ms=3000, ttft_ms_per_1k_isl=100, itl_ms=80, attainment_target=0.95, warmup_frac=0.1, drain_frac=0.1
    ),
    search=SearchParams(seeds=(0,), rel_tol=0.1, guard_points=0),
    excerpt_requests=300,
    shortlist=1,
    max_simulated=1,
    pd_prefill_shortlist=0,
    count_seeds=(),
)


@pytest.fixture(scope="module")
def trace():
    return ingest(TRACES["mooncake_conversation"]).trace.slice(0, 1500)


def test_lru_hits_shrink_with_the_cache_and_reach_the_unbounded_figure(trace):
    lengths = Lengths.of(trace)
    assert lengths.hashes is not None and lengths.block == 512
    tiny, small, huge = (lengths.at_capacity(k).cached.sum() for k in (512, 512 * 200, 10**12))
    assert tiny < small < huge
    assert huge == lengths.cached.sum()  # a cache that never evicts is the ideal reuse
    assert lengths.at_capacity(512 * 200) is lengths.at_capacity(512 * 200 + 1)  # memoised per whole block count
    assert (lengths.at_capacity(512 * 200).cached <= lengths.isl).all()


def test_routing_is_searched_on_the_chosen_plan_and_the_cheaper_kept(trace):
    spec = EnumerationSpec(
        gpus=["h100"], weight_quants=["fp8"], parallel={"tp": [1]}, max_context_len=131072, modes=["aggregated"]
    )
    candidates = enumerate_candidates(MODEL, spec).table
    out = size_deployments(trace, candidates, MODEL, PARAMS)
    s = out.summary
    compared = s["routers_compared"]
    assert set(compared) == {"least_outstanding_tokens", "prefix_aware"}
    best = min(
        compared,
        key=lambda r: (not compared[r]["scenarios_pass"], compared[r]["usd_per_hour"], r != "least_outstanding_tokens"),
    )
    assert s["router"] == best
    assert s["gpus"] == compared[best]["gpus"]
    assert any(n.startswith("routing searched on the chosen plan") for n in s["notes"])


def test_no_routing_search_without_hashes_or_when_off(trace):
    def sizer(t, params):
        return Sizer(t, MODEL, params, planning_traffic(t, None, params.headroom), None, lambda _msg: None, None)

    assert sizer(trace, PARAMS).routers() == ["least_outstanding_tokens", "prefix_aware"]
    off = PARAMS.model_copy(update={"prefix_routing": "off"})
    assert sizer(trace, off).routers() == ["least_outstanding_tokens"]
    plain = trace.drop_columns(["hash_ids"])
    assert sizer(plain, PARAMS).routers() == ["least_outstanding_tokens"]
    assert np.all(Lengths.of(plain).cached == 0)
