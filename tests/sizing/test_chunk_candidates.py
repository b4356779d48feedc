"""Chunk sizes as aggregated candidates: the grid offers 512-8192, the search tries a chunk whose step fits the
ITL target before a larger one with a better prefill bound, and the prefill bound is a lower bound on each prompt."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.candidates import EnumerationSpec, SchedulerGrid, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.config import load_params
from llmcap.perf import build_step_model, prefill_time
from llmcap.sizing.params import SearchParams, SizeParams, SloParams
from llmcap.sizing.plan import size_deployments
from llmcap.sizing.units import Lengths, make_unit, prefill_alone
from llmcap.trace import ingest
from tests.conftest import ROOT, TRACES

MODEL = load_model("Llama-3.1-8B")
CHUNKS = [512, 1024, 2048, 8192]


def test_default_grid_offers_every_chunk_size_to_aggregated_rows():
    grid = load_params(ROOT / "params.yaml").enumerate.aggregated
    assert sorted(grid.max_num_batched_tokens) == CHUNKS


@pytest.fixture(scope="module")
def trace():
    return ingest(TRACES["azure_conv"]).trace.slice(0, 600)


@pytest.fixture(scope="module")
def candidates():
    spec = EnumerationSpec(
        gpus=["h100"],
        weight_quants=["bf16"],
        kv_dtypes=["bf16"],
        parallel={"tp": [1]},
        modes=["aggregated"],
        aggregated=SchedulerGrid(max_num_batched_tokens=CHUNKS),
        max_context_len=16384,
    )
    table = enumerate_candidates(MODEL, spec).table
    assert sorted(table[table["feasible"]]["max_num_batched_tokens"]) == CHUNKS
    return table


def test_prefill_alone_is_a_lower_bound_on_each_prompt(trace):
    lengths = Lengths.of(trace)
    step = build_step_model(MODEL.source, "H100-SXM-80GB", tp=1)
    for chunk in (512, 8192):
        exact = prefill_time(step, lengths.isl, lengths.cached, chunk=chunk)
        fast = prefill_alone(step, lengths, chunk)
        assert np.all(fast <= exact * (1 + 1e-12))
        short = lengths.isl < 128  # below 128 tokens the grain is one token: exact
        assert short.any()
        np.testing.assert_allclose(fast[short], exact[short], rtol=1e-9)
        assert fast.mean() > 0.98 * exact.mean()  # rounded down < 1/64, and a chunk boundary now and then


def test_a_chunk_that_fits_the_itl_target_is_simulated_before_a_stalling_one(trace, candidates):
    slo = SloParams(ttft_ms=2000, itl_ms=60, attainment_target=0.9, warmup_frac=0.1, drain_frac=0.1)
    lengths = Lengths.of(trace)
    units = {
        int(r["max_num_batched_tokens"]): make_unit(MODEL, r, lengths, slo)
        for _, r in candidates[candidates["feasible"]].iterrows()
    }
    # the premise: 8192-token chunks have the best prefill bound but a step longer than the ITL target
    assert units[8192].bound_per_gpu == max(u.bound_per_gpu for u in units.values())
    assert units[8192].chunk_step_s > 0.060 > units[2048].chunk_step_s
    fits = max((c for c, u in units.items() if u.chunk_step_s <= 0.060), key=lambda c: units[c].bound_per_gpu)
    params = SizeParams(
        slo=slo,
        search=SearchParams(seeds=(0,), rel_tol=0.2, guard_points=0),
        excerpt_requests=200,
        shortlist=1,
        max_simulated=1,
        pd_prefill_shortlist=0,
        confirm_whole_trace="off",
    )
    out = size_deployments(trace, candidates, MODEL, params, simulate_scenarios=False)
    assert out.summary["chosen"] == units[fits].key
    assert any(f"not simulated {units[8192].key}" in n for n in out.summary["notes"])
