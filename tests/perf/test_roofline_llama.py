"""Roofline numbers for Llama-3.1-8B and -70B on H100 SXM, computed by hand from the config and datasheet.

Shapes (config.json): 8B: hidden 4096, 32 layers, 32 heads / 8 KV heads of 128, MLP 14336, vocab 128256.
70B: hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, MLP 28672. H100 SXM: 989.5 dense bf16 TFLOPS,
3.35 TB/s HBM, NVLink 900 GB/s bidirectional (450 one way). Default efficiencies (RooflineParams):
matmul 0.70 · T / (T + 32), attention 0.50 · T / (T + 32), HBM 0.80, links 0.80, 1 µs per ring step,
0.5 ms per step. Activations are bf16 (2 B).
"""

import pytest

from llmcap.catalog import get_gpu, load_model
from llmcap.memory import plan_memory
from llmcap.parallelism import Parallelism
from llmcap.perf import RooflineParams, StepBatch, build_step_model, decode_step_time, prefill_time

P = RooflineParams()
PEAK = 989.5e12
BW = 3.35e12 * 0.80  # achieved HBM bytes/s
NVLINK = 450e9 * 0.80  # achieved one-direction NVLink bytes/s


def _ops(model, batch):
    return {r.op: r for r in model.breakdown(batch)}


def _eff(tokens, max_eff=0.70):
    return max_eff * tokens / (tokens + 32)


# ---------------------------------------------------------------- Llama-3.1-8B, TP1

# per layer, bf16: q 4096x4096 + k,v 1024x4096 each = 25,165,824 params; o 4096x4096 = 16,777,216;
# MLP 3 x 14336 x 4096 = 176,160,768. lm_head 128256 x 4096 = 525,336,576.
QKV_8B, O_8B, MLP_8B, HEAD_8B = 25_165_824, 16_777_216, 176_160_768, 525_336_576


def test_8b_decode_batch_1_flops_and_bytes():
    m = build_step_model("Llama-3.1-8B", "h100", params=P)
    ops = _ops(m, StepBatch.build(decode_seqs=1, decode_context=1024))
    # matmuls: 2 FLOPs per param per row; bytes = weights (2 B/param) + rows x (in + out) x 2 B
    assert ops["qkv_proj"].flops == 32 * 2 * QKV_8B == 1_610_612_736
    assert ops["qkv_proj"].bytes == 32 * (2 * QKV_8B + 2 * ((4096 + 4096) + 2 * (4096 + 1024)))  # 1,611,792,384
    assert ops["o_proj"].flops == 32 * 2 * O_8B
    assert ops["o_proj"].bytes == 32 * (2 * O_8B + 2 * (4096 + 4096))
    # gate and up (4096 -> 14336) then down (14336 -> 4096)
    assert ops["mlp"].flops == 32 * 2 * MLP_8B == 11_274_289_152
    assert ops["mlp"].bytes == 32 * (2 * MLP_8B + 2 * (2 * (4096 + 14336) + (14336 + 4096)))
    assert ops["lm_head"].flops == 2 * HEAD_8B
    assert ops["lm_head"].bytes == 2 * HEAD_8B + 2 * (4096 + 128256)
    # attention: 2 x 32 heads x (128 qk + 128 v) FLOPs per context token and layer;
    # KV per token and layer = 2 x 8 heads x 128 x 2 B = 4096 B, read for 1024 tokens, plus the new
    # token's KV written and its Q / output (2 x 4096 x 2 B)
    assert ops["attn_decode"].flops == 32 * 2 * 32 * 256 * 1024 == 536_870_912
    assert ops["attn_decode"].bytes == 32 * (1024 * 4096 + 4096 + 2 * 4096 * 2) == 134_873_088
    # 2 RMSNorms per layer (4096 x 2 B weights, read + write one row each) + the final norm
    assert ops["norms"].bytes == 32 * (2 * 4096 * 2 + 2 * 2 * 4096 * 2) + (4096 * 2 + 2 * 4096 * 2)
    assert ops["embed"].bytes == 2 * 4096 * 2  # a gather of one row, written back
    assert "attn_prefill" not in ops and "tp_allreduce" not in ops


def test_8b_weights_read_are_the_weights_held_minus_the_embedding_table():
    m = build_step_model("Llama-3.1-8B", "h100", params=P)
    ops = _ops(m, StepBatch.build(decode_seqs=1, decode_context=0))
    act = 32 * 2 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336)) + 2 * (4096 + 128256)
    weights_read = sum(ops[o].bytes for o in ("qkv_proj", "o_proj", "mlp", "lm_head")) - act
    assert weights_read == 2 * (32 * (QKV_8B + O_8B + MLP_8B) + HEAD_8B) == 15_009_316_864
    held = plan_memory(load_model("Llama-3.1-8B"), get_gpu("h100")).weights_bytes_per_rank
    norms = 2 * (32 * 2 * 4096 + 4096)
    assert weights_read == held - 2 * 128256 * 4096 - norms


