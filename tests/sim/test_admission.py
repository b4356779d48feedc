"""Admission policies on a KV-bound replica (few blocks, long requests, all queued at once):
- vLLM admits whatever this step's blocks allow and preempts when decodes outgrow the cache;
- TensorRT-LLM's GUARANTEED_NO_EVICT admits only what fits for its whole life beside the running
  requests' reservations, so it never preempts, and the reservation is exactly those requests' lives;
- TensorRT-LLM's MAX_UTILIZATION is vLLM's mechanics by construction (the same class behaviour: nothing to test apart);
- SGLang holds back a decaying share of the running requests' remaining outputs: fewer preemptions than
  vLLM, and a retraction resets its ratio as SGLang's retract_decode does.
(The random-config invariant and fast-vs-reference tests run every policy too: tests/sim/_workloads.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.sim import EngineConfig, SimConfig, simulate
from llmcap.sim.admission import (
    ADMISSION_POLICIES,
    MIN_NEW_TOKEN_RATIO,
    AdmissionView,
    SglangAdmission,
    lifetime_blocks,
)
from llmcap.sim.engine import Replica
from tests.sim._workloads import MODEL, table

N, ISL, OSL, BLOCKS, BS = 24, 400, 300, 128, 16  # a life is 44 blocks: 2 fit whole, ~5 fit by their prompts


def run(policy: str, on_decision=None):
    trace = table({"isl": np.full(N, ISL), "osl": np.full(N, OSL), "arrival_s": np.arange(N) * 0.001})
    engine = EngineConfig(
        num_blocks=BLOCKS,
        block_size=BS,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
        admission_policy=policy,
    )
    return simulate(trace, MODEL, SimConfig(engine=engine, replicas=1), on_decision=on_decision)


@pytest.mark.parametrize("policy", ["vllm", "trtllm-guaranteed-no-evict", "trtllm-max-utilization", "sglang"])
@pytest.mark.parametrize("isl,osl,blocks", [(ISL, OSL, BLOCKS), (100, 800, 256), (50, 2000, 1024)])
def test_decode_runs_planned_at_once_equal_the_step_by_step_reference(
    policy: str, isl: int, osl: int, blocks: int
) -> None:
    # SGLang's admission loosens every decode step: a run must end where it could first admit the queue's head
    # (the last two cells differ from the reference when it does not)
    trace = table({"isl": np.full(N, isl), "osl": np.full(N, osl), "arrival_s": np.arange(N) * 0.001})
    engine = EngineConfig(
        num_blocks=blocks,
        block_size=BS,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
        admission_policy=policy,
    )
    fast, ref = (
        simulate(trace, MODEL, SimConfig(engine=engine, replicas=1, reference=r)).records for r in (False, True)
    )
    assert fast.equals(ref)


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
    assert max(lives for lives, _ in seen) == 2 * lifetime_blocks(
        ISL, OSL, BS
    )  # two at a time: the cache's whole-life limit


def test_sglang_admits_conservatively_and_preempts_less_than_vllm() -> None:
    ratios: list[float] = []

    def watch(rep: Replica, t: float) -> None:
        ratios.append(rep.admission.new_token_ratio(rep.step_clock))  # type: ignore[attr-defined]

    sglang, vllm = run("sglang", watch), run("vllm")
    assert sglang.summary["completed"] == N and sglang.summary["preemptions"] < vllm.summary["preemptions"]
    assert ratios[0] == pytest.approx(0.7) and min(ratios) >= MIN_NEW_TOKEN_RATIO


def test_sglangs_ratio_decays_over_600_steps_and_a_retraction_resets_it() -> None:
    policy = SglangAdmission()
    assert policy.new_token_ratio(0) == 0.7 and policy.new_token_ratio(300) == pytest.approx((0.7 + 0.098) / 2)
    assert policy.new_token_ratio(600) == pytest.approx(0.098) == policy.new_token_ratio(10_000)
    policy.retracted(step=1000, decoded=300, max_new=2000, running=10)  # (300 + 20·10) / 2001
    assert policy.new_token_ratio(1000) == pytest.approx(500 / 2001) and policy.new_token_ratio(
        1010
    ) < policy.new_token_ratio(1000)
    # free 10,000 tokens, the newcomer needs 4,000; running outputs left 20,000 × ratio 0.7 = 14,000 → no; at 0.098 → yes
    fresh, view = SglangAdmission(), AdmissionView()
    view.free_tokens, view.new_tokens, view.running_remaining = 10_000, 4_000, 20_000
    assert not fresh.admits(view)
    view.step = 600
    assert fresh.admits(view)


def test_sglang_starts_a_request_its_rule_refuses_on_an_empty_cache_once_the_replica_is_empty() -> None:
    # 10 blocks of 16 = 160 tokens; the second request's life is 149 tokens (10 blocks: it fits), but its prompt,
    # output and a page are 166, over what the rule ever allows: it waits until the first is done, then runs
    trace = table({"isl": [20, 100, 10], "osl": [30, 50, 5], "arrival_s": [0.0, 0.001, 0.002]})
    engine = EngineConfig(
        num_blocks=10,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
        admission_policy="sglang",
    )
    fast, ref = (simulate(trace, MODEL, SimConfig(engine=engine, replicas=1, reference=r)) for r in (False, True))
    assert fast.records.equals(ref.records)
    rec = fast.records.to_pandas()
    assert (rec.status == "ok").all()
    assert rec.admitted_s[1] == rec.finish_s[0] and rec.admitted_s[2] >= rec.admitted_s[1]


def test_an_unknown_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match="unknown admission policy 'sglang-ish'.*vllm, trtllm-max-utilization, trtllm-guaranteed-no-evict, sglang",
    ):
        EngineConfig(num_blocks=10, admission_policy="sglang-ish")
    assert set(ADMISSION_POLICIES) == {"vllm", "trtllm-max-utilization", "trtllm-guaranteed-no-evict", "sglang"}


def test_no_evict_on_the_kv_bound_long_context_cell_runs_at_perfs_estimate(tmp_path) -> None:
    """Llama-3.3-70B fp8 on 2×H100, 136 requests of 20000/2000 queued at once: the KV holds ~20 whole lives.
    TensorRT-LLM's policy runs ~20 at a time without a preemption, at what `llmcap perf` estimates for that
    batch; vLLM's admits more by their prompts and preempts as they grow, which costs it here."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from llmcap.cli import app

    n = 136
    pq.write_table(
        pa.table(
            {"request_id": np.arange(n), "arrival_s": np.zeros(n), "isl": np.full(n, 20000), "osl": np.full(n, 2000)}
        ),
        tmp_path / "t.parquet",
    )
    cell = [
        "--model",
        "Llama-3.3-70B-Instruct",
        "--gpu",
        "h100",
        "--tp",
        "2",
        "--weight-quant",
        "fp8",
        "--kv-dtype",
        "fp8",
    ]
    runner = CliRunner()
    perfs = {
        p: json.loads(
            runner.invoke(
                app, ["perf", *cell, "--isl", "20000", "--osl", "2000", "--admission-policy", p, "--json"]
            ).stdout
        )["throughput"]
        for p in ("vllm", "trtllm-guaranteed-no-evict")
    }
    sims = {}
    for policy in ("vllm", "trtllm-guaranteed-no-evict"):
        r = runner.invoke(
            app, ["simulate", "--trace", str(tmp_path / "t.parquet"), *cell, "--admission-policy", policy, "--json"]
        )
        assert r.exit_code == 0, r.output
        sims[policy] = json.loads(r.stdout)
    no_evict, vllm = sims["trtllm-guaranteed-no-evict"], sims["vllm"]
    assert no_evict["completed"] == vllm["completed"] == n
    assert no_evict["preemptions"] == 0 and vllm["preemptions"] > 0
    estimate = perfs["vllm"]["output_tokens_per_s"]
    assert (
        perfs["vllm"]["limited_by"] == "kv" and perfs["trtllm-guaranteed-no-evict"]["output_tokens_per_s"] == estimate
    )
    assert (
        "no preemption" in perfs["trtllm-guaranteed-no-evict"]["policy_effect"]
        and "preempts" in perfs["vllm"]["policy_effect"]
    )
    assert abs(no_evict["throughput"]["output_tok_s"] / estimate - 1) <= 0.10, (no_evict["throughput"], estimate)
    assert vllm["throughput"]["output_tok_s"] < no_evict["throughput"]["output_tok_s"]  # here the recompute costs vLLM


