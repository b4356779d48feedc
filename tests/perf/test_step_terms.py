"""The roofline's step-time terms beyond the efficiencies: a fixed cost per kernel, decode attention's own
KV-read bandwidth, vLLM's one-shot all-reduce, CUDA-graph padding (llmcap.perf.allreduce, cuda_graphs)."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.catalog import get_gpu
from llmcap.perf import StepBatch, build_step_model
from llmcap.perf.allreduce import CUSTOM_MAX_BYTES, allreduce_time, oneshot_max_bytes
from llmcap.perf.comm import link_for, ring_allreduce_time
from llmcap.perf.cuda_graphs import capture_sizes, padded_rows
from llmcap.perf.efficiency import RooflineParams

H100 = get_gpu("h100")
BASE = RooflineParams()  # explicit params: the documented defaults, whatever the GPU's calibration


def _decode(seqs: float, context: float = 4096.0) -> StepBatch:
    return StepBatch.build(decode_seqs=[seqs], decode_context=[seqs * context], decode_max_context=[context])


def test_fixed_costs_are_paid_once_per_gemm_and_attention_kernel():
    # Llama-3.1-8B at TP 1: 32 layers of qkv (1 GEMM), o (1), MLP (gate/up merged + down: 2), and lm_head once:
    # 32 x 4 + 1 = 129 GEMM kernels; one attention kernel a layer: 32
    gemm, attn = 5e-6, 11e-6
    plain = build_step_model("Llama-3.1-8B", "h100", params=BASE)
    fixed = build_step_model(
        "Llama-3.1-8B", "h100", params=BASE.model_copy(update={"gemm_kernel_s": gemm, "attention_kernel_s": attn})
    )
    batch = _decode(8.0)
    np.testing.assert_allclose(fixed.step_time(batch) - plain.step_time(batch), 129 * gemm + 32 * attn, rtol=1e-9)
    ops = {c.op: c for c in fixed.breakdown(batch)}
    assert ops["attn_kernel"].time_s == pytest.approx(32 * attn) and ops["attn_kernel"].bound == "overhead"
    # the simulator's tables carry them too (they depend on the rows alone)
    np.testing.assert_allclose(fixed.compile().step_time(batch), fixed.step_time(batch), rtol=1e-12)
    empty = StepBatch.build(decode_seqs=[0.0], decode_context=[0.0], decode_max_context=[0.0])
    np.testing.assert_allclose(fixed.step_time(empty), plain.step_time(empty), rtol=1e-12)  # no kernel runs


def test_decode_attention_reads_the_kv_at_its_own_bandwidth():
    kv = build_step_model("Llama-3.1-8B", "h100", params=BASE.model_copy(update={"kv_hbm_efficiency": 0.9}))
    plain = build_step_model("Llama-3.1-8B", "h100", params=BASE)
    batch = _decode(64.0, 8192.0)  # memory bound: 8192 keys a sequence
    t_kv = {c.op: c.time_s for c in kv.breakdown(batch)}
    t_plain = {c.op: c.time_s for c in plain.breakdown(batch)}
    assert t_kv["attn_decode"] == pytest.approx(t_plain["attn_decode"] * BASE.hbm_efficiency / 0.9, rel=1e-12)
    assert t_kv["mlp"] == t_plain["mlp"]  # weights still stream at hbm_efficiency
    np.testing.assert_allclose(kv.compile().step_time(batch), kv.step_time(batch), rtol=1e-12)


def test_vllm_picks_the_one_shot_all_reduce_by_message_size_and_gpu_count():
    assert (
        oneshot_max_bytes(2) == CUSTOM_MAX_BYTES
        and oneshot_max_bytes(4) == 512 * 1024
        and oneshot_max_bytes(8) == 256 * 1024
    )
    params = BASE.model_copy(update={"comm_efficiency": 0.7, "scale_up_latency_s": 0.8e-6})
    lat = 4.5e-6
    for n, b, oneshot in (
        (8, 64 * 1024, True),
        (8, 1024 * 1024, False),
        (4, 300 * 1024, True),
        (4, 600 * 1024, False),
        (2, 4 * 1024 * 1024, True),
        (2, 16 * 1024 * 1024, False),
        (8, 64 * 1024 * 1024, False),
    ):
        link = link_for(H100, n, params)
        assert link.bytes_s == pytest.approx(900e9 / 2 * 0.7)
        # one-shot: one barrier, every peer's whole message; two-stage: two barriers, a ring's bytes
        want = lat + (n - 1) * b / link.bytes_s if oneshot else 2 * lat + 2 * (n - 1) / n * b / link.bytes_s
        assert float(allreduce_time(b, n, link, lat)) == pytest.approx(want, rel=1e-12), (n, b)
    # the time grows with the message across both switches (8 GPUs: 256 KiB; 2 GPUs: 8 MiB)
    for n in (2, 4, 8):
        sizes = np.arange(1, 2 * CUSTOM_MAX_BYTES, 4096.0)
        assert np.all(np.diff(allreduce_time(sizes, n, link_for(H100, n, params), lat)) > 0), n
    # a tiny message: one barrier at every width, where the ring pays 2(n-1) steps
    t2, t8 = (float(allreduce_time(256.0, n, link_for(H100, n, params), lat)) for n in (2, 8))
    assert t8 - t2 == pytest.approx(6 * 256.0 / link_for(H100, 8, params).bytes_s)  # 6 more peers' 256 B, ns
    # no one-shot latency, more than 2 PCIe cards, across nodes: the ring at every size
    l40s = get_gpu("l40s")
    for n, link, latency in (
        (8, link_for(H100, 8, params), None),
        (4, link_for(l40s, 4, params), lat),
        (16, link_for(H100, 16, params), lat),
    ):
        assert float(allreduce_time(4096.0, n, link, latency)) == float(ring_allreduce_time(4096.0, n, link))
    pcie2 = link_for(l40s, 2, params)  # vLLM keeps its custom kernel on 2 PCIe GPUs, NCCL's ring past 8 MiB
    assert pcie2.name == "pcie" and float(allreduce_time(4096.0, 2, pcie2, lat)) == pytest.approx(
        lat + 4096.0 / pcie2.bytes_s
    )
    assert float(allreduce_time(16e6, 2, pcie2, lat)) == float(ring_allreduce_time(16e6, 2, pcie2))


def test_the_tp_all_reduce_of_a_decode_step_uses_the_one_shot_kernel():
    # Llama-3.1-70B at TP 8, 8 sequences: 8 x 8192 x 2 B = 128 KiB per all-reduce, under vLLM's 256 KiB
    lat = 4.5e-6
    ring = build_step_model("Llama-3.1-70B", "h100", tp=8, params=BASE)
    oneshot = build_step_model(
        "Llama-3.1-70B", "h100", tp=8, params=BASE.model_copy(update={"allreduce_oneshot_latency_s": lat})
    )
    batch = _decode(8.0)
    link = link_for(H100, 8, BASE)
    b = 8 * 8192 * 2.0
    per_ar = lat + 7 * b / link.bytes_s
    count = 2 * 80 + 1  # two a layer, one after the vocab-parallel embedding
    got = {c.op: c.time_s for c in oneshot.breakdown(batch)}["tp_allreduce"]
    assert got == pytest.approx(count * per_ar, rel=1e-12)
    assert {c.op: c.time_s for c in ring.breakdown(batch)}["tp_allreduce"] == pytest.approx(
        count * (14 * BASE.scale_up_latency_s + 1.75 * b / link.bytes_s)
    )
    np.testing.assert_allclose(oneshot.compile().step_time(batch), oneshot.step_time(batch), rtol=1e-12)


def test_cuda_graph_sizes_are_vllms_ladder_and_steps_pad_up_to_them():
    sizes = capture_sizes(512)
    assert len(sizes) == 3 + 31 + 17  # 1, 2, 4; 8..248 by 8; 256..512 by 16
    assert sizes[:5].tolist() == [1, 2, 4, 8, 16] and sizes[-2:].tolist() == [496, 512]
    assert capture_sizes(0).size == 0
    rows = [0, 1, 3, 5, 9, 248, 249, 257, 512, 513, 8192]
    assert padded_rows(rows, 512).tolist() == [0, 1, 4, 8, 16, 248, 256, 272, 512, 513, 8192]
    assert padded_rows(rows, 0).tolist() == rows


def test_a_padded_step_runs_its_gemms_at_the_captured_size_and_its_logits_unpadded():
    padded = build_step_model("Llama-3.1-8B", "h100", params=BASE.model_copy(update={"cuda_graph_max_tokens": 512}))
    plain = build_step_model("Llama-3.1-8B", "h100", params=BASE)
    tok_p, log_p, _ = padded.row_terms(np.array([3.0, 4.0, 600.0]))
    tok_4, log_3, _ = plain.row_terms(np.array([4.0, 4.0, 600.0]))
    np.testing.assert_array_equal(tok_p, tok_4)  # 3 rows run as 4; 600 is past the largest graph: unpadded
    np.testing.assert_array_equal(log_p, plain.row_terms(np.array([3.0, 4.0, 600.0]))[1])  # lm_head: real rows only
    batch = _decode(3.0)
    assert padded.step_time(batch)[0] > plain.step_time(batch)[0]
    np.testing.assert_allclose(padded.compile().step_time(batch), padded.step_time(batch), rtol=1e-12)
