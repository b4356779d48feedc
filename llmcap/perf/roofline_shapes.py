"""What the roofline costs, per rank: the matmul groups of each kind of decoder layer and of the lm_head, with
their weight bytes, FLOPs and activation bytes per row, and the tensor-core dtype quantised matmuls run in.

The bytes come from llmcap.memory's sharding rules (`rank_shard`, `rank_tensor_bytes`), so the weights a step
reads are exactly the weights a rank holds, quantisation scales included. llmcap.perf.roofline costs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from llmcap.catalog.gpus import GpuSpec
from llmcap.catalog.models import ModelSpec, Tensor
from llmcap.catalog.quant import QuantPolicy, WeightFormat
from llmcap.memory import QUANTIZED_COMPONENTS, rank_tensor_bytes
from llmcap.parallelism import Parallelism, pp_stage_layers, rank_shard


@dataclass(frozen=True)
class Gemm:
    """A group of matmuls on one rank: weight bytes, and FLOPs / activation bytes per row (token)."""

    weight_bytes: float
    flops_per_row: float
    act_bytes_per_row: float
    peak_flops: float
    kernels: int = 1  # GEMM kernels the group launches (vLLM merges q/k/v and gate/up): each pays gemm_kernel_s


@dataclass(frozen=True)
class LayerKind:
    """Per-rank constants of one kind of decoder layer (MoE or dense, sliding window or full)."""

    is_moe: bool
    window: int | None
    qkv: Gemm
    o: Gemm
    norm_weight_bytes: float
    mlp: Gemm | None
    router: Gemm | None
    shared: Gemm | None
    expert: Gemm | None  # ONE local expert: its weights; FLOPs / activations per (token, expert) pair


@dataclass(frozen=True)
class RankShapes:
    """Builds the `Gemm`s and `LayerKind`s of `model` on one rank of `par`, matmuls at `peak_bf16`, or at `peak_q`
    where the weights are quantised (activations of `activation_bytes` per element)."""

    model: ModelSpec
    par: Parallelism
    policy: QuantPolicy
    activation_bytes: float
    peak_bf16: float
    peak_q: float

    def gemm(self, tensors: list[Tensor], kernels: int = 1) -> Gemm:
        wb = flops = act = 0.0
        quantized = False
        for t in tensors:
            wb += rank_tensor_bytes(t, self.model, self.par, self.policy)
            out, inn, cnt = rank_shard(t, self.model, self.par)
            if inn > 1:  # a matrix (vectors: norms, biases, router bias have in_features = 1)
                flops += 2.0 * cnt * out * inn
                act += self.activation_bytes * cnt * (out + inn)
                quantized |= t.quantizable and t.component in QUANTIZED_COMPONENTS and self.policy.weights.is_quantized
        return Gemm(wb, flops, act, self.peak_q if quantized else self.peak_bf16, kernels)

    def lm_head(self) -> Gemm:
        """The lm_head, or with tied embeddings the embedding table read as one."""
        first, last = self.model.edge_tensors()
        head = [t for t in last if t.component == "lm_head"] or [
            Tensor("lm_head", "lm_head(tied)", first[0].out_features, first[0].in_features, "vocab", quantizable=False)
        ]
        return self.gemm(head)

    def layer_kinds(self) -> tuple[list[LayerKind], NDArray[np.int64]]:
        """The kinds of layer in first-seen order, and per PP stage (rows) how many layers of each kind (columns)."""
        m, par = self.model, self.par
        keys: list[tuple[bool, int | None]] = []
        kinds: list[LayerKind] = []
        stages = pp_stage_layers(m.num_layers, par.pp)
        counts = np.zeros((par.pp, 0), dtype=np.int64)
        for s, layers in enumerate(stages):
            for layer in layers:
                key = (m.layer_is_moe[layer], m.layer_window[layer])
                if key not in keys:
                    keys.append(key)
                    kinds.append(self.kind(layer))
                    counts = np.column_stack([counts, np.zeros(par.pp, dtype=np.int64)])
                counts[s, keys.index(key)] += 1
        return kinds, counts

    def kind(self, layer: int) -> LayerKind:
        ts = self.model.layer_tensors(layer)
        by: dict[str, list[Tensor]] = {}
        for t in ts:
            op: str = t.component
            if t.component == "attention":
                op = "o" if t.name.startswith("o_") else "qkv"
            by.setdefault(op, []).append(t)
        is_moe = self.model.layer_is_moe[layer]
        expert = None
        if is_moe and "routed_experts" in by:
            g = self.gemm(by["routed_experts"], 2)  # fused MoE: the gate/up and the down kernel
            local = -(-self.model.moe.num_experts // self.par.ep)  # type: ignore[union-attr]
            expert = Gemm(
                g.weight_bytes / local, g.flops_per_row / local, g.act_bytes_per_row / local, g.peak_flops, g.kernels
            )
        norm_bytes = sum(rank_tensor_bytes(t, self.model, self.par, self.policy) for t in by.get("norms", []))
        return LayerKind(
            is_moe=is_moe,
            window=self.model.layer_window[layer],
            qkv=self.gemm(by["qkv"]),
            o=self.gemm(by["o"]),
            norm_weight_bytes=float(norm_bytes),
            mlp=self.gemm(by["dense_mlp"], 2) if "dense_mlp" in by else None,  # gate/up merged, down
            router=self.gemm(by["router"]) if "router" in by else None,
            shared=self.gemm(by["shared_experts"], 2) if "shared_experts" in by else None,
            expert=expert,
        )


def compute_dtype(fmt: WeightFormat, gpu: GpuSpec) -> str:
    """Tensor-core dtype quantised matmuls run in: the weights' own when the GPU has it, else bf16."""
    name = fmt.name
    if name.startswith("fp8"):
        want = "fp8"
    elif name == "int8":
        want = "int8"
    elif name in ("nvfp4", "mxfp4"):
        want = "fp4"
    else:
        return "bf16"  # bf16/fp16 models, and weight-only int4 (AWQ / GPTQ dequantise into bf16 GEMMs)
    return want if want in gpu.dense_flops else "bf16"
