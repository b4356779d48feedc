"""Model specs: a frozen `ModelSpec` that knows the model's structure layer by layer (read from a Hugging
Face `config.json` by `llmcap.catalog.model_config`). Parameter counts, weight tensors, KV bytes and FLOPs are *derived* from
that structure, never hard-coded per model.

Supported families (by `model_type`): Llama 2/3/3.1, Mistral, Mixtral (MoE), Qwen2/2.5, Qwen2-MoE, Qwen3,
Qwen3-MoE, DeepSeek-V2/V3 (MLA + shared/routed experts + dense first layers).

Conventions worth knowing:
- SwiGLU MLPs (gate, up, down) — true for every supported family.
- Tied embeddings are counted once (lm_head = 0 parameters).
- DeepSeek-V3 checkpoints carry `num_nextn_predict_layers` multi-token-prediction (MTP) modules. They are
  not part of the served model's forward pass (only of MTP speculative decoding), so they are counted in
  `ParamCounts.mtp` and excluded from `total` — this is how DeepSeek arrives at "671B" while the HF
  checkpoint holds ~685B (671B + ~11.6B MTP-unique + stored copies of embedding and head).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

# How a tensor is laid out across tensor/expert-parallel ranks (memory.py implements the split).
Split = Literal["col", "row", "replicated", "kv_col", "vocab", "expert_col", "expert_row"]
Component = Literal[
    "embeddings", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norms", "lm_head"
]
COMPONENTS: tuple[Component, ...] = (
    "embeddings",
    "attention",
    "dense_mlp",
    "routed_experts",
    "shared_experts",
    "router",
    "norms",
    "lm_head",
)


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention (DeepSeek-V2/V3). The KV cache holds kv_lora_rank + qk_rope_head_dim."""

    q_lora_rank: int | None  # None: q is a plain projection (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoeDims:
    num_experts: int  # routed experts per MoE layer
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int  # DeepSeek style: n shared experts of expert_intermediate_size
    shared_intermediate_size: int  # total width of the shared MLP (0 if none)
    shared_expert_gate: bool  # Qwen2-MoE: sigmoid gate on the shared expert
    router_bias: bool  # DeepSeek-V3 noaux_tc: e_score_correction_bias (one float per expert)


