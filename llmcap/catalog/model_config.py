"""Reading a model: a Hugging Face `config.json` validated at the edge (`parse_model_config`) into a
`ModelSpec` (llmcap.catalog.models), or a short catalog name looked up (`load_model`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmcap.catalog.models import MlaDims, ModelSpec, MoeDims
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


# ---------------------------------------------------------------- config.json schema (the edge)


class HfConfig(BaseModel):
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
        cfg = HfConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = "missing required field" if err["type"] == "missing" else err["msg"]
        raise InputFileError(p, msg, field=loc) from None
    return _build_spec(cfg, p, name or p.parent.name or p.stem)


def _build_spec(c: HfConfig, p: Path, name: str) -> ModelSpec:
    def bad(field: str, msg: str) -> InputFileError:
        return InputFileError(p, msg, field=field)

    family = re.sub(r"_moe$", "", c.model_type)
    att = _attention(c, family, bad)
    moe, layer_is_moe = _moe(c, bad)
    if moe is not None and moe.top_k > moe.num_experts:
        raise bad("num_experts_per_tok", f"{moe.top_k} exceeds the number of experts ({moe.num_experts})")
    if not all(layer_is_moe) and c.intermediate_size is None:
        raise bad("intermediate_size", "missing required field (model has dense MLP layers)")
    intermediate = c.intermediate_size if not all(layer_is_moe) else 0
    windows = _windows(c, family, bad)
    return ModelSpec(
        name=name,
        source=str(p),
        model_type=c.model_type,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        vocab_size=c.vocab_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=att.num_kv_heads,
        head_dim=att.head_dim,
        intermediate_size=intermediate or 0,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        qkv_bias=att.qkv_bias,
        o_bias=att.o_bias,
        qk_norm=family == "qwen3",
        mlp_bias=c.mlp_bias,
        mla=att.mla,
        moe=moe,
        layer_is_moe=tuple(layer_is_moe),
        layer_window=tuple(windows),
        num_mtp_layers=c.num_nextn_predict_layers,
        dtype=c.torch_dtype or c.dtype or "bfloat16",
        native_quant=_native_quant(c),
    )


Bad = Callable[[str, str], InputFileError]  # (field, message) -> the error naming the file and that field


@dataclass(frozen=True)
class _Attention:
    mla: MlaDims | None
    head_dim: int
    num_kv_heads: int
    qkv_bias: bool
    o_bias: bool


def _attention(c: HfConfig, family: str, bad: Bad) -> _Attention:
    """Head layout, MLA latent dims and biases of the attention, by family."""
    mt = c.model_type
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
    return _Attention(mla, head_dim, n_kv, qkv_bias, o_bias)


def _moe(c: HfConfig, bad: Bad) -> tuple[MoeDims | None, list[bool]]:
    """The experts (field names differ per family) and which layers route to them."""
    L, mt = c.num_hidden_layers, c.model_type
    if mt == "mixtral":
        if c.num_local_experts is None or c.num_experts_per_tok is None or c.intermediate_size is None:
            raise bad("num_local_experts", "Mixtral needs num_local_experts, num_experts_per_tok, intermediate_size")
        return MoeDims(c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, 0, 0, False, False), [True] * L
    if mt in ("qwen2_moe", "qwen3_moe"):
        for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if getattr(c, f) is None:
                raise bad(f, "missing required field for a MoE model")
        shared = c.shared_expert_intermediate_size or 0
        moe = MoeDims(
            c.num_experts,  # type: ignore[arg-type]
            c.num_experts_per_tok,  # type: ignore[arg-type]
            c.moe_intermediate_size,  # type: ignore[arg-type]
            1 if shared else 0,
            shared,
            shared > 0,
            False,
        )
        step = c.decoder_sparse_step or 1
        dense_only = set(c.mlp_only_layers or [])
        return moe, [(i not in dense_only) and c.num_experts > 0 and (i + 1) % step == 0 for i in range(L)]  # type: ignore[operator]
    if mt.startswith("deepseek") and c.n_routed_experts:
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
        return moe, [i >= k_dense and i % freq == 0 for i in range(L)]
    return None, [False] * L


def _windows(c: HfConfig, family: str, bad: Bad) -> list[int | None]:
    """Each layer's sliding attention window (None: full attention)."""
    L = c.num_hidden_layers
    if c.layer_types is not None:
        if len(c.layer_types) != L:
            raise bad("layer_types", f"has {len(c.layer_types)} entries for {L} layers")
        if any(t == "sliding_attention" for t in c.layer_types) and c.sliding_window is None:
            raise bad("sliding_window", "layer_types has sliding layers but sliding_window is null")
        return [c.sliding_window if t == "sliding_attention" else None for t in c.layer_types]
    if c.sliding_window is not None and c.use_sliding_window is not False:
        if family in ("qwen2", "qwen3") and c.max_window_layers is not None:
            # transformers' Qwen2/3: layers at index >= max_window_layers use the window.
            return [c.sliding_window if i >= c.max_window_layers else None for i in range(L)]
        return [c.sliding_window] * L  # Mistral v0.1 style: every layer
    return [None] * L


def _native_quant(c: HfConfig) -> str | None:
    """The checkpoint's own quantisation method, if it ships quantised (fp8 with block scales: "fp8-block")."""
    q = c.quantization_config
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        return "fp8-block" if method == "fp8" and q.get("weight_block_size") else (method or None)
    return None


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
