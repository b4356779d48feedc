"""Analytic roofline step-time model: one engine iteration, op by op, on one GPU of the instance.

Each op of a decoder layer costs max(FLOPs / (peak x eff_matmul(rows)), bytes / (HBM bw x eff_hbm)) on one
rank; communication ops cost an alpha-beta time on the link they use (llmcap.perf.comm). A step is:

    embed -> L x [norms, qkv_proj, attn_prefill, attn_decode, o_proj, TP all-reduce,
                  dense MLP | (router, shared experts, routed experts, EP all-to-all), TP all-reduce]
          -> final norm, lm_head (+ logits gather over TP) ; + fixed per-step overhead

plus, where the GPU's calibration keeps them (llmcap.perf.calibration.select_terms), a fixed cost per GEMM
kernel and per layer's attention kernel, decode attention's own KV-read bandwidth, and vLLM's one-shot
all-reduce for small messages (llmcap.perf.allreduce); and, where the engine pads steps to captured CUDA
graphs (`cuda_graph_max_tokens`), the padded rows (llmcap.perf.cuda_graphs).

What each op reads and computes, per rank (tensor shapes and sharding from llmcap.catalog / llmcap.memory,
so the weights read are exactly the weights held, quantisation scales included: llmcap.perf.roofline_shapes):
- matmuls: weight bytes + activations in and out (rows x (in + out) x activation bytes); 2 x rows x out x in
  FLOPs. Rows are the step's tokens (prefill tokens + one per decode sequence). Quantised weights run on
  their tensor-core dtype when the GPU has one (fp8 -> fp8, int8 -> int8, nvfp4/mxfp4 -> fp4) and on bf16
  otherwise (int4 AWQ/GPTQ are weight-only: fewer bytes, bf16 FLOPs).
- routed experts: weights of the experts actually touched. T tokens each pick top-k of E experts, so an
  expert is untouched with probability (1 - k/E)^T and E(1 - (1 - k/E)^T) are read in expectation (uniform
  routing). FLOPs follow the T·k (token, expert) pairs; GEMM efficiency uses the rows per touched expert.
  With EP the busiest rank carries `moe_load_imbalance` x the mean routed tokens (compute and all-to-all).
- attention prefill: causal FLOPs 2 x heads x (qk + v dims) x query-key pairs (StepBatch.prefill_pairs),
  at the attention efficiency; bytes: new KV written, Q read, output written.
- attention decode: reads every context token's KV (decode_context x KV bytes per token, layer and rank).
- lm_head: only rows that produce logits (one per decode sequence and per prefill chunk); the embedding is
  a gather of T rows, not a read of the table. vLLM's vocab-parallel embedding adds one all-reduce and the
  sharded lm_head a logits gather when TP > 1.
- TP: 2 all-reduces of T x hidden activations per layer (after attention and after the MLP). With EP
  the MoE output returns through the combine all-to-all instead of the second all-reduce.
- PP: the step's sequences are spread over m = min(pp, sequences) micro-batches in flight (vLLM's virtual
  engines). A micro-batch crosses all stages (sum of stage times + (pp-1) send/recv of hidden states and
  residual); a stage serves the m micro-batches in turn, so the step (every sequence advancing one
  token) takes max(traversal, m x slowest stage). The difference is the pipeline bubble.

Approximations (to be corrected by calibration): uniform expert routing; sliding-window layers use
min(context sum, sequences x window) as the attended context; MLA attention uses the un-absorbed FLOPs
and reads the latent cache; norms, rotary and activation functions are counted as memory traffic only
where listed (norms) and otherwise ignored; kernels do not overlap (no compute/communication overlap).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from llmcap.catalog.gpus import GpuSpec, get_gpu
from llmcap.catalog.model_config import load_model
from llmcap.catalog.models import ModelSpec
from llmcap.catalog.quant import QuantPolicy, WeightFormat, kv_dtype_bytes, weight_format
from llmcap.parallelism import VOCAB_PADDING, Parallelism, validate_parallelism
from llmcap.perf.allreduce import allreduce_time
from llmcap.perf.attention import AttentionTerms, attention_coefficients, decode_attention, prefill_attention
from llmcap.perf.calibration import Calibration, calibrated_params
from llmcap.perf.comm import all_to_all_time, gather_time, link_for, p2p_time
from llmcap.perf.cuda_graphs import padded_rows
from llmcap.perf.efficiency import RooflineParams, matmul_efficiency
from llmcap.perf.model import F64, StepBatch
from llmcap.perf.ops import COMM_OPS, OPS, Bound, OpAccumulator, OpCost
from llmcap.perf.roofline_shapes import Gemm, LayerKind, RankShapes, compute_dtype

__all__ = ["COMM_OPS", "OPS", "OpAccumulator", "OpCost", "RooflineModel", "build_step_model"]

if TYPE_CHECKING:
    from llmcap.perf.roofline_compiled import CompiledRoofline


class RooflineModel:
    """`StepTimeModel` from first principles: catalog specs x achieved-efficiency curves (`RooflineParams`).

    `step_time(batch)` is vectorised over the batches of a `StepBatch`; `breakdown(batch, i)` lists every op
    of batch i with its time, FLOPs, bytes and bound, summing to `step_time`.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        parallelism: Parallelism | None = None,
        weight_quant: str | WeightFormat = "bf16",
        kv_dtype: str = "bf16",
        params: RooflineParams | None = None,
    ) -> None:
        par = parallelism or Parallelism()
        if par.dp != 1:
            raise ValueError("RooflineModel times one data-parallel replica; use dp = 1")
        validate_parallelism(model, par)
        fmt = weight_quant if isinstance(weight_quant, WeightFormat) else weight_format(weight_quant)
        self.model = model
        self.gpu = gpu
        self.parallelism = par
        self.policy = QuantPolicy(fmt)
        self.kv_dtype = kv_dtype
        self.compute_dtype = compute_dtype(fmt, gpu)
        # no params given: the GPU's shipped calibration where it has one, else the documented defaults
        self.calibration: Calibration | None = None
        if params is None:
            params, self.calibration = calibrated_params(gpu, self.compute_dtype)
        self.params = params
        self._peak_bf16 = gpu.peak_flops("bf16")
        self._peak_q = gpu.peak_flops(self.compute_dtype)
        self.attention = attention_coefficients(model, gpu, par.tp, kv_dtype, params)
        shapes = RankShapes(model, par, self.policy, params.activation_bytes, self._peak_bf16, self._peak_q)
        self._kinds, self._stage_counts = shapes.layer_kinds()
        self._lm_head = shapes.lm_head()
        self._vocab_padded = -(-model.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        self._link_tp = link_for(gpu, par.tp, self.params)
        self._link_ep = link_for(gpu, par.ep, self.params)
        self._link_pp = link_for(gpu, par.tp * par.pp, self.params)

    # ---------------------------------------------------------------- costing

    def _roofline(
        self,
        acc: OpAccumulator,
        op: str,
        flops: F64,
        nbytes: F64,
        peak: float,
        eff: F64,
        scale: float = 1.0,
        fixed: F64 | float = 0.0,
    ) -> F64:
        tc = flops / (peak * eff)
        tm = nbytes / (self.gpu.hbm_bandwidth_bytes_s * self.params.hbm_efficiency)
        t = np.maximum(tc, tm) + fixed
        acc.add(op, t, tc, tm, flops, nbytes, scale)
        return t

    def _matmul(self, acc: OpAccumulator, op: str, g: Gemm, rows: F64, scale: float = 1.0) -> F64:
        p = self.params
        live = rows > 0  # an op with no rows does not run (and reads no weights)
        flops = g.flops_per_row * rows
        nbytes = np.where(live, g.weight_bytes + g.act_bytes_per_row * rows, 0.0)
        eff = matmul_efficiency(rows, p.matmul_efficiency_max, p.matmul_half_tokens)
        return self._roofline(
            acc, op, flops, nbytes, g.peak_flops, eff, scale, np.where(live, g.kernels * p.gemm_kernel_s, 0.0)
        )

    def _rows(self, tokens: F64) -> F64:
        """Token rows the step's GEMMs, norms and collectives run with: CUDA-graph padded (llmcap.perf.cuda_graphs)."""
        return padded_rows(tokens, self.params.cuda_graph_max_tokens) if self.params.cuda_graph_max_tokens else tokens

    def _allreduce(self, message_bytes: F64) -> F64:
        return allreduce_time(
            message_bytes, self.parallelism.tp, self._link_tp, self.params.allreduce_oneshot_latency_s
        )

    def _attention(self, acc: OpAccumulator, op: str, a: AttentionTerms, scale: float) -> F64:
        t = a.time()  # the same max(compute, memory) as `_roofline`
        acc.add(op, t, a.compute_s, a.memory_s, a.flops, a.nbytes, scale)
        return t

    def _comm(self, acc: OpAccumulator, op: str, t: F64, sent: F64, scale: float = 1.0) -> F64:
        acc.add(op, t, np.zeros_like(t), np.zeros_like(t), np.zeros_like(t), sent, scale)
        return t

    def _layer(self, acc: OpAccumulator, k: LayerKind, mb: StepBatch, scale: float) -> F64:
        """Cost one layer of kind `k` for micro-batch `mb`, added to `acc` x scale (layers of this kind)."""
        m, p, par = self.model, self.params, self.parallelism
        act, h = p.activation_bytes, m.hidden_size
        rows = self._rows(mb.tokens)
        total = np.zeros(len(mb))
        # two RMSNorms: weights + read and write of T x hidden each
        nb = np.where(rows > 0, k.norm_weight_bytes + 2 * 2 * act * h * rows, 0.0)
        total += self._roofline(acc, "norms", np.zeros_like(rows), nb, self._peak_bf16, np.ones_like(rows), scale)
        total += self._matmul(acc, "qkv_proj", k.qkv, rows, scale)
        a = self.attention
        total += self._attention(
            acc, "attn_prefill", prefill_attention(a, mb.prefill_tokens, mb.prefill_pairs, k.window), scale
        )
        total += self._attention(
            acc, "attn_decode", decode_attention(a, mb.decode_seqs, mb.decode_context, k.window), scale
        )
        if (
            p.attention_kernel_s
        ):  # one attention kernel a layer in a step with tokens: a function of the rows, so tabulated
            fixed = np.where(rows > 0, p.attention_kernel_s, 0.0)
            total += self._comm(acc, "attn_kernel", fixed, np.zeros_like(fixed), scale)
        total += self._matmul(acc, "o_proj", k.o, rows, scale)
        msg = rows * h * act
        n_ar = 1 if (k.is_moe and par.ep > 1) else 2
        if par.tp > 1:
            total += self._comm(acc, "tp_allreduce", n_ar * self._allreduce(msg), n_ar * msg, scale)
        if k.mlp is not None:
            total += self._matmul(acc, "mlp", k.mlp, rows, scale)
        if k.router is not None:
            total += self._matmul(acc, "router", k.router, rows, scale)
        if k.shared is not None:
            total += self._matmul(acc, "shared_experts", k.shared, rows, scale)
        if k.expert is not None:
            total += self._experts(acc, k.expert, rows, scale)
        return total

    def _experts(self, acc: OpAccumulator, g: Gemm, rows: F64, scale: float) -> F64:
        moe = self.model.moe
        assert moe is not None
        p, par = self.params, self.parallelism
        e, k = moe.num_experts, moe.top_k
        imb = p.moe_load_imbalance if par.ep > 1 else 1.0
        touched_frac = 1.0 - (1.0 - k / e) ** rows  # chance a given expert gets >= 1 of the T·k picks
        local = -(-e // par.ep)
        pairs_rank = rows * k / par.ep  # (token, expert) pairs this rank computes, on average
        per_expert_rows = np.divide(rows * k, e * touched_frac, out=np.zeros_like(rows), where=touched_frac > 0)
        flops = pairs_rank * g.flops_per_row
        nbytes = local * touched_frac * g.weight_bytes + pairs_rank * g.act_bytes_per_row
        eff = matmul_efficiency(per_expert_rows, p.matmul_efficiency_max, p.matmul_half_tokens)
        tc = imb * flops / (g.peak_flops * eff)
        tm = nbytes / (self.gpu.hbm_bandwidth_bytes_s * p.hbm_efficiency)
        t = np.maximum(tc, tm) + np.where(rows > 0, g.kernels * p.gemm_kernel_s, 0.0)
        acc.add("moe_experts", t, tc, tm, flops, nbytes, scale)
        if par.ep > 1:
            # dispatch + combine: each rank sends its T/ep tokens' k copies, (ep-1)/ep of them off-rank
            sent = imb * (rows / par.ep) * k * self.model.hidden_size * p.activation_bytes * (par.ep - 1) / par.ep
            t_a2a = 2 * all_to_all_time(sent, par.ep, self._link_ep)
            t = t + self._comm(acc, "ep_all_to_all", t_a2a, 2 * sent, scale)
        return t

    # The step-level terms, split by what they depend on (rows = tokens, or logit rows) so that
    # `row_terms` can give them for tabulation with the very same arithmetic; `_evaluate` adds them in order.

    def _first_stage_terms(self, acc: OpAccumulator, rows: F64) -> list[F64]:
        """Embedding gather (read + write T rows) and, with TP, vLLM's vocab-parallel all-reduce."""
        h, act, par = self.model.hidden_size, self.params.activation_bytes, self.parallelism
        zeros, ones, rows = np.zeros(acc.n), np.ones(acc.n), self._rows(rows)
        out = [self._roofline(acc, "embed", zeros, 2 * rows * h * act, self._peak_bf16, ones)]
        if par.tp > 1:
            out.append(self._comm(acc, "tp_allreduce", self._allreduce(rows * h * act), rows * h * act))
        return out

    def _last_stage_row_terms(self, acc: OpAccumulator, rows: F64) -> list[F64]:
        """Final norm over the step's T rows."""
        h, act, rows = self.model.hidden_size, self.params.activation_bytes, self._rows(rows)
        nb = np.where(rows > 0, h * act + 2 * act * h * rows, 0.0)
        return [self._roofline(acc, "norms", np.zeros(acc.n), nb, self._peak_bf16, np.ones(acc.n))]

    def _logit_terms(self, acc: OpAccumulator, logit_rows: F64) -> list[F64]:
        """lm_head over the rows that produce logits, and the logits gather over TP."""
        act, par = self.params.activation_bytes, self.parallelism
        out = [self._matmul(acc, "lm_head", self._lm_head, logit_rows)]
        if par.tp > 1:
            logits = logit_rows * self._vocab_padded * act
            out.append(self._comm(acc, "logits_gather", gather_time(logits, par.tp, self._link_tp), logits / par.tp))
        return out

    def _pp_hops(self, acc: OpAccumulator, rows: F64) -> F64:
        """(pp - 1) stage-to-stage sends of hidden states + residual."""
        par = self.parallelism
        msg = 2 * self._rows(rows) * self.model.hidden_size * self.params.activation_bytes
        hops = (par.pp - 1) * p2p_time(msg, self._link_pp)
        return self._comm(acc, "pp_send_recv", hops, (par.pp - 1) * msg)

    def _evaluate(self, batch: StepBatch) -> tuple[OpAccumulator, F64]:
        n, p, par = len(batch), self.params, self.parallelism
        micro = np.clip(batch.prefill_seqs + batch.decode_seqs, 1.0, float(par.pp))
        mb = StepBatch(
            batch.prefill_tokens / micro,
            batch.prefill_pairs / micro,
            batch.prefill_seqs / micro,
            batch.decode_seqs / micro,
            batch.decode_context / micro,
            batch.decode_max_context,
        )
        rows = mb.tokens
        acc = OpAccumulator(n)
        stage_t = np.zeros((par.pp, n))
        for j, kind in enumerate(self._kinds):
            layers = self._stage_counts[:, j]
            layer_t = self._layer(acc, kind, mb, float(layers.sum()))
            stage_t += layers[:, None] * layer_t[None, :]
        for t in self._first_stage_terms(acc, rows):
            stage_t[0] += t
        for t in self._last_stage_row_terms(acc, rows) + self._logit_terms(acc, mb.decode_seqs + mb.prefill_seqs):
            stage_t[-1] += t
        traversal = stage_t.sum(axis=0)
        if par.pp > 1:
            traversal = traversal + self._pp_hops(acc, rows)
            bubble = np.maximum(0.0, micro * stage_t.max(axis=0) - traversal)
            acc.add("pp_bubble", bubble, np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))
            traversal = traversal + bubble
        acc.add("overhead", np.full(n, p.step_overhead_s), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))
        return acc, traversal + p.step_overhead_s

    # ---------------------------------------------------------------- what CompiledRoofline tabulates

    def attention_layers(self) -> list[list[tuple[int | None, int]]]:
        """Per PP stage: (sliding window or None, number of layers) of each kind of layer, kinds in a fixed order."""
        return [[(k.window, int(c)) for k, c in zip(self._kinds, counts, strict=True)] for counts in self._stage_counts]

    def row_terms(self, rows: F64) -> tuple[F64, F64, F64]:
        """A step's costs that depend on one count alone (all but attention and the fixed overhead), for
        micro-batches of `rows` rows: per stage, its layers without attention, the embedding (first stage)
        and the final norm (last) over `rows` token rows; per stage, lm_head and logits gather over `rows`
        logit rows; the PP sends of `rows` token rows (zeros at pp = 1). `step_time`'s arithmetic."""
        n, pp = len(rows), self.parallelism.pp
        zeros = np.zeros(n)
        mb = StepBatch(rows, zeros, zeros, zeros, zeros, zeros)  # tokens == rows exactly
        tokens, logits = np.zeros((pp, n)), np.zeros((pp, n))
        for j, kind in enumerate(self._kinds):
            acc = OpAccumulator(n)
            self._layer(acc, kind, mb, 1.0)
            per_layer = sum((v[0] for op, v in acc.ops.items() if op not in ("attn_prefill", "attn_decode")), zeros)
            tokens += self._stage_counts[:, j][:, None] * per_layer[None, :]
        acc = OpAccumulator(n)
        for t in self._first_stage_terms(acc, rows):
            tokens[0] += t
        for t in self._last_stage_row_terms(acc, rows):
            tokens[-1] += t
        for t in self._logit_terms(acc, rows):
            logits[-1] += t
        return tokens, logits, (self._pp_hops(acc, rows) if pp > 1 else zeros)

    # ---------------------------------------------------------------- public

    def step_time(self, batch: StepBatch) -> F64:
        """Seconds per engine iteration for every batch in `batch`."""
        return self._evaluate(batch)[1]

    def compile(self, max_tokens: int = 0) -> CompiledRoofline:
        """The same step times, fast: tables over integer token counts (pre-sized for `max_tokens`)."""
        from llmcap.perf.roofline_compiled import CompiledRoofline

        return CompiledRoofline(self, max_tokens)

    def timing_form(self) -> CompiledRoofline:
        """The simulator times a roofline through its compiled tables (see `StepTimeModel`), shared by every
        simulation of this configuration in the process."""
        from llmcap.perf.roofline_compiled import shared_tables

        return shared_tables(self)

    def identity(self) -> tuple[object, ...]:
        """What the step times are a function of (a hashable key: the GPU spec holds a dict, hence its repr)."""
        return (type(self), self.model, repr(self.gpu), self.parallelism, self.policy, self.kv_dtype, self.params)

    def breakdown(self, batch: StepBatch, index: int = 0) -> list[OpCost]:
        """Every op of batch `index` that does work (time, FLOPs, bytes, bound), in execution order; their
        times sum to its step time. Ops the configuration lacks (TP all-reduce at tp = 1, experts in a dense
        model) or the batch does not use (prefill attention in a pure-decode step) are left out."""
        if not 0 <= index < len(batch):
            raise IndexError(f"batch index {index} out of range for {len(batch)} batches")
        acc, _ = self._evaluate(batch)
        rows = []
        for op in OPS:
            if op not in acc.ops:
                continue
            t, tc, tm, flops, nbytes = (float(a[index]) for a in acc.ops[op])
            if t == 0.0 and flops == 0.0 and nbytes == 0.0:
                continue
            if op in COMM_OPS:
                bound: Bound = "communication"
            elif op in ("overhead", "pp_bubble", "attn_kernel"):
                bound = "overhead"
            else:
                bound = "compute" if tc > tm else "memory"
            rows.append(OpCost(op, t, flops, nbytes, bound))
        return rows


