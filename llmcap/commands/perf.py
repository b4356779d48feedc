"""`llmcap perf --model M --gpu G --tp N --isl I --osl O`: roofline step times, to sanity-check against
published numbers before trusting any capacity plan built on them.

Max throughput is the steady state at the largest batch B the KV cache (and max_num_seqs) allows: every
sequence decodes OSL tokens at a mean context of ISL + OSL/2, and for every B·OSL tokens decoded the engine
also prefills B prompts of ISL tokens, packed into n_p steps of max_num_batched_tokens as chunked prefill packs
them (several short prompts to a step; a long one over several). The prompts finish prefill one after another
over those steps, and the ones done decode along in the rest of them; they finish decoding as staggered, and the
next cycle's prefill takes the slots they leave: the cycle's pure-decode steps are OSL less that triangle,
min(n_p, OSL)/2:

    tokens/s = B·OSL / ((OSL − min(n_p, OSL)/2) · t_decode(B, ISL + OSL/2) + T_prefill(B × ISL in steps of max_num_batched_tokens))

B counts whole lives (ISL + OSL each), which is what TensorRT-LLM's guaranteed-no-evict admission runs. When
the KV binds, vLLM's admission (TensorRT-LLM's max-utilization, SGLang's) starts more sequences by their
prompts and preempts them as they grow: `limited_by` and `policy_effect` say so, and the figure is then a
ceiling (`estimate`) that leaves out the preempted sequences' recompute, which `llmcap simulate
--admission-policy` counts (`llmcap.sim.admission`). Elsewhere the two agree within 10% over dense and MoE
models, TP 1–8 and 128/128 to 20000/2000 (tests/perf/test_perf_simulate_grid.py).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from llmcap.catalog.gpus import GIB
from llmcap.commands._common import (
    JsonFlagOpt,
    OutputFormatOpt,
    out_console,
    output_format,
    print_csv,
    print_json,
    user_errors,
)
from llmcap.errors import LlmcapError
from llmcap.memory import MemoryParams, MemoryPlan, plan_memory
from llmcap.perf import StepBatch, build_step_model, causal_pairs, decode_step_time, prefill_time
from llmcap.perf.roofline import OpCost, RooflineModel
from llmcap.policy_names import DEFAULT_ADMISSION, admission_option, never_preempts


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... below `max_batch`, then `max_batch` itself."""
    sizes = [1 << i for i in range(max(max_batch, 1).bit_length()) if (1 << i) < max_batch]
    return sizes + [max_batch]


def batched_prefill_time(model: RooflineModel, batch: int, isl: int, chunk: int) -> float:
    """Seconds to prefill `batch` prompts of `isl` tokens in steps of `chunk` tokens: a prompt longer than a
    step runs in chunks of its own; shorter ones share steps, the last one split to fill them."""
    if isl >= chunk:
        return batch * float(prefill_time(model, isl, chunk=chunk)[0])
    total = batch * isl
    full, rest = divmod(total, chunk)
    tokens = np.array([chunk, rest], dtype=np.float64)
    times = model.step_time(
        StepBatch.build(tokens, tokens * (isl + 1) / 2.0, tokens / isl)
    )  # whole prompts' causal pairs
    return full * float(times[0]) + (float(times[1]) if rest else 0.0)


def steady_throughput(
    model: RooflineModel, batch: int, isl: int, osl: int, t_prefill_batch: float, chunk: int
) -> float:
    """Output tokens/s at `batch` concurrent sequences of ISL/OSL, their prompts prefilled in `t_prefill_batch`
    (`batched_prefill_time`, in steps of `chunk`; formula in the module docstring)."""
    t_dec = float(decode_step_time(model, batch, isl + osl / 2)[0])
    return batch * osl / (decode_steps(batch, isl, osl, chunk) * t_dec + t_prefill_batch)