def test_8b_decode_batch_1_is_memory_bound_at_weight_bytes_over_bandwidth():
    m = build_step_model("Llama-3.1-8B", "h100", params=P)
    batch = StepBatch.build(decode_seqs=1, decode_context=1024)
    ops = _ops(m, batch)
    assert {r.bound for o, r in ops.items() if o != "overhead"} == {"memory"}
    # every op memory bound: the step is exactly bytes / achieved bandwidth + the fixed overhead
    total_bytes = sum(r.bytes for r in ops.values())
    t = m.step_time(batch)[0]
    assert t == pytest.approx(total_bytes / BW + 5e-4, rel=1e-12)
    # ... and within 1.5% of weight bytes alone: 15,009,316,864 B / 2.68e12 B/s = 5.601 ms + 0.5 ms
    assert t == pytest.approx(15_009_316_864 / BW + 5e-4, rel=0.015)
    # qkv would need 1.61e9 FLOPs / (989.5e12 x 0.7 x 1/33) = 76.7 µs of compute vs 601 µs of reads
    assert ops["qkv_proj"].time_s == pytest.approx(ops["qkv_proj"].bytes / BW)


def test_8b_decode_batch_1_matches_published_latency():
    # Published: Llama-3.1-8B bf16 on one H100 decodes a single stream at ~6-8 ms/token (vLLM), and
    # johnmusgrave.com measured 75 tok/s on A100-40GB with vLLM 0.23 = 77% of the bandwidth ceiling;
    # the same fraction on H100 gives 16.06 GB / (3.35 TB/s x 0.77) = 6.2 ms.
    t = decode_step_time(build_step_model("Llama-3.1-8B", "h100", params=P), 1, 1024)[0]
    assert 6e-3 <= t <= 8e-3


def test_8b_prefill_1024_flops_and_compute_bound():
    m = build_step_model("Llama-3.1-8B", "h100", params=P)
    ops = _ops(m, StepBatch.build(prefill_tokens=1024))
    # projections: 2 x 1024 rows x params, at 0.7 x 1024 / 1056 = 0.6788 of peak
    assert ops["qkv_proj"].flops == 32 * 2 * 1024 * QKV_8B == 1_649_267_441_664
    assert ops["qkv_proj"].bytes == 32 * (2 * QKV_8B + 1024 * 2 * ((4096 + 4096) + 2 * (4096 + 1024)))
    assert ops["qkv_proj"].time_s == pytest.approx(1_649_267_441_664 / (PEAK * _eff(1024)))  # 2.456 ms
    assert ops["mlp"].flops == 32 * 2 * 1024 * MLP_8B
    assert ops["mlp"].time_s == pytest.approx(32 * 2 * 1024 * MLP_8B / (PEAK * _eff(1024)))  # 17.19 ms
    # causal attention over 1024 x 1025 / 2 = 524,800 query-key pairs, 2 x 32 x 256 FLOPs each per layer
    assert ops["attn_prefill"].flops == 32 * 2 * 32 * 256 * 524_800 == 275_146_342_400
    assert ops["attn_prefill"].time_s == pytest.approx(275_146_342_400 / (PEAK * _eff(1024, 0.50)))  # 0.574 ms
    for op in ("qkv_proj", "o_proj", "mlp", "attn_prefill"):
        assert ops[op].bound == "compute", op
    # logits only for the last prompt token: one lm_head row, memory bound
    assert ops["lm_head"].flops == 2 * HEAD_8B and ops["lm_head"].bound == "memory"
    assert sum(r.time_s for r in ops.values()) == pytest.approx(prefill_time(m, 1024)[0], rel=1e-12)


def test_8b_long_prefill_is_compute_bound():
    m = build_step_model("Llama-3.1-8B", "h100", params=P)
    ops = _ops(m, StepBatch.build(prefill_tokens=8192))
    for op in ("qkv_proj", "o_proj", "mlp", "attn_prefill"):
        assert ops[op].bound == "compute", op
    compute = sum(r.time_s for r in ops.values() if r.bound == "compute")
    assert compute / m.step_time(StepBatch.build(prefill_tokens=8192))[0] > 0.95
    # MLP alone: 2 x 8192 x 32 x 176,160,768 FLOPs at 0.7 x 8192 / 8224 of peak = 133.9 ms
    assert ops["mlp"].time_s == pytest.approx(2 * 8192 * 32 * MLP_8B / (PEAK * _eff(8192)))


# ---------------------------------------------------------------- Llama-3.1-70B, TP8