@overload
def build_step_model(
    model: str | Path | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = ...,
    pp: int = ...,
    ep: int = ...,
    weight_quant: str = ...,
    kv_dtype: str = ...,
    params: RooflineParams | None = ...,
    compiled: Literal[False] = ...,
) -> RooflineModel: ...


@overload
def build_step_model(
    model: str | Path | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = ...,
    pp: int = ...,
    ep: int = ...,
    weight_quant: str = ...,
    kv_dtype: str = ...,
    params: RooflineParams | None = ...,
    *,
    compiled: Literal[True],
) -> CompiledRoofline: ...


def build_step_model(
    model: str | Path | ModelSpec,
    gpu: str | GpuSpec,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    weight_quant: str = "bf16",
    kv_dtype: str = "bf16",
    params: RooflineParams | None = None,
    compiled: bool = False,
) -> RooflineModel | CompiledRoofline:
    """A `RooflineModel` from catalog names (or a config.json path / directory for the model, or specs).

    `compiled=True` returns its `CompiledRoofline` (same step times to ~1e-15, tabulated: for callers
    that time many steps; the simulator's StepTimer compiles a plain RooflineModel by itself).
    Unknown model, GPU, weight format or KV dtype, or a parallelism the model cannot use: LlmcapError.
    """
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    g = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu)
    kv_dtype_bytes(kv_dtype)  # validate early: one clear error
    m = RooflineModel(spec, g, Parallelism(tp=tp, pp=pp, ep=ep), weight_quant, kv_dtype, params)
    return m.compile() if compiled else m
