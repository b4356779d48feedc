"""`llmcap memory --model M --gpu G [--tp N ...]`: where one rank's HBM goes, and how many KV tokens are left."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from llmcap.catalog import get_gpu, load_model
from llmcap.catalog.gpus import GIB
from llmcap.catalog.quant import kv_dtype_bytes
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
from llmcap.parallelism import Parallelism


def _amount(n_bytes: float) -> str:
    """GiB, or MiB under a tenth of one (a KV block is a few MiB: 0.00 GiB would say nothing)."""
    return f"{n_bytes / GIB:.2f} GiB" if n_bytes >= GIB / 10 else f"{n_bytes / 2**20:.2f} MiB"


def does_not_fit(plan: MemoryPlan) -> str:
    """The one-line error of a rank with no room for one KV block: how many GiB it lacks, and for what."""
    b, p = plan.breakdown, plan.params
    usable = b.hbm_bytes - b.total("reserved")
    block = plan.block_size * plan.kv_bytes_per_token_per_rank
    what = (
        f"{plan.model.name} on {plan.gpu.name} ({plan.parallelism.label()}, {plan.weight_format.name} weights, {plan.kv_dtype} KV) "
        "does not fit"
    )
    if b.kv_budget_bytes <= 0:
        why = (
            f"needs {-b.kv_budget_bytes / GIB:.2f} GiB more than the {usable / GIB:.2f} GiB usable per rank (HBM x {p.gpu_memory_utilization:g}) "
            f"for weights ({b.weights_bytes / GIB:.2f} GiB) + activations and runtime ({b.runtime_bytes / GIB:.2f} GiB) "
            f"+ safety margin ({b.total('margin') / GIB:.2f} GiB), before any KV cache"
        )
    else:
        why = (
            f"needs {_amount(block - b.kv_budget_bytes)} more: weights and runtime leave {_amount(b.kv_budget_bytes)} per rank, "
            f"less than one {plan.block_size}-token KV block ({_amount(block)})"
        )
    return f"{what}: {why}; try a larger --tp or --pp, a smaller --weight-quant, or a GPU with more memory"


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
EpOpt = Annotated[int, typer.Option(min=1, help="Expert parallel degree (1, or a divisor of TP x DP).")]
DpOpt = Annotated[int, typer.Option(min=1, help="Data parallel degree (attention DP replicas per instance).")]
QuantOpt = Annotated[
    str,
    typer.Option(
        "--weight-quant",
        "--quant",
        help="Weight format: bf16, fp8, fp8-block, int8, int4-awq[-gN], int4-gptq[-gN], nvfp4, mxfp4.",
    ),
]
BlockSizeOpt = Annotated[int, typer.Option(min=1, help="KV block size in tokens.")]
GpuMemUtilOpt = Annotated[float, typer.Option(min=0.01, max=1.0, help="Fraction of HBM the engine may use.")]
MaxNumSeqsOpt = Annotated[int, typer.Option(min=1, help="Largest decode batch (sizes the logits buffer).")]
MaxBatchedOpt = Annotated[int, typer.Option(min=1, help="Largest forward pass in tokens (sizes activations).")]
ContextLenOpt = Annotated[
    int | None, typer.Option(min=1, help="Also report how many sequences of this total length fit.")
]


@user_errors
def memory(
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    quant: QuantOpt = "bf16",
    kv_dtype: KvDtypeOpt = "bf16",
    block_size: BlockSizeOpt = 16,
    gpu_memory_utilization: GpuMemUtilOpt = 0.90,
    max_num_seqs: MaxNumSeqsOpt = 256,
    max_num_batched_tokens: MaxBatchedOpt = 8192,
    context_len: ContextLenOpt = None,
    output_fmt: OutputFormatOpt = "table",
    json_out: JsonFlagOpt = False,
) -> None:
    """Memory per rank: weights, runtime, KV budget and KV token capacity for MODEL on GPU."""
    output = output_format(output_fmt, json_out)
    spec = load_model(model)
    g = get_gpu(gpu)
    params = MemoryParams(
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    plan = plan_memory(spec, g, Parallelism(tp=tp, pp=pp, ep=ep, dp=dp), quant, kv_dtype, block_size, params)
    if not plan.fits:  # a negative KV budget is no plan: say so and exit 2, whatever the output format
        raise LlmcapError(does_not_fit(plan))
    out = _summary(plan, context_len)
    if output == "json":
        print_json(out)
    elif output == "csv":
        print_csv([{k: v for k, v in out.items() if k not in ("params_by_component", "breakdown")}])
    else:
        _print_tables(out, plan, context_len)


def _summary(plan: MemoryPlan, context_len: int | None) -> dict[str, Any]:
    """The plan as the JSON object (and, less its nested parts, the CSV row)."""
    spec, par, p = plan.model, plan.parallelism, plan.model.params
    out: dict[str, Any] = {
        "model": spec.name,
        "gpu": plan.gpu.name,
        "parallelism": {"tp": par.tp, "pp": par.pp, "ep": par.ep, "dp": par.dp},
        "weight_format": plan.weight_format.name,
        "kv_dtype": plan.kv_dtype,
        "block_size": plan.block_size,
        "params_total": p.total,
        "params_active": p.active,
        "params_active_no_embeddings": p.active_no_embeddings,
        "params_mtp_excluded": p.mtp,
        "params_by_component": p.by_component(),
        "kv_bytes_per_token": spec.kv_bytes_per_token(kv_dtype_bytes(plan.kv_dtype)),
        "kv_bytes_per_token_per_rank": plan.kv_bytes_per_token_per_rank,
        "weights_bytes_per_rank": plan.weights_bytes_per_rank,
        "kv_budget_bytes_per_rank": plan.kv_budget_bytes_per_rank,
        "kv_blocks_per_rank": plan.kv_blocks_per_rank,
        "kv_tokens_per_rank": plan.kv_tokens_per_rank,
        "kv_tokens_per_instance": plan.kv_tokens_per_instance,
        "breakdown": plan.breakdown.as_dicts(),
    }
    if context_len is not None:
        out["context_len"] = context_len
        out["max_concurrent_sequences"] = int(plan.max_concurrent_sequences([context_len])[0])
    return out


def _print_tables(out: dict[str, Any], plan: MemoryPlan, context_len: int | None) -> None:
    spec, p = plan.model, plan.model.params
    console = out_console()
    head = Table(
        title=f"{spec.name} on {plan.gpu.name} — {plan.parallelism.label()}, {plan.weight_format.name} weights, "
        f"{plan.kv_dtype} KV"
    )
    head.add_column("quantity")
    head.add_column("value", justify="right")
    head.add_row("params total", f"{p.total:,}")
    head.add_row("params active / token", f"{p.active:,}")
    head.add_row("KV bytes / token (all layers)", f"{out['kv_bytes_per_token']:,.0f}")
    head.add_row("KV bytes / token / rank", f"{plan.kv_bytes_per_token_per_rank:,.0f}")
    head.add_row("KV tokens / rank", f"{plan.kv_tokens_per_rank:,}")
    head.add_row("KV tokens / instance", f"{plan.kv_tokens_per_instance:,}")
    if context_len is not None:
        head.add_row(f"sequences of {context_len} tokens", f"{out['max_concurrent_sequences']:,}")
    console.print(head)
    table = Table(title=f"memory per rank (PP stage {plan.bottleneck_stage})")
    table.add_column("item")
    table.add_column("GiB", justify="right")
    table.add_column("bytes", justify="right")
    for r in plan.breakdown.rows:
        table.add_row(r.label, f"{r.bytes / GIB:,.2f}", f"{r.bytes:,}")
    console.print(table)
