"""Model specs parsed from Hugging Face `config.json` files.

The file is validated by a pydantic model (the edge); the result is a frozen `ModelSpec` that knows the
model's structure layer by layer. Parameter counts, weight tensors, KV bytes and FLOPs are *derived* from
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

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmcap.errors import InputFileError, LlmcapError

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
)

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


# ---------------------------------------------------------------- config.json schema (the edge)


class _HfConfig(BaseModel):
    """The fields of a HF config.json that llmcap reads. Unknown keys are allowed and ignored."""

    # `model_type` collides with pydantic's protected namespace; strict: no silent "4096" -> 4096 coercion.
    model_config = ConfigDict(extra="allow", protected_namespaces=(), strict=True)

    model_type: str
    architectures: list[str] | None = None
    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int | None = Field(default=None, gt=0)
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    mlp_bias: bool = False
    torch_dtype: str | None = None
    dtype: str | None = None
    # sliding window
    sliding_window: int | None = Field(default=None, gt=0)
    use_sliding_window: bool | None = None
    max_window_layers: int | None = Field(default=None, ge=0)
    layer_types: list[str] | None = None
    # MoE (names differ per family)
    num_local_experts: int | None = Field(default=None, ge=0)
    num_experts: int | None = Field(default=None, ge=0)
    n_routed_experts: int | None = Field(default=None, ge=0)
    num_experts_per_tok: int | None = Field(default=None, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    n_shared_experts: int | None = Field(default=None, ge=0)
    shared_expert_intermediate_size: int | None = Field(default=None, ge=0)
    first_k_dense_replace: int | None = Field(default=None, ge=0)
    moe_layer_freq: int | None = Field(default=None, gt=0)
    decoder_sparse_step: int | None = Field(default=None, gt=0)
    mlp_only_layers: list[int] | None = None
    topk_method: str | None = None
    # MLA (DeepSeek)
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    v_head_dim: int | None = Field(default=None, gt=0)
    # multi-token prediction modules shipped in the checkpoint (DeepSeek-V3)
    num_nextn_predict_layers: int = Field(default=0, ge=0)
    quantization_config: dict[str, Any] | None = None


# ---------------------------------------------------------------- domain objects


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
        Tensor("routed_experts", "experts.gate_up_proj", e.expert_intermediate_size, h, "expert_col", count=2 * e.num_experts),
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


def parse_model_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Parse one HF config.json into a ModelSpec; InputFileError names the file and field on bad input."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(p, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(p, f"cannot read: {exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(p, f"not valid JSON: {exc.msg}", line=exc.lineno) from None
    if not isinstance(raw, dict):
        raise InputFileError(p, "expected a JSON object at the top level")
    # Multimodal wrappers keep the language model under text_config.
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        raw = {**raw, **raw["text_config"]}
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise InputFileError(p, "missing or non-string model_type", field="model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InputFileError(
            p,
            f"unsupported model_type '{model_type}' (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
            field="model_type",
        )
    try:
        cfg = _HfConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = "missing required field" if err["type"] == "missing" else err["msg"]
        raise InputFileError(p, msg, field=loc) from None
    return _build_spec(cfg, p, name or p.parent.name or p.stem)


def _build_spec(c: _HfConfig, p: Path, name: str) -> ModelSpec:
    def bad(field: str, msg: str) -> InputFileError:
        return InputFileError(p, msg, field=field)

    L = c.num_hidden_layers
    mt = c.model_type
    family = re.sub(r"_moe$", "", mt)

    # ---- attention
    mla: MlaDims | None = None
    if mt.startswith("deepseek") and c.kv_lora_rank is not None:
        for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(c, f) is None:
                raise bad(f, "missing required field for MLA attention")
        mla = MlaDims(c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim)  # type: ignore[arg-type]
    if c.head_dim is not None:
        head_dim = c.head_dim
    elif mla is not None:
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        if c.hidden_size % c.num_attention_heads:
            raise bad("head_dim", "absent and hidden_size is not divisible by num_attention_heads")
        head_dim = c.hidden_size // c.num_attention_heads
    n_kv = c.num_key_value_heads if c.num_key_value_heads is not None else c.num_attention_heads
    if mla is None and c.num_attention_heads % n_kv:
        raise bad("num_key_value_heads", f"{n_kv} does not divide num_attention_heads={c.num_attention_heads}")
    if mla is not None:
        n_kv = 1  # one shared latent "head" per token
    # Qwen2 hard-codes q/k/v biases; Llama/Qwen3 follow attention_bias for q/k/v/o; Mistral has none.
    if family == "qwen2":
        qkv_bias, o_bias = (True if c.attention_bias is None else c.attention_bias), False
    elif family in ("llama", "qwen3"):
        qkv_bias = o_bias = bool(c.attention_bias)
    elif mt.startswith("deepseek"):
        qkv_bias = o_bias = False if mla is not None else bool(c.attention_bias)
    else:
        qkv_bias = o_bias = False

    # ---- MLP / MoE
    moe: MoeDims | None = None
    layer_is_moe = [False] * L
    if mt == "mixtral":
        if c.num_local_experts is None or c.num_experts_per_tok is None or c.intermediate_size is None:
            raise bad("num_local_experts", "Mixtral needs num_local_experts, num_experts_per_tok, intermediate_size")
        moe = MoeDims(c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, 0, 0, False, False)
        layer_is_moe = [True] * L
    elif mt in ("qwen2_moe", "qwen3_moe"):
        for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if getattr(c, f) is None:
                raise bad(f, "missing required field for a MoE model")
        shared = c.shared_expert_intermediate_size or 0
        moe = MoeDims(c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, 1 if shared else 0, shared, shared > 0, False)  # type: ignore[arg-type]
        step = c.decoder_sparse_step or 1
        dense_only = set(c.mlp_only_layers or [])
        layer_is_moe = [(i not in dense_only) and c.num_experts > 0 and (i + 1) % step == 0 for i in range(L)]  # type: ignore[operator]
    elif mt.startswith("deepseek") and c.n_routed_experts:
        for f in ("num_experts_per_tok", "moe_intermediate_size"):
            if getattr(c, f) is None:
                raise bad(f, "missing required field for a MoE model")
        n_shared = c.n_shared_experts or 0
        moe = MoeDims(
            c.n_routed_experts,
            c.num_experts_per_tok,  # type: ignore[arg-type]
            c.moe_intermediate_size,  # type: ignore[arg-type]
            n_shared,
            n_shared * c.moe_intermediate_size,  # type: ignore[operator]
            False,
            c.topk_method == "noaux_tc",
        )
        k_dense = c.first_k_dense_replace or 0
        freq = c.moe_layer_freq or 1
        layer_is_moe = [i >= k_dense and i % freq == 0 for i in range(L)]
    if moe is not None and moe.top_k > moe.num_experts:
        raise bad("num_experts_per_tok", f"{moe.top_k} exceeds the number of experts ({moe.num_experts})")
    if not all(layer_is_moe) and c.intermediate_size is None:
        raise bad("intermediate_size", "missing required field (model has dense MLP layers)")
    intermediate = c.intermediate_size if not all(layer_is_moe) else 0

    # ---- sliding windows
    windows: list[int | None] = [None] * L
    if c.layer_types is not None:
        if len(c.layer_types) != L:
            raise bad("layer_types", f"has {len(c.layer_types)} entries for {L} layers")
        if any(t == "sliding_attention" for t in c.layer_types) and c.sliding_window is None:
            raise bad("sliding_window", "layer_types has sliding layers but sliding_window is null")
        windows = [c.sliding_window if t == "sliding_attention" else None for t in c.layer_types]
    elif c.sliding_window is not None and c.use_sliding_window is not False:
        if family in ("qwen2", "qwen3") and c.max_window_layers is not None:
            # transformers' Qwen2/3: layers at index >= max_window_layers use the window.
            windows = [c.sliding_window if i >= c.max_window_layers else None for i in range(L)]
        else:
            windows = [c.sliding_window] * L  # Mistral v0.1 style: every layer

    native_quant = None
    q = c.quantization_config
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        native_quant = "fp8-block" if method == "fp8" and q.get("weight_block_size") else (method or None)

    return ModelSpec(
        name=name,
        source=str(p),
        model_type=mt,
        hidden_size=c.hidden_size,
        num_layers=L,
        vocab_size=c.vocab_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=intermediate or 0,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=family == "qwen3",
        mlp_bias=c.mlp_bias,
        mla=mla,
        moe=moe,
        layer_is_moe=tuple(layer_is_moe),
        layer_window=tuple(windows),
        num_mtp_layers=c.num_nextn_predict_layers,
        dtype=c.torch_dtype or c.dtype or "bfloat16",
        native_quant=native_quant,
    )


# ---------------------------------------------------------------- lookup


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def known_models(models_dir: str | Path | None = None) -> list[str]:
    """Short names available in the catalog (sub-directories holding a config.json)."""
    d = Path(models_dir) if models_dir is not None else _default_models_dir()
    if not d.is_dir():
        return []
    return sorted(x.name for x in d.iterdir() if (x / "config.json").is_file())


def _default_models_dir() -> Path:
    from llmcap.catalog.gpus import default_catalog_dir

    return default_catalog_dir() / "models"


def load_model(name_or_path: str | Path, models_dir: str | Path | None = None) -> ModelSpec:
    """A ModelSpec from a config.json path, a directory holding one, or a short catalog name (case-insensitive)."""
    p = Path(name_or_path)
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise InputFileError(p, "directory has no config.json")
        return parse_model_config(cfg, name=p.name)
    if p.is_file():
        return parse_model_config(p)
    d = Path(models_dir) if models_dir is not None else _default_models_dir()
    names = known_models(d)
    key = _norm(str(name_or_path))
    for n in names:
        if _norm(n) == key:
            return parse_model_config(d / n / "config.json", name=n)
    raise LlmcapError(
        f"unknown model '{name_or_path}': not a path to a config.json or a directory, "
        f"and not in the catalog ({', '.join(names) or 'empty'})"
    )
