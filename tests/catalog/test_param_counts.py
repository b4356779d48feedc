"""Parameter counts: hand-counted small configs exactly, shipped configs within 0.5% of published figures."""

import json

import pytest

from llmcap.catalog import load_model, parse_model_config


def within(value: int, published: float, tol: float = 0.005) -> bool:
    return abs(value / published - 1) <= tol


def test_llama_31_8b():
    assert within(load_model("Llama-3.1-8B").params.total, 8.03e9)


def test_llama_31_70b():
    assert within(load_model("Llama-3.1-70B").params.total, 70.6e9)


def test_mixtral_total_and_active():
    p = load_model("Mixtral-8x7B").params
    assert within(p.total, 46.7e9)
    assert within(p.active, 12.9e9)  # Mistral counts the embedding table in "12.9B per token"


def test_deepseek_v3_total_excludes_mtp():
    p = load_model("DeepSeek-V3").params
    assert within(p.total, 671e9)
    # README_WEIGHTS.md: activated 36.6B including the output head (the "37B" headline is its rounding)
    assert within(p.active_no_embeddings, 36.6e9)
    # The HF checkpoint stores 685B: 671B + MTP module + its copies of embedding and head.
    assert within(p.total + p.mtp + p.embeddings + p.lm_head, 685e9)
    assert p.mtp > 0


def test_qwen_models():
    assert within(load_model("Qwen2.5-7B").params.total, 7.61e9)
    assert within(load_model("Qwen3-8B").params.total, 8.2e9)
    assert within(load_model("Qwen3-30B-A3B").params.total, 30.5e9)
    assert within(load_model("Mistral-7B-v0.1").params.total, 7.24e9)


def _tiny(tmp_path, **over):
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    cfg.update(over)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return parse_model_config(p)


def test_tiny_dense_by_component(tmp_path):
    p = _tiny(tmp_path).params
    assert p.by_component() == {
        "embeddings": 1000 * 64,
        "attention": 4 * (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64),  # q, k, v (2 heads x 16), o
        "dense_mlp": 4 * 3 * 64 * 128,
        "routed_experts": 0,
        "shared_experts": 0,
        "router": 0,
        "norms": 4 * 2 * 64 + 64,
        "lm_head": 1000 * 64,
    }
    assert p.total == p.active == 276_032


def test_tied_embeddings_counted_once(tmp_path):
    p = _tiny(tmp_path, tie_word_embeddings=True).params
    assert p.lm_head == 0 and p.total == 276_032 - 64_000


def test_qwen2_qkv_bias_and_qwen3_qk_norm(tmp_path):
    q2 = _tiny(tmp_path, model_type="qwen2").params
    assert q2.attention == 4 * (12_288 + 64 + 32 + 32)  # q, k, v biases; o has none
    q3 = _tiny(tmp_path, model_type="qwen3", head_dim=16).params
    assert q3.norms == 4 * (2 * 64 + 2 * 16) + 64  # q_norm, k_norm per layer


def test_tiny_mla_moe_by_component(tmp_path):
    cfg = {
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "intermediate_size": 96,
        "vocab_size": 100,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = parse_model_config(p)
    assert m.layer_is_moe == (False, True)
    attn = 64 * 32 + 32 * 4 * 12 + 64 * 20 + 16 * 4 * 16 + 4 * 8 * 64  # q_a, q_b, kv_a, kv_b, o
    c = m.params
    assert c.by_component() == {
        "embeddings": 6400,
        "attention": 2 * attn,
        "dense_mlp": 3 * 64 * 96,
        "routed_experts": 4 * 3 * 64 * 16,
        "shared_experts": 3 * 64 * 16,
        "router": 4 * 64 + 4,  # gate + e_score_correction_bias
        "norms": 2 * (2 * 64 + 32 + 16) + 64,  # + q_a_layernorm, kv_a_layernorm
        "lm_head": 6400,
    }
    assert c.total == 63_140
    assert c.active == 63_140 - 4 * 3072 + 2 * 3072
    assert c.active_no_embeddings == c.active - 6400
    # MTP: enorm + hnorm + eh_proj(2h x h) + one MoE layer + shared_head norm
    assert c.mtp == 64 + 64 + 2 * 64 * 64 + (attn + 260 + 4 * 3072 + 3072 + 176) + 64


@pytest.mark.parametrize(
    "step,dense,expected",
    [(1, [], (True,) * 4), (2, [], (False, True, False, True)), (1, [0], (False, True, True, True))],
)
def test_qwen_moe_layer_pattern(tmp_path, step, dense, expected):
    m = _tiny(
        tmp_path,
        model_type="qwen3_moe",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=step,
        mlp_only_layers=dense,
    )
    assert m.layer_is_moe == expected
