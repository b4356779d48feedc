"""Memory per rank under TP / PP / EP / DP, and the KV-cache capacity it leaves.

One rank (GPU) of an instance holds:
- weights: attention and MLP matrices split by TP (column/row parallel), KV projections split by KV head
  (replicated when TP > KV heads), routed experts split by EP (whole experts) and, inside an expert,
  by the remaining expert-TP; embeddings / lm_head vocab-parallel by TP (vocab padded to 64 as vLLM
  does); norms, routers and MLA down-projections replicated; layers split by PP as vLLM splits them
  (the first stage also holds the embedding, the last the final norm and lm_head);
- runtime: peak activations of one max_num_batched_tokens forward, fp32 logits of max_num_seqs rows,
  non-torch memory (CUDA context, library handles), communication buffers, CUDA graphs, workspace;
- a safety margin;
- the KV cache: everything left of HBM x gpu_memory_utilization — never "all free memory".

KV per rank: standard attention divides KV heads by TP (at least one head per rank); MLA's latent is
not split by TP (every rank caches the whole latent, as vLLM does); PP divides layers. vLLM allocates
whole blocks: num_blocks = kv_bytes // (block_size x kv_bytes_per_token_per_rank); tokens = blocks x block_size.
All ranks of an instance hold the same sequences, so an instance's capacity is its worst rank's; DP
replicas (attention data parallel) each hold their own sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from llmcap.catalog.gpus import MIB, GpuSpec
from llmcap.catalog.models import COMPONENTS, ModelSpec, Tensor
from llmcap.catalog.quant import QuantPolicy, WeightFormat, kv_dtype_bytes, weight_format
from llmcap.errors import LlmcapError
from llmcap.lora import lora_slot_bytes
from llmcap.parallelism import (
    VOCAB_PADDING,
    Parallelism,
    kv_heads_per_rank,
    padded,
    pp_partition,
    pp_stage_layers,
    rank_shard,
    validate_parallelism,
)

QUANTIZED_COMPONENTS = ("attention", "dense_mlp", "routed_experts", "shared_experts")


class MemoryParams(BaseModel):
    """Memory knobs, each with a documented default. Bytes are per rank (GPU)."""

    # strict + finite: read from params.yaml, where `true` for a byte count or .nan for a fraction is a mistake
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, strict=True, allow_inf_nan=False
    )

    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    """Fraction of the driver-reported HBM the engine may use (vLLM's default 0.90)."""
    max_num_batched_tokens: int = Field(default=8192, gt=0)
    """Tokens in the largest forward pass; sets the activation peak (vLLM profiles exactly this)."""
    max_num_seqs: int = Field(default=256, gt=0)
    """Sequences in the largest decode batch; sets the fp32 logits buffer."""
    activation_bytes_per_token: float | None = Field(default=None, ge=0)
    """Peak activation bytes per batched token; None = 2 B x (4 x hidden + 3 x MLP width per rank),
    a first-order estimate to calibrate against vLLM's 'torch peak memory increase' log line."""
    logits_copies: int = Field(default=2, ge=0)
    """fp32 [max_num_seqs, vocab] buffers alive at the sampler peak (logits + one working copy)."""
    non_torch_bytes: int = Field(default=512 * MIB, ge=0)
    """CUDA context and library handles, outside PyTorch's allocator (vLLM's 'non-torch memory')."""
    comm_buffer_bytes: int = Field(default=512 * MIB, ge=0)
    """NCCL / custom all-reduce buffers; charged only when the instance has more than one GPU."""
    cuda_graph_bytes: int = Field(default=512 * MIB, ge=0)
    """Memory of captured CUDA graphs (0 with enforce_eager)."""
    workspace_bytes: int = Field(default=256 * MIB, ge=0)
    """Attention-backend and GEMM workspaces."""
    safety_margin_bytes: int = Field(default=256 * MIB, ge=0)
    """Headroom against fragmentation and estimation error, taken out of the KV budget."""
    lora_slots: int = Field(default=0, ge=0)
    """LoRA adapters resident at once (vLLM --max-loras), each with a buffer on every rank (`llmcap.lora`); 0 = no LoRA."""
    lora_rank: int = Field(default=16, ge=1)
    """The largest adapter rank the slots hold (vLLM --max-lora-rank, default 16)."""


def kv_bytes_per_token_layer_rank(model: ModelSpec, tp: int, kv_dtype: str = "bf16") -> float:
    """KV bytes one token adds to one layer on one TP rank."""
    b = kv_dtype_bytes(kv_dtype)
    if model.mla is not None:
        return model.kv_bytes_per_token_layer(b)  # not split by TP
    return 2 * kv_heads_per_rank(model, tp) * model.head_dim * b


def kv_bytes_per_token_per_rank(model: ModelSpec, par: Parallelism, kv_dtype: str = "bf16") -> float:
    """KV bytes per token on the PP stage with the most layers (the one that limits capacity)."""
    layers = max(pp_partition(model.num_layers, par.pp))
    return layers * kv_bytes_per_token_layer_rank(model, par.tp, kv_dtype)


# ---------------------------------------------------------------- weights


def rank_tensor_bytes(t: Tensor, model: ModelSpec, par: Parallelism, policy: QuantPolicy) -> int:
    """Bytes of tensor `t` one rank holds, in the format `policy` gives it (the roofline reads these bytes)."""
    out, inn, cnt = rank_shard(t, model, par)
    quantized = (t.quantizable and t.component in QUANTIZED_COMPONENTS) or (
        (t.component == "embeddings" and policy.quantize_embeddings)
        or (t.component == "lm_head" and policy.quantize_lm_head)
    )
    if quantized and policy.weights.is_quantized:
        return cnt * policy.weights.tensor_bytes(out, inn)
    return cnt * out * inn * policy.unquantized_dtype_bytes


def stage_weight_bytes(model: ModelSpec, par: Parallelism, policy: QuantPolicy, stage: int) -> dict[str, int]:
    """Weight bytes by component on one rank of PP stage `stage`."""
    out: dict[str, int] = dict.fromkeys(COMPONENTS, 0)
    layers = pp_stage_layers(model.num_layers, par.pp)[stage]
    first, last = model.edge_tensors()
    tensors: list[Tensor] = []
    if stage == 0:
        tensors += first
    if stage == par.pp - 1:
        tensors += last
        if model.tie_word_embeddings and par.pp > 1:
            # The last stage cannot borrow stage 0's embedding: it keeps its own copy as lm_head.
            emb = first[0]
            tensors.append(
                Tensor("lm_head", "lm_head(tied copy)", emb.out_features, emb.in_features, "vocab", quantizable=False)
            )
    # Layers of one kind share a structure: compute each distinct layer once.
    cache: dict[bool, list[tuple[str, int]]] = {}
    for layer in layers:
        kind = model.layer_is_moe[layer]
        if kind not in cache:
            cache[kind] = [(t.component, rank_tensor_bytes(t, model, par, policy)) for t in model.layer_tensors(layer)]
        for comp, b in cache[kind]:
            out[comp] += b
    for t in tensors:
        out[t.component] += rank_tensor_bytes(t, model, par, policy)
    return out


def weight_bytes_total(model: ModelSpec, policy: QuantPolicy) -> int:
    """Bytes of the whole checkpoint in this format (no sharding; MTP modules excluded)."""
    return sum(stage_weight_bytes(model, Parallelism(), policy, 0).values())


# ---------------------------------------------------------------- runtime


def activation_bytes(model: ModelSpec, par: Parallelism, params: MemoryParams) -> int:
    """Peak activation bytes of one forward with max_num_batched_tokens on one rank (first-order)."""
    if params.activation_bytes_per_token is not None:
        return int(params.max_num_batched_tokens * params.activation_bytes_per_token)
    width = model.intermediate_size / par.tp if model.intermediate_size else 0.0
    if model.moe is not None and model.is_moe:
        width = max(width, model.moe.top_k * model.moe.expert_intermediate_size / par.expert_tp)
    per_token = 2 * (4 * model.hidden_size + 3 * width)
    return int(params.max_num_batched_tokens * per_token)


def logits_bytes(model: ModelSpec, params: MemoryParams) -> int:
    """fp32 logits of max_num_seqs rows over the full vocabulary (gathered on every rank)."""
    return params.logits_copies * params.max_num_seqs * padded(model.vocab_size, VOCAB_PADDING) * 4


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class BreakdownRow:
    label: str
    bytes: int
    kind: str  # "capacity" | "reserved" | "weights" | "runtime" | "margin" | "kv"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where one rank's HBM goes, row by row. Rows after 'HBM' subtract from it; the last row is the KV budget."""

    rows: tuple[BreakdownRow, ...]

    def total(self, kind: str) -> int:
        return sum(r.bytes for r in self.rows if r.kind == kind)

    @property
    def hbm_bytes(self) -> int:
        return self.total("capacity")

    @property
    def weights_bytes(self) -> int:
        return self.total("weights")

    @property
    def runtime_bytes(self) -> int:
        return self.total("runtime")

    @property
    def kv_budget_bytes(self) -> int:
        return self.total("kv")

    def as_dicts(self) -> list[dict[str, object]]:
        return [{"label": r.label, "bytes": r.bytes, "kind": r.kind} for r in self.rows]


@dataclass(frozen=True)
class MemoryPlan:
    """Memory of one instance's ranks. With PP, `breakdown` is the KV-limiting stage's rank, while
    `weights_bytes_per_rank` is the heaviest stage's (they coincide unless layers split unevenly)."""

    model: ModelSpec
    gpu: GpuSpec
    parallelism: Parallelism
    weight_format: WeightFormat
    kv_dtype: str
    block_size: int
    params: MemoryParams
    breakdown: MemoryBreakdown  # of the bottleneck rank
    bottleneck_stage: int
    stage_weights_bytes: tuple[int, ...]
    kv_bytes_per_token_per_rank: float  # bottleneck stage
    kv_blocks_per_rank: int
    stage_layers: range = field(default=range(0))

    @property
    def weights_bytes_per_rank(self) -> int:
        return max(self.stage_weights_bytes)

    @property
    def kv_budget_bytes_per_rank(self) -> int:
        return self.breakdown.kv_budget_bytes

    @property
    def kv_tokens_per_rank(self) -> int:
        return self.kv_blocks_per_rank * self.block_size

    @property
    def kv_tokens_per_instance(self) -> int:
        """Tokens the instance can keep cached: each DP replica holds its own sequences."""
        return self.kv_tokens_per_rank * self.parallelism.dp

    @property
    def fits(self) -> bool:
        return self.kv_blocks_per_rank > 0

    def max_concurrent_sequences(self, context_lengths: ArrayLike) -> NDArray[np.int64]:
        """Sequences of each given total length (ISL + OSL) the instance can hold at once, KV-wise.

        Whole blocks per sequence; sliding-window layers hold ceil(window / block) + 1 blocks at most.
        """
        ctx = np.maximum(np.asarray(context_lengths, dtype=np.int64), 1)
        bs = self.block_size
        layer_blocks = np.zeros(ctx.shape, dtype=np.float64)
        for layer in self.stage_layers:
            w = self.model.layer_window[layer]
            full = -(-ctx // bs)
            layer_blocks += full if w is None else np.minimum(full, -(-w // bs) + 1)
        n_layers = max(len(self.stage_layers), 1)
        per_rank = np.floor(self.kv_blocks_per_rank * n_layers / layer_blocks).astype(np.int64)
        return per_rank * self.parallelism.dp


def _policy(quant: str | WeightFormat | QuantPolicy) -> QuantPolicy:
    if isinstance(quant, QuantPolicy):
        return quant
    fmt = quant if isinstance(quant, WeightFormat) else weight_format(quant)
    return QuantPolicy(fmt)


def plan_memory(
    model: ModelSpec,
    gpu: GpuSpec,
    par: Parallelism | None = None,
    quant: str | WeightFormat | QuantPolicy = "bf16",
    kv_dtype: str = "bf16",
    block_size: int = 16,
    params: MemoryParams | None = None,
) -> MemoryPlan:
    """Weights, runtime and KV budget per rank, and the KV capacity they leave (LlmcapError if `par` is invalid).

    A negative KV budget is reported as such (kv_blocks_per_rank = 0), not raised: the caller decides.
    """
    par = par or Parallelism()
    params = params or MemoryParams()
    if block_size < 1:
        raise LlmcapError(f"block size must be >= 1, got {block_size}")
    validate_parallelism(model, par)
    policy = _policy(quant)
    kv_b = kv_dtype_bytes(kv_dtype)
    usable = int(gpu.hbm_bytes * params.gpu_memory_utilization)
    runtime = [
        ("activations (peak forward)", activation_bytes(model, par, params)),
        ("logits / sampler (fp32)", logits_bytes(model, params)),
        ("non-torch (CUDA context)", params.non_torch_bytes),
        ("communication buffers", params.comm_buffer_bytes if par.gpus > 1 else 0),
        ("CUDA graphs", params.cuda_graph_bytes),
        ("workspace", params.workspace_bytes),
    ]
    stages = _stage_fits(model, par, policy, kv_dtype, block_size, params, usable - sum(b for _, b in runtime))
    # the KV cache is as large as the stage with the fewest blocks (ties: the smaller budget) lets it be
    neck = min(stages, key=lambda f: (f.blocks, f.budget))
    rows = [
        BreakdownRow(f"HBM ({gpu.name}, driver-reported)", gpu.hbm_bytes, "capacity"),
        BreakdownRow(
            f"reserved (1 - gpu_memory_utilization={params.gpu_memory_utilization:g})",
            gpu.hbm_bytes - usable,
            "reserved",
        ),
    ]
    rows += [BreakdownRow(f"weights: {c}", b, "weights") for c, b in neck.weights.items() if b]
    rows += [BreakdownRow(label, b, "runtime") for label, b in runtime if b]
    if neck.lora:
        rows.append(
            BreakdownRow(f"LoRA slots ({params.lora_slots} adapters × rank {params.lora_rank})", neck.lora, "runtime")
        )
    rows.append(BreakdownRow("safety margin", params.safety_margin_bytes, "margin"))
    rows.append(BreakdownRow(f"KV cache ({kv_dtype}, {kv_b} B/elem)", neck.budget, "kv"))
    return MemoryPlan(
        model=model,
        gpu=gpu,
        parallelism=par,
        weight_format=policy.weights,
        kv_dtype=kv_dtype,
        block_size=block_size,
        params=params,
        breakdown=MemoryBreakdown(tuple(rows)),
        bottleneck_stage=neck.stage,
        stage_weights_bytes=tuple(sum(f.weights.values()) for f in stages),
        kv_bytes_per_token_per_rank=neck.kv_per_token,
        kv_blocks_per_rank=neck.blocks,
        stage_layers=neck.layers,
    )


@dataclass(frozen=True)
class _StageFit:
    """One PP stage's rank: its weights and LoRA slots, the KV budget they leave, and the blocks it holds."""

    stage: int
    layers: range
    weights: dict[str, int]
    lora: int
    budget: int
    kv_per_token: float
    blocks: int


def _stage_fits(
    model: ModelSpec,
    par: Parallelism,
    policy: QuantPolicy,
    kv_dtype: str,
    block_size: int,
    params: MemoryParams,
    left: int,
) -> list[_StageFit]:
    """Each stage's rank, given the bytes `left` after the reservation and the runtime."""
    per_layer_kv = kv_bytes_per_token_layer_rank(model, par.tp, kv_dtype)
    out = []
    for s, layers in enumerate(pp_stage_layers(model.num_layers, par.pp)):
        w = stage_weight_bytes(model, par, policy, s)
        lora = lora_slot_bytes(
            model, par.tp, len(layers), params.lora_slots, params.lora_rank, policy.unquantized_dtype_bytes
        )
        budget = left - sum(w.values()) - lora - params.safety_margin_bytes
        kv_tok = len(layers) * per_layer_kv
        blocks = max(0, budget) // int(block_size * kv_tok) if kv_tok > 0 else 0
        out.append(_StageFit(s, layers, w, lora, budget, kv_tok, int(blocks)))
    return out


def vllm_kv_capacity_tokens(
    model: ModelSpec,
    kv_cache_bytes: int,
    block_size: int,
    kv_dtype: str = "bf16",
    tp: int = 1,
    pp: int = 1,
) -> int:
    """What vLLM reports as 'KV cache size: N tokens' for a KV cache of `kv_cache_bytes` per rank.

    vLLM: num_blocks = kv_bytes // (block_size x kv_bytes_per_token_per_rank); tokens = num_blocks x block_size.
    (Full-attention models; with sliding-window layers vLLM's hybrid allocator groups layers differently.)
    """
    if block_size < 1:
        raise LlmcapError(f"block size must be >= 1, got {block_size}")
    per_token = kv_bytes_per_token_per_rank(model, Parallelism(tp=tp, pp=pp), kv_dtype)
    page = int(block_size * per_token)
    return (int(kv_cache_bytes) // page) * block_size
