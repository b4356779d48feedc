"""Admission policies on a KV-bound replica (few blocks, long requests, all queued at once):
- vLLM admits whatever this step's blocks allow and preempts when decodes outgrow the cache;
- TensorRT-LLM's GUARANTEED_NO_EVICT admits only what fits for its whole life beside the running
  requests' reservations, so it never preempts, and the reservation is exactly those requests' lives;
- TensorRT-LLM's MAX_UTILIZATION has vLLM's mechanics here: the same records, bit for bit.
(The random-config invariant and fast-vs-reference tests run every policy too: tests/sim/_workloads.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.admission import ADMISSION_POLICIES, lifetime_blocks
from llmcap.sim.engine import Replica
from tests.sim._workloads import MODEL, table

N, ISL, OSL, BLOCKS, BS = 24, 400, 300, 128, 16  # a life is 44 blocks: 2 fit whole, ~5 fit by their prompts


def run(policy: str, on_decision=None):
    trace = table({"isl": np.full(N, ISL), "osl": np.full(N, OSL), "arrival_s": np.arange(N) * 0.001})
    engine = EngineConfig(num_blocks=BLOCKS, block_size=BS, max_num_seqs=16, max_num_batched_tokens=512, enable_prefix_caching=False,
                          admission_policy=policy)  # fmt: skip
    return simulate(trace, MODEL, SimConfig(engine=engine, replicas=1), on_decision=on_decision)


def test_vllm_preempts_when_decodes_outgrow_the_cache() -> None:
    r = run("vllm")
    assert r.summary["completed"] == N and r.summary["preemptions"] > 0


def test_guaranteed_no_evict_reserves_whole_lives_and_never_preempts() -> None:
    seen: list[tuple[int, int]] = []

    def watch(rep: Replica, t: float) -> None:
        lives = sum(lifetime_blocks(q.isl, q.osl, rep.bs) for q in rep.running.values())
        seen.append((lives, rep.admission.reserved))  # type: ignore[attr-defined]

    r = run("trtllm-guaranteed-no-evict", watch)
    assert r.summary["completed"] == N and r.summary["preemptions"] == 0
    assert all(lives == reserved <= BLOCKS for lives, reserved in seen)
    assert max(lives for lives, _ in seen) == 2 * lifetime_blocks(ISL, OSL, BS)  # two at a time: the cache's whole-life limit


def test_max_utilization_has_vllm_mechanics() -> None:
    assert run("trtllm-max-utilization").records.equals(run("vllm").records)


def test_an_unknown_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown admission policy 'sglang-ish'.*vllm, trtllm-max-utilization, trtllm-guaranteed-no-evict"):
        EngineConfig(num_blocks=10, admission_policy="sglang-ish")
    assert set(ADMISSION_POLICIES) == {"vllm", "trtllm-max-utilization", "trtllm-guaranteed-no-evict"}


def test_no_evict_on_the_kv_bound_long_context_cell_runs_at_perfs_estimate(tmp_path) -> None:
    """Llama-3.3-70B fp8 on 2×H100, 136 requests of 20000/2000 queued at once: the KV holds ~20 whole lives.
    TensorRT-LLM's policy runs ~20 at a time without a preemption, at what `llmcap perf` estimates for that
    batch; vLLM's admits more by their prompts and preempts as they grow, below the bound perf states for it."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from llmcap.cli import app

    n = 136
    pq.write_table(pa.table({"request_id": np.arange(n), "arrival_s": np.zeros(n), "isl": np.full(n, 20000), "osl": np.full(n, 2000)}), tmp_path / "t.parquet")
    cell = ["--model", "Llama-3.3-70B-Instruct", "--gpu", "h100", "--tp", "2", "--weight-quant", "fp8", "--kv-dtype", "fp8"]
    runner = CliRunner()
    perfs = {p: json.loads(runner.invoke(app, ["perf", *cell, "--isl", "20000", "--osl", "2000", "--admission-policy", p, "--json"]).stdout)["throughput"]
             for p in ("vllm", "trtllm-guaranteed-no-evict")}  # fmt: skip
    sims = {}
    for policy in ("vllm", "trtllm-guaranteed-no-evict"):
        r = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "t.parquet"), *cell, "--admission-policy", policy, "--json"])
        assert r.exit_code == 0, r.output
        sims[policy] = json.loads(r.stdout)
    no_evict, vllm = sims["trtllm-guaranteed-no-evict"], sims["vllm"]
    assert no_evict["completed"] == vllm["completed"] == n
    assert no_evict["preemptions"] == 0 and vllm["preemptions"] > 0
    estimate = perfs["vllm"]["output_tokens_per_s"]
    assert perfs["vllm"]["limited_by"] == "kv" and perfs["trtllm-guaranteed-no-evict"]["output_tokens_per_s"] == estimate
    assert "no preemption" in perfs["trtllm-guaranteed-no-evict"]["policy_effect"] and "upper bound" in perfs["vllm"]["policy_effect"]
    assert abs(no_evict["throughput"]["output_tok_s"] / estimate - 1) <= 0.10, (no_evict["throughput"], estimate)
    assert vllm["throughput"]["output_tok_s"] <= estimate  # the bound perf states for vLLM holds
