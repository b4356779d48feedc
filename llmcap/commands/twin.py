"""`llmcap twin serve --model M --gpu G [--tp N] [--replicas R | --pd P:D] ...`: serve the simulated
deployment as an OpenAI-compatible endpoint (see `llmcap.twin`). Prints one line with its URL, serves
until SIGINT/SIGTERM (exit 0) or a simulated crash (exit 3).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated

import typer

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import user_errors
from llmcap.commands._deployment import (
    DecodeGpuOpt,
    DecodeMaxBatchedOpt,
    DecodeMaxNumSeqsOpt,
    DecodeNumBlocksOpt,
    DecodeTpOpt,
    FirstTokenFromOpt,
    GpuMemUtilOpt,
    GpuOpt,
    HostBlocksOpt,
    HostGbpsOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    LinkGbpsOpt,
    LinkLatencyOpt,
    MaxBatchedOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    NumBlocksOpt,
    PdOpt,
    PrefixCachingOpt,
    QuantOpt,
    ReplicasOpt,
    RouterOpt,
    TpOpt,
)
from llmcap.deployment import (
    ENGINE,
    EngineOptions,
    check_choices,
    decode_step_model,
    deployment_label,
    sim_config,
    step_model,
)
from llmcap.errors import LlmcapError
from llmcap.twin import Twin, TwinSpec

CRASH_EXIT = 3

app = typer.Typer(
    help="The digital twin: the simulator behind an OpenAI-compatible API (not a measurement).", no_args_is_help=True
)


@app.command("serve")
@user_errors
def serve(
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = ENGINE.tp,
    replicas: ReplicasOpt = ENGINE.replicas,
    pd: PdOpt = None,
    router: RouterOpt = ENGINE.router,
    first_token_from: FirstTokenFromOpt = ENGINE.first_token_from,
    link_gbps: LinkGbpsOpt = ENGINE.link_gbps,
    link_latency_ms: LinkLatencyOpt = ENGINE.link_latency_ms,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    num_blocks: NumBlocksOpt = None,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    prefix_caching: PrefixCachingOpt = ENGINE.prefix_caching,
    host_blocks: HostBlocksOpt = ENGINE.host_blocks,
    host_gbps: HostGbpsOpt = ENGINE.host_gbps,
    max_model_len: MaxModelLenOpt = None,
    decode_gpu: DecodeGpuOpt = None,
    decode_tp: DecodeTpOpt = None,
    decode_max_num_seqs: DecodeMaxNumSeqsOpt = None,
    decode_max_num_batched_tokens: DecodeMaxBatchedOpt = None,
    decode_num_blocks: DecodeNumBlocksOpt = None,
    host: Annotated[str, typer.Option(help="address to bind (fault knobs answer loopback clients only)")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="port (0: any free one; the printed URL says which)")
    ] = 8000,
    served_model_name: Annotated[
        str | None, typer.Option(help="model id clients send (default: the catalog name)")
    ] = None,
    dilation: Annotated[
        float, typer.Option(min=1e-6, help="wall seconds per simulated second (10: ten times slower than real time)")
    ] = TwinSpec.dilation,
    slowdown: Annotated[
        float, typer.Option(min=1e-6, help="fault: every engine step takes this many times its simulated time")
    ] = TwinSpec.slowdown,
    error_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="fault: share of completion requests answered HTTP 500 (seeded)")
    ] = TwinSpec.error_rate,
    crash_after: Annotated[
        int | None, typer.Option(min=0, help="fault: the request after this many kills the twin (streams cut, exit 3)")
    ] = TwinSpec.crash_after,
    stall_s: Annotated[
        float, typer.Option(min=0.0, help="fault: the engine produces nothing for this many simulated seconds ...")
    ] = TwinSpec.stall_s,
    stall_at: Annotated[
        float, typer.Option(min=0.0, help="... starting this many simulated seconds after start")
    ] = TwinSpec.stall_at,
    long_prompt_slowdown: Annotated[
        float,
        typer.Option(
            min=1e-6,
            help="fault: steps whose prefill reaches past --long-prompt-tokens take this many times their simulated time",
        ),
    ] = TwinSpec.long_prompt_slowdown,
    long_prompt_tokens: Annotated[
        int, typer.Option(min=1, help="... the context length from which --long-prompt-slowdown applies")
    ] = TwinSpec.long_prompt_tokens,
    seed: Annotated[int, typer.Option(help="seed of the error draws and the power-of-two router")] = TwinSpec.seed,
    max_in_flight: Annotated[
        int, typer.Option(min=1, help="requests in flight at once; more are answered 503")
    ] = TwinSpec.slots,
    engine_version: Annotated[
        str, typer.Option(help="the version GET /version reports (another value stands for an engine upgrade)")
    ] = TwinSpec.engine_version,
) -> None:
    """Serve MODEL on GPU (TP, replicas or P/D pools) as a simulated OpenAI-compatible endpoint."""
    opts = EngineOptions(
        tp=tp,
        replicas=replicas,
        router=router,
        pd=pd,
        first_token_from=first_token_from,
        link_gbps=link_gbps,
        link_latency_ms=link_latency_ms,
        quant=quant,
        kv_dtype=kv_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_blocks=num_blocks,
        gpu_memory_utilization=gpu_memory_utilization,
        prefix_caching=prefix_caching,
        host_blocks=host_blocks,
        host_gbps=host_gbps,
        max_model_len=max_model_len,
        decode_gpu=decode_gpu,
        decode_tp=decode_tp,
        decode_max_num_seqs=decode_max_num_seqs,
        decode_max_num_batched_tokens=decode_max_num_batched_tokens,
        decode_num_blocks=decode_num_blocks,
    )
    check_choices(opts)
    spec = load_model(model)
    g = get_gpu(gpu)
    cfg = sim_config(spec, g, opts)
    label = deployment_label(cfg)
    twin_spec = TwinSpec(
        config=cfg,
        step_model=step_model(model, gpu, tp, quant, kv_dtype),
        served_model_name=served_model_name or spec.name,
        info={"model": spec.name, "gpu": g.name, "tp": str(tp), "deployment": label, "dilation": f"{dilation:g}"},
        vocab_size=spec.vocab_size,
        max_model_len=cfg.engine.max_model_len,
        dilation=dilation,
        decode_step_model=decode_step_model(model, gpu, opts),
        slowdown=slowdown,
        error_rate=error_rate,
        crash_after=crash_after,
        stall_s=stall_s,
        stall_at=stall_at,
        seed=seed,
        slots=max_in_flight,
        long_prompt_slowdown=long_prompt_slowdown,
        long_prompt_tokens=long_prompt_tokens,
        engine_version=engine_version,
    )
    served_before_crash = asyncio.run(_serve(twin_spec, host, port, f"{spec.name} on {g.name} TP{tp}, {label}"))
    if served_before_crash is not None:
        print(
            f"llmcap twin: simulated crash at completion request {served_before_crash} (injected fault)",
            file=sys.stderr,
        )
        raise typer.Exit(CRASH_EXIT)


async def _serve(spec: TwinSpec, host: str, port: int, what: str) -> int | None:
    """Serve until a signal (None) or a simulated crash (the completion request that crashed it, counted
    from 1; the fault is set by --crash-after or later through the faults endpoint)."""
    twin = Twin(spec)
    try:
        url = await twin.start(host, port)
    except OSError as exc:
        raise LlmcapError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, twin.ended.set)
    print(f"llmcap twin (simulated, not a measurement): {what} at {url}", flush=True)
    await twin.ended.wait()
    crashed_at = twin.faults.requests if twin.crashed else None
    await twin.stop()
    return crashed_at
