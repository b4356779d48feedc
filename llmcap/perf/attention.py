"""Attention of one decoder layer on one rank: its coefficients and its roofline terms.

The one definition of the roofline's attention arithmetic. `RooflineModel` costs its `attn_prefill` and
`attn_decode` ops with `prefill_attention` and `decode_attention`; `CompiledRoofline` times attention
with `layer_attention_time` and `decode_attention_time`; `ScalarRoofline` (llmcap.perf.roofline_scalar)
transcribes them into plain floats for the simulator, checked bit for bit against these functions
(tests/perf/test_attention.py). Each keeps the operation order, so all three agree to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from llmcap.catalog.gpus import GpuSpec
from llmcap.catalog.models import ModelSpec
from llmcap.memory import kv_bytes_per_token_layer_rank
from llmcap.perf.efficiency import RooflineParams, attention_half, matmul_efficiency
from llmcap.perf.model import F64


@dataclass(frozen=True)
class AttentionCoefficients:
    """Per-rank constants of one layer's attention (every layer's: windows are applied per call)."""

    per_pair: float  # FLOPs per query-key pair: 2 x query heads on the rank x (qk + v head dims)
    peak: float  # FLOP/s attention runs at (bf16 tensor cores, whatever the weights' format)
    amax: float  # attention_efficiency_max
    half: float  # prefill tokens at which attention reaches amax / 2
    kv: float  # KV bytes one token adds to the layer on the rank
    c_pf: float  # bytes per new token: its KV written, its Q read, its output written
    bw: float  # achieved HBM bytes/s
    bw_kv: float  # achieved HBM bytes/s of decode attention's KV reads (kv_hbm_efficiency; else bw)

    @property
    def dec_peak(self) -> float:
        """FLOP/s of decode attention: split-KV kernels parallelise over the context, so no ramp."""
        return self.peak * self.amax


def attention_coefficients(
    model: ModelSpec, gpu: GpuSpec, tp: int, kv_dtype: str, params: RooflineParams
) -> AttentionCoefficients:
    """The attention constants of `model` on one of `tp` ranks of `gpu` (KV sharded as llmcap.memory holds it)."""
    heads = -(-model.num_heads // tp)
    if model.mla is not None:
        d = model.mla
        dims = d.qk_nope_head_dim + d.qk_rope_head_dim + d.v_head_dim  # un-absorbed MLA
    else:
        dims = 2 * model.head_dim
    kv = kv_bytes_per_token_layer_rank(model, tp, kv_dtype)
    return AttentionCoefficients(
        per_pair=float(2.0 * heads * dims),
        peak=float(gpu.peak_flops("bf16")),
        amax=float(params.attention_efficiency_max),
        half=float(attention_half(params)),
        kv=float(kv),
        c_pf=float(kv + 2 * (heads * model.head_dim) * params.activation_bytes),
        bw=float(gpu.hbm_bandwidth_bytes_s * params.hbm_efficiency),
        bw_kv=float(
            gpu.hbm_bandwidth_bytes_s
            * (params.hbm_efficiency if params.kv_hbm_efficiency is None else params.kv_hbm_efficiency)
        ),
    )


class AttentionTerms(NamedTuple):
    """One attention op's FLOPs, HBM bytes, and the seconds each takes at its roof."""

    flops: F64
    nbytes: F64
    compute_s: F64
    memory_s: F64

    def time(self) -> F64:
        """The op's roofline time: the slower of compute and memory."""
        return np.maximum(self.compute_s, self.memory_s)


def prefill_attention(c: AttentionCoefficients, tokens: F64, pairs: F64, window: int | None) -> AttentionTerms:
    """Causal prefill attention over `pairs` query-key pairs of `tokens` new tokens (a sliding window
    attends at most `window` keys a token), at the attention efficiency ramp over the new tokens."""
    if window is not None:
        pairs = np.minimum(pairs, tokens * window)
    flops = c.per_pair * pairs
    nbytes = tokens * c.c_pf
    eff = matmul_efficiency(tokens, c.amax, c.half)
    return AttentionTerms(flops, nbytes, flops / (c.peak * eff), nbytes / c.bw)


def decode_attention(c: AttentionCoefficients, seqs: float | F64, context: F64, window: int | None) -> AttentionTerms:
    """Decode attention of `seqs` sequences over `context` tokens in all: every context token's KV read
    (a sliding window reads at most `window` tokens a sequence), plus each new token's own bytes, at the
    KV-read bandwidth."""
    if window is not None:
        context = np.minimum(context, seqs * window)
    flops = c.per_pair * context
    nbytes = context * c.kv + seqs * c.c_pf
    return AttentionTerms(flops, nbytes, flops / c.dec_peak, nbytes / c.bw_kv)


def decode_attention_time(c: AttentionCoefficients, seqs: float | F64, context: F64, window: int | None) -> F64:
    """Seconds of `decode_attention`."""
    return decode_attention(c, seqs, context, window).time()


def layer_attention_time(
    c: AttentionCoefficients, tokens: F64, pairs: F64, seqs: F64, context: F64, window: int | None
) -> F64:
    """Seconds of one layer's attention in a step: prefill, then decode."""
    return prefill_attention(c, tokens, pairs, window).time() + decode_attention(c, seqs, context, window).time()