@dataclass(frozen=True)
class Tensor:
    """One weight tensor kind of the model (count identical copies, e.g. experts). Vectors have in_features=1."""

    component: Component
    name: str
    out_features: int
    in_features: int
    split: Split
    count: int = 1
    quantizable: bool = True  # False for norms, biases, routers (they stay in the model dtype)

    @property
    def params(self) -> int:
        return self.count * self.out_features * self.in_features


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by component. `total` excludes MTP modules; `active` counts routed experts at top_k/E."""

    embeddings: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    lm_head: int
    routed_experts_active: int
    mtp: int  # DeepSeek multi-token-prediction modules (unique params), not in `total`

    def by_component(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in COMPONENTS}

    @property
    def total(self) -> int:
        return sum(self.by_component().values())

    @property
    def active(self) -> int:
        """Parameters used per token, embedding table included (the convention of Mixtral's '12.9B')."""
        return self.total - self.routed_experts + self.routed_experts_active

    @property
    def active_no_embeddings(self) -> int:
        """Active parameters without the input embedding (a lookup, not a matmul): DeepSeek's '36.6B'."""
        return self.active - self.embeddings


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # the config.json it came from
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int  # MLA: the latent is shared by all heads; reported as 1 for KV purposes
    head_dim: int
    intermediate_size: int  # dense MLP width (0 if no dense layer)
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    mlp_bias: bool
    mla: MlaDims | None
    moe: MoeDims | None
    layer_is_moe: tuple[bool, ...]
    layer_window: tuple[int | None, ...]  # sliding window per layer (None: full attention)
    num_mtp_layers: int
    dtype: str
    native_quant: str | None  # e.g. "fp8-block" when the checkpoint itself is quantized

    # ---- structure

    @property
    def attention_kind(self) -> str:
        if self.mla is not None:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        if self.num_kv_heads == 1:
            return "mqa"
        return "gqa"

    @property
    def is_moe(self) -> bool:
        return self.moe is not None and any(self.layer_is_moe)

    def layer_tensors(self, layer: int) -> list[Tensor]:
        """Every weight tensor of decoder layer `layer` (attention, MLP or MoE, norms)."""
        return _attention_tensors(self) + _mlp_tensors(self, self.layer_is_moe[layer]) + _layer_norms(self)

    def edge_tensors(self) -> tuple[list[Tensor], list[Tensor]]:
        """(first-stage tensors, last-stage tensors): embedding; final norm + lm_head (absent when tied)."""
        h = self.hidden_size
        first = [Tensor("embeddings", "embed_tokens", self.vocab_size, h, "vocab", quantizable=False)]
        last = [Tensor("norms", "norm", h, 1, "replicated", quantizable=False)]
        if not self.tie_word_embeddings:
            last.append(Tensor("lm_head", "lm_head", self.vocab_size, h, "vocab", quantizable=False))
        return first, last

    @cached_property
    def params(self) -> ParamCounts:
        counts = dict.fromkeys(COMPONENTS, 0)
        first, last = self.edge_tensors()
        for t in first + last:
            counts[t.component] += t.params
        for layer in range(self.num_layers):
            for t in self.layer_tensors(layer):
                counts[t.component] += t.params
        routed_active = 0
        if self.moe is not None:
            per_expert = 3 * self.hidden_size * self.moe.expert_intermediate_size
            routed_active = sum(self.layer_is_moe) * self.moe.top_k * per_expert
        return ParamCounts(**counts, routed_experts_active=routed_active, mtp=self._mtp_params())

    def _mtp_params(self) -> int:
        """DeepSeek MTP module: enorm + hnorm + eh_proj (2h->h) + one decoder layer + shared_head norm."""
        if self.num_mtp_layers == 0:
            return 0
        h = self.hidden_size
        # An MTP block uses the structure of the last (MoE) layer; embedding and head are shared.
        layer = sum(t.params for t in self.layer_tensors(self.num_layers - 1))
        return self.num_mtp_layers * (h + h + 2 * h * h + layer + h)

    # ---- KV cache

    def kv_bytes_per_token_layer(self, kv_dtype_bytes: float) -> float:
        """KV bytes one token adds to one layer (whole model, before any parallel split)."""
        if self.mla is not None:
            # MLA caches the compressed latent plus the shared rope key: one "head" of this width.
            return (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> float:
        """KV bytes per token over all layers (MTP excluded), ignoring sliding-window caps."""
        return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype_bytes)

    def kv_bytes_for_context(self, context_len: ArrayLike, kv_dtype_bytes: float = 2) -> NDArray[np.float64]:
        """KV bytes held by one sequence of `context_len` tokens; sliding-window layers hold at most the window."""
        ctx = np.asarray(context_len, dtype=np.float64)
        per_layer = self.kv_bytes_per_token_layer(kv_dtype_bytes)
        held = np.zeros_like(ctx)
        for w in self.layer_window:
            held = held + (ctx if w is None else np.minimum(ctx, w))
        return held * per_layer

    # ---- FLOPs

    def attention_flops_per_token(self, context_len: ArrayLike) -> NDArray[np.float64]:
        """Score + weighted-sum FLOPs of one new token attending over `context_len` cached tokens."""
        ctx = np.asarray(context_len, dtype=np.float64)
        if self.mla is not None:
            # Un-absorbed form (what prefill runs): qk over nope+rope dims, weighted sum over v dims.
            dims = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim + self.mla.v_head_dim
        else:
            dims = 2 * self.head_dim
        total = np.zeros_like(ctx)
        for w in self.layer_window:
            total = total + 2.0 * self.num_heads * dims * (ctx if w is None else np.minimum(ctx, w))
        return total

    def flops_per_token(self, context_len: ArrayLike) -> NDArray[np.float64]:
        """Forward FLOPs for one token at `context_len`: 2 x active matmul params + attention."""
        return 2.0 * self.params.active_no_embeddings + self.attention_flops_per_token(context_len)

    def prefill_flops(self, new_tokens: ArrayLike, cached_tokens: ArrayLike = 0) -> NDArray[np.float64]:
        """FLOPs to prefill `new_tokens` after `cached_tokens` (prefix hits), with causal attention."""
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(cached_tokens, dtype=np.float64)
        if self.mla is not None:
            dims = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim + self.mla.v_head_dim
        else:
            dims = 2 * self.head_dim
        attn = np.zeros(np.broadcast(n, c).shape)
        for w in self.layer_window:
            # token j (1-based, j = c+1 .. c+n) attends over min(j, w) positions
            attn = attn + 2.0 * self.num_heads * dims * _sum_min(c + 1, c + n, w)
        return 2.0 * self.params.active_no_embeddings * n + attn


def _sum_min(a: NDArray[np.float64], b: NDArray[np.float64], w: int | None) -> NDArray[np.float64]:
    """sum_{j=a}^{b} min(j, w) for integer-valued arrays (0 where b < a)."""
    a, b = np.broadcast_arrays(a, b)
    empty = b < a

    def arith(lo: NDArray[np.float64], hi: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.where(hi >= lo, (lo + hi) * (hi - lo + 1) / 2.0, 0.0)

    if w is None:
        out = arith(a, b)
    else:
        below = arith(a, np.minimum(b, w))
        above = np.maximum(0.0, b - np.maximum(a - 1, w)) * w
        out = below + above
    return np.where(empty, 0.0, out)


def _attention_tensors(m: ModelSpec) -> list[Tensor]:
    h = m.hidden_size
    if m.mla is not None:
        d = m.mla
        qk = d.qk_nope_head_dim + d.qk_rope_head_dim
        ts: list[Tensor] = []
        if d.q_lora_rank is not None:
            ts.append(Tensor("attention", "q_a_proj", d.q_lora_rank, h, "replicated"))
            ts.append(Tensor("attention", "q_b_proj", m.num_heads * qk, d.q_lora_rank, "col"))
        else:
            ts.append(Tensor("attention", "q_proj", m.num_heads * qk, h, "col"))
        ts.append(Tensor("attention", "kv_a_proj_with_mqa", d.kv_lora_rank + d.qk_rope_head_dim, h, "replicated"))
        ts.append(
            Tensor("attention", "kv_b_proj", m.num_heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank, "col")
        )
        ts.append(Tensor("attention", "o_proj", h, m.num_heads * d.v_head_dim, "row"))
        return ts
    q = m.num_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    ts = [
        Tensor("attention", "q_proj", q, h, "col"),
        Tensor("attention", "k_proj", kv, h, "kv_col"),
        Tensor("attention", "v_proj", kv, h, "kv_col"),
        Tensor("attention", "o_proj", h, q, "row"),
    ]
    if m.qkv_bias:
        ts += [
            Tensor("attention", "q_bias", q, 1, "col", quantizable=False),
            Tensor("attention", "k_bias", kv, 1, "kv_col", quantizable=False),
            Tensor("attention", "v_bias", kv, 1, "kv_col", quantizable=False),
        ]
    if m.o_bias:
        # Row-parallel output bias is added once, so every rank keeps the whole vector.
        ts.append(Tensor("attention", "o_bias", h, 1, "replicated", quantizable=False))
    return ts


def _mlp_tensors(m: ModelSpec, is_moe: bool) -> list[Tensor]:
    h = m.hidden_size
    if not is_moe:
        i = m.intermediate_size
        ts = [
            Tensor("dense_mlp", "gate_up_proj", i, h, "col", count=2),
            Tensor("dense_mlp", "down_proj", h, i, "row"),
        ]
        if m.mlp_bias:
            ts += [
                Tensor("dense_mlp", "gate_up_bias", i, 1, "col", count=2, quantizable=False),
                Tensor("dense_mlp", "down_bias", h, 1, "replicated", quantizable=False),
            ]
        return ts
    assert m.moe is not None
    e = m.moe
    ts = [
        Tensor("router", "gate", e.num_experts, h, "replicated", quantizable=False),
        Tensor(
            "routed_experts",
            "experts.gate_up_proj",
            e.expert_intermediate_size,
            h,
            "expert_col",
            count=2 * e.num_experts,
        ),
        Tensor("routed_experts", "experts.down_proj", h, e.expert_intermediate_size, "expert_row", count=e.num_experts),
    ]
    if e.router_bias:
        ts.append(Tensor("router", "e_score_correction_bias", e.num_experts, 1, "replicated", quantizable=False))
    if e.shared_intermediate_size > 0:
        s = e.shared_intermediate_size
        ts += [
            Tensor("shared_experts", "shared_experts.gate_up_proj", s, h, "col", count=2),
            Tensor("shared_experts", "shared_experts.down_proj", h, s, "row"),
        ]
        if e.shared_expert_gate:
            ts.append(Tensor("shared_experts", "shared_expert_gate", 1, h, "replicated", quantizable=False))
    return ts


def _layer_norms(m: ModelSpec) -> list[Tensor]:
    h = m.hidden_size
    ts = [Tensor("norms", "input_layernorm+post_attention_layernorm", h, 1, "replicated", count=2, quantizable=False)]
    if m.mla is not None:
        if m.mla.q_lora_rank is not None:
            ts.append(Tensor("norms", "q_a_layernorm", m.mla.q_lora_rank, 1, "replicated", quantizable=False))
        ts.append(Tensor("norms", "kv_a_layernorm", m.mla.kv_lora_rank, 1, "replicated", quantizable=False))
    if m.qk_norm:
        ts.append(Tensor("norms", "q_norm+k_norm", m.head_dim, 1, "replicated", count=2, quantizable=False))
    return ts


# ---------------------------------------------------------------- parsing
