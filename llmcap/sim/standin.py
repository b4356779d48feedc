"""A first-order linear step-time model from the catalog: the benchmark's fast reference beside the roofline.

A `LinearStepModel` with terms set from peak numbers (one rank of a TP group; TP splits both the
weights and the FLOPs, so dividing by TP is the ideal scaling):
- overhead_s: one read of the rank's weights from HBM per step (decode is bandwidth bound) plus a
  fixed launch/sampling cost;
- per_prefill_token_s / per_decode_seq_s: 2 x active params FLOPs per token at `mfu` of dense peak;
- per_pair_s: attention score + weighted-sum FLOPs per causal query-key pair at `mfu`;
- per_context_token_s: reading one token's KV (all layers, this rank) from HBM.
It ignores the compute/bandwidth overlap a roofline would take the max of; treat its absolute
numbers as rough. The simulator only needs the `StepTimeModel` interface.
"""

from __future__ import annotations

from llmcap.catalog import get_gpu, load_model
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.memory import plan_memory
from llmcap.parallelism import Parallelism
from llmcap.perf.model import LinearStepModel


def analytic_step_model(
    model: str,
    gpu: str,
    tp: int = 1,
    weight_quant: str = "bf16",
    kv_dtype: str = "bf16",
    mfu: float = 0.5,
    launch_s: float = 2e-3,
) -> LinearStepModel:
    spec = load_model(model)
    g = get_gpu(gpu)
    plan = plan_memory(spec, g, Parallelism(tp=tp), weight_quant, kv_dtype)
    bw = g.hbm_bandwidth_bytes_s
    flops = g.peak_flops("bf16") * mfu
    token_s = 2.0 * spec.params.active_no_embeddings / tp / flops
    pair_s = float(spec.attention_flops_per_token(1.0)) / tp / flops
    return LinearStepModel(
        overhead_s=plan.weights_bytes_per_rank / bw + launch_s,
        per_prefill_token_s=token_s,
        per_pair_s=pair_s,
        per_decode_seq_s=token_s,
        per_context_token_s=spec.kv_bytes_per_token(kv_dtype_bytes(kv_dtype)) / tp / bw,
    )