@pytest.mark.parametrize(
    "command",
    [
        ["perf", "--model", "Llama-3.1-8B", "--gpu", "h100", "--isl", "128", "--osl", "128"],
        ["simulate", "--trace", "missing.parquet", "--model", "Llama-3.1-8B", "--gpu", "h100"],
        ["size", "--trace", "missing.parquet", "--model", "Llama-3.1-8B", "--gpu", "h100", "--slo-ttft-p99", "500"],
    ],
)
def test_every_command_refuses_an_unknown_policy_with_the_same_line(command):
    from typer.testing import CliRunner

    from llmcap.cli import app

    r = CliRunner().invoke(app, [*command, "--admission-policy", "orca"])
    assert r.exit_code == 2
    assert f"--admission-policy must be one of {', '.join(ADMISSION_POLICIES)}, got 'orca'" in r.output


def _capped(policy: str, cap: int | None, on_decision=None):
    """`run`'s 24 requests, each stating max_tokens `cap` (None: none stated) for its 300 output tokens."""
    cols = {"isl": np.full(N, ISL), "osl": np.full(N, OSL), "arrival_s": np.arange(N) * 0.001}
    if cap is not None:
        cols["max_tokens"] = np.full(N, cap)
    engine = EngineConfig(
        num_blocks=BLOCKS,
        block_size=BS,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
        admission_policy=policy,
    )
    return simulate(table(cols), MODEL, SimConfig(engine=engine, replicas=1), on_decision=on_decision)


