"""Roofline model as a StepTimeModel: vectorised, monotone, consistent breakdown, PP, quantisation, errors."""

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.perf import (
    RooflineModel,
    RooflineParams,
    StepBatch,
    StepTimeModel,
    build_step_model,
    causal_pairs,
    decode_step_time,
    prefill_time,
)

CONFIGS = [
    dict(model="Llama-3.1-8B", gpu="h100"),
    dict(model="Llama-3.1-70B", gpu="h100", tp=4, pp=2),
    dict(model="Qwen3-30B-A3B", gpu="h200", tp=2, ep=2),
    dict(model="Mistral-7B-v0.1", gpu="l40s", tp=2),  # sliding window, PCIe
    dict(model="DeepSeek-V3", gpu="b200", tp=8, ep=8, weight_quant="fp8-block"),  # MLA, dense + MoE layers
]


def _random_batches(n: int, seed: int = 0) -> StepBatch:
    rng = np.random.default_rng(seed)
    new = rng.integers(0, 4096, n) * (rng.random(n) < 0.6)
    cached = rng.integers(0, 8192, n)
    seqs = rng.integers(0, 300, n)
    ctx = rng.integers(1, 16384, n)
    return StepBatch.build(
        prefill_tokens=new,
        prefill_pairs=causal_pairs(new, cached),
        decode_seqs=seqs,
        decode_context=seqs * ctx,
        decode_max_context=np.where(seqs > 0, ctx * 1.5, 0),
    )


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['model']}-tp{c.get('tp', 1)}")
def test_vectorised_equals_per_batch(cfg):
    m = build_step_model(**cfg)
    assert isinstance(m, StepTimeModel)
    b = _random_batches(40)
    together = m.step_time(b)
    one_by_one = [
        m.step_time(StepBatch(*(np.asarray(getattr(b, f)[i : i + 1]) for f in b.__dataclass_fields__)))[0]
        for i in range(len(b))
    ]
    np.testing.assert_allclose(together, one_by_one, rtol=1e-12)
    # the breakdown of each batch adds up to its step time
    for i in (0, 7, 21):
        assert sum(r.time_s for r in m.breakdown(b, i)) == pytest.approx(together[i], rel=1e-12)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['model']}-tp{c.get('tp', 1)}")
def test_monotone_in_tokens_and_context(cfg):
    m = build_step_model(**cfg)
    sizes = np.arange(1, 600)
    assert np.all(np.diff(decode_step_time(m, sizes, 2048)) > 0)
    by_ctx = np.diff(decode_step_time(m, 16, np.arange(0, 40000, 97)))
    windowed = any(w is not None for w in m.model.layer_window)  # Mistral: flat past its 4096 window
    assert np.all(by_ctx >= 0) and (windowed or np.all(by_ctx > 0))
    assert np.all(np.diff(prefill_time(m, np.arange(1, 20000, 37))) > 0)
    # more prefill on top of the same decodes costs more; prefix-cache hits save time
    mixed = m.step_time(StepBatch.build(prefill_tokens=[0, 128, 512], decode_seqs=32, decode_context=32 * 1000))
    assert np.all(np.diff(mixed) > 0)
    assert np.all(np.diff(prefill_time(m, 8192, [6144, 2048, 0])) > 0)


def test_empty_step_costs_only_the_overhead():
    m = build_step_model("Llama-3.1-8B", "h100")
    assert m.step_time(StepBatch.build())[0] == RooflineParams().step_overhead_s
    assert [r.op for r in m.breakdown(StepBatch.build())] == ["overhead"]


def test_params_change_the_numbers():
    fast = RooflineParams(hbm_efficiency=1.0, step_overhead_s=0.0)
    m = build_step_model("Llama-3.1-8B", "h100", params=fast)
    b = StepBatch.build(decode_seqs=1, decode_context=0)
    # batch 1, no context: every op memory bound at the full 3.35 TB/s, no overhead
    assert m.step_time(b)[0] == pytest.approx(sum(r.bytes for r in m.breakdown(b)) / 3.35e12, rel=1e-12)
    with pytest.raises(ValueError):
        RooflineParams(hbm_efficiency=1.5)


def test_pipeline_parallel_bubble_and_send_recv():
    m = build_step_model("Llama-3.1-70B", "h100", tp=4, pp=2, params=RooflineParams())
    # one sequence: one micro-batch walks both stages; no bubble; one hop of hidden states + residual
    ops = {r.op: r for r in m.breakdown(StepBatch.build(decode_seqs=1, decode_context=1024))}
    assert "pp_bubble" not in ops
    assert ops["pp_send_recv"].bytes == 2 * 8192 * 2
    assert ops["pp_send_recv"].time_s == pytest.approx(1e-6 + 32_768 / (450e9 * 0.8))
    # two micro-batches in flight: the step is 2 x the slower stage; with equal layers the stages differ
    # only by their edges (embedding vs final norm + lm_head + logits gather), so a bubble appears
    ops = {r.op: r for r in m.breakdown(StepBatch.build(decode_seqs=64, decode_context=64 * 1024))}
    assert ops["pp_bubble"].time_s > 0
    # PP alone does not cut the latency of a lone sequence (weights are still read layer after layer)
    tp8 = build_step_model("Llama-3.1-70B", "h100", tp=8)
    assert decode_step_time(m, 1, 1024)[0] > decode_step_time(tp8, 1, 1024)[0]


