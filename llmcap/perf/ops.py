"""The roofline's per-op bookkeeping: the ops of a step in breakdown order, one op's cost, and the per-op
sums over a vector of batches (llmcap.perf.roofline fills them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from llmcap.perf.model import F64

Bound = Literal["compute", "memory", "communication", "overhead"]

# Breakdown order (ops absent from a configuration are left out).
OPS = (
    "embed",
    "norms",
    "qkv_proj",
    "attn_prefill",
    "attn_decode",
    "attn_kernel",
    "o_proj",
    "mlp",
    "router",
    "shared_experts",
    "moe_experts",
    "lm_head",
    "tp_allreduce",
    "logits_gather",
    "ep_all_to_all",
    "pp_send_recv",
    "pp_bubble",
    "overhead",
)
COMM_OPS = ("tp_allreduce", "logits_gather", "ep_all_to_all", "pp_send_recv")


@dataclass(frozen=True)
class OpCost:
    """One op of one step on one rank: its time, FLOPs and bytes (summed over the layers of all stages for
    one micro-batch; with pp = 1 that is exactly what one GPU of the TP group does), and what bounds it."""

    op: str
    time_s: float
    flops: float
    bytes: float  # HBM bytes for compute ops; bytes each rank sends for communication ops
    bound: Bound

    def as_dict(self) -> dict[str, object]:
        return {"op": self.op, "time_s": self.time_s, "flops": self.flops, "bytes": self.bytes, "bound": self.bound}


class OpAccumulator:
    """Per-op arrays over batches: time, compute-time, memory-time, FLOPs, bytes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ops: dict[str, list[F64]] = {}

    def add(self, op: str, t: F64, tc: F64, tm: F64, flops: F64, nbytes: F64, scale: float | F64 = 1.0) -> None:
        vals = [np.broadcast_to(np.asarray(v, dtype=np.float64) * scale, (self.n,)) for v in (t, tc, tm, flops, nbytes)]
        if op in self.ops:
            self.ops[op] = [a + b for a, b in zip(self.ops[op], vals, strict=True)]
        else:
            self.ops[op] = [np.array(v) for v in vals]

    def time(self) -> F64:
        return sum((v[0] for v in self.ops.values()), np.zeros(self.n))
