"""FLOPs: 2 x active matmul parameters + attention over the context (capped by sliding windows)."""

import json

from llmcap.catalog import parse_model_config

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
LINEAR = 2 * (276_032 - 64_000)  # active params without the input embedding
ATTN_PER_CTX_TOKEN = 4 * 2 * 4 * (16 + 16)  # layers x 2 x heads x (qk dim + v dim)


def _model(tmp_path, **over):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**TINY, **over}))
    return parse_model_config(p)


def test_decode_token_flops(tmp_path):
    m = _model(tmp_path)
    assert list(m.flops_per_token([0, 100])) == [LINEAR, LINEAR + 100 * ATTN_PER_CTX_TOKEN]


def test_prefill_is_causal_and_skips_cached_prefix(tmp_path):
    m = _model(tmp_path)
    # 3 new tokens after 2 cached ones attend over 3, 4, 5 positions
    assert m.prefill_flops(3, 2) == 3 * LINEAR + (3 + 4 + 5) * ATTN_PER_CTX_TOKEN
    assert m.prefill_flops(0, 10) == 0


def test_sliding_window_caps_attention(tmp_path):
    m = _model(tmp_path, model_type="mistral", sliding_window=4)
    assert m.prefill_flops(3, 2) == 3 * LINEAR + (3 + 4 + 4) * ATTN_PER_CTX_TOKEN
    assert m.flops_per_token(1000) == LINEAR + 4 * ATTN_PER_CTX_TOKEN


def test_prefill_vectorised(tmp_path):
    m = _model(tmp_path)
    out = m.prefill_flops([1, 2], [0, 0])
    assert list(out) == [LINEAR + 1 * ATTN_PER_CTX_TOKEN, 2 * LINEAR + (1 + 2) * ATTN_PER_CTX_TOKEN]
