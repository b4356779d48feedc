"""MoE in the roofline: only the experts a step touches are read; EP adds all-to-all and a straggler.

Mixtral-8x7B: 32 layers, hidden 4096, 8 experts of width 14336, top-2. One expert = 3 x 14336 x 4096
= 176,160,768 params = 352,321,536 B in bf16. Qwen3-30B-A3B: 48 layers, hidden 2048, 128 experts of
width 768, top-8; one expert = 3 x 768 x 2048 = 4,718,592 params = 9,437,184 B.
Expected experts touched by T tokens each picking k of E: E x (1 - (1 - k/E)^T).
"""

import pytest

from llmcap.perf import RooflineParams, StepBatch, build_step_model

MIXTRAL_EXPERT = 2 * 3 * 14336 * 4096  # bytes
QWEN_EXPERT = 2 * 3 * 768 * 2048


def _experts(model, tokens):
    b = StepBatch.build(decode_seqs=tokens, decode_context=tokens * 512)
    return next(r for r in model.breakdown(b) if r.op == "moe_experts")


def test_mixtral_batch_1_reads_two_of_eight_experts():
    m = build_step_model("Mixtral-8x7B", "h200")
    op = _experts(m, 1)
    # one token, top-2: 8 x (1 - 6/8) = 2 experts per layer, plus 2 (token, expert) rows of activations
    # (gate and up: 4096 -> 14336 twice, down: 14336 -> 4096, 2 B each)
    act_per_pair = 2 * (2 * (4096 + 14336) + (14336 + 4096))
    assert op.bytes == 32 * (2 * MIXTRAL_EXPERT + 2 * act_per_pair)
    assert op.bytes < 0.26 * 32 * 8 * MIXTRAL_EXPERT  # vs all experts: a quarter
    assert op.flops == 32 * 2 * 2 * 176_160_768  # 2 pairs x 2 FLOPs x params of one expert
    assert op.bound == "memory"
    # 64 tokens: 1 - 0.75^64 = 1 - 1.0e-8: every expert is read
    assert _experts(m, 64).bytes == pytest.approx(32 * (8 * MIXTRAL_EXPERT + 128 * act_per_pair), rel=1e-7)


def test_qwen3_moe_expected_distinct_experts():
    m = build_step_model("Qwen3-30B-A3B", "h100")
    act_per_pair = 2 * 3 * (2048 + 768)
    # T = 1: 128 x (1 - 120/128) = 8 experts
    assert _experts(m, 1).bytes == pytest.approx(48 * (8 * QWEN_EXPERT + 8 * act_per_pair), rel=1e-12)
    # T = 16: 0.9375^16 = exp(16 x ln 0.9375) = exp(-1.03262) = 0.35606 -> 128 x 0.64394 = 82.42 experts
    assert _experts(m, 16).bytes == pytest.approx(48 * (82.42 * QWEN_EXPERT + 128 * act_per_pair), rel=2e-4)
    # fewer bytes than a dense read of all 128 experts until the batch touches nearly all of them
    assert _experts(m, 1).bytes < _experts(m, 16).bytes < 48 * 128 * QWEN_EXPERT


def test_expert_parallel_all_to_all_and_imbalance():
    tp2 = build_step_model("Qwen3-30B-A3B", "h100", tp=2, params=RooflineParams())
    ep2 = build_step_model("Qwen3-30B-A3B", "h100", tp=2, ep=2, params=RooflineParams())
    b = StepBatch.build(decode_seqs=64, decode_context=64 * 1024)
    no_ep = {r.op: r for r in tp2.breakdown(b)}
    with_ep = {r.op: r for r in ep2.breakdown(b)}
    assert "ep_all_to_all" not in no_ep
    # dispatch + combine, each: 1.2 (imbalance) x 64/2 tokens x 8 copies x 2048 x 2 B x 1/2 off-rank
    sent = 1.2 * 32 * 8 * 2048 * 2 * 0.5
    assert with_ep["ep_all_to_all"].bytes == pytest.approx(48 * 2 * sent)
    assert with_ep["ep_all_to_all"].time_s == pytest.approx(48 * 2 * (1e-6 + sent / (450e9 * 0.8)))
    # all 48 layers are MoE: with EP the combine replaces the second all-reduce (48 + 1 embedding)
    assert with_ep["tp_allreduce"].bytes == 49 * 64 * 2048 * 2
    assert no_ep["tp_allreduce"].bytes == 97 * 64 * 2048 * 2
    # EP: each rank holds 64 whole experts; TP: 128 half-width experts -- the same bytes when all are touched
    big = StepBatch.build(decode_seqs=512, decode_context=512 * 1024)
    e_tp = next(r for r in tp2.breakdown(big) if r.op == "moe_experts")
    e_ep = next(r for r in ep2.breakdown(big) if r.op == "moe_experts")
    # weights: 48 x 64 x 9,437,184 B either way; activations differ: TP has 512 x 8 pairs of half width,
    # EP 512 x 8 / 2 pairs of full width (gate, up: 2048 -> w; down: w -> 2048; 2 B)
    act_tp = 48 * 4096 * 2 * (2 * (2048 + 384) + (384 + 2048))
    act_ep = 48 * 2048 * 2 * (2 * (2048 + 768) + (768 + 2048))
    assert e_ep.bytes - act_ep == pytest.approx(e_tp.bytes - act_tp, rel=1e-9)
    assert e_ep.bytes - act_ep == pytest.approx(48 * 64 * QWEN_EXPERT, rel=1e-9)
    # no imbalance, no straggler: the EP expert op gets cheaper or equal
    even = build_step_model("Qwen3-30B-A3B", "h100", tp=2, ep=2, params=RooflineParams(moe_load_imbalance=1.0))
    assert even.step_time(big)[0] < ep2.step_time(big)[0]


def test_deepseek_v3_mixes_dense_and_moe_layers():
    m = build_step_model("DeepSeek-V3", "h200", tp=8, weight_quant="fp8-block")
    ops = {r.op: r for r in m.breakdown(StepBatch.build(decode_seqs=1, decode_context=4096))}
    assert {"mlp", "router", "shared_experts", "moe_experts"} <= set(ops)
    assert m.compute_dtype == "fp8"
    # 3 dense layers of 18432 / 8 = 2304 wide; fp8-block: 1 B per weight + fp32 scale per 128 x 128 tile
    gate = 2304 * 7168 + 18 * 56 * 4  # (2304 x 7168 values) + ceil(2304/128) x ceil(7168/128) scales
    down = 7168 * 2304 + 56 * 18 * 4
    assert ops["mlp"].bytes == 3 * (2 * gate + down + 2 * (2 * (7168 + 2304) + (2304 + 7168)))