def decode_steps(batch: int, isl: int, osl: int, chunk: int) -> float:
    """Pure-decode steps per cycle: OSL, less the triangle where one cycle's prompts, finishing their prefill one
    after another over its n_p = ⌈B·ISL / chunk⌉ steps, decode along in the rest of them (and finish decoding
    as staggered, while the next cycle's prefill fills the slots they leave)."""
    prefill_steps = math.ceil(batch * isl / chunk)
    return osl - min(prefill_steps, osl) / 2


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="Catalog model name (e.g. Llama-3.1-8B) or a path to config.json / its directory."
    ),
]
GpuOpt = Annotated[
    str, typer.Option("--gpu", "-g", help="GPU name or alias from llmcap/catalog/data/gpus.yaml (e.g. h100).")
]
TpOpt = Annotated[int, typer.Option(min=1, help="Tensor parallel degree.")]
PpOpt = Annotated[int, typer.Option(min=1, help="Pipeline parallel degree.")]
KvDtypeOpt = Annotated[str, typer.Option(help="KV cache dtype: bf16, fp8, int8.")]
IslOpt = Annotated[int, typer.Option(min=1, help="Input (prompt) length in tokens.")]
OslOpt = Annotated[int, typer.Option(min=1, help="Output length in tokens.")]
EpOpt = Annotated[int, typer.Option(min=1, help="Expert parallel degree (1, or a divisor of TP).")]
WeightQuantOpt = Annotated[
    str, typer.Option(help="Weight format: bf16, fp8, fp8-block, int8, int4-awq[-gN], int4-gptq[-gN], nvfp4, mxfp4.")
]
MaxNumSeqsOpt = Annotated[int, typer.Option(min=1, help="Engine cap on concurrent sequences (vLLM max_num_seqs).")]
MaxBatchedOpt = Annotated[
    int,
    typer.Option(min=1, help="Token budget of one step (vLLM max_num_batched_tokens): prefill packs prompts into it."),
]
AdmissionPolicyOpt = Annotated[
    str,
    typer.Option(help="the engine's admission: vllm | trtllm-guaranteed-no-evict | trtllm-max-utilization | sglang"),
]


