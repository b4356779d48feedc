"""LoRA adapters served beside their base model: the memory their slots take from each rank.

vLLM with `--enable-lora` allocates, at startup, on every rank, a buffer for `max_loras` adapters of rank
`max_lora_rank` on every LoRA-wrapped linear layer (vllm/lora/layers: `create_lora_weights` makes
`lora_a_stacked` [max_loras, 1, rank, in] and `lora_b_stacked` [max_loras, 1, out, rank] per projection), in
the model's dtype, whether or not adapters are loaded. The KV cache is smaller by that much. Without
`fully_sharded_loras` (vLLM's default), a column-parallel projection (q, k, v, gate, up) holds A whole and
B split by TP; a row-parallel one (o, down) holds A split and B whole. The wrapped projections here are
every attention and dense-MLP matrix (vLLM wraps every linear layer of a supported model; routed experts are
not counted: a MoE model is refused). Adapters beyond the slots wait in host memory (`max_cpu_loras`).
"""

from __future__ import annotations

from llmcap.catalog.models import ModelSpec
from llmcap.errors import LlmcapError
from llmcap.parallelism import Parallelism, pp_stage_layers, rank_shard

LORA_COMPONENTS = ("attention", "dense_mlp")


def lora_slot_bytes(model: ModelSpec, tp: int, layers: int, slots: int, rank: int, dtype_bytes: int = 2) -> int:
    """Bytes one rank holds for `slots` adapters of rank `rank` over `layers` decoder layers at TP `tp`."""
    if slots == 0:
        return 0
    if model.is_moe:
        raise LlmcapError(
            f"{model.name}: LoRA slots of a MoE model's experts are not modelled; size it without adapters"
        )
    if rank < 1:
        raise LlmcapError(f"LoRA rank must be >= 1, got {rank}")
    par = Parallelism(tp=tp)
    per_layer = 0
    for t in model.layer_tensors(0):
        if t.component not in LORA_COMPONENTS or t.in_features == 1:  # biases and norms carry no adapter
            continue
        out, inn, count = rank_shard(t, model, par)
        # A [rank × in] and B [out × rank], each at the split the wrapped projection has on this rank
        a_in = inn if t.split == "row" else t.in_features
        b_out = out if t.split in ("col", "kv_col") else t.out_features
        per_layer += count * rank * (a_in + b_out)
    return slots * layers * per_layer * dtype_bytes


def slot_cost(
    model: ModelSpec, tp: int, pp: int, slots: int, rank: int, kv_bytes_per_token_per_rank: float
) -> tuple[int, int]:
    """(bytes the fullest pipeline stage's rank holds for `slots` adapters of `rank`, the KV tokens per rank they displace)."""
    layers = max(len(stage) for stage in pp_stage_layers(model.num_layers, pp))
    held = lora_slot_bytes(model, tp, layers, slots, rank)
    return held, int(held // kv_bytes_per_token_per_rank) if kv_bytes_per_token_per_rank > 0 else 0
