"""Weights held by one rank: sharded vs replicated parts, PP stages, quantized formats — by hand."""

import json

import pytest

from llmcap.catalog import load_model, parse_model_config
from llmcap.catalog.quant import QuantPolicy, weight_format
from llmcap.memory import stage_weight_bytes, weight_bytes_total
from llmcap.parallelism import Parallelism

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
BF16 = QuantPolicy(weight_format("bf16"))


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    return parse_model_config(p)


def test_tp1_bf16(tiny):
    w = stage_weight_bytes(tiny, Parallelism(), BF16, 0)
    assert w["embeddings"] == 1024 * 64 * 2  # vocab padded to a multiple of 64, as vLLM does
    assert w["lm_head"] == 1024 * 64 * 2
    assert w["attention"] == 4 * 12_288 * 2
    assert w["dense_mlp"] == 4 * 24_576 * 2
    assert w["norms"] == 576 * 2
    assert sum(w.values()) == 558_208


def test_tp2_shards_matrices_and_vocab_but_not_norms(tiny):
    w = stage_weight_bytes(tiny, Parallelism(tp=2), BF16, 0)
    assert w["embeddings"] == 512 * 64 * 2
    # q: 32 x 64, k and v: one 16-wide KV head each, o: 64 x 32
    assert w["attention"] == 4 * (32 * 64 + 16 * 64 + 16 * 64 + 64 * 32) * 2
    assert w["dense_mlp"] == 4 * (2 * 64 * 64 + 64 * 64) * 2
    assert w["norms"] == 576 * 2
    assert sum(w.values()) == 279_680


def test_tp4_replicates_kv_heads(tiny):
    w = stage_weight_bytes(tiny, Parallelism(tp=4), BF16, 0)
    # 2 KV heads over 4 ranks: each rank keeps one whole KV head (16 wide) for k and v
    assert w["attention"] == 4 * (16 * 64 + 16 * 64 + 16 * 64 + 64 * 16) * 2


def test_pp2_splits_layers_embedding_first_head_last(tiny):
    layer = (12_288 + 24_576 + 128) * 2
    first = stage_weight_bytes(tiny, Parallelism(pp=2), BF16, 0)
    last = stage_weight_bytes(tiny, Parallelism(pp=2), BF16, 1)
    assert sum(first.values()) == 1024 * 64 * 2 + 2 * layer
    assert first["lm_head"] == 0
    assert sum(last.values()) == 2 * layer + 64 * 2 + 1024 * 64 * 2
    assert last["embeddings"] == 0


def test_tied_embeddings_with_pp_keep_a_head_copy(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**TINY, "tie_word_embeddings": True}))
    m = parse_model_config(p)
    assert stage_weight_bytes(m, Parallelism(), BF16, 0)["lm_head"] == 0
    assert stage_weight_bytes(m, Parallelism(pp=2), BF16, 1)["lm_head"] == 1024 * 64 * 2


def test_int4_awq_g32_keeps_embeddings_head_and_norms_in_bf16(tiny):
    awq = QuantPolicy(weight_format("int4-awq-g32"))
    w = stage_weight_bytes(tiny, Parallelism(), awq, 0)

    def q(out, inp):  # packed int4 + fp16 scale and int4 zero per group of 32 inputs
        groups = out * (inp // 32)
        return out * inp // 2 + groups * 2 + groups // 2

    assert w["attention"] == 4 * (q(64, 64) + q(32, 64) + q(32, 64) + q(64, 64))
    assert w["dense_mlp"] == 4 * (2 * q(128, 64) + q(64, 128))
    assert w["embeddings"] == w["lm_head"] == 1024 * 64 * 2
    assert w["norms"] == 576 * 2
    assert sum(w.values()) == 348_544
    gptq = QuantPolicy(weight_format("int4-gptq-g32"))
    assert weight_bytes_total(tiny, gptq) == 348_544 + 4 * (6 * 64 * 4 + 128 * 4)  # int32 g_idx per input row


def test_experts_split_by_ep_router_replicated():
    m = load_model("Mixtral-8x7B")
    expert = 3 * 4096 * 14336 * 2  # one bf16 expert
    w = stage_weight_bytes(m, Parallelism(tp=2, ep=2), BF16, 0)
    assert w["routed_experts"] == 32 * 4 * expert  # 4 whole experts per rank
    assert w["router"] == 32 * 8 * 4096 * 2
    w_tp = stage_weight_bytes(m, Parallelism(tp=2), BF16, 0)
    assert w_tp["routed_experts"] == 32 * 8 * expert // 2  # every expert, half of each


def test_mla_down_projections_replicated_under_tp():
    m = load_model("DeepSeek-V3")
    w = stage_weight_bytes(m, Parallelism(tp=8), BF16, 0)
    h, heads = 7168, 128
    per_layer = (
        h * 1536  # q_a_proj, replicated
        + 1536 * heads * 192 // 8  # q_b_proj, split by heads
        + h * 576  # kv_a_proj_with_mqa, replicated
        + 512 * heads * 256 // 8  # kv_b_proj, split
        + heads * 128 * h // 8  # o_proj, split
    )
    assert w["attention"] == 61 * per_layer * 2


def test_fp8_block_checkpoint_size_of_deepseek_v3():
    m = load_model("DeepSeek-V3")

    def fp8b(out, inp):  # 1-byte values + one fp32 scale per 128 x 128 tile
        return out * inp + -(-out // 128) * -(-inp // 128) * 4

    h = 7168
    attn = fp8b(1536, h) + fp8b(128 * 192, 1536) + fp8b(576, h) + fp8b(128 * 256, 512) + fp8b(h, 128 * 128)
    dense = 2 * fp8b(18432, h) + fp8b(h, 18432)
    expert = 2 * fp8b(2048, h) + fp8b(h, 2048)
    norms = 61 * (2 * h + 1536 + 512) + h
    bf16 = 2 * (2 * 129280 * h + norms + 58 * (256 * h + 256))  # embedding, head, norms, router (+bias)
    expected = 61 * attn + 3 * dense + 58 * (256 + 1) * expert + bf16
    assert weight_bytes_total(m, QuantPolicy(weight_format("fp8-block"))) == expected
