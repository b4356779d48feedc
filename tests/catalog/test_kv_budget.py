"""KV budget per rank = HBM x utilization - weights - runtime - margin, in whole blocks (toy GPU, by hand)."""

import json

import pytest

from llmcap.catalog import parse_model_config
from llmcap.catalog.gpus import GpuSpec
from llmcap.memory import MemoryParams, plan_memory
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
TOY = GpuSpec(
    name="toy",
    vendor="test",
    hbm_bytes=16 * 2**20,
    hbm_gb_datasheet=0.016,
    hbm_bandwidth_bytes_s=1e9,
    dense_flops={"bf16": 1e12},
    scale_up=None,
    scale_up_bytes_s=None,
    gpus_per_node=8,
    nic_bytes_s=1e9,
    usd_per_gpu_hour=1.0,
)
PARAMS = MemoryParams(
    gpu_memory_utilization=0.5,
    max_num_batched_tokens=100,
    max_num_seqs=10,
    activation_bytes_per_token=1000,
    logits_copies=2,
    non_torch_bytes=1_000_000,
    comm_buffer_bytes=500_000,
    cuda_graph_bytes=200_000,
    workspace_bytes=100_000,
    safety_margin_bytes=50_000,
)
USABLE = 8 * 2**20  # 16 MiB x 0.5
RUNTIME_1GPU = 100 * 1000 + 2 * 10 * 1024 * 4 + 1_000_000 + 200_000 + 100_000  # activations, logits, ...
RUNTIME_NGPU = RUNTIME_1GPU + 500_000  # + communication buffers


def _model(tmp_path, **over):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**TINY, **over}))
    return parse_model_config(p)


def test_breakdown_rows_tp1(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(), "bf16", "bf16", 16, PARAMS)
    kv = USABLE - 558_208 - RUNTIME_1GPU - 50_000
    assert [(r.label, r.bytes) for r in plan.breakdown.rows] == [
        ("HBM (toy, driver-reported)", 16 * 2**20),
        ("reserved (1 - gpu_memory_utilization=0.5)", 8 * 2**20),
        ("weights: embeddings", 1024 * 64 * 2),
        ("weights: attention", 4 * 12_288 * 2),
        ("weights: dense_mlp", 4 * 24_576 * 2),
        ("weights: norms", 576 * 2),
        ("weights: lm_head", 1024 * 64 * 2),
        ("activations (peak forward)", 100_000),
        ("logits / sampler (fp32)", 81_920),
        ("non-torch (CUDA context)", 1_000_000),
        ("CUDA graphs", 200_000),
        ("workspace", 100_000),
        ("safety margin", 50_000),
        ("KV cache (bf16, 2 B/elem)", kv),
    ]
    assert kv == 6_298_480
    assert plan.breakdown.weights_bytes == plan.weights_bytes_per_rank == 558_208
    assert plan.kv_bytes_per_token_per_rank == 2 * 2 * 16 * 2 * 4 == 512
    assert plan.kv_blocks_per_rank == 6_298_480 // (16 * 512) == 768
    assert plan.kv_tokens_per_rank == plan.kv_tokens_per_instance == 768 * 16


def test_block_rounding_keeps_whole_blocks_only(tmp_path):
    m = _model(tmp_path)
    assert 6_298_480 // 512 == 12_301  # what "all tokens that fit" would claim
    assert plan_memory(m, TOY, Parallelism(), block_size=16, params=PARAMS).kv_tokens_per_rank == 12_288
    assert plan_memory(m, TOY, Parallelism(), block_size=160, params=PARAMS).kv_tokens_per_rank == 76 * 160


def test_tp2_halves_kv_heads_and_charges_comm_buffers(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(tp=2), params=PARAMS)
    assert plan.kv_budget_bytes_per_rank == USABLE - 279_680 - RUNTIME_NGPU - 50_000 == 6_077_008
    assert plan.kv_bytes_per_token_per_rank == 2 * 1 * 16 * 2 * 4
    assert plan.kv_tokens_per_rank == (6_077_008 // (16 * 256)) * 16 == 23_728


def test_dp_replicas_each_hold_their_own_sequences(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(dp=2), params=PARAMS)
    per_rank = (USABLE - 558_208 - RUNTIME_NGPU - 50_000) // (16 * 512) * 16
    assert plan.kv_tokens_per_rank == per_rank == 11_312
    assert plan.kv_tokens_per_instance == 2 * per_rank


def test_pp_bottleneck_is_the_heavier_stage(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(pp=2), params=PARAMS)
    assert plan.stage_weights_bytes == (279_040, 279_168)
    assert plan.bottleneck_stage == 1 and plan.weights_bytes_per_rank == 279_168
    assert plan.kv_bytes_per_token_per_rank == 2 * 2 * 16 * 2 * 2  # 2 layers per stage
    assert plan.kv_budget_bytes_per_rank == USABLE - 279_168 - RUNTIME_NGPU - 50_000


def test_default_activation_estimate(tmp_path):
    params = PARAMS.model_copy(update={"activation_bytes_per_token": None})
    rows = {
        r.label: r.bytes for r in plan_memory(_model(tmp_path), TOY, Parallelism(tp=2), params=params).breakdown.rows
    }
    assert rows["activations (peak forward)"] == 100 * 2 * (4 * 64 + 3 * 128 // 2)


def test_max_concurrent_sequences_in_whole_blocks(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(), params=PARAMS)  # 768 blocks of 16
    assert list(plan.max_concurrent_sequences([1, 16, 17, 1000, 4096])) == [768, 768, 384, 768 // 63, 3]


def test_sliding_window_layers_need_fewer_blocks(tmp_path):
    plan = plan_memory(_model(tmp_path, model_type="mistral", sliding_window=64), TOY, params=PARAMS)
    # window 64 = 4 blocks, +1 for a window straddling a block boundary; full attention would need 63
    assert list(plan.max_concurrent_sequences([32, 1000])) == [768 // 2, 768 // 5]


def test_negative_budget_is_reported_not_raised(tmp_path):
    small = GpuSpec(**{**TOY.__dict__, "hbm_bytes": 2 * 2**20})
    plan = plan_memory(_model(tmp_path), small, Parallelism(), params=PARAMS)
    assert plan.kv_budget_bytes_per_rank == 2**20 - 558_208 - RUNTIME_1GPU - 50_000 < 0
    assert plan.kv_tokens_per_rank == 0 and not plan.fits


def test_mla_latent_is_not_split_by_tp(tmp_path):
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
        "intermediate_size": 96,
        "vocab_size": 100,
    }
    m = _model(tmp_path, **cfg)
    for tp in (1, 4):
        assert plan_memory(m, TOY, Parallelism(tp=tp), params=PARAMS).kv_bytes_per_token_per_rank == 2 * (16 + 4) * 2


def test_fp8_kv_doubles_tokens(tmp_path):
    plan = plan_memory(_model(tmp_path), TOY, Parallelism(), kv_dtype="fp8", params=PARAMS)
    assert plan.kv_tokens_per_rank == 6_298_480 // (16 * 256) * 16


def test_bad_block_size(tmp_path):
    from llmcap.errors import LlmcapError

    with pytest.raises(LlmcapError, match="block size"):
        plan_memory(_model(tmp_path), TOY, block_size=0, params=PARAMS)