def test_fp8_uses_fp8_tensor_cores_and_int4_only_saves_bytes():
    bf16 = build_step_model("Llama-3.1-8B", "h100", params=RooflineParams())  # the defaults: one curve for both dtypes
    fp8 = build_step_model("Llama-3.1-8B", "h100", weight_quant="fp8", params=RooflineParams())
    awq = build_step_model("Llama-3.1-8B", "h100", weight_quant="int4-awq", params=RooflineParams())
    assert (bf16.compute_dtype, fp8.compute_dtype, awq.compute_dtype) == ("bf16", "fp8", "bf16")
    pf = StepBatch.build(prefill_tokens=4096)
    dec = StepBatch.build(decode_seqs=1, decode_context=1024)
    op = lambda m, b, name: next(r for r in m.breakdown(b) if r.op == name)  # noqa: E731
    # fp8 q/k/v: 1 B per weight + a 4 B per-tensor scale each: 25,165,824 + 12 bytes per layer
    assert op(fp8, dec, "qkv_proj").bytes == 32 * (25_165_824 + 12 + 2 * ((4096 + 4096) + 2 * (4096 + 1024)))
    # the same FLOPs at 1979 instead of 989.5 TFLOPS: half the compute time in a long prefill
    assert op(fp8, pf, "mlp").time_s == pytest.approx(op(bf16, pf, "mlp").time_s / 2)
    # AWQ: 0.5 B per weight + per 128-input group an fp16 scale and a 4-bit zero (2.5 B): q is
    # 4096 x 4096 / 2 + 4096 x 32 groups x 2.5 = 8,716,288 B; k, v: 1024 x 4096 / 2 + 1024 x 32 x 2.5 = 2,179,072 B
    assert op(awq, dec, "qkv_proj").bytes == 32 * (8_716_288 + 2 * 2_179_072 + 2 * ((4096 + 4096) + 2 * (4096 + 1024)))
    # ... but bf16 math: prefill compute time unchanged, decode much faster
    assert op(awq, pf, "mlp").time_s == pytest.approx(op(bf16, pf, "mlp").time_s)
    assert awq.step_time(dec)[0] < 0.4 * bf16.step_time(dec)[0] + 5e-4
    # a GPU without fp8 tensor cores runs fp8 weights through bf16 math
    assert build_step_model("Llama-3.1-8B", "a100", weight_quant="fp8").compute_dtype == "bf16"


def test_sliding_window_caps_attention():
    m = build_step_model("Mistral-7B-v0.1", "h100")  # window 4096 on every layer
    short = decode_step_time(m, 8, 4096)
    long = decode_step_time(m, 8, 32768)
    assert long[0] == pytest.approx(short[0], rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(model="Llama-9-1T", gpu="h100"), "unknown model 'Llama-9-1T'"),
        (dict(model="Llama-3.1-8B", gpu="v100"), "unknown GPU 'v100'"),
        (dict(model="Llama-3.1-8B", gpu="h100", weight_quant="int3"), "unknown weight format 'int3'"),
        (dict(model="Llama-3.1-8B", gpu="h100", kv_dtype="fp4"), "unknown KV cache dtype 'fp4'"),
        (dict(model="Llama-3.1-70B", gpu="h100", tp=3), "not divisible by TP=3"),
        (dict(model="Llama-3.1-8B", gpu="h100", ep=2), "EP=2 on a model without experts"),
    ],
)
def test_bad_inputs_are_llmcap_errors(kwargs, message):
    with pytest.raises(LlmcapError, match=message):
        build_step_model(**kwargs)


def test_model_from_specs_and_config_path(tmp_path):
    import json

    from llmcap.catalog import get_gpu, load_model

    m = RooflineModel(load_model("Llama-3.1-8B"), get_gpu("h100"))
    b = StepBatch.build(decode_seqs=4, decode_context=4000)
    assert m.step_time(b)[0] == build_step_model("Llama-3.1-8B", "h100").step_time(b)[0]
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
                "tie_word_embeddings": True,
            }
        )
    )
    tiny = build_step_model(str(cfg), "h100")
    # tied embeddings: the lm_head is the embedding table, vocab padded to 1024 (a multiple of 64 as vLLM
    # pads it): 4 logit rows x 2 x 1024 x 256 FLOPs, 1024 x 256 x 2 B of weights
    head = next(r for r in tiny.breakdown(b) if r.op == "lm_head")
    assert head.flops == 4 * 2 * 1024 * 256
    assert head.bytes == 1024 * 256 * 2 + 4 * 2 * (256 + 1024)