def test_70b_tp8_decode_batch_1_per_rank():
    m = build_step_model("Llama-3.1-70B", "h100", tp=8, params=P)
    ops = _ops(m, StepBatch.build(decode_seqs=1, decode_context=1024))
    # per rank: q 1024x8192 (64/8 heads), k and v 128x8192 (one of 8 KV heads) -> 10,485,760 params
    assert ops["qkv_proj"].flops == 80 * 2 * 10_485_760 == 1_677_721_600
    assert ops["qkv_proj"].bytes == 80 * (2 * 10_485_760 + 2 * ((8192 + 1024) + 2 * (8192 + 128)))
    assert ops["o_proj"].flops == 80 * 2 * 8192 * 1024
    # MLP 28672 / 8 = 3584 wide: 3 x 3584 x 8192 = 88,080,384 params per rank
    assert ops["mlp"].flops == 80 * 2 * 88_080_384 == 14_092_861_440
    # lm_head vocab-parallel: 128256 / 8 = 16032 rows
    assert ops["lm_head"].flops == 2 * 16032 * 8192
    # attention: 8 heads per rank; one KV head per rank = 2 x 128 x 2 B = 512 B per token and layer
    assert ops["attn_decode"].flops == 80 * 2 * 8 * 256 * 1024
    assert ops["attn_decode"].bytes == 80 * (1024 * 512 + 512 + 2 * 1024 * 2)
    assert ops["attn_decode"].bound == "memory"
    # TP: 2 ring all-reduces per layer + vLLM's embedding all-reduce = 161, of 8192 x 2 B = 16,384 B each:
    # 2 x 7 steps x 1 µs + (14 / 8) x 16,384 B / 360e9 B/s = 14.0796 µs each -> 2.2668 ms
    one = 14 * 1e-6 + 14 / 8 * 16_384 / NVLINK
    assert ops["tp_allreduce"].time_s == pytest.approx(161 * one, rel=1e-12)
    assert ops["tp_allreduce"].bytes == 161 * 16_384 and ops["tp_allreduce"].bound == "communication"
    # logits gather of 128256 x 2 B: 7 steps x 1 µs + 7/8 of the bytes
    assert ops["logits_gather"].time_s == pytest.approx(7e-6 + 7 / 8 * 128256 * 2 / NVLINK)
    # weights per rank 17.4 GB / 2.68 TB/s = 6.5 ms, + 2.27 ms all-reduce + 0.5 ms: ~9 ms per token
    assert 8e-3 < m.step_time(StepBatch.build(decode_seqs=1, decode_context=1024))[0] < 1e-2


def test_tp_communication_only_with_tp_above_1():
    batch = StepBatch.build(decode_seqs=8, decode_context=8 * 2048)
    one = _ops(build_step_model("Llama-3.1-8B", "h100", tp=1, params=P), batch)
    two = _ops(build_step_model("Llama-3.1-8B", "h100", tp=2, params=P), batch)
    assert not {"tp_allreduce", "logits_gather"} & set(one)
    assert {r.bound for r in one.values()} <= {"memory", "compute", "overhead"}
    assert two["tp_allreduce"].time_s > 0 and two["logits_gather"].time_s > 0
    # 65 all-reduces of 8 rows x 4096 x 2 B over NVLink: 2 ring steps x 1 µs + 1/2 x 2 x 65,536 B / 360e9
    assert two["tp_allreduce"].time_s == pytest.approx(65 * (2e-6 + 65_536 / NVLINK))
    # half the weights per rank: decode at this batch gets faster despite the all-reduces
    assert two["mlp"].bytes < one["mlp"].bytes
    m1, m2 = (
        build_step_model("Llama-3.1-8B", "h100", params=P),
        build_step_model("Llama-3.1-8B", "h100", tp=2, params=P),
    )
    assert m2.step_time(batch)[0] < m1.step_time(batch)[0]


def test_70b_tp8_weights_read_match_memory_plan():
    m = build_step_model("Llama-3.1-70B", "h100", tp=8, params=P)
    ops = _ops(m, StepBatch.build(decode_seqs=1, decode_context=0))
    h, q, kv, i, v = 8192, 1024, 128, 3584, 16032
    act = 80 * 2 * ((h + q) + 2 * (h + kv) + (q + h) + 3 * (h + i)) + 2 * (h + v)
    weights_read = sum(ops[o].bytes for o in ("qkv_proj", "o_proj", "mlp", "lm_head")) - act
    plan = plan_memory(load_model("Llama-3.1-70B"), get_gpu("h100"), Parallelism(tp=8))
    norms = 2 * (80 * 2 * h + h)  # replicated
    assert weights_read == plan.weights_bytes_per_rank - 2 * v * h - norms
