"""A P/D role whose pool would need more than `size.pd_search_max_instances` instances is searched at that many, at
their share of the planning rate: its per-instance rate G is the capped pool's max rate ÷ its instances."""

from __future__ import annotations

import math
import re

import pytest

from llmcap.candidates import EnumerationSpec, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.sizing.headroom import planning_traffic
from llmcap.sizing.params import SearchParams, SizeParams, SloParams
from llmcap.sizing.pd_search import disaggregated
from llmcap.sizing.sizer import Sizer
from llmcap.trace import ingest
from tests.conftest import TRACES

MODEL = load_model("Llama-3.1-8B")
PARAMS = SizeParams(
    slo=SloParams(ttft_ms=500, itl_ms=60, attainment_target=0.95, warmup_frac=0.1, drain_frac=0.1),
    search=SearchParams(seeds=(0,), rel_tol=0.1, guard_points=1),
    excerpt_requests=300,
    pd_prefill_shortlist=1,
    pd_decode_shortlist=1,
    pd_search_max_instances=2,
    target_rps=200.0,
)


@pytest.fixture(scope="module")
def sizer_and_rows():
    trace = ingest(TRACES["azure_conv"]).trace.slice(0, 2000)
    spec = EnumerationSpec(gpus=["h100"], weight_quants=["fp8"], parallel={"tp": [1]}, max_context_len=16384)
    table = enumerate_candidates(MODEL, spec).table
    dis = table[table["feasible"] & (table["mode"] == "disaggregated")]
    sizer = Sizer(trace, MODEL, PARAMS, planning_traffic(trace, 200.0, PARAMS.headroom), None, lambda _m: None, None)
    return sizer, disaggregated(sizer, dis)


def test_each_role_is_searched_in_a_pool_no_larger_than_the_cap(sizer_and_rows):
    sizer, rows = sizer_and_rows
    assert rows and {r.role for r in sizer.roles} == {"prefill", "decode"}
    capped = []
    for role in sizer.roles:
        assert 1 <= role.instances <= 2
        assert role.rate == pytest.approx(role.result.max_rate / role.instances) and role.rate > 0
        found = re.search(r"a pool of 2 \(of the (\d+) its rate needs: pd_search_max_instances\)", role.partner)
        if found:
            capped.append(role)
            assert int(found.group(1)) > 2
    # 200 req/s is far more than two TP1 instances of either role carry: the prefill search at least is capped
    assert any(r.role == "prefill" for r in capped), [r.partner for r in sizer.roles]
    assert all(math.ceil(sizer.planning / r.rate) > 2 for r in capped)
