"""KV bytes per token from the shipped configs, computed by hand: 2 x layers x KV heads x head_dim x bytes
(MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes)."""

from llmcap.catalog import load_model


def test_llama_31_8b_bf16():
    assert load_model("Llama-3.1-8B").kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_llama_31_70b_bf16():
    assert load_model("Llama-3.1-70B").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_deepseek_v3_mla_latent_bf16():
    m = load_model("DeepSeek-V3")
    assert m.attention_kind == "mla"
    assert m.kv_bytes_per_token(2) == 61 * (512 + 64) * 2 == 70_272  # the MTP layer is not counted


def test_moe_and_qwen_models():
    assert load_model("Mixtral-8x7B").kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2
    assert load_model("Qwen3-30B-A3B").kv_bytes_per_token(2) == 2 * 48 * 4 * 128 * 2 == 98_304
    assert load_model("Qwen2.5-7B").kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344


def test_fp8_kv_halves_it():
    assert load_model("Llama-3.1-8B").kv_bytes_per_token(1) == 65_536


def test_attention_kinds(tmp_path):
    import json

    from llmcap.catalog import parse_model_config

    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 8, "vocab_size": 10}
    kinds = {}
    for kv in (4, 2, 1):
        p = tmp_path / f"c{kv}.json"
        p.write_text(json.dumps({**base, "num_attention_heads": 4, "num_key_value_heads": kv}))
        m = parse_model_config(p)
        kinds[kv] = (m.attention_kind, m.kv_bytes_per_token(2))
    assert kinds == {4: ("mha", 2 * 2 * 4 * 16 * 2), 2: ("gqa", 2 * 2 * 2 * 16 * 2), 1: ("mqa", 2 * 2 * 1 * 16 * 2)}


def test_sliding_window_layers_hold_at_most_their_window():
    m = load_model("Mistral-7B-v0.1")  # sliding_window 4096 on all 32 layers
    per_token = 2 * 8 * 128 * 2 * 32
    held = m.kv_bytes_for_context([1000, 4096, 8192, 32768], 2)
    assert list(held) == [1000 * per_token, 4096 * per_token, 4096 * per_token, 4096 * per_token]


def test_qwen_window_applies_only_from_max_window_layers(tmp_path):
    import json

    from llmcap.catalog import parse_model_config

    cfg = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 8,
        "vocab_size": 10,
        "sliding_window": 100,
        "use_sliding_window": True,
        "max_window_layers": 3,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert parse_model_config(p).layer_window == (None, None, None, 100)
    p.write_text(json.dumps({**cfg, "use_sliding_window": False}))
    assert parse_model_config(p).layer_window == (None, None, None, None)
    p.write_text(json.dumps({**cfg, "layer_types": ["sliding_attention", "full_attention"] * 2}))
    m = parse_model_config(p)
    assert m.layer_window == (100, None, 100, None)
    # 2 windowed + 2 full layers at 500 tokens, 2*2*16*2 = 128 B per token-layer
    assert m.kv_bytes_for_context(500, 2) == (100 * 2 + 500 * 2) * 128