@user_errors
def perf(
    model: ModelOpt,
    gpu: GpuOpt,
    isl: IslOpt,
    osl: OslOpt,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    weight_quant: WeightQuantOpt = "bf16",
    kv_dtype: KvDtypeOpt = "bf16",
    max_num_seqs: MaxNumSeqsOpt = 256,
    max_num_batched_tokens: MaxBatchedOpt = 8192,
    admission_policy: AdmissionPolicyOpt = DEFAULT_ADMISSION,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """Roofline prefill and decode step times, max batch by KV and max output throughput for MODEL on GPU."""
    output = output_format(output_fmt, json_out)
    admission_option(admission_policy)
    rm = build_step_model(model, gpu, tp=tp, pp=pp, ep=ep, weight_quant=weight_quant, kv_dtype=kv_dtype)
    plan = plan_memory(
        rm.model, rm.gpu, rm.parallelism, rm.policy, kv_dtype, params=MemoryParams(max_num_seqs=max_num_seqs)
    )
    context = isl + osl
    max_batch_kv = int(plan.max_concurrent_sequences([context])[0])
    if max_batch_kv < 1:
        raise LlmcapError(
            f"{rm.model.name} on {rm.gpu.name} ({rm.parallelism.label()}, {rm.policy.weights.name}): no room for the KV "
            f"cache of one {context}-token sequence (KV budget {plan.kv_budget_bytes_per_rank / GIB:.2f} GiB per rank)"
        )
    batch = min(max_batch_kv, max_num_seqs)
    mean_ctx = isl + osl / 2
    pf = StepBatch.build(isl, causal_pairs(isl, 0))
    steps = {"prefill": pf, "1": _decode(1, mean_ctx), "B": _decode(batch, mean_ctx)}
    out = _summary(rm, plan, isl, osl, max_batch_kv, max_num_seqs, max_num_batched_tokens, admission_policy, steps)
    if output == "json":
        print_json(out)
    elif output == "csv":
        print_csv([{k: out[k] for k in _CSV_KEYS} | out["parallelism"] | r for r in out["decode"]])
    else:
        _print_tables(out, rm, {k: rm.breakdown(b) for k, b in steps.items()})


_CSV_KEYS = ("model", "gpu", "weight_quant", "kv_dtype", "isl", "osl", "prefill_time_s", "max_batch_kv")


def _summary(
    rm: RooflineModel,
    plan: MemoryPlan,
    isl: int,
    osl: int,
    max_batch_kv: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    admission_policy: str,
    steps: dict[str, StepBatch],
) -> dict[str, Any]:
    """The JSON object: step times, the decode sweep, the steady throughput at the largest batch and the per-op
    breakdowns of `steps` (a prefill, decode at batch 1 and at the largest batch)."""
    par = rm.parallelism
    batch = min(max_batch_kv, max_num_seqs)
    mean_ctx = isl + osl / 2
    sizes = batch_sizes(batch)
    dec = decode_step_time(rm, sizes, mean_ctx)
    t_prefill = float(prefill_time(rm, isl)[0])
    decode_rows = [
        {"batch": b, "step_time_s": float(t), "output_tokens_per_s": b / float(t)}
        for b, t in zip(sizes, dec, strict=True)
    ]
    t_prefill_batch = batched_prefill_time(rm, batch, isl, max_num_batched_tokens)
    return {
        "model": rm.model.name,
        "gpu": rm.gpu.name,
        "parallelism": {"tp": par.tp, "pp": par.pp, "ep": par.ep},
        "weight_quant": rm.policy.weights.name,
        "compute_dtype": rm.compute_dtype,
        "kv_dtype": rm.kv_dtype,
        "isl": isl,
        "osl": osl,
        "weights_bytes_per_rank": plan.weights_bytes_per_rank,
        "kv_tokens_per_instance": plan.kv_tokens_per_instance,
        "prefill_time_s": t_prefill,
        "decode_mean_context": mean_ctx,
        "decode": decode_rows,
        "max_batch_kv": max_batch_kv,
        "max_num_seqs": max_num_seqs,
        "throughput": {
            "batch": batch,
            "output_tokens_per_s": steady_throughput(rm, batch, isl, osl, t_prefill_batch, max_num_batched_tokens),
            "prefill_time_batch_s": t_prefill_batch,
            "max_num_batched_tokens": max_num_batched_tokens,
            "formula": "B*OSL / ((OSL - min(n_p, OSL)/2)*t_decode(B, ISL+OSL/2) + T_prefill(B x ISL in n_p steps of max_num_batched_tokens))",
            "limited_by": "kv" if max_batch_kv < max_num_seqs else "max_num_seqs",
            "estimate": "ceiling" if preempts(admission_policy, max_batch_kv, max_num_seqs) else "steady state",
            "admission_policy": admission_policy,
            "policy_effect": policy_effect(admission_policy, max_batch_kv, max_num_seqs),
        },
        "breakdown": {
            "prefill": [r.as_dict() for r in rm.breakdown(steps["prefill"])],
            "decode_batch_1": [r.as_dict() for r in rm.breakdown(steps["1"])],
            "decode_max_batch": [r.as_dict() for r in rm.breakdown(steps["B"])],
        },
        "params": rm.params.model_dump(),
        "calibration": rm.calibration.describe() if rm.calibration else None,  # None: the documented defaults
    }


def preempts(policy: str, max_batch_kv: int, max_num_seqs: int) -> bool:
    """Whether the policy preempts at this cell: the KV binds and admission does not reserve whole lives."""
    return max_batch_kv < max_num_seqs and not never_preempts(policy)


def policy_effect(policy: str, max_batch_kv: int, max_num_seqs: int) -> str:
    """What the engine's admission policy does to the estimate at this cell."""
    if max_batch_kv >= max_num_seqs:
        return f"max_num_seqs ({max_num_seqs}) binds before the KV cache: no policy preempts here"
    if not preempts(policy, max_batch_kv, max_num_seqs):
        return (
            f"whole lives are reserved at admission: {max_batch_kv} at a time, no preemption (the estimate's own batch)"
        )
    return (
        f"the KV binds at {max_batch_kv} whole lives: {policy} admits more by their prompts and preempts (recompute) as they grow; "
        "the figure is a ceiling that leaves the recompute out; `llmcap simulate --admission-policy` counts the preemptions and their cost"
    )


def _decode(batch: int, mean_ctx: float) -> StepBatch:
    return StepBatch.build(decode_seqs=batch, decode_context=batch * mean_ctx, decode_max_context=mean_ctx)


def _ms(t: float) -> str:
    return f"{t * 1e3:,.3f}"


def _print_tables(out: dict, rm: RooflineModel, ops: dict[str, list[OpCost]]) -> None:
    console = out_console()
    tput = out["throughput"]
    head = Table(
        title=f"{out['model']} on {out['gpu']} — {rm.parallelism.label()}, {out['weight_quant']} weights "
        f"({out['compute_dtype']} math), {out['kv_dtype']} KV, ISL {out['isl']} / OSL {out['osl']} (roofline)"
    )
    head.add_column("quantity")
    head.add_column("value", justify="right")
    head.add_row("weights / rank (GiB)", f"{out['weights_bytes_per_rank'] / GIB:,.2f}")
    head.add_row("KV tokens / instance", f"{out['kv_tokens_per_instance']:,}")
    head.add_row(f"prefill {out['isl']} tokens (ms)", _ms(out["prefill_time_s"]))
    head.add_row(f"max batch by KV (ISL+OSL = {out['isl'] + out['osl']})", f"{out['max_batch_kv']:,}")
    head.add_row(f"max throughput at batch {tput['batch']} (output tok/s)", f"{tput['output_tokens_per_s']:,.0f}")
    console.print(head)
    console.print(f"throughput = {tput['formula']}", highlight=False)
    console.print(
        f"batch limited by {tput['limited_by']}; {tput['admission_policy']}: {tput['policy_effect']}", highlight=False
    )
    cal = out["calibration"]
    console.print(
        f"efficiencies: {'calibrated, ' + cal['file'] + ' (sha256 ' + cal['sha256'][:12] + ')' if cal else 'documented defaults (no calibration for this GPU)'}"
        f" — matmul max {rm.params.matmul_efficiency_max:.2f}, attention max {rm.params.attention_efficiency_max:.2f}, "
        f"HBM {rm.params.hbm_efficiency:.2f}",
        highlight=False,
    )
    dec = Table(title=f"decode step vs batch (mean context {out['decode_mean_context']:g} tokens)")
    for col in ("batch", "step = ITL (ms)", "output tok/s"):
        dec.add_column(col, justify="right")
    for r in out["decode"]:
        dec.add_row(f"{r['batch']:,}", _ms(r["step_time_s"]), f"{r['output_tokens_per_s']:,.0f}")
    console.print(dec)
    labels = {
        "prefill": f"prefill of {out['isl']} tokens",
        "1": "decode step, batch 1",
        "B": f"decode step, batch {tput['batch']}",
    }
    for key, rows in ops.items():
        total = sum(r.time_s for r in rows)
        table = Table(title=f"{labels[key]}: {_ms(total)} ms, per op on one rank")
        for col in ("op", "ms", "share", "GFLOP", "MB", "bound"):
            table.add_column(col, justify="left" if col in ("op", "bound") else "right", no_wrap=True)
        for r in rows:
            table.add_row(
                r.op,
                _ms(r.time_s),
                f"{r.time_s / total:.0%}",
                f"{r.flops / 1e9:,.1f}",
                f"{r.bytes / 1e6:,.1f}",
                r.bound,
            )
        console.print(table)
