"""Knobs of the roofline model: achieved-efficiency curves, link latencies, fixed overheads.

Peak numbers (TFLOPS, HBM and link bandwidth) come from the GPU catalog; everything here is what a real
engine achieves of those peaks. Every default is an ASSUMPTION from public measurements, stated per field;
they are the starting point that profiling (llmcap.perf calibration) corrects.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field

from llmcap.perf.model import F64


class RooflineParams(BaseModel):
    """Achieved fractions of peak and fixed costs, each with a documented default (a GPU with a shipped
    calibration replaces the efficiencies with fitted ones: llmcap.perf.calibration)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    matmul_efficiency_max: float = Field(default=0.70, gt=0, le=1)
    """Fraction of dense tensor-core peak a large GEMM reaches. Assumption: cuBLAS bf16 GEMMs on H100 SXM
    measure ~650-750 of 989 TFLOPS at large shapes."""
    matmul_half_tokens: float = Field(default=32.0, ge=0)
    """Rows (tokens) at which a GEMM reaches half of `matmul_efficiency_max`: eff(T) = max·T/(T + half).
    Assumption standing for tile quantisation of skinny GEMMs; with the defaults an 8B model on H100
    turns compute bound near batch ~230, close to the ~250-300 of the plain peak/bandwidth ratio."""
    attention_efficiency_max: float = Field(default=0.50, gt=0, le=1)
    """Fraction of bf16 peak that prefill attention (FlashAttention) reaches at long sequences; the same
    T/(T + half) ramp applies over prefill tokens. Assumption between FlashAttention-2 (~35-40% on H100)
    and FlashAttention-3 (~75%, Shah et al. 2024)."""
    attention_half_tokens: float | None = Field(default=None, ge=0)
    """Prefill tokens at which attention reaches half of `attention_efficiency_max`; None: `matmul_half_tokens`.
    A calibrated GPU sets its own (FlashAttention needs far more tokens than a GEMM to fill the GPU)."""
    hbm_efficiency: float = Field(default=0.80, gt=0, le=1)
    """Fraction of datasheet HBM bandwidth that weight / KV streaming kernels reach. Assumption: STREAM-like
    copies reach ~90% on H100, skinny decode GEMMs less; vLLM Llama-3.1-8B decode at batch 1 on A100-40GB
    ran at 77% of the bandwidth ceiling, per-step overheads included (johnmusgrave.com, vLLM 0.23)."""
    kv_hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of datasheet HBM bandwidth decode attention reaches reading the KV cache; None:
    `hbm_efficiency`. A calibrated GPU sets its own where it predicts held-out timings better: split-KV
    decode kernels stream long contiguous pages (~0.9 of peak at large sizes in vLLM's FlashAttention 3
    timings on H100), while skinny decode GEMMs reach ~0.7 streaming weights."""
    gemm_kernel_s: float = Field(default=0.0, ge=0)
    """Fixed cost of one GEMM kernel (setup, wave tail, epilogue) added to its roofline time, once per GEMM
    a layer launches (llmcap.perf.kernels). 0: none. Fitted per GPU where it predicts held-out timings
    better (vLLM's GEMMs in CUDA graphs take 4-8 us for 1-3 us of work on H100)."""
    attention_kernel_s: float = Field(default=0.0, ge=0)
    """Fixed cost of one attention kernel (one per layer and step with any tokens). 0: none. Fitted per GPU
    as `gemm_kernel_s` (FlashAttention 3 decode / prefill calls take ~12 us with next to no work on H100)."""
    comm_efficiency: float = Field(default=0.80, gt=0, le=1)
    """Fraction of one-direction link bandwidth a collective reaches (nccl-tests all_reduce bus bandwidth
    on 8xH100 NVSwitch is ~360 of 450 GB/s). Assumption for the other links too."""
    scale_up_latency_s: float = Field(default=1e-6, ge=0)
    """Latency per ring step on NVLink / Infinity Fabric / PCIe. Assumption: makes a small-message TP8
    all-reduce cost 2·7·1 µs = 14 µs, in the 10-20 µs range of vLLM's custom all-reduce / NCCL LL."""
    allreduce_oneshot_latency_s: float | None = Field(default=None, ge=0)
    """Latency of vLLM's one-shot custom all-reduce (every rank reads every peer's whole message after one
    barrier: its latency barely depends on the GPU count), used where vLLM picks that kernel; its two-stage
    kernel above takes twice it (llmcap.perf.allreduce). None: the ring at every size. Fitted per GPU."""
    scale_out_latency_s: float = Field(default=5e-6, ge=0)
    """Latency per step across nodes (RDMA NIC). Assumption."""
    pcie_bytes_s: float = Field(default=25e9, gt=0)
    """Bytes/s one direction between GPUs without scale-up links (catalog scale_up null): PCIe Gen4 x16 is
    32 GB/s nominal, ~25 GB/s achieved. Assumption."""
    moe_load_imbalance: float = Field(default=1.2, ge=1)
    """With expert parallelism: routed tokens of the busiest EP rank over the mean (the straggler every
    rank waits for). Assumption; EPLB-style balancing brings it towards 1. With ep = 1 every rank holds
    a shard of every expert, so imbalance only moves work between experts inside one grouped GEMM."""
    activation_bytes: float = Field(default=2.0, gt=0)
    """Bytes per activation element and per element of TP / PP / EP messages (bf16, vLLM's default dtype)."""
    cuda_graph_max_tokens: int = Field(default=0, ge=0)
    """The largest step (token rows) the engine runs as a captured CUDA graph; smaller steps are padded to
    the next captured size (llmcap.perf.cuda_graphs: vLLM's ladder 1, 2, 4, 8, 16, ..., 256, 272, ...).
    vLLM's default is min(2 x max_num_seqs, 512). 0 (default): no padding. Not fitted: operation timings
    are taken at their own row counts, so they cannot judge it."""
    step_overhead_s: float = Field(default=5e-4, ge=0)
    """Fixed cost per engine iteration: scheduling, input preparation, sampling, launch gaps. Assumption
    (vLLM V1 with CUDA graphs: a few hundred µs to ~1 ms); calibration should refit it."""


def matmul_efficiency(tokens: ArrayLike, max_eff: float, half_tokens: float) -> F64:
    """Achieved fraction of peak for GEMMs with `tokens` rows: rises with tokens, saturates at `max_eff`.

    Tokens are floored at 1 so an empty step never divides by zero (its FLOPs are 0 anyway).
    """
    t = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)
    return max_eff * t / (t + half_tokens)


def attention_half(p: RooflineParams) -> float:
    """Prefill tokens at which attention reaches half its maximum efficiency."""
    return p.matmul_half_tokens if p.attention_half_tokens is None else p.attention_half_tokens