def test_a_reserving_policy_reserves_the_stated_cap_not_the_output_to_come() -> None:
    # a cap of 1,100 makes a life ⌈(400 + 1,100 − 1) / 16⌉ = 94 blocks: one fits the 128-block cache at a time
    # (two, 188, do not), where the real 300-token outputs (44 blocks) let two run together
    assert lifetime_blocks(ISL, 1100, BS) == 94 and lifetime_blocks(ISL, OSL, BS) == 44
    seen: list[int] = []
    capped = _capped("trtllm-guaranteed-no-evict", 1100, lambda rep, t: seen.append(rep.admission.reserved))  # type: ignore[attr-defined]
    assert capped.summary["completed"] == N and capped.summary["preemptions"] == 0
    assert max(seen) == 94  # never two at once
    assert _capped("trtllm-guaranteed-no-evict", None).records.equals(run("trtllm-guaranteed-no-evict").records)
    uncapped = run("trtllm-guaranteed-no-evict")
    end = lambda r: float(np.max(r.records.column("finish_s").to_numpy()))  # noqa: E731
    assert end(capped) > 1.5 * end(uncapped)  # one at a time instead of two: the same work takes far longer
    # a cap equal to the output is the same as none; vLLM reserves nothing, so a cap changes nothing
    assert _capped("trtllm-guaranteed-no-evict", OSL).records.equals(uncapped.records)
    assert _capped("vllm", 1100).records.equals(run("vllm").records)


def test_a_cap_past_max_model_len_is_rejected_as_vllm_rejects_it() -> None:
    # vLLM refuses prompt + max_tokens > max_model_len before queueing, even when the output would have fit
    engine = EngineConfig(
        num_blocks=BLOCKS, block_size=BS, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=1000
    )
    trace = table({"isl": [400, 400], "osl": [300, 300], "max_tokens": [600, 601], "arrival_s": [0.0, 1.0]})
    statuses = simulate(trace, MODEL, SimConfig(engine=engine, replicas=1)).records.column("status").to_pylist()
    assert statuses[0] != statuses[1] and statuses[1] == "rejected"  # 400 + 600 = 1,000 fits; 400 + 601 does not
