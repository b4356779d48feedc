"""Candidate enumeration: every row feasible or not with reasons; 8x H100 for Llama-3.1-70B bf16 by hand."""

import pytest

from llmcap.candidates import EnumerationSpec, ParallelGrid, SchedulerGrid, enumerate_candidates
from llmcap.catalog import load_model
from llmcap.errors import LlmcapError

MIB = 2**20


def _expected_kv_tokens(tp: int) -> int:
    """Llama-3.1-70B, bf16, H100 (81,559 MiB), default MemoryParams, seqs 256, batched 8192, block 16."""
    h, layers, vocab, inter = 8192, 80, 128256, 28672
    usable = int(81559 * MIB * 0.9)
    params_per_rank = (
        2 * vocab * h // tp  # embedding + lm_head, vocab-parallel (128256 is a multiple of 64)
        + layers * (h * h + 2 * 1024 * h + h * h) // tp  # q, k, v, o
        + layers * 3 * h * inter // tp  # gate, up, down
        + layers * 2 * h
        + h  # norms, replicated
    )
    weights = 2 * params_per_rank
    runtime = (
        8192 * 2 * (4 * h + 3 * inter // tp)  # activations
        + 2 * 256 * vocab * 4  # fp32 logits, two copies
        + 512 * MIB  # non-torch
        + (512 * MIB if tp > 1 else 0)  # communication buffers
        + 512 * MIB  # CUDA graphs
        + 256 * MIB  # workspace
    )
    budget = usable - weights - runtime - 256 * MIB  # safety margin
    per_token = layers * 2 * (8 // tp) * 128 * 2
    return budget // (16 * per_token) * 16


SPEC = EnumerationSpec(
    gpus=["h100"],
    parallel=ParallelGrid(tp=[1, 2, 4, 8]),
    modes=["aggregated"],
    max_context_len=8192,
    aggregated=SchedulerGrid(max_num_seqs=[256], max_num_batched_tokens=[8192], block_sizes=[16]),
)


@pytest.fixture(scope="module")
def llama70b():
    return load_model("Llama-3.1-70B")


def test_70b_on_8x_h100(llama70b):
    t = enumerate_candidates(llama70b, SPEC).table
    assert list(t["tp"]) == [1, 2, 4, 8]
    assert list(t["feasible"]) == [False, True, True, True]
    assert t.loc[0, "reason_codes"] == "weights_do_not_fit"
    assert t.loc[0, "weights_bytes_per_rank"] == 2 * 70_553_706_496
    for i, tp in [(1, 2), (2, 4), (3, 8)]:
        assert t.loc[i, "kv_tokens_per_instance"] == _expected_kv_tokens(tp), tp
        assert t.loc[i, "reasons"] == ""
    # TP4 with 8,192-token requests: the KV cache, not max_num_seqs, bounds concurrency
    assert t.loc[2, "max_seqs_at_max_context"] == min(_expected_kv_tokens(4) // 8192, 256)
    assert t.loc[2, "usd_per_instance_hour"] == 4 * 2.50


def test_full_128k_context_does_not_fit_tp2(llama70b):
    spec = SPEC.model_copy(update={"max_context_len": None, "parallel": ParallelGrid(tp=[2])})
    t = enumerate_candidates(llama70b, spec).table
    assert t.loc[0, "max_context_len"] == 131072
    assert _expected_kv_tokens(2) < 131072
    assert t.loc[0, "reason_codes"] == "kv_below_one_max_context_request"


def test_every_infeasible_row_says_why(llama70b):
    spec = EnumerationSpec(
        gpus=["h100", "l40s"],
        weight_quants=["bf16", "fp8"],
        kv_dtypes=["bf16", "fp8"],
        parallel=ParallelGrid(tp=[1, 3, 8, 16], pp=[1, 2], ep=[1, 2]),
        max_context_len=32768,
    )
    res = enumerate_candidates(llama70b, spec)
    t = res.table
    bad = t[~t["feasible"]]
    assert len(bad) > 0 and (bad["reasons"].str.len() > 0).all() and (bad["reason_codes"].str.len() > 0).all()
    assert (t.loc[t["feasible"], "reasons"] == "").all()
    assert res.summary["rows"] == len(t) == 3 * 2 * 2 * 2 * 4 * 2 * 2  # roles x gpus x quants x kv x tp x pp x ep
    assert res.summary["feasible"] + res.summary["infeasible"] == len(t)
    tp3 = t[t["tp"] == 3]
    assert tp3["reason_codes"].str.contains("heads_not_divisible_by_tp").all()
    assert t[t["tp"] == 16]["reason_codes"].str.contains("instance_exceeds_node").all()
    assert t[t["ep"] == 2]["reason_codes"].str.contains("ep_without_moe").all()


def test_disaggregated_rows_carry_their_role_knobs(llama70b):
    spec = EnumerationSpec(
        gpus=["h100"],
        parallel=ParallelGrid(tp=[4]),
        modes=["disaggregated"],
        max_context_len=8192,
        prefill=SchedulerGrid(max_num_seqs=[8], max_num_batched_tokens=[16384]),
        decode=SchedulerGrid(max_num_seqs=[128, 512], max_num_batched_tokens=[256]),
    )
    t = enumerate_candidates(llama70b, spec).table
    assert list(zip(t["role"], t["max_num_seqs"], t["max_num_batched_tokens"], strict=True)) == [
        ("prefill", 8, 16384),
        ("decode", 128, 256),
        ("decode", 512, 256),
    ]
    assert t.loc[2, "reason_codes"] == "batched_tokens_below_num_seqs"


def test_row_order_is_deterministic(llama70b):
    spec = EnumerationSpec(gpus=["h200", "h100"], parallel=ParallelGrid(tp=[8, 2, 4]), max_context_len=8192)
    a = enumerate_candidates(llama70b, spec).table
    b = enumerate_candidates(llama70b, spec).table
    assert a.equals(b)
    assert list(a["row"]) == list(range(len(a)))
    assert list(a["gpu"][:3]) == ["H200-SXM-141GB"] * 3 and list(a["tp"][:3]) == [8, 2, 4]


def test_moe_expert_parallel_rows():
    spec = EnumerationSpec(
        gpus=["h100"], parallel=ParallelGrid(tp=[2, 4], ep=[1, 2, 4, 16]), modes=["aggregated"], max_context_len=4096
    )
    t = enumerate_candidates(load_model("Mixtral-8x7B"), spec).table
    codes = dict(zip(zip(t["tp"], t["ep"], strict=True), t["reason_codes"], strict=True))
    assert codes[(2, 4)] == "ep_incompatible"  # EP must divide TP x DP
    assert codes[(4, 16)] == "ep_incompatible"
    assert codes[(4, 4)] == ""


def test_bad_spec_values_are_one_clear_error(llama70b):
    with pytest.raises(LlmcapError, match="unknown GPU 'v100'"):
        enumerate_candidates(llama70b, EnumerationSpec(gpus=["v100"]))
    with pytest.raises(LlmcapError, match="unknown weight format"):
        enumerate_candidates(llama70b, EnumerationSpec(weight_quants=["int3"]))


def test_spec_reads_from_a_params_dict():
    spec = EnumerationSpec.model_validate(
        {"gpus": ["h100"], "parallel": {"tp": [2, 4]}, "memory": {"gpu_memory_utilization": 0.85}}
    )
    assert spec.parallel.tp == [2, 4] and spec.memory.gpu_memory_utilization == 0.85
    assert spec.parallel.pp == [1] and spec.modes == ["aggregated", "disaggregated"]


def test_price_override_by_alias(llama70b):
    spec = SPEC.model_copy(update={"usd_per_gpu_hour": {"H100-sxm": 1.75}, "parallel": ParallelGrid(tp=[4])})
    assert enumerate_candidates(llama70b, spec).table.loc[0, "usd_per_instance_hour"] == 4 * 1.75
